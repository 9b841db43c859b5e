"""FAQ drafts for the agent console (same session and CSRF rules as app/agent/api.py). A draft is
written by the `draft_faq` task when an agent resolves a handed-off conversation
(pipelines/faq_draft.py); approving it publishes it to the help centre.

    GET  /api/agent/faq-drafts?status=pending&limit=   the tenant's drafts, most merged first
    POST /api/agent/faq-drafts/<id>/approve            optional {"question", "answer"} edit; the
                                                       article is rewritten and the index refreshed
    POST /api/agent/faq-drafts/<id>/reject
"""
from __future__ import annotations

import uuid

from flask import Blueprint, current_app, jsonify, request

from app.agent.auth import agent_required, current_agent
from app.agent.faq_schemas import FaqApproveIn, FaqDraftList, FaqDraftOut, FaqDraftPath, FaqDraftQuery
from app.errors import PlainError, render, validate_body
from app.schemas import Error, error_responses
from app.store.handoffs import Conflict, NotFound
from httpkit.openapi import documented

bp = Blueprint("agent_faq", __name__, url_prefix="/api/agent/faq-drafts")
bp.register_error_handler(PlainError, render)
bp.before_request(agent_required)
_ERRORS = error_responses(Error, 400, 401, 429, 503)
_CHANGE = {**_ERRORS, **error_responses(Error, 404, 409)}


def _drafts():
    return current_app.extensions["support_chat"]["faq_drafts"]


@bp.get("")
@documented(query=FaqDraftQuery, responses={200: FaqDraftList, **_ERRORS}, tags=("agent",))
def drafts():
    """The tenant's FAQ drafts with one status (default pending), the most often asked first."""
    query = validate_body(FaqDraftQuery, request.args.to_dict())
    return jsonify({"drafts": _drafts().list(current_agent().tenant_id, query.status, query.limit)})


def _decide(draft_id: int, decide) -> dict:
    try:
        return decide()
    except NotFound:
        raise PlainError(404, f"unknown FAQ draft {draft_id}") from None
    except Conflict as exc:
        raise PlainError(409, str(exc)) from None


@bp.post("/<int:draft_id>/approve")
@documented(path=FaqDraftPath, body=FaqApproveIn, body_required=False, responses={200: FaqDraftOut, **_CHANGE},
            tags=("agent",))
def approve(draft_id: int):
    """Publish a pending draft, as written or with the agent's edit, to the help centre; the bot
    answers from it once the knowledge base has re-indexed (seconds)."""
    agent = current_agent()
    body = validate_body(FaqApproveIn, request.get_json(silent=True) or {})
    clean = current_app.extensions["support_chat"]["services"].clean
    done = _decide(draft_id, lambda: _drafts().approve(
        agent.tenant_id, draft_id, agent.id, question=clean(body.question) if body.question else None,
        answer=clean(body.answer) if body.answer else None))
    _reindex()
    return jsonify(done)


@bp.post("/<int:draft_id>/reject")
@documented(path=FaqDraftPath, responses={200: FaqDraftOut, **_CHANGE}, tags=("agent",))
def reject(draft_id: int):
    """Drop a pending draft."""
    agent = current_agent()
    return jsonify(_decide(draft_id, lambda: _drafts().reject(agent.tenant_id, draft_id, agent.id)))


def _reindex() -> None:
    """Embed the changed article off this request (the knowledge-base job); without a broker
    the web workers' own folder check picks it up within seconds."""
    from app.jobs.tasks import BrokerUnavailable, index_knowledge_base, start
    job_id = uuid.uuid4().hex
    jobs = current_app.extensions["completion"]["jobs"]
    jobs.set(job_id, status="queued", kind="kb")
    try:
        start(index_knowledge_base, job_id)
    except BrokerUnavailable as exc:
        jobs.set(job_id, status="failed", error=str(exc))
        current_app.logger.warning("FAQ approved; re-index not queued (%s): the folder check will pick it up", exc)
