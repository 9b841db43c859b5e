"""OpenAI requests as the engine takes them, and response shapes, with no web framework in sight.

`parse_completion` / `parse_chat` validate a decoded JSON body with the API's pydantic models
(inference/server/schemas.py, the source of /openapi.json too) and turn it into a `ParsedRequest`
(engine prompts + SamplingParams), or raise `OpenAIError` (status, message, param) that the server
renders as OpenAI's error body.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from httpkit.errors import OpenAIError, validate_request
from httpkit.validation import InvalidRequest
from inference.outputs import Logprob
from inference.sampling_params import SamplingParams, StructuredOutputsParams
from inference.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, NamedToolChoice
from inference.server.structured_schemas import structured_params
from inference.server.tool_calls import call_grammar, check_parameters, template_messages


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
    tools: list[dict[str, Any]] | None = None  # chat: the tools offered (their calls are parsed from the text)


def _sampling(req: GenerationRequest, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """The engine's parameters: the request's, OpenAI's defaults for what it leaves out (null too)."""
    def given(value, default):
        return default if value is None else value
    try:
        structured = structured_params(req.response_format, req.structured_outputs)
    except InvalidRequest as exc:
        raise OpenAIError.invalid(exc) from None
    try:
        return SamplingParams(
            n=given(req.n, 1), temperature=given(req.temperature, 1.0), top_p=given(req.top_p, 1.0),
            top_k=given(req.top_k, -1), min_p=given(req.min_p, 0.0),
            presence_penalty=given(req.presence_penalty, 0.0), frequency_penalty=given(req.frequency_penalty, 0.0),
            repetition_penalty=given(req.repetition_penalty, 1.0), seed=req.seed, max_tokens=max_tokens,
            min_tokens=given(req.min_tokens, 0), stop=req.stop, stop_token_ids=req.stop_token_ids,
            ignore_eos=given(req.ignore_eos, False), logprobs=logprobs,
            skip_special_tokens=given(req.skip_special_tokens, True),
            include_stop_str_in_output=given(req.include_stop_str_in_output, False), structured_outputs=structured,
            cache_reuse=given(req.cache_reuse, 0))
    except ValueError as exc:                      # what only SamplingParams knows (seed + n, min_tokens <= max)
        raise OpenAIError(400, str(exc), str(exc).split(":", 1)[0]) from None


def _include_usage(req: GenerationRequest) -> bool:
    return bool(req.stream_options is not None and req.stream_options.include_usage)


def parse_completion(body: Any) -> ParsedRequest:
    req = validate_request(CompletionRequest, body)
    prompt = req.prompt
    # one prompt (text or token ids) or a batch of them
    prompts = [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else list(prompt)
    params = _sampling(req, 16 if req.max_tokens is None else req.max_tokens, req.logprobs)
    engine_prompts = [{"prompt_token_ids": p} if isinstance(p, list) else {"text": p} for p in prompts]
    return ParsedRequest("completion", req.model, engine_prompts, params, bool(req.stream), _include_usage(req),
                         echo=bool(req.echo), priority=req.priority or 0)


def parse_chat(body: Any) -> ParsedRequest:
    req = validate_request(ChatCompletionRequest, body)
    conv = template_messages([m.for_template() for m in req.messages])
    top = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling(req, req.max_completion_tokens or req.max_tokens, top)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools and req.tool_choice != "none" else None
    if tools:
        try:
            check_parameters(tools)
        except ValueError as exc:
            raise OpenAIError(400, str(exc), "tools") from None
        forced = req.tool_choice.function.name if isinstance(req.tool_choice, NamedToolChoice) else None
        if forced is not None or req.tool_choice == "required":      # the call is held to the tools' schemas
            if params.structured_outputs is not None:
                raise OpenAIError(400, "tool_choice 'required' or a named function cannot be combined with "
                                       "response_format or structured_outputs", "tool_choice")
            params = dataclasses.replace(params, structured_outputs=StructuredOutputsParams(
                grammar=call_grammar(tools, forced)))
    prompt = {"messages": conv, **({"tools": tools} if tools else {})}
    return ParsedRequest("chat", req.model, [prompt], params, bool(req.stream), _include_usage(req),
                         top_logprobs=top, priority=req.priority or 0, tools=tools)


# ---- response shapes -------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; cached_tokens: prompt tokens served from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


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
