"""OpenAI-compatible HTTP service around one OnlineEngine (the only Flask module in inference/).

    create_app(engine_loader, ServerConfig(...)) -> Flask app
    /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models, /health, /ready, /metrics

The engine loads in a background thread so /health answers at once and /ready turns 200 when the
model is loaded and the engine loop is alive. Every client mistake is a 4xx with OpenAI's error
body (httpkit/errors.py), worded by the request models (inference/server/schemas.py); a client
that disconnects mid-stream has its request aborted before the next engine step.
"""
from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from httpkit.errors import OpenAIError, openai_error_body, validate_request
from httpkit.openapi import build_spec, documented
from inference.online_engine import OnlineEngine
from inference.server.generation import ClientDisconnected, collect, sse, tokenize_job
from inference.server.protocol import ParsedRequest, parse_chat, parse_completion
from inference.server.schemas import (
    CHAT_STREAM,
    COMPLETION_STREAM,
    METRICS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    HealthStatus,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str
    api_keys: tuple[str, ...] = ()          # empty: no authentication
    max_queue_len: int = 256                # waiting requests beyond this -> 429
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_queue_len < 1:
            raise ValueError(f"max_queue_len: must be >= 1, got {self.max_queue_len}")


class EngineHolder:
    """Loads the engine off the request path; handlers get it or a 503 while it loads."""

    def __init__(self, loader: Callable[[], OnlineEngine], on_ready: Callable[[OnlineEngine], None] | None = None):
        self.engine: OnlineEngine | None = None
        self.error: BaseException | None = None

        def load() -> None:
            try:
                engine = loader()
                if on_ready is not None:
                    on_ready(engine)
                self.engine = engine
            except BaseException as exc:                 # reported by /ready and /health
                log.exception("engine failed to load")
                self.error = exc

        self.thread = threading.Thread(target=load, name="engine-load", daemon=True)
        self.thread.start()

    def ready(self) -> bool:
        return self.engine is not None and self.engine.is_alive()

    def get(self) -> OnlineEngine:
        if self.error is not None:
            raise OpenAIError(503, f"model failed to load: {self.error}", type_="server_error",
                              code="model_load_failed")
        if self.engine is None:
            raise OpenAIError(503, "model is loading", type_="server_error", code="model_loading",
                           headers={"Retry-After": "5"})
        if not self.engine.is_alive():
            raise OpenAIError(503, "engine loop is not running", type_="server_error", code="engine_dead")
        return self.engine


bp = Blueprint("openai", __name__)
# every /v1 route: a bad body or key, an unknown model, a full queue, a body over the limit, no engine
_ERRORS = {s: ErrorResponse for s in (400, 401, 404, 413, 429, 503)}
_SECURITY = {"bearer": {"type": "http", "scheme": "bearer",
                        "description": "one of the service's --api-key values (none configured: no auth)"}}


def create_app(engine_loader: Callable[[], OnlineEngine], config: ServerConfig) -> Flask:
    """One app per engine process. `engine_loader` builds the OnlineEngine (called in a thread)."""
    from monitoring.engine_metrics import EngineMetrics

    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    metrics = EngineMetrics(model_name=config.served_model_name)
    app.extensions["inference"] = {"config": config, "metrics": metrics, "admission": threading.Lock(),
                                   "holder": EngineHolder(engine_loader, lambda e: _watch(e, metrics)),
                                   "embedder": None, "embedder_lock": threading.Lock()}
    app.register_blueprint(bp)

    @app.get("/openapi.json")
    def openapi():
        """This document, generated from the routes and their pydantic models (inference/server/schemas.py)."""
        spec = build_spec(app, title="Inference service (OpenAI-compatible)", version="1",
                          security_schemes=_SECURITY if config.api_keys else None,
                          default_security={"/v1/": ("bearer",), "/tokenize": ("bearer",)} if config.api_keys else None)
        return _json(spec)

    @app.errorhandler(OpenAIError)
    def _api_error(exc: OpenAIError):
        return _json(exc.body(), exc.status, exc.headers)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        error = OpenAIError(exc.code or 500, exc.description, code=exc.name.lower().replace(" ", "_"))
        return _json(error.body(), error.status)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return _json(openai_error_body("internal error", "server_error"), 500)

    return app


def _watch(engine: OnlineEngine, metrics) -> None:
    engine.add_stats_listener(metrics.observe)
    if engine.config.model.device == "cpu":
        from inference.kernels.cpu_ops import cpu_isa
        metrics.set_cpu_isa(cpu_isa())
    if engine.expert_load():                   # a mixture-of-experts model: per-expert load
        metrics.watch_expert_load(engine.expert_load)


def _ctx() -> dict:
    return current_app.extensions["inference"]


def _json(body: dict, status: int = 200, headers: dict | None = None) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status=status, headers=headers or {},
                    mimetype="application/json")


@bp.before_request
def _authenticate() -> None:
    keys = _ctx()["config"].api_keys
    if not keys or not (request.path.startswith("/v1/") or request.path == "/tokenize"):
        return
    header = request.headers.get("Authorization", "")
    token = header[7:] if header.startswith("Bearer ") else ""
    if not any(hmac.compare_digest(token.encode(), k.encode()) for k in keys):
        raise OpenAIError(401, "Incorrect API key provided" if token else "Missing bearer API key",
                       code="invalid_api_key")


@bp.get("/health")
@documented(responses={200: HealthStatus, 503: HealthStatus})
def health():
    """Liveness: 503 once the engine loop has died or the model failed to load."""
    holder = _ctx()["holder"]
    if holder.error is not None or (holder.engine is not None and not holder.engine.is_alive()):
        return _json({"status": "unhealthy"}, 503)
    return _json({"status": "ok"})


