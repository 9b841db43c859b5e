"""OpenAI request parsing and response shapes, with no web framework in sight.

`parse_completion` / `parse_chat` turn a decoded JSON body into a validated `ParsedRequest` or
raise `APIError` (status, message, param) that the server renders as OpenAI's error body.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from inference.outputs import Logprob
from inference.sampling_params import SamplingParams


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI fields we honour, plus vLLM's sampling extensions; anything else is rejected like OpenAI does.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
           "presence_penalty", "frequency_penalty", "user", "logprobs",
           # vLLM extensions
           "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids",
           "skip_special_tokens", "include_stop_str_in_output", "priority"}
COMPLETION_FIELDS = _COMMON | {"prompt", "suffix", "echo", "best_of"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
ROLES = ("system", "user", "assistant")


@dataclass
class ParsedRequest:
    kind: str                                 # "completion" | "chat"
    model: str
    prompts: list[dict[str, Any]]             # engine prompts: {"prompt_token_ids": [...], "prompt": text?}
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool = False
    top_logprobs: int | None = None           # chat: top_logprobs when logprobs=true
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    priority: int = 0


def _get(body: dict, name: str, types: tuple, default=None, *, allow_none: bool = True):
    if name not in body or (body[name] is None and allow_none):
        return default
    value = body[name]
    if isinstance(value, bool) and bool not in types:
        raise APIError(400, f"'{name}' must be of type {'/'.join(t.__name__ for t in types)}, got a boolean", name)
    if not isinstance(value, types):
        raise APIError(400, f"'{name}' must be of type {'/'.join(t.__name__ for t in types)}, "
                            f"got {type(value).__name__}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise APIError(400, f"'{name}' must be a finite number", name)
    return value


def _check_fields(body: Any, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise APIError(400, f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])


def _sampling(body: dict, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise APIError(400, "'stop' must be a string or a list of strings", "stop")
    if isinstance(stop, list) and len(stop) > 16:
        raise APIError(400, "'stop' accepts at most 16 strings", "stop")
    stop_ids = _get(body, "stop_token_ids", (list,))
    kwargs = dict(
        n=_get(body, "n", (int,), 1), temperature=_get(body, "temperature", (int, float), 1.0),
        top_p=_get(body, "top_p", (int, float), 1.0), top_k=_get(body, "top_k", (int,), -1),
        min_p=_get(body, "min_p", (int, float), 0.0),
        presence_penalty=_get(body, "presence_penalty", (int, float), 0.0),
        frequency_penalty=_get(body, "frequency_penalty", (int, float), 0.0),
        repetition_penalty=_get(body, "repetition_penalty", (int, float), 1.0),
        seed=_get(body, "seed", (int,)), max_tokens=max_tokens,
        min_tokens=_get(body, "min_tokens", (int,), 0), stop=stop, stop_token_ids=stop_ids,
        ignore_eos=_get(body, "ignore_eos", (bool,), False), logprobs=logprobs,
        skip_special_tokens=_get(body, "skip_special_tokens", (bool,), True),
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", (bool,), False))
    if kwargs["n"] > 16:
        raise APIError(400, "'n' must be <= 16", "n")
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:                      # SamplingParams names the field first
        param = str(exc).split(":", 1)[0]
        raise APIError(400, str(exc), param) from None


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = _get(body, "stream", (bool,), False)
    opts = _get(body, "stream_options", (dict,))
    if opts is not None:
        if not stream:
            raise APIError(400, "'stream_options' is only allowed when 'stream' is true", "stream_options")
        if set(opts) - {"include_usage", "continuous_usage_stats"}:
            raise APIError(400, f"unknown stream_options: {sorted(set(opts))}", "stream_options")
    include_usage = bool(opts and opts.get("include_usage"))
    return stream, include_usage


def _max_tokens(body: dict, name: str = "max_tokens") -> int | None:
    value = _get(body, name, (int,))
    if value is not None and value < 1:
        raise APIError(400, f"'{name}' must be at least 1, got {value}", name)
    return value


def parse_completion(body: Any) -> ParsedRequest:
    _check_fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
        prompts = list(prompt)
    else:
        raise APIError(400, "'prompt' must be a non-empty string, list of strings, list of token ids "
                            "or list of token-id lists", "prompt")
    if any(p == "" for p in prompts):
        raise APIError(400, "'prompt' must not be empty", "prompt")
    _get(body, "suffix", (str,))                   # accepted; the completion endpoint ignores it
    _get(body, "user", (str,))
    best_of = _get(body, "best_of", (int,))
    if best_of is not None and best_of != _get(body, "n", (int,), 1):
        raise APIError(400, "'best_of' other than n is not supported", "best_of")
    logprobs = _get(body, "logprobs", (int,))
    if logprobs is not None and not 0 <= logprobs <= 5:
        raise APIError(400, "'logprobs' must be between 0 and 5", "logprobs")
    stream, include_usage = _stream_flags(body)
    max_tokens = _max_tokens(body)
    params = _sampling(body, 16 if max_tokens is None else max_tokens, logprobs)
    engine_prompts = [{"prompt_token_ids": p} if isinstance(p, list) else {"text": p} for p in prompts]
    return ParsedRequest("completion", _model(body), engine_prompts, params, stream, include_usage,
                         echo=_get(body, "echo", (bool,), False), priority=_get(body, "priority", (int,), 0))


def parse_chat(body: Any) -> ParsedRequest:
    _check_fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", "messages")
    conv = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise APIError(400, f"'messages[{i}]' must be an object", "messages")
        if m.get("role") not in ROLES:
            raise APIError(400, f"'messages[{i}].role' must be one of {list(ROLES)}, got {m.get('role')!r}", "messages")
        content = m.get("content")
        if isinstance(content, list):          # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise APIError(400, f"'messages[{i}].content' parts must be text parts", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"'messages[{i}].content' must be a string", "messages")
        conv.append({"role": m["role"], "content": content})
    _get(body, "user", (str,))
    want_logprobs = _get(body, "logprobs", (bool,), False)
    top = _get(body, "top_logprobs", (int,))
    if top is not None and (not want_logprobs or not 0 <= top <= 20):
        raise APIError(400, "'top_logprobs' needs logprobs=true and must be between 0 and 20", "top_logprobs")
    stream, include_usage = _stream_flags(body)
    max_tokens = _max_tokens(body, "max_completion_tokens") or _max_tokens(body)
    params = _sampling(body, max_tokens, (top or 0) if want_logprobs else None)
    return ParsedRequest("chat", _model(body), [{"messages": conv}], params, stream, include_usage,
                         top_logprobs=(top or 0) if want_logprobs else None, priority=_get(body, "priority", (int,), 0))


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' must be a non-empty string", "model")
    return model


# ---- response shapes -------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], decode, offset: int) -> dict:
    """Legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for token, lps in zip(token_ids, logprobs):
        text = decode(token)
        tokens.append(text)
        token_lps.append(lps[token].logprob)
        tops.append({decode(t): lp.logprob for t, lp in lps.items()})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(token_ids: list[int], logprobs: list[dict[int, Logprob]], decode, top: int) -> dict:
    content = []
    for token, lps in zip(token_ids, logprobs):
        text = decode(token)
        ranked = sorted(lps.items(), key=lambda kv: kv[1].rank)[:top]
        content.append({"token": text, "logprob": lps[token].logprob, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": decode(t), "logprob": lp.logprob,
                                          "bytes": list(decode(t).encode())} for t, lp in ranked]})
    return {"content": content}
