"""llama.cpp's /infill endpoint, so llama.vscode and llama.vim work against this server unchanged.

    POST /infill   {input_prefix, input_suffix, input_extra: [{filename, text}], prompt, n_predict,
                    t_max_predict_ms, n_indent, stop, samplers, cache_prompt, stream}
                   -> {content, stop, stop_type, tokens_predicted, tokens_evaluated, tokens_cached,
                       truncated, generation_settings, timings: {prompt_n, prompt_ms, ...}}

The body becomes the same CompletionRequest as Tabby's and OpenAI's (pipelines/completion.py
`parse_infill`), so the FIM template of the model's family, repository-level context from
input_extra, the cache, trimming and the stop rules are one code path. `n_predict: 0` (what
llama.vscode sends to warm the server up with new context) prefills and returns "". A newer
request from the same editor (API key and address) cancels the older one. Auth, limits
and errors are the completion API's: `Authorization: Bearer <api key>`, OpenAI's error body.
"""
from __future__ import annotations

import json
import time
import uuid

from flask import Blueprint, Response, current_app, jsonify, request

from app.api_keys import API_ERRORS, api_key_routes
from app.completion.routes import _ext, _model_name, _service
from app.completion.schemas import INFILL_STREAM, InfillOut
from app.tenants import hash_api_key
from httpkit.errors import OpenAIError
from httpkit.openapi import documented
from httpkit.validation import InvalidRequest
from pipelines.completion import CompletionRequest, CompletionResult, parse_infill
from pipelines.completion_schemas import InfillIn
from pipelines.inference_client import InferenceError

bp = api_key_routes(Blueprint("infill", __name__))


@bp.post("/infill")
@documented(body=InfillIn, responses={200: (InfillOut, INFILL_STREAM), **API_ERRORS}, tags=("completion",))
def infill():
    """Fill in the code between input_prefix + prompt and input_suffix (llama.cpp's /infill)."""
    t0 = time.perf_counter()
    try:
        req = parse_infill(request.get_json(silent=True))
    except InvalidRequest as exc:
        raise OpenAIError.invalid(exc) from None
    req.user = _editor()
    metrics = _ext()["metrics"]
    try:
        result = _service().complete(req)
    except InferenceError as exc:          # as /v1/completions: nothing to show now, not an error
        current_app.logger.warning("infill degraded: %s", exc)
        metrics.requests.labels(req.language, "degraded").inc()
        result = CompletionResult(f"cmpl-degraded-{uuid.uuid4().hex[:12]}", [""])
    elapsed = time.perf_counter() - t0
    metrics.latency.labels(req.language).observe(elapsed)
    outcome = "cancelled" if result.cancelled else "cached" if result.cached else "empty" if not result.texts[0] \
        else "ok"
    metrics.requests.labels(req.language, outcome).inc()
    body = _body(req, result)
    if not req.stream:
        return jsonify(body)

    def sse():                 # llama.cpp's stream: the text, then a last event with stop: true
        yield f"data: {json.dumps({'content': body['content'], 'stop': False}, ensure_ascii=False)}\n\n"
        yield f"data: {json.dumps({**body, 'content': ''}, ensure_ascii=False)}\n\n"
    return Response(sse(), mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


def _editor() -> str:
    """Who is typing: llama.cpp's body names neither user nor file, and an editor has one cursor, so
    one API key from one address is one editor. Its newer request supersedes the older one (which
    then answers "" at once and frees its KV), as the completion API does per user and file."""
    key = request.headers.get("Authorization", "")
    return f"infill:{hash_api_key(key)[:16]}:{request.remote_addr or ''}"


def _body(req: CompletionRequest, result: CompletionResult) -> dict:
    text = result.texts[0]
    prompt_ms = result.first_token_s * 1e3
    evaluated = max(0, result.prompt_tokens - result.cached_tokens)     # computed, not from the cache
    predicted_ms = max(0.0, (result.engine_s - result.first_token_s) * 1e3)
    n_pred = result.completion_tokens
    limit = req.max_tokens > 0 and n_pred >= req.max_tokens
    return {
        "index": 0, "id_slot": -1, "model": _model_name(), "content": text, "tokens": [], "stop": True,
        "stop_type": "limit" if limit else "eos", "stopping_word": "", "has_new_line": "\n" in text,
        "tokens_predicted": n_pred, "tokens_evaluated": result.prompt_tokens, "tokens_cached": result.cached_tokens,
        "truncated": False, "prompt": "",
        "generation_settings": {"n_predict": req.max_tokens, "temperature": req.temperature, "top_k": req.top_k,
                                "top_p": req.top_p, "stop": req.stop, "n_indent": req.n_indent,
                                "t_max_predict_ms": req.t_max_predict_ms or -1},
        "timings": {"prompt_n": evaluated, "prompt_ms": round(prompt_ms, 3),
                    "prompt_per_second": round(evaluated / (prompt_ms / 1e3), 3) if prompt_ms else 0.0,
                    "predicted_n": n_pred, "predicted_ms": round(predicted_ms, 3),
                    "predicted_per_second": round(n_pred / (predicted_ms / 1e3), 3) if predicted_ms else 0.0},
    }


def init_infill(app) -> None:
    app.register_blueprint(bp)
