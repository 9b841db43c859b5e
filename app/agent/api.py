"""The agent API: what the console at /agent/ (and an integrator) calls. Cookie sessions from
POST /api/agent/login (app/agent/auth.py); every state-changing call sends X-CSRF-Token. An
agent sees its own tenant's conversations only: another tenant's id is simply not found.

    GET  /api/agent/conversations?status=&limit=&before=   the inbox, newest first, paginated
    GET  /api/agent/conversations/<id>                     transcript, summary, feedback
    POST /api/agent/conversations/<id>/claim               status human, assignee me (409 if taken)
    POST /api/agent/conversations/<id>/messages            {"content"}: to the customer, live
    POST /api/agent/conversations/<id>/typing              {"typing"}: the widget's indicator
    POST /api/agent/conversations/<id>/resolve             status resolved; the widget asks for CSAT, and
                                                           the agent's answer is drafted into an FAQ entry
    GET  /api/agent/conversations/<id>/suggestion          the bot's draft answer to the last question
    GET  /api/agent/events                                 SSE: handoffs, customer messages, status
    GET  /api/agent/reports?from=YYYY-MM-DD&to=YYYY-MM-DD  the team's numbers (app/reports/queries.py)
    GET  /api/agent/knowledge-gaps?from=&to=&limit=        what the help centre does not answer, clustered
    GET  /api/agent/knowledge-gaps.csv?from=&to=&limit=    the same as CSV (app/reports/knowledge_gaps.py)
"""
from __future__ import annotations

import base64
import datetime as dt
import re

from flask import Blueprint, Response, current_app, jsonify, request

from app import handoff_events
from app.agent.auth import agent_required, current_agent
from app.agent.schemas import (
    AGENT_EVENTS,
    AgentMessageIn,
    ClaimOut,
    ConversationDetail,
    ConversationList,
    ConversationListQuery,
    ConversationPath,
    GapsOut,
    GapsQuery,
    MessageOut,
    ReportOut,
    ReportQuery,
    ResolveOut,
    SuggestionOut,
    TypingIn,
)
from app.errors import PlainError, render, validate_body
from app.limits import TurnSlot
from app.live_events import sse_response, tenant_channel
from app.reports.knowledge_gaps import gap_turns, gaps_csv, knowledge_gaps
from app.reports.queries import report
from app.schemas import Error, Ok, error_responses
from app.store.handoffs import Conflict, NotFound
from app.webhook_events import emit
from httpkit.openapi import Body, documented

bp = Blueprint("agent_api", __name__, url_prefix="/api/agent")
bp.register_error_handler(PlainError, render)
bp.before_request(agent_required)
_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
_ERRORS = error_responses(Error, 400, 401, 429, 503)
_ONE = {**_ERRORS, **error_responses(Error, 404)}
_CHANGE = {**_ONE, **error_responses(Error, 409)}


def _ext() -> dict:
    return current_app.extensions["support_chat"]


@bp.errorhandler(Conflict)
def _conflict(exc: Conflict):
    return jsonify({"error": str(exc)}), 409


@bp.errorhandler(NotFound)
def _not_found(_exc: NotFound):
    return jsonify({"error": "unknown conversation"}), 404


def _conversation_id(cid: str) -> str:
    if not _ID.match(cid):
        raise NotFound(cid)
    return cid


def _cursor(value: tuple[dt.datetime, str] | None) -> str | None:
    if value is None:
        return None
    return base64.urlsafe_b64encode(f"{value[0].isoformat()}|{value[1]}".encode()).decode()


def _parse_cursor(text: str | None) -> tuple[dt.datetime, str] | None:
    if not text:
        return None
    try:
        at, cid = base64.urlsafe_b64decode(text.encode()).decode().split("|", 1)
        at = dt.datetime.fromisoformat(at)
        # the API's cursors are UTC; one without a zone is read as UTC, not compared naive
        return (at.astimezone(dt.UTC) if at.tzinfo else at.replace(tzinfo=dt.UTC)), cid
    except (ValueError, UnicodeDecodeError, OverflowError):
        raise PlainError(400, "before: not a cursor this API returned") from None


