"""Batch generation jobs (Celery): submit many prompts or chat requests at once, poll, download,
cancel. Authenticated like the completion API (a tenant's API key); a job is visible only to the
tenant that submitted it.

    POST /v1/jobs                {"requests": [item, ...]} or a JSONL body (one item per line),
                                 optional Idempotency-Key header -> 202 {"job_id", "status", "total"}
                                 (the same key again -> 200 and the first job)
    GET  /v1/jobs/<id>           -> {"job_id", "status", "done", "total", "error"?}
    GET  /v1/jobs/<id>/results   -> JSONL, one {"index", "text"} per item (409 until done)
    POST /v1/jobs/<id>/cancel    -> {"status": "cancelled"} (409 once finished)

    item: {"prompt": str} or {"messages": [{"role", "content"}, ...]}, with optional max_tokens
          (1-1024, default 128), temperature (0-2), top_p (0-1], stop (list of str), seed (int)
          (app/schemas.py BatchIn parses them; errors are OpenAI's body, httpkit/errors.py)
"""
from __future__ import annotations

import json
import re
import uuid

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.api_keys import API_ERRORS, api_key_routes
from app.schemas import (
    JSONL,
    ApiError,
    BatchIn,
    IdempotencyHeader,
    JobCancelled,
    JobPath,
    JobView,
)
from httpkit.errors import OpenAIError, validate_request
from httpkit.openapi import documented

bp = api_key_routes(Blueprint("jobs", __name__, url_prefix="/v1/jobs"))
_ID = re.compile(r"^[0-9a-f]{32}$")
JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "application/x-jsonlines")


def _store():
    return current_app.extensions["completion"]["batches"]


def _body():
    """{"requests": [...]}: the JSON body, or the JSONL body's lines as the items."""
    if request.mimetype not in JSONL_TYPES:
        return request.get_json(silent=True)
    lines = [ln for ln in request.get_data(as_text=True).splitlines() if ln.strip()]
    items = []
    for n, line in enumerate(lines):
        try:
            items.append(json.loads(line))
        except ValueError:
            raise OpenAIError(400, f"line {n + 1}: not valid JSON") from None
    return {"requests": items}


_IN_JOB = {404: ApiError, **API_ERRORS}


@bp.post("")
@documented(body=BatchIn, extra_bodies=(JSONL,), headers=IdempotencyHeader,
            responses={200: JobView, 202: JobView, **API_ERRORS}, tags=("jobs",))
def submit():
    """Submit a batch of prompts or chat requests (JSON, or JSONL with one item per line)."""
    key = request.headers.get("Idempotency-Key")
    validate_request(IdempotencyHeader, {} if key is None else {"Idempotency-Key": key})
    body = _body()
    validate_request(BatchIn, body)
    items = body["requests"]                 # as sent (validated): what the worker reads
    job_id = uuid.uuid4().hex
    found = _store().create(job_id, g.api_tenant, items, key)
    if found != job_id:                                  # the same key: the job it started
        return jsonify(_view(found)), 200
    from app.jobs.tasks import BrokerUnavailable, run_batch, start
    try:
        start(run_batch, job_id)
    except BrokerUnavailable as exc:
        # not accepted: forget the job (and its key), so the client's retry creates it afresh
        _store().discard(job_id, g.api_tenant, key)
        raise OpenAIError(503, f"{exc}; retry after the Retry-After seconds", type_="service_unavailable",
                          headers={"Retry-After": "5"}) from None
    return jsonify(_view(job_id)), 202


def _job(job_id: str) -> dict:
    job = _store().get(job_id) if _ID.match(job_id) else None
    if job is None or job.get("tenant") != g.api_tenant:
        raise OpenAIError(404, "unknown job")
    return job


def _view(job_id: str) -> dict:
    job = _store().get(job_id)
    out = {"job_id": job_id, "status": job["status"], "done": job.get("done", 0), "total": job["total"]}
    if job.get("error"):
        out["error"] = job["error"]
    return out


@bp.get("/<job_id>")
@documented(path=JobPath, responses={200: JobView, **_IN_JOB}, tags=("jobs",))
def status(job_id: str):
    """A job's progress."""
    _job(job_id)
    return jsonify(_view(job_id))


@bp.get("/<job_id>/results")
@documented(path=JobPath, responses={200: JSONL, 409: ApiError, **_IN_JOB}, tags=("jobs",))
def results(job_id: str):
    """The results, one {"index", "text"} line per item, once the job is done."""
    job = _job(job_id)
    if job["status"] != "done":
        raise OpenAIError(409, f"job is {job['status']}: results come when it is done")
    rows = _store().results(job_id)
    body = "".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in sorted(rows))
    return Response(body, mimetype="application/x-ndjson")


@bp.post("/<job_id>/cancel")
@documented(path=JobPath, responses={200: JobCancelled, 409: ApiError, **_IN_JOB}, tags=("jobs",))
def cancel(job_id: str):
    """Stop a queued or running job (done items keep their results)."""
    job = _job(job_id)
    if not _store().finish(job_id, "cancelled"):
        raise OpenAIError(409, f"job is already {job['status']}")
    return jsonify({"job_id": job_id, "status": "cancelled"})
