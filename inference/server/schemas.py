"""Pydantic models of the inference service's OpenAI-compatible API: they parse its requests
(`validate(CompletionRequest, body)`, inference/server/protocol.py) and are the source of its
/openapi.json, so what the document says is what the service enforces (the schemathesis test,
tests/inference/server/test_openapi_server.py, holds them to it). The `Errors` markers word each rule the way
OpenAI's API does, naming the field in `param` (httpkit/validation.py).
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from httpkit.openapi import Body, Stream
from httpkit.validation import Errors, InvalidRequest
from inference.core.engine import check_messages
from inference.embeddings import EMBEDDING_MODEL, check_inputs
from inference.sampling_params import MAX_TOP_K
from inference.server.structured_schemas import ResponseFormat, StructuredOutputsIn

TokenId = Annotated[int, Field(ge=0)]
Penalty = Annotated[float | None, Field(ge=-2, le=2), Errors(range="{at}: must be in [-2, 2], got {input!r}")]
# SamplingParams seeds sample i with seed + i: at most 2**63 - 1 - n (checked there, knowing n)
Seed = Annotated[int | None, Field(ge=0, le=2**63 - 2, description="at most 2^63 - 1 - n"),
                 Errors(range="seed: must be an integer in [0, 2**63 - n), got {input!r}")]
TYPE = "'{at}' must be of type {label}, got {got}"           # OpenAI's words for a wrong JSON type
ROLES = ("system", "user", "assistant", "tool")


class _Request(BaseModel):
    """Strict JSON types (no "5" for 5, no true for 1), finite numbers."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    error_messages: ClassVar[Errors] = Errors(body="request body must be a JSON object",
                                              extra_forbidden="Unrecognized request argument supplied: {unknown_names}",
                                              finite_number="'{at}' must be a finite number", type=TYPE)


class StreamOptions(_Request):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class GenerationRequest(_Request):
    """Fields both generation endpoints take (OpenAI's, then vLLM's extensions); null = default."""
    model: Annotated[str, Field(min_length=1, description="the served model name (GET /v1/models)"),
                     Errors("'model' must be a non-empty string")]
    max_tokens: Annotated[int | None, Field(ge=1),
                          Errors(greater_than_equal="'max_tokens' must be at least 1, got {input}")] = None
    temperature: Annotated[float | None, Field(ge=0), Errors(range="temperature: must be >= 0, got {input!r}")] = None
    top_p: Annotated[float | None, Field(gt=0, le=1), Errors(range="top_p: must be in (0, 1], got {input!r}")] = None
    n: Annotated[int | None, Field(ge=1, le=16), Errors(greater_than_equal="n: must be an integer >= 1, got {input!r}",
                                                         less_than_equal="'n' must be <= 16")] = None
    stream: bool | None = None
    stream_options: Annotated[StreamOptions | None, Field(description="only with stream: true"),
                              Errors(extra_forbidden=lambda v: f"unknown stream_options: {sorted(v['value'])}")] = None
    stop: Annotated[Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                                    Field(max_length=16)] | None,
                    Errors("'stop' must be a string or a list of strings", too_long="'stop' accepts at most 16 strings",
                           string_too_short="stop: must be a non-empty string or a list of non-empty strings, "
                                            "got {value!r}")] = None
    seed: Seed = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    user: str | None = None
    top_k: Annotated[int | None, Field(ge=-1, le=MAX_TOP_K),
                     Errors(range=f"top_k: must be -1 (off), 0 (off) or a positive integer up to {MAX_TOP_K}, "
                                  "got {input!r}")] = None
    min_p: Annotated[float | None, Field(ge=0, le=1), Errors(range="min_p: must be in [0, 1], got {input!r}")] = None
    repetition_penalty: Annotated[float | None, Field(gt=0),
                                  Errors(range="repetition_penalty: must be > 0, got {input!r}")] = None
    min_tokens: Annotated[int | None, Field(ge=0, description="at most max_tokens"),
                          Errors(range="min_tokens: must be an integer >= 0, got {input!r}")] = None
    ignore_eos: bool | None = None
    stop_token_ids: Annotated[list[TokenId] | None,
                              Errors("stop_token_ids: must be a list of non-negative integers, got {value!r}",
                                     list_type=None)] = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    priority: int | None = Field(None, description="lower runs first (vLLM's priority scheduling)")
    cache_reuse: Annotated[int | None, Field(ge=0, description="llama.cpp's --cache-reuse, per request: take the "
                                                               "KV of a moved run of at least this many prompt "
                                                               "tokens from a recent request (0: off)"),
                           Errors(range="cache_reuse: must be an integer >= 0, got {input!r}")] = None
    response_format: ResponseFormat | None = None
    structured_outputs: Annotated[StructuredOutputsIn | None,
                                  Field(description="vLLM's: exactly one of json, json_object, regex, choice, "
                                                    "grammar")] = None

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", "stream_options")
        return self


class CompletionRequest(GenerationRequest):
    prompt: Annotated[Annotated[str, Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)]
                      | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
                      | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)],
                      Errors("'prompt' must be a non-empty string, list of strings, list of token ids or list of "
                             "token-id lists", string_too_short="'prompt' must not be empty",
                             greater_than_equal="'prompt' token ids must be in [0, vocab_size), got {input}")]
    suffix: str | None = Field(None, description="accepted; the completion endpoint ignores it")
    echo: bool | None = None
    best_of: int | None = Field(None, description="only equal to n")
    logprobs: Annotated[int | None, Field(ge=0, le=5), Errors(range="'logprobs' must be between 0 and 5")] = None

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidRequest("'best_of' other than n is not supported", "best_of")
        return self


