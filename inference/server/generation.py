"""One OpenAI request through the engine, with no web framework in sight: its prompts tokenized
and checked against the context, then its deltas gathered into one response body (`collect`) or
streamed as server-sent events (`sse`). inference/server/app.py admits the request and picks one.
"""
from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from httpkit.errors import OpenAIError
from inference.online_engine import OnlineEngine, RequestStream
from inference.outputs import StreamDelta
from inference.server.protocol import ParsedRequest, chat_logprobs, completion_logprobs, usage
from inference.server.tool_calls import OPEN, parse_calls, safe_prefix

POLL_S = 0.2            # how often a waiting handler checks whether its client is still there


class ClientDisconnected(Exception):
    pass


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


def tokenize_job(parsed: ParsedRequest, engine: OnlineEngine) -> _Job:
    tok, limit = engine.tokenizer, engine.max_model_len
    ids_list, texts = [], []
    for p in parsed.prompts:
        if "messages" in p:
            tools = {"tools": p["tools"]} if p.get("tools") else {}
            ids, text = tok.apply_chat_template(p["messages"], add_generation_prompt=True, **tools), None
        elif "text" in p:
            ids, text = tok.encode(p["text"]), p["text"]
        else:
            ids, text = p["prompt_token_ids"], None
            if any(not 0 <= t < engine.engine.arch.vocab_size for t in ids):
                raise OpenAIError(400, f"'prompt' token ids must be in [0, {engine.engine.arch.vocab_size})", "prompt")
        max_tokens = parsed.params.max_tokens
        if max_tokens is None:                         # chat default: the rest of the context
            if len(ids) >= limit:
                raise OpenAIError(400, f"This model's maximum context length is {limit} tokens, but the "
                                    f"messages take {len(ids)} tokens", "messages", code="context_length_exceeded")
        elif len(ids) + max_tokens > limit:
            raise OpenAIError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
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
                raise OpenAIError(503, f"engine failure: {delta.error}", type_="server_error", code="engine_error")
            yield i, delta


def _choice_index(job: _Job, prompt_index: int, sample: int) -> int:
    return prompt_index * job.parsed.params.n + sample


def _decode_one(job: _Job):
    tok = job.engine.tokenizer
    return lambda t: tok.decode([t], skip_special_tokens=False)


def collect(job: _Job) -> dict:
    p, n = job.parsed, job.parsed.params.n
    texts: dict[int, list[str]] = {}
    tokens: dict[int, list[int]] = {}
    lps: dict[int, list] = {}
    finish: dict[int, str | None] = {}
    cached: dict[int, int] = {}                  # prompt -> its tokens from the prefix cache
    for i, d in _deltas(job):
        cached[i] = max(cached.get(i, 0), d.num_cached_tokens)
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
            message, fin = {"role": "assistant", "content": text}, finish.get(k)
            content, calls = parse_calls(text, _names(p)) if p.tools else (text, [])
            if calls:                          # the model called tools (OpenAI's shape)
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                fin = "tool_calls" if fin == "stop" else fin
            choice = {"index": k, "message": message, "logprobs": None, "finish_reason": fin}
            if p.top_logprobs is not None:
                choice["logprobs"] = chat_logprobs(tokens.get(k, []), lps.get(k, []), _decode_one(job), p.top_logprobs)
        else:
            prefix = _echo_text(job, i) if p.echo else ""
            choice = {"index": k, "text": prefix + text, "logprobs": None, "finish_reason": finish.get(k)}
            if p.params.logprobs is not None:
                choice["logprobs"] = completion_logprobs(tokens.get(k, []), lps.get(k, []), _decode_one(job),
                                                         len(prefix))
        choices.append(choice)
    completion_tokens = sum(len(v) for v in tokens.values())
    return {"id": _response_id(p), "object": "chat.completion" if p.kind == "chat" else "text_completion",
            "created": p.created, "model": p.model, "choices": choices,
            "usage": usage(sum(len(ids) for ids in job.prompt_ids), completion_tokens, sum(cached.values()))}


def sse(job: _Job) -> Iterator[str]:
    p = job.parsed
    obj = "chat.completion.chunk" if p.kind == "chat" else "text_completion"
    base = {"id": _response_id(p), "object": obj, "created": p.created, "model": p.model}
    completion_tokens = 0
    started: set[int] = set()
    cached: dict[int, int] = {}
    held: dict[int, list] = {}                   # with tools: choice -> [its text, how much went out]
    names = _names(p)
    try:
        for i, d in _deltas(job):
            k = _choice_index(job, i, d.index)
            completion_tokens += len(d.token_ids)
            cached[i] = max(cached.get(i, 0), d.num_cached_tokens)
            if p.kind == "chat" and p.tools:
                for chunk in _tool_deltas(held.setdefault(k, ["", 0]), d, k not in started, names):
                    started.add(k)
                    yield f"data: {json.dumps({**base, 'choices': [{'index': k, **chunk}]}, ensure_ascii=False)}\n\n"
                continue
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
            chunk = {**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens, sum(cached.values()))}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    except OpenAIError as exc:                    # headers are gone: report in-band, then end
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


def _names(p: ParsedRequest) -> set[str]:
    return {t["function"]["name"] for t in p.tools or []}


def _tool_deltas(held: list, d: StreamDelta, first: bool, names: set[str]) -> Iterator[dict]:
    """A streamed choice of a request with tools: text goes out as content up to where a call may
    start; at the end the calls go out as OpenAI's delta.tool_calls (id, type and name first, then
    the arguments), which the openai SDK reassembles, and finish_reason is "tool_calls"."""
    held[0] += d.text
    calls = parse_calls(held[0], names)[1] if d.finish_reason else []
    cut = (max(0, held[0].find(OPEN)) if calls else len(held[0])) if d.finish_reason else safe_prefix(held[0])
    text, held[1] = held[0][held[1]:max(cut, held[1])], max(cut, held[1])
    role = {"role": "assistant"} if first else {}
    if text or first:
        yield {"delta": {**role, "content": text}, "logprobs": None, "finish_reason": None}
    for n, call in enumerate(calls):
        fn = call["function"]
        yield {"delta": {"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                         "function": {"name": fn["name"], "arguments": ""}}]},
               "logprobs": None, "finish_reason": None}
        yield {"delta": {"tool_calls": [{"index": n, "function": {"arguments": fn["arguments"]}}]},
               "logprobs": None, "finish_reason": None}
    if d.finish_reason:
        fin = "tool_calls" if calls and d.finish_reason == "stop" else d.finish_reason
        yield {"delta": {}, "logprobs": None, "finish_reason": fin}

