"""The IDE code-completion API (Tabby- and OpenAI-compatible), its own blueprint; the logic is
pipelines/completion.py.

    POST /v1/completions   Tabby body {language, segments: {prefix, suffix, ...}} -> {id, choices}
                           or OpenAI legacy body {prompt, suffix, max_tokens, ...} (SSE if stream)
    POST /v1/events        view / select / dismiss (select_kind=line for partial accepts)
    GET  /v1/health        what Tabby's plugins ask for on start (503 while the model loads)
    GET  /v1beta/server_setting   Tabby's client settings

Requests carry `Authorization: Bearer <api key>`: a key whose SHA-256 a tenant lists in
configs/tenants.yaml (`api_keys`; demo: demo-api-key), or one of COMPLETION_API_KEYS (env,
for deployments that inject keys as secrets; hashed at start-up, never kept in the clear).

Bodies are parsed by their models (the completion bodies: pipelines/completion_schemas.py; the
rest: app/schemas.py); every error of these /v1 routes, and of the job and knowledge-base ones,
is OpenAI's error body (httpkit/errors.py).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
import uuid
from collections import Counter, OrderedDict
from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, request

from app.api_keys import API_ERRORS, api_key_routes
from app.completion.schemas import (
    COMPLETION_STREAM,
    CompletionIn,
    CompletionOut,
    Empty,
    EventIn,
    HealthOut,
    RepositoryIn,
    RepositoryJob,
    ServerSettingOut,
)
from app.schemas import METRICS, ApiError, JobPath, RepositoryQueued
from app.tenants import hash_api_key
from httpkit.errors import OpenAIError, validate_request
from httpkit.openapi import documented
from httpkit.validation import InvalidRequest
from pipelines.completion import CompletionService, parse_request, service_for
from pipelines.completion_cache import CompletionCache
from pipelines.inference_client import InferenceError

bp = api_key_routes(Blueprint("completion", __name__, url_prefix="/v1"))
beta = api_key_routes(Blueprint("completion_beta", __name__, url_prefix="/v1beta"))   # Tabby's settings route


class CompletionStats:
    """Counters for the completion endpoint (exported as metrics by the operations work)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events: Counter = Counter()                 # (language, type) -> count
        self.latencies_ms: list[float] = []
        self.languages: OrderedDict[str, str] = OrderedDict()   # completion id -> language (recent)
        self.wasted_tokens = 0                            # generated after being superseded
        self.cache_hits = 0

    def record_completion(self, cid: str, language: str, ms: float) -> None:
        with self.lock:
            self.latencies_ms.append(ms)
            del self.latencies_ms[:-10000]
            self.languages[cid] = language
            while len(self.languages) > 10000:
                self.languages.popitem(last=False)

    def acceptance(self) -> dict[str, float]:
        langs = {lang for lang, _ in self.events}
        return {lang: self.events[(lang, "select")] / max(1, self.events[(lang, "view")]) for lang in langs}


def _ext() -> dict:
    return current_app.extensions["completion"]


def _model_name() -> str:
    return current_app.config["COMPLETION_MODEL_NAME"]


def _service() -> CompletionService:
    ext = _ext()
    with ext["lock"]:
        if ext.get("service") is None:
            ext["service"] = service_for(current_app.extensions["support_chat"]["services"].client,
                                         current_app.config.get("CODE_INDEX_DIR"))
            if current_app.config.get("REDIS_URL"):          # exact hits shared by every web worker
                ext["service"].cache = CompletionCache(redis_url=current_app.config["REDIS_URL"])
        return ext["service"]