class TextPart(_Request):
    model_config = ConfigDict(extra="allow")
    error_messages: ClassVar[Errors] = Errors()            # the message's content says what is wrong
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    model_config = ConfigDict(extra="allow")
    error_messages: ClassVar[Errors] = Errors(object="'{at}' must be an object")
    role: Annotated[Literal["system", "user", "assistant", "tool"],
                    Errors(f"'{{at}}' must be one of {list(ROLES)}, got {{input!r}}",
                           missing=f"'{{at}}' must be one of {list(ROLES)}, got None")]
    tool_calls: list[dict[str, Any]] | None = None       # an assistant's calls (OpenAI's shape)
    tool_call_id: str | None = None                      # a tool message: the call it answers
    content: Annotated[str | list[TextPart] | None, Field(validate_default=True),
                       Errors("'{at}' parts must be text parts", string_type="'{at}' must be a string",
                              missing="'{at}' must be a string")] = None

    @field_validator("content")
    @classmethod
    def _content_unless_calls(cls, value, info):
        if value is None and not (info.data.get("role") == "assistant" and info.data.get("tool_calls")):
            raise PydanticCustomError("string_type", "content must be a string")   # worded by the marker
        return value

    @model_validator(mode="after")
    def _tool_answers_a_call(self):
        if self.role == "tool" and self.tool_call_id is None:
            raise InvalidRequest("a 'tool' message needs the 'tool_call_id' it answers", "messages")
        return self

    @property
    def content_text(self) -> str:
        """The content, its text parts joined ("" for an assistant's tool calls alone)."""
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template takes it (tool calls and their ids kept)."""
        out = {"role": self.role, "content": self.content_text}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key, None) is not None:
                out[key] = getattr(self, key)
        return out


class FunctionDef(_Request):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$"),
                    Errors("'{at}' must be 1-64 letters, digits, '_', '.' or '-', got {input!r}")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Annotated[Literal["function"], Errors("'{at}' must be 'function', got {input!r}")]
    function: FunctionDef


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Annotated[Literal["function"], Errors("'{at}' must be 'function', got {input!r}")]
    function: NamedFunction


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1), Errors("'messages' must be a non-empty list")]
    max_completion_tokens: Annotated[int | None, Field(ge=1), Errors(
        greater_than_equal="'max_completion_tokens' must be at least 1, got {input}")] = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int | None, Field(ge=0, le=20, description="needs logprobs: true"), Errors(
        range="'top_logprobs' needs logprobs=true and must be between 0 and 20")] = None
    tools: Annotated[list[Tool] | None, Field(max_length=128)] = None
    tool_choice: Annotated[Literal["auto", "none", "required"] | NamedToolChoice | None,
                           Errors("'tool_choice' must be 'auto', 'none', 'required' or "
                                  "{{'type': 'function', 'function': {{'name': ...}}}}")] = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        names = [t.function.name for t in self.tools or []]
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise InvalidRequest(f"tool_choice: no tool named {self.tool_choice.function.name!r} in 'tools'",
                                 "tool_choice")
        if self.tool_choice == "required" and not names:
            raise InvalidRequest("tool_choice: 'required' needs 'tools'", "tool_choice")
        return self

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("'top_logprobs' needs logprobs=true and must be between 0 and 20", "top_logprobs")
        return self


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


class EmbeddingRequest(_Request):
    model_config = ConfigDict(extra="allow")
    model: Annotated[Literal["all-MiniLM-L6-v2"] | None,
                     Errors(f"model {{value!r}} does not exist; embeddings come from {EMBEDDING_MODEL!r}",
                            status=404, code="model_not_found")] = None
    input: Annotated[Annotated[str, Field(min_length=1, max_length=16384, pattern=r"\S")]
                     | Annotated[list[Annotated[str, Field(min_length=1, max_length=16384, pattern=r"\S")]],
                                 Field(min_length=1, max_length=512)],
                     Errors(missing="input: must be a non-empty string or a non-empty list of strings")]

    @field_validator("input", mode="before")
    @classmethod
    def _inputs(cls, value: Any) -> Any:
        check_inputs(value)                 # the embedder's own rule, in its words
        return value

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


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


class PlainMessage(_Request):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str


class TokenizeRequest(_Request):
    """vLLM's /tokenize: a prompt, or messages put through the chat template (messages win)."""
    model_config = ConfigDict(extra="allow", json_schema_extra={"anyOf": [{"required": ["prompt"]},
                                                                          {"required": ["messages"]}]})
    prompt: Annotated[str | None, Errors("'prompt' must be a string")] = None
    messages: Annotated[list[PlainMessage], Field(min_length=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _prompt_or_messages(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not (isinstance(data.get("prompt"), str) or "messages" in data):
            raise InvalidRequest("tokenize: send {'prompt': str} or {'messages': [...]}")
        return data

    @field_validator("messages", mode="before")
    @classmethod
    def _conversation(cls, value: Any) -> Any:
        check_messages(value)               # the engine's own rule (also for null), in its words
        return value


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class HealthStatus(BaseModel):
    status: Literal["ok", "unhealthy", "ready", "loading", "failed"]


METRICS = Body("text/plain", description="Prometheus text exposition format")
