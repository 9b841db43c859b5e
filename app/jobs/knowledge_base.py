"""Knowledge-base administration (a tenant's API key): re-index the help centre after its
articles change, as a Celery job, and see what the index holds.

    POST /v1/kb/reindex          -> 202 {"job_id", "status": "queued"}
    GET  /v1/kb/jobs/<id>        -> {"status", "fingerprint", "num_chunks", "num_articles", "error"?}

Web workers also notice a changed folder on their own (pipelines/knowledge_base.py checks its
fingerprint every few seconds); the job moves the embedding work off their request threads.
"""
from __future__ import annotations

import re
import uuid

from flask import Blueprint, current_app, jsonify

from app.api_keys import API_ERRORS, api_key_routes
from app.schemas import ApiError, JobPath, KbJob, RepositoryQueued
from httpkit.errors import OpenAIError
from httpkit.openapi import documented

bp = api_key_routes(Blueprint("kb", __name__, url_prefix="/v1/kb"))
_ID = re.compile(r"^[0-9a-f]{32}$")


@bp.post("/reindex")
@documented(responses={202: RepositoryQueued, **API_ERRORS}, tags=("knowledge base",))
def reindex():
    """Queue a re-index of the knowledge base (embeds only what changed)."""
    from app.jobs.tasks import BrokerUnavailable, index_knowledge_base, start
    job_id = uuid.uuid4().hex
    current_app.extensions["completion"]["jobs"].set(job_id, status="queued", kind="kb")
    try:
        start(index_knowledge_base, job_id)
    except BrokerUnavailable as exc:                   # the app answers 503; the job says why
        current_app.extensions["completion"]["jobs"].set(job_id, status="failed", error=str(exc))
        raise
    return jsonify({"job_id": job_id, "status": "queued"}), 202


@bp.get("/jobs/<job_id>")
@documented(path=JobPath, responses={200: KbJob, 404: ApiError, **API_ERRORS}, tags=("knowledge base",))
def job(job_id: str):
    """The state of a re-index job."""
    found = current_app.extensions["completion"]["jobs"].get(job_id) if _ID.match(job_id) else None
    if found is None or found.get("kind") != "kb":
        raise OpenAIError(404, "unknown job")
    return jsonify(found)