@bp.post("/completions")
@documented(body=CompletionIn, responses={200: (CompletionOut, COMPLETION_STREAM), **API_ERRORS}, tags=("completion",))
def completions():
    """Complete the code at the cursor (an empty completion, fast, when inference is down)."""
    t0 = time.perf_counter()
    try:
        req, tabby = parse_request(request.get_json(silent=True))
    except InvalidRequest as exc:
        raise OpenAIError.invalid(exc) from None
    try:
        result = _service().complete(req)
    except InferenceError as exc:
        # every endpoint failed or has its breaker open: an empty completion now (the editor
        # shows nothing and the developer keeps typing) rather than an error or a wait
        current_app.logger.warning("completion degraded: %s", exc)
        _ext()["metrics"].requests.labels(req.language, "degraded").inc()
        return _respond(req, tabby, f"cmpl-degraded-{uuid.uuid4().hex[:12]}", [""] * req.n, (0, 0),
                        {"X-Inference-Degraded": "1"})
    stats: CompletionStats = _ext()["stats"]
    elapsed = time.perf_counter() - t0
    stats.record_completion(result.id, req.language, elapsed * 1e3)
    with stats.lock:
        stats.wasted_tokens += result.wasted_tokens
        stats.cache_hits += result.cached
    metrics = _ext()["metrics"]
    metrics.latency.labels(req.language).observe(elapsed)
    outcome = "cancelled" if result.cancelled else "cached" if result.cached else "empty" if not any(
        result.texts) else "ok"
    metrics.requests.labels(req.language, outcome).inc()
    if result.cancelled:
        metrics.cancellations.inc()
        metrics.wasted_tokens.inc(result.wasted_tokens)
    if result.cached:
        metrics.cache_hits.labels(result.cache_kind).inc()
    # what the endpoint spent in all, and in the engine: the difference is its overhead
    timing = {"Server-Timing": f"engine;dur={result.engine_s * 1e3:.2f}, "
                               f"endpoint;dur={(time.perf_counter() - t0) * 1e3:.2f}"}
    return _respond(req, tabby, result.id, result.texts, (result.prompt_tokens, result.completion_tokens), timing)


