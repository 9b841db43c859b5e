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
"""
from __future__ import annotations

import json
import re
import uuid

from flask import Blueprint, Response, current_app, g, jsonify, request

from app.completion import API_ERRORS, _auth, _error
from app.schemas import (
    JSONL,
    ApiError,
    BatchIn,
    IdempotencyHeader,
    JobCancelled,
    JobPath,
    JobView,
)
from httpkit.openapi import documented

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")
bp.before_request(_auth)
MAX_ITEMS = 1000
MAX_SEED = 2**63 - 2                    # SamplingParams wants seed + n - 1 < 2**63; items sample once
MAX_PROMPT_CHARS = 16000
_ID = re.compile(r"^[0-9a-f]{32}$")
_ROLES = {"system", "user", "assistant"}


def _store():
    return current_app.extensions["completion"]["batches"]


def _check_item(i: int, item) -> dict:
    where = f"requests[{i}]"
    if not isinstance(item, dict):
        raise ValueError(f"{where}: must be an object")
    unknown = set(item) - {"prompt", "messages", "max_tokens", "temperature", "top_p", "stop", "seed"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    if ("prompt" in item) == ("messages" in item):
        raise ValueError(f"{where}: give exactly one of prompt or messages")
    if "prompt" in item and (not isinstance(item["prompt"], str) or not 0 < len(item["prompt"]) <= MAX_PROMPT_CHARS):
        raise ValueError(f"{where}.prompt: a non-empty string of at most {MAX_PROMPT_CHARS} characters")
    if "messages" in item:
        msgs = item["messages"]
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and m.get("role") in _ROLES and isinstance(m.get("content"), str) for m in msgs):
            raise ValueError(f"{where}.messages: a non-empty list of {{role: system|user|assistant, content: str}}")
        if sum(len(m["content"]) for m in msgs) > MAX_PROMPT_CHARS:
            raise ValueError(f"{where}.messages: more than {MAX_PROMPT_CHARS} characters in all")
    checks = {"max_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024,
              "temperature": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 2,
              "top_p": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
              "stop": lambda v: isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) and s for s in v),
              "seed": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEED}
    for name, ok in checks.items():
        if name in item and not ok(item[name]):
            raise ValueError(f"{where}.{name}: out of range or of the wrong type")
    return item


def _items() -> list:
    if request.mimetype in ("application/x-ndjson", "application/jsonl", "application/x-jsonlines"):
        lines = [ln for ln in request.get_data(as_text=True).splitlines() if ln.strip()]
        out = []
        for n, line in enumerate(lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                raise ValueError(f"line {n + 1}: not valid JSON") from None
        return out
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise ValueError('body: {"requests": [...]} as JSON, or JSONL with Content-Type application/x-ndjson')
    return body["requests"]


_IN_JOB = {404: ApiError, **API_ERRORS}


@bp.post("")
@documented(body=BatchIn, extra_bodies=(JSONL,), headers=IdempotencyHeader,
            responses={200: JobView, 202: JobView, **API_ERRORS}, tags=("jobs",))
def submit():
    """Submit a batch of prompts or chat requests (JSON, or JSONL with one item per line)."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 0 < len(key) <= 200:
        return _error(400, "Idempotency-Key: 1 to 200 characters")
    try:
        items = [_check_item(i, item) for i, item in enumerate(_items())]
    except ValueError as exc:
        return _error(400, str(exc))
    if not 0 < len(items) <= MAX_ITEMS:
        return _error(400, f"requests: 1 to {MAX_ITEMS} items, got {len(items)}")
    job_id = uuid.uuid4().hex
    found = _store().create(job_id, g.api_tenant, items, key)
    if found != job_id:                                  # the same key: the job it started
        return jsonify(_view(found)), 200
    from app.tasks import BrokerUnavailable, run_batch, start
    try:
        start(run_batch, job_id)
    except BrokerUnavailable as exc:
        # not accepted: forget the job (and its key), so the client's retry creates it afresh
        _store().discard(job_id, g.api_tenant, key)
        body, status = _error(503, f"{exc}; retry after the Retry-After seconds")
        return body, status, {"Retry-After": "5"}
    return jsonify(_view(job_id)), 202


def _job(job_id: str) -> dict:
    job = _store().get(job_id) if _ID.match(job_id) else None
    if job is None or job.get("tenant") != g.api_tenant:
        raise LookupError
    return job


def _view(job_id: str) -> dict:
    job = _store().get(job_id)
    out = {"job_id": job_id, "status": job["status"], "done": job.get("done", 0), "total": job["total"]}
    if job.get("error"):
        out["error"] = job["error"]
    return out


@bp.errorhandler(LookupError)
def _unknown(_exc):
    return _error(404, "unknown job")


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
        return _error(409, f"job is {job['status']}: results come when it is done")
    rows = _store().results(job_id)
    body = "".join(json.dumps(rows[i], ensure_ascii=False) + "\n" for i in sorted(rows))
    return Response(body, mimetype="application/x-ndjson")


@bp.post("/<job_id>/cancel")
@documented(path=JobPath, responses={200: JobCancelled, 409: ApiError, **_IN_JOB}, tags=("jobs",))
def cancel(job_id: str):
    """Stop a queued or running job (done items keep their results)."""
    job = _job(job_id)
    if not _store().finish(job_id, "cancelled"):
        return _error(409, f"job is already {job['status']}")
    return jsonify({"job_id": job_id, "status": "cancelled"})