@bp.get("/conversations")
@documented(query=ConversationListQuery, responses={200: ConversationList, **_ERRORS}, tags=("agent",))
def conversations():
    """The inbox: this tenant's conversations, most recently updated first."""
    query = validate_body(ConversationListQuery, request.args.to_dict())
    rows, nxt = _ext()["store"].list(current_agent().tenant_id, query.status, query.limit, _parse_cursor(query.before))
    return jsonify({"conversations": rows, "next": _cursor(nxt)})


@bp.get("/conversations/<cid>")
@documented(path=ConversationPath, responses={200: ConversationDetail, **_ONE}, tags=("agent",))
def conversation(cid: str):
    """One conversation: transcript (with the citations the bot used), handoff summary, feedback."""
    found = _ext()["store"].detail(current_agent().tenant_id, _conversation_id(cid))
    if found is None:
        raise NotFound(cid)
    return jsonify(found)


@bp.post("/conversations/<cid>/claim")
@documented(path=ConversationPath, responses={200: ClaimOut, **_CHANGE}, tags=("agent",))
def claim(cid: str):
    """Take the conversation over: the bot stops answering; a second agent gets 409."""
    agent = current_agent()
    claimed = _ext()["handoffs"].claim(agent.tenant_id, _conversation_id(cid), agent.id)
    if claimed["changed"]:
        current_app.extensions["web_metrics"].handoffs.labels("claimed").inc()
        handoff_events.status_changed(agent.tenant_id, cid, "human", claimed["assignee"])
    return jsonify(claimed)


@bp.post("/conversations/<cid>/messages")
@documented(path=ConversationPath, body=AgentMessageIn, responses={201: MessageOut, **_CHANGE,
                                                                  **error_responses(Error, 413)}, tags=("agent",))
def send(cid: str):
    """Reply to the customer (PII is masked before it is stored and sent)."""
    agent = current_agent()
    body = validate_body(AgentMessageIn, request.get_json(silent=True),
                         context={"max_chars": current_app.config["MAX_MESSAGE_CHARS"]})
    text = _ext()["services"].clean(body.content.strip())
    message, first_wait = _ext()["handoffs"].reply(agent.tenant_id, _conversation_id(cid), agent.id, text)
    metrics = current_app.extensions["web_metrics"]
    metrics.agent_messages.inc()
    if first_wait is not None:
        metrics.first_human_reply.observe(first_wait)
    handoff_events.agent_message(agent.tenant_id, cid, message)
    emit(agent.tenant_id, "message.created", {"conversation_id": cid, "message": message})
    if current_app.config["SMTP_HOST"] and _ext()["store"].contact(agent.tenant_id, cid):
        from app.jobs.tasks import email_agent_reply, start_or_queue
        start_or_queue(email_agent_reply, agent.tenant_id, cid, message["index"],     # the email fallback
                       delay_s=current_app.config["EMAIL_REPLY_DELAY_S"])
    return jsonify({"message": message}), 201


@bp.post("/conversations/<cid>/typing")
@documented(path=ConversationPath, body=TypingIn, responses={200: Ok, **_ONE}, tags=("agent",))
def typing(cid: str):
    """Show or hide "<agent> is typing" in the customer's widget."""
    agent = current_agent()
    body = validate_body(TypingIn, request.get_json(silent=True))
    if _ext()["store"].status(agent.tenant_id, _conversation_id(cid)) is None:
        raise NotFound(cid)
    handoff_events.agent_typing(agent.tenant_id, cid, agent.name, body.typing)
    return jsonify({"ok": True})


@bp.post("/conversations/<cid>/resolve")
@documented(path=ConversationPath, responses={200: ResolveOut, **_CHANGE}, tags=("agent",))
def resolve(cid: str):
    """Close the conversation; the customer's widget asks for a rating."""
    agent = current_agent()
    done = _ext()["handoffs"].resolve(agent.tenant_id, _conversation_id(cid), agent.id)
    current_app.extensions["web_metrics"].handoffs.labels("resolved").inc()
    handoff_events.status_changed(agent.tenant_id, cid, "resolved", None)
    emit(agent.tenant_id, "conversation.resolved", {"conversation_id": cid, "agent": {"name": agent.name}})
    from app.jobs.tasks import draft_faq, start_or_queue
    start_or_queue(draft_faq, agent.tenant_id, cid)         # the agent's answer becomes a pending FAQ draft
    return jsonify(done)