@bp.get("/ready")
@documented(responses={200: HealthStatus, 503: HealthStatus})
def ready():
    """Readiness: 200 once the model is loaded and the engine loop runs."""
    if _ctx()["holder"].ready():
        return _json({"status": "ready"})
    return _json({"status": "loading" if _ctx()["holder"].error is None else "failed"}, 503)


@bp.get("/metrics")
@documented(responses={200: METRICS}, summary="Prometheus metrics")
def metrics():
    body, content_type = _ctx()["metrics"].render(ready=_ctx()["holder"].ready())
    return Response(body, mimetype=None, content_type=content_type)


@bp.get("/v1/models")
@documented(responses={200: ModelList, 401: ErrorResponse, 503: ErrorResponse})
def models():
    """The served model."""
    engine, name = _ctx()["holder"].get(), _ctx()["config"].served_model_name
    return _json({"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                              "owned_by": "support-inference", "max_model_len": engine.max_model_len}]})


@bp.post("/v1/embeddings")
@documented(body=EmbeddingRequest, responses={200: EmbeddingResponse, **_ERRORS})
def embeddings():
    """OpenAI's embeddings API over the sentence embedder (all-MiniLM-L6-v2), loaded on first use."""
    from inference.embeddings import EMBEDDING_MODEL
    texts = validate_request(EmbeddingRequest, _body()).texts
    embedder = _embedder()
    vecs = embedder.embed(texts)
    num_tokens = sum(embedder.count_tokens(t) for t in texts)
    return _json({"object": "list", "model": EMBEDDING_MODEL,
                  "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)],
                  "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})


@bp.post("/tokenize")
@documented(body=TokenizeRequest, responses={200: TokenizeResponse, **_ERRORS})
def tokenize():
    """vLLM's /tokenize: {"prompt"} or {"messages"} -> {"tokens", "count", "max_model_len"}."""
    body, engine = _body(), _ctx()["holder"].get()
    req = validate_request(TokenizeRequest, body)
    try:
        if "messages" in req.model_fields_set:
            ids = engine.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True)
        else:
            ids = engine.tokenizer.encode(req.prompt)
    except ValueError as exc:
        raise OpenAIError(400, str(exc)) from None
    return _json({"tokens": ids, "count": len(ids), "max_model_len": engine.max_model_len})


def _embedder():
    ctx = _ctx()
    with ctx["embedder_lock"]:
        if ctx.get("embedder") is None:
            from inference.embeddings import SentenceEmbedder
            ctx["embedder"] = SentenceEmbedder()
        return ctx["embedder"]


@bp.post("/v1/completions")
@documented(body=CompletionRequest, responses={200: (CompletionResponse, COMPLETION_STREAM), **_ERRORS})
def completions():
    """OpenAI's completions API (JSON, or server-sent events with stream: true)."""
    return _serve(parse_completion(_body()))


@bp.post("/v1/chat/completions")
@documented(body=ChatCompletionRequest, responses={200: (ChatCompletionResponse, CHAT_STREAM), **_ERRORS})
def chat_completions():
    """OpenAI's chat completions API (JSON, or server-sent events with stream: true)."""
    return _serve(parse_chat(_body()))


def _body():
    raw = request.get_data(cache=False)
    try:
        body = json.loads(raw.decode("utf-8"))
        # "\ud800" is valid JSON but no text: it would fail later, in the tokenizer or the response
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError:
        raise OpenAIError(400, "request body is not valid UTF-8") from None
    except UnicodeEncodeError:
        raise OpenAIError(400, "request body contains an unpaired surrogate (\\ud800-\\udfff)") from None
    except json.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except (ValueError, RecursionError) as exc:     # a 5000-digit integer, nesting deeper than ~1000
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
    return body


def _serve(parsed: ParsedRequest) -> Response:
    cfg, engine = _ctx()["config"], _ctx()["holder"].get()
    if parsed.model != cfg.served_model_name:
        raise OpenAIError(404, f"The model '{parsed.model}' does not exist", "model", code="model_not_found")
    job = tokenize_job(parsed, engine)
    job.client_gone = request.environ.get("waitress.client_disconnected", lambda: False)
    try:                                       # a new constraint compiles here, not under the lock
        engine.engine.compile_grammar(parsed.params)
    except ValueError as exc:
        raise OpenAIError(400, str(exc), str(exc).split(":", 1)[0]) from None
    with _ctx()["admission"]:                  # count and admit atomically
        stats = engine.stats()
        waiting = engine.num_unfinished - (stats.scheduler.num_running if stats else 0)
        if waiting >= cfg.max_queue_len:
            raise OpenAIError(429, f"server busy: {waiting} requests waiting", type_="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        try:
            for i, ids in enumerate(job.prompt_ids):
                job.streams.append(engine.add_request({"prompt_token_ids": ids, "prompt": job.prompt_texts[i]},
                                                      parsed.params, request_id=f"{parsed.request_id}-{i}",
                                                      priority=parsed.priority))
        except ValueError as exc:
            job.abort_unfinished()
            raise OpenAIError(400, str(exc), str(exc).split(":", 1)[0]) from None
    if parsed.stream:
        return Response(sse(job), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return _json(collect(job))
    except ClientDisconnected:                 # nobody is listening; nginx's code for this case
        return _json(OpenAIError(499, "client closed request", code="client_closed_request").body(), 499)
    finally:
        job.abort_unfinished()
