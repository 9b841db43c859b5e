"""Pydantic models of the inference service's OpenAI-compatible API, the source of its
/openapi.json. The requests are parsed by openai_protocol.py (OpenAI's error messages and `param`);
these models say the same rules to clients and to the schemathesis test that holds the two
together (tests/test_openapi_server.py).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from httpkit.openapi import Body, Stream

TokenId = Annotated[int, Field(ge=0)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 17, description="at most 2^63 - 1 - n")]


class _Sampling(BaseModel):
    """Fields both generation endpoints take (OpenAI's, then vLLM's extensions); null = default."""
    model_config = ConfigDict(extra="forbid")
    model: Annotated[str, Field(min_length=1, description="the served model name (GET /v1/models)")]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: str | None = None
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    min_tokens: Annotated[int, Field(ge=0, description="at most max_tokens")] | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = Field(None, description="lower runs first (vLLM's priority scheduling)")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class CompletionRequest(_Sampling):
    prompt: (Annotated[str, Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)])
    suffix: str | None = None
    echo: bool | None = None
    best_of: int | None = Field(None, description="only equal to n")
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20, description="needs logprobs: true")] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length", "abort"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "abort"] | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length", "abort"] | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body; inside a stream it is one event, then [DONE]."""
    error: ErrorDetail


COMPLETION_STREAM = Stream({None: (CompletionResponse, ErrorResponse)}, sentinel="[DONE]")
CHAT_STREAM = Stream({None: (ChatCompletionChunk, ErrorResponse)}, sentinel="[DONE]")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Literal["all-MiniLM-L6-v2"] | None = None
    input: (Annotated[str, Field(min_length=1, max_length=16384, pattern=r"\S")]
            | Annotated[list[Annotated[str, Field(min_length=1, max_length=16384, pattern=r"\S")]],
                        Field(min_length=1, max_length=512)])


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float]


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class PlainMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a prompt, or messages put through the chat template (messages win)."""
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": [{"required": ["prompt"]},
                                                                          {"required": ["messages"]}]})
    prompt: str | None = None
    messages: Annotated[list[PlainMessage], Field(min_length=1)] | None = None


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class HealthStatus(BaseModel):
    status: Literal["ok", "unhealthy", "ready", "loading", "failed"]


METRICS = Body("text/plain", description="Prometheus text exposition format")