@bp.get("/conversations/<cid>/suggestion")
@documented(path=ConversationPath, responses={200: SuggestionOut, **_ONE}, tags=("agent",))
# (503 + Retry-After, in _ERRORS, when CHAT_MAX_TURNS turns are already generating)
def suggestion(cid: str):
    """A draft answer to the customer's last message from the grounded-answer pipeline; the
    agent edits it before sending (nothing is stored or sent)."""
    agent = current_agent()
    messages = _ext()["store"].messages(agent.tenant_id, _conversation_id(cid))
    if not messages and _ext()["store"].status(agent.tenant_id, cid) is None:
        raise NotFound(cid)
    asks = [i for i, m in enumerate(messages) if m["role"] == "user" and not m.get("blocked")]
    if not asks:
        return jsonify({"suggestion": "", "citations": [], "grounding": None})
    tenant = _ext()["tenants"].by_id(agent.tenant_id)
    if tenant is None:
        raise PlainError(404, f"tenant {agent.tenant_id!r} has no chat configuration to draft from")
    draft, last = None, asks[-1]
    slot = TurnSlot(_ext()["turn_slots"])                # a draft runs the model like a chat turn
    try:
        for kind, value in _ext()["services"].chat.respond(tenant.tenant, messages[:last], messages[last]["content"]):
            if kind == "done":
                draft = value
    finally:
        slot.release()
    return jsonify({"suggestion": draft.reply if draft and not draft.handoff else "",
                    "citations": draft.citations if draft else [], "grounding": draft.grounding if draft else None})


@bp.get("/events")
@documented(responses={200: AGENT_EVENTS, **_ERRORS}, tags=("agent",))
def events():
    """Live events for this tenant's agents: `handoff` (a new one), `message` (a customer wrote in a
    conversation with or waiting for a human), `status`. Reconnect with Last-Event-ID."""
    return sse_response(current_app.extensions["live_events"], tenant_channel(current_agent().tenant_id),
                        request.headers.get("Last-Event-ID"), max_s=current_app.config["SSE_MAX_S"],
                        slots=current_app.extensions["sse_slots"])


@bp.get("/reports")
@documented(query=ReportQuery, responses={200: ReportOut, **_ERRORS}, tags=("agent",))
def reports():
    """Conversations, resolution rate and outcomes, handoff rate, median first human response and
    CSAT for the conversations started between `from` and `to` (inclusive dates, UTC; default the
    last 7 days)."""
    query = validate_body(ReportQuery, request.args.to_dict())
    start = dt.datetime.combine(query.start, dt.time(0), dt.UTC)
    end = dt.datetime.combine(query.end + dt.timedelta(days=1), dt.time(0), dt.UTC)
    window = dt.timedelta(hours=current_app.config["RESOLUTION_WINDOW_H"])
    body = report(current_app.extensions["db"], current_agent().tenant_id, start, end, window)
    return jsonify({"from": query.start.isoformat(), "to": query.end.isoformat(), **body})


def _gaps() -> tuple[GapsQuery, dict]:
    query = validate_body(GapsQuery, request.args.to_dict())
    start = dt.datetime.combine(query.start, dt.time(0), dt.UTC)
    end = dt.datetime.combine(query.end + dt.timedelta(days=1), dt.time(0), dt.UTC)
    turns = gap_turns(current_app.extensions["db"], current_agent().tenant_id, start, end)
    services = _ext()["services"]
    return query, knowledge_gaps(turns, lambda texts: services.client.embed(texts), query.limit)


@bp.get("/knowledge-gaps")
@documented(query=GapsQuery, responses={200: GapsOut, **_ERRORS}, tags=("agent",))
def gaps():
    """What customers asked between `from` and `to` that the help centre did not answer
    (unanswerable, low support, or followed by a request for a human), clustered by meaning,
    largest cluster first. Default: the last 7 days."""
    query, body = _gaps()
    return jsonify({"from": query.start.isoformat(), "to": query.end.isoformat(), **body})


@bp.get("/knowledge-gaps.csv")
@documented(query=GapsQuery, responses={200: Body("text/csv", {"type": "string"}), **_ERRORS}, tags=("agent",))
def gaps_export():
    """The knowledge gaps as a CSV download, one row per cluster."""
    query, body = _gaps()
    name = f"knowledge-gaps-{query.start.isoformat()}-{query.end.isoformat()}.csv"
    return Response(gaps_csv(body), mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
