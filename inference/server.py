"""OpenAI-compatible HTTP service around one OnlineEngine (the only Flask module in inference/).

    create_app(engine_loader, ServerConfig(...)) -> Flask app
    /v1/completions, /v1/chat/completions (JSON or SSE), /v1/models, /health, /ready, /metrics

The engine loads in a background thread so /health answers at once and /ready turns 200 when the
model is loaded and the engine loop is alive. Every client mistake is a 4xx with OpenAI's error
body; a client that disconnects mid-stream has its request aborted before the next engine step.
"""
from __future__ import annotations

import hmac
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from inference.engine import check_messages
from inference.online_engine import OnlineEngine, RequestStream
from inference.openai_protocol import (
    APIError,
    ParsedRequest,
    chat_logprobs,
    completion_logprobs,
    parse_chat,
    parse_completion,
    usage,
)
from inference.openai_schemas import (
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
from inference.openapi import build_spec, documented
from inference.outputs import StreamDelta

log = logging.getLogger(__name__)
POLL_S = 0.2            # how often a waiting handler checks whether its client is still there


class ClientDisconnected(Exception):
    pass


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
            raise APIError(503, f"model failed to load: {self.error}", type_="server_error", code="model_load_failed")
        if self.engine is None:
            raise APIError(503, "model is loading", type_="server_error", code="model_loading",
                           headers={"Retry-After": "5"})
        if not self.engine.is_alive():
            raise APIError(503, "engine loop is not running", type_="server_error", code="engine_dead")
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
        """This document, generated from the routes and their pydantic models (inference/openai_schemas.py)."""
        spec = build_spec(app, title="Inference service (OpenAI-compatible)", version="1",
                          security_schemes=_SECURITY if config.api_keys else None,
                          default_security={"/v1/": ("bearer",), "/tokenize": ("bearer",)} if config.api_keys else None)
        return _json(spec)

    @app.errorhandler(APIError)
    def _api_error(exc: APIError):
        return _json(exc.body(), exc.status, exc.headers)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        kind = "invalid_request_error" if (exc.code or 500) < 500 else "server_error"
        return _json({"error": {"message": exc.description, "type": kind, "param": None,
                                "code": exc.name.lower().replace(" ", "_")}}, exc.code or 500)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return _json({"error": {"message": "internal error", "type": "server_error", "param": None,
                                "code": None}}, 500)

    return app


def _watch(engine: OnlineEngine, metrics) -> None:
    engine.add_stats_listener(metrics.observe)
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
        raise APIError(401, "Incorrect API key provided" if token else "Missing bearer API key",
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
    from inference.embeddings import EMBEDDING_MODEL, check_inputs
    body = _body()
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    if body.get("model") not in (None, EMBEDDING_MODEL):
        raise APIError(404, f"model {body.get('model')!r} does not exist; embeddings come from {EMBEDDING_MODEL!r}",
                       param="model", code="model_not_found")
    try:
        texts = check_inputs(body.get("input"))
    except ValueError as exc:
        raise APIError(400, str(exc), param="input") from None
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
    if not isinstance(body, dict) or not (isinstance(body.get("prompt"), str) or "messages" in body):
        raise APIError(400, "tokenize: send {'prompt': str} or {'messages': [...]}")
    if body.get("prompt") is not None and not isinstance(body["prompt"], str):
        raise APIError(400, "'prompt' must be a string", "prompt")
    try:
        if "messages" in body:
            check_messages(body["messages"])
            ids = engine.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True)
        else:
            ids = engine.tokenizer.encode(body["prompt"])
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
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
        raise APIError(400, "request body is not valid UTF-8") from None
    except UnicodeEncodeError:
        raise APIError(400, "request body contains an unpaired surrogate (\\ud800-\\udfff)") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except (ValueError, RecursionError) as exc:     # a 5000-digit integer, nesting deeper than ~1000
        raise APIError(400, f"request body is not valid JSON: {exc}") from None
    return body


# ---- one request ---------------------------------------------------------------------------------
@dataclass
class _Job:
    parsed: ParsedRequest
    engine: OnlineEngine
    prompt_ids: list[list[int]]
    prompt_texts: list[str | None]
    streams: list[RequestStream] = field(default_factory=list)
    client_gone: Callable[[], bool] = lambda: False

    def abort_unfinished(self) -> None:
        for s in self.streams:
            if not s.finished:
                s.abort()


def _serve(parsed: ParsedRequest) -> Response:
    cfg, engine = _ctx()["config"], _ctx()["holder"].get()
    if parsed.model != cfg.served_model_name:
        raise APIError(404, f"The model '{parsed.model}' does not exist", "model", code="model_not_found")
    job = _tokenize(parsed, engine)
    job.client_gone = request.environ.get("waitress.client_disconnected", lambda: False)
    with _ctx()["admission"]:                  # count and admit atomically
        stats = engine.stats()
        waiting = engine.num_unfinished - (stats.scheduler.num_running if stats else 0)
        if waiting >= cfg.max_queue_len:
            raise APIError(429, f"server busy: {waiting} requests waiting", type_="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        try:
            for i, ids in enumerate(job.prompt_ids):
                job.streams.append(engine.add_request({"prompt_token_ids": ids, "prompt": job.prompt_texts[i]},
                                                      parsed.params, request_id=f"{parsed.request_id}-{i}",
                                                      priority=parsed.priority))
        except ValueError as exc:
            job.abort_unfinished()
            raise APIError(400, str(exc), str(exc).split(":", 1)[0]) from None
    if parsed.stream:
        return Response(_sse(job), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        return _json(_collect(job))
    except ClientDisconnected:                 # nobody is listening; nginx's code for this case
        return _json({"error": {"message": "client closed request", "type": "invalid_request_error",
                                "param": None, "code": "client_closed_request"}}, 499)
    finally:
        job.abort_unfinished()


def _tokenize(parsed: ParsedRequest, engine: OnlineEngine) -> _Job:
    tok, limit = engine.tokenizer, engine.max_model_len
    ids_list, texts = [], []
    for p in parsed.prompts:
        if "messages" in p:
            ids, text = tok.apply_chat_template(p["messages"], add_generation_prompt=True), None
        elif "text" in p:
            ids, text = tok.encode(p["text"]), p["text"]
        else:
            ids, text = p["prompt_token_ids"], None
            if any(not 0 <= t < engine.engine.arch.vocab_size for t in ids):
                raise APIError(400, f"'prompt' token ids must be in [0, {engine.engine.arch.vocab_size})", "prompt")
        max_tokens = parsed.params.max_tokens
        if max_tokens is None:                         # chat default: the rest of the context
            if len(ids) >= limit:
                raise APIError(400, f"This model's maximum context length is {limit} tokens, but the "
                                    f"messages take {len(ids)} tokens", "messages", code="context_length_exceeded")
        elif len(ids) + max_tokens > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                                f"completion). Please reduce the prompt or max_tokens.",
                           "messages" if parsed.kind == "chat" else "prompt", code="context_length_exceeded")
        ids_list.append(ids)
        texts.append(text)
    return _Job(parsed, engine, ids_list, texts)


def _deltas(job: _Job) -> Iterator[tuple[int, StreamDelta]]:
    """(prompt index, delta) for every delta of every stream; aborts everything if the client leaves."""
    next_check = time.monotonic() + POLL_S
    for i, stream in enumerate(job.streams):
        while not stream.finished:
            try:
                delta = stream.get(timeout=POLL_S)
            except queue.Empty:
                delta = None
            # checked every POLL_S even while deltas flow: a non-streaming request never writes
            # until the end, so nothing else would notice its client leaving
            if delta is None or time.monotonic() >= next_check:
                next_check = time.monotonic() + POLL_S
                if job.client_gone():
                    job.abort_unfinished()
                    raise ClientDisconnected() from None
            if delta is None:
                continue
            if delta.error is not None:
                job.abort_unfinished()
                raise APIError(503, f"engine failure: {delta.error}", type_="server_error", code="engine_error")
            yield i, delta


def _choice_index(job: _Job, prompt_index: int, sample: int) -> int:
    return prompt_index * job.parsed.params.n + sample


def _decode_one(job: _Job):
    tok = job.engine.tokenizer
    return lambda t: tok.decode([t], skip_special_tokens=False)


def _collect(job: _Job) -> dict:
    p, n = job.parsed, job.parsed.params.n
    texts: dict[int, list[str]] = {}
    tokens: dict[int, list[int]] = {}
    lps: dict[int, list] = {}
    finish: dict[int, str | None] = {}
    for i, d in _deltas(job):
        k = _choice_index(job, i, d.index)
        texts.setdefault(k, []).append(d.text)
        tokens.setdefault(k, []).extend(d.token_ids)
        lps.setdefault(k, []).extend(d.logprobs or [])
        finish[k] = d.finish_reason or finish.get(k)
    choices = []
    for k in range(len(job.prompt_ids) * n):
        text = "".join(texts.get(k, []))
        i = k // n
        if p.kind == "chat":
            choice = {"index": k, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish.get(k)}
            if p.top_logprobs is not None:
                choice["logprobs"] = chat_logprobs(tokens.get(k, []), lps.get(k, []), _decode_one(job), p.top_logprobs)
        else:
            prefix = _echo_text(job, i) if p.echo else ""
            choice = {"index": k, "text": prefix + text, "logprobs": None, "finish_reason": finish.get(k)}
            if p.params.logprobs is not None:
                choice["logprobs"] = completion_logprobs(tokens.get(k, []), lps.get(k, []), _decode_one(job), len(prefix))
        choices.append(choice)
    completion_tokens = sum(len(v) for v in tokens.values())
    return {"id": _response_id(p), "object": "chat.completion" if p.kind == "chat" else "text_completion",
            "created": p.created, "model": p.model, "choices": choices,
            "usage": usage(sum(len(ids) for ids in job.prompt_ids), completion_tokens)}


def _sse(job: _Job) -> Iterator[str]:
    p = job.parsed
    obj = "chat.completion.chunk" if p.kind == "chat" else "text_completion"
    base = {"id": _response_id(p), "object": obj, "created": p.created, "model": p.model}
    completion_tokens = 0
    started: set[int] = set()
    try:
        for i, d in _deltas(job):
            k = _choice_index(job, i, d.index)
            completion_tokens += len(d.token_ids)
            if p.kind == "chat":
                delta = {"content": d.text}
                if k not in started:
                    delta = {"role": "assistant", "content": d.text}
                choice = {"index": k, "delta": delta, "logprobs": None, "finish_reason": d.finish_reason}
                if p.top_logprobs is not None and d.logprobs:
                    choice["logprobs"] = chat_logprobs(d.token_ids, d.logprobs, _decode_one(job), p.top_logprobs)
            else:
                text = (_echo_text(job, i) if p.echo and k not in started else "") + d.text
                choice = {"index": k, "text": text, "logprobs": None, "finish_reason": d.finish_reason}
                if p.params.logprobs is not None and d.logprobs:
                    choice["logprobs"] = completion_logprobs(d.token_ids, d.logprobs, _decode_one(job), 0)
            started.add(k)
            yield f"data: {json.dumps({**base, 'choices': [choice]}, ensure_ascii=False)}\n\n"
        if p.include_usage:
            prompt_tokens = sum(len(ids) for ids in job.prompt_ids)
            chunk = {**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    except APIError as exc:                    # headers are gone: report in-band, then end
        yield f"data: {json.dumps(exc.body())}\n\n"
        yield "data: [DONE]\n\n"
    except (GeneratorExit, ClientDisconnected):
        return
    finally:
        job.abort_unfinished()                 # client went away or the server closed the stream


def _echo_text(job: _Job, i: int) -> str:
    text = job.prompt_texts[i]
    return text if text is not None else job.engine.tokenizer.decode(job.prompt_ids[i], skip_special_tokens=False)


def _response_id(p: ParsedRequest) -> str:
    return ("chatcmpl-" if p.kind == "chat" else "cmpl-") + p.request_id