def _respond(req, tabby: bool, completion_id: str, texts: list[str], usage: tuple[int, int], headers: dict):
    """The body in the caller's dialect: Tabby's, or OpenAI's (JSON, or one SSE event + [DONE])."""
    if tabby:
        resp = jsonify({"id": completion_id, "choices": [{"index": i, "text": t} for i, t in enumerate(texts)]})
        resp.headers.update(headers)
        return resp
    choices = [{"text": t, "index": i, "logprobs": None, "finish_reason": "stop"} for i, t in enumerate(texts)]
    payload = {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": _model_name(),
               "choices": choices,
               "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}
    if not req.stream:
        resp = jsonify(payload)
        resp.headers.update(headers)
        return resp

    def sse():
        yield f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"
    return Response(sse(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache", **headers})


@bp.post("/events")
@documented(body=EventIn, responses={200: Empty, **API_ERRORS}, tags=("completion",))
def events():
    """Report what the editor did with a completion (shown, accepted, dismissed)."""
    event = validate_request(EventIn, request.get_json(silent=True))
    line = event.select_kind == "line"
    stats: CompletionStats = _ext()["stats"]
    with stats.lock:
        language = stats.languages.get(event.completion_id, "unknown")
        stats.events[(language, event.type)] += 1
        if event.type == "select" and line:
            stats.events[(language, "select_line")] += 1
    _ext()["metrics"].events.labels(language, "select_line" if line else event.type).inc()
    return jsonify({})


@bp.get("/metrics")
@documented(responses={200: METRICS}, security=(), tags=("completion",))
def metrics():
    """The same as the app's /metrics (kept where the completion API's clients look)."""
    body, content_type = current_app.extensions["web_metrics"].render()
    return Response(body, content_type=content_type)


@bp.get("/health")
@documented(responses={200: HealthOut, 503: ApiError}, security=(), tags=("completion",))
def health():
    """The server's model and device; 503 while the model is still loading, so an editor's plugin
    reports "ready" only once a completion can be answered."""
    client = current_app.extensions["support_chat"]["services"].client
    loading = getattr(client, "model_loading", None)
    if loading is not None and loading():
        getattr(client, "warm", lambda: None)()
        raise OpenAIError(503, "the model is loading; retry after the Retry-After seconds",
                          type_="service_unavailable", headers={"Retry-After": "5"})
    return jsonify({"model": _model_name(), "device": "cpu", "arch": platform.machine(),
                    "cpu_info": platform.processor(),
                    "cpu_count": os.cpu_count(), "cuda_devices": [], "version": _ext()["version"]})


@beta.get("/server_setting")
@documented(responses={200: ServerSettingOut, **API_ERRORS}, tags=("completion",))
def server_setting():
    """What Tabby's plugins (0.9 and later) read after connecting."""
    return jsonify({"disable_client_side_telemetry": True})


def _version() -> dict[str, str]:
    """The build, as Tabby's health body names it (git_sha from the checkout when there is one)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        release = version("support-inference")
    except PackageNotFoundError:
        release = "0.0.0"
    sha = os.environ.get("GIT_SHA", "")
    root = Path(__file__).resolve().parents[2]
    if not sha and (root / ".git").exists():
        try:
            sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            sha = ""
    return {"build_date": "", "build_timestamp": "", "git_sha": sha, "git_describe": f"v{release}"}


@bp.post("/repositories")
@documented(body=RepositoryIn, responses={202: RepositoryQueued, 403: ApiError, **API_ERRORS}, tags=("completion",))
def index_repository():
    """Start indexing a repository folder (a Celery job): {"name", "path"} -> 202 {"job_id"}."""
    body = validate_request(RepositoryIn, request.get_json(silent=True))
    name, path = body.name, body.path
    real = Path(path).resolve()
    roots = [Path(r).resolve() for r in current_app.config["COMPLETION_REPO_ROOTS"]]
    if not any(real == r or r in real.parents for r in roots):
        raise OpenAIError(403, "path: not under an allowed repository root (COMPLETION_REPO_ROOTS)", "path")
    if not real.is_dir():
        raise OpenAIError(400, f"path: {path} is not a directory", "path")
    from app.jobs.tasks import BrokerUnavailable, start
    from app.jobs.tasks import index_repository as task
    job_id = uuid.uuid4().hex
    _ext()["jobs"].set(job_id, status="queued", name=name)
    try:
        start(task, job_id, name, str(real))
    except BrokerUnavailable as exc:                   # the app answers 503; the job says why
        _ext()["jobs"].set(job_id, status="failed", error=str(exc))
        raise
    return jsonify({"job_id": job_id, "status": "queued"}), 202


@bp.get("/repositories/<job_id>")
@documented(path=JobPath, responses={200: RepositoryJob, 404: ApiError, **API_ERRORS}, tags=("completion",))
def repository_job(job_id: str):
    """The state of a repository indexing job."""
    job = _ext()["jobs"].get(job_id) if len(job_id) <= 64 else None
    if job is None:
        raise OpenAIError(404, "unknown job")
    return jsonify(job)


def init_completion(app) -> None:
    app.config["COMPLETION_API_KEY_HASHES"] = [hash_api_key(k) for k in app.config["COMPLETION_API_KEYS"] or []]
    app.config["COMPLETION_API_KEYS"] = None             # only the hashes are kept
    from app.jobs.store import BatchStore, JobStore
    from monitoring.completion_metrics import CompletionMetrics
    from pipelines.completion_prompt import Languages
    app.extensions["completion"] = {"lock": threading.Lock(), "service": None, "stats": CompletionStats(),
                                    "metrics": CompletionMetrics(app.extensions["web_metrics"].metric_registry),
                                    "jobs": JobStore(app.config.get("REDIS_URL")),
                                    "batches": BatchStore(app.config.get("REDIS_URL")),
                                    "extensions": set(Languages().by_ext), "version": _version()}
    app.register_blueprint(bp)
    app.register_blueprint(beta)
