"""Request and response models of the web app's three APIs (support chat, code completion, batch
jobs). /openapi.json is generated from them (httpkit/openapi.py); the views validate with the
precise per-field messages users see, and the schemathesis test (tests/app/test_openapi.py) holds
the two together: what these models call valid is accepted, what they call invalid gets a 4xx.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from httpkit.openapi import Body, Stream

SESSION_ID = r"^[A-Za-z0-9_-]{16,64}$"
JOB_ID = r"^[0-9a-f]{32}$"
MAX_SEGMENT_CHARS = 200_000          # pipelines/completion.py cuts longer segments, it does not refuse them
JSONL = Body("application/x-ndjson", description="one JSON object per line")
METRICS = Body("text/plain", description="Prometheus text exposition format")
CompletionSeed = Annotated[int, Field(ge=0, le=2**63 - 5)]       # pipelines/completion.py MAX_SEED
JobSeed = Annotated[int, Field(ge=0, le=2**63 - 2)]              # app/jobs.py MAX_SEED


class Error(BaseModel):
    """The chat API's and the web app's error body."""
    error: str


class ApiErrorDetail(BaseModel):
    message: str
    type: str


class ApiError(BaseModel):
    """The completion and job APIs' error body (OpenAI's shape)."""
    error: ApiErrorDetail


class Status(BaseModel):
    status: str


class Readyz(BaseModel):
    """/readyz (app/readiness.py): status ready | degraded | warming | unavailable."""
    status: Literal["ready", "degraded", "warming", "unavailable"]
    degraded: list[str] = Field(default_factory=list, description="the dependencies that are down")
    error: str | None = None
    dependencies: dict[str, dict[str, Any]] = Field(description="inference_primary, inference_standby, "
                                                    "embeddings, kb_index, redis, celery_broker: each a state and details")


# ---- support chat ------------------------------------------------------------------------------
class SessionPath(BaseModel):
    sid: str = Field(description="a session id from POST /api/chat/sessions (unknown or expired: 404)")


class SessionCreated(BaseModel):
    session_id: Annotated[str, Field(pattern=SESSION_ID)]


class Citation(BaseModel):
    title: str
    source: str


class StoredMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: str
    time: float
    citations: list[Citation] | None = None
    intent: str | None = None
    degraded: bool | None = None
    blocked: bool | None = None


class SessionView(BaseModel):
    messages: list[StoredMessage]
    status: str = Field(description="open, or pending_human after a handoff")


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    content: Annotated[str, Field(min_length=1, max_length=4000, pattern=r"\S",
                                  description="the customer's message (PII is redacted before it is stored)")]
    stream: bool = Field(False, description="true: server-sent events (token ..., then done)")


class ChatReplyOut(BaseModel):
    reply: str
    intent: str
    confidence: float
    citations: list[Citation]
    handoff: bool
    degraded: bool = Field(description="true when the model was unavailable and the reply is a KB excerpt")
    message_index: int


class TokenEvent(BaseModel):
    text: str


class StreamError(BaseModel):
    error: str = Field(description="the exception's type; the turn is not stored")


CHAT_STREAM = Stream({"token": TokenEvent, "done": ChatReplyOut, "error": StreamError})


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    message_index: Annotated[int, Field(ge=0, description="index of an assistant message in this session")]
    rating: Literal["up", "down"]
    comment: Annotated[str, Field(max_length=2000)] = ""


class Ok(BaseModel):
    ok: bool


# ---- code completion (Tabby's and OpenAI's dialects) --------------------------------------------
class Snippet(BaseModel):
    model_config = ConfigDict(extra="allow")
    filepath: str | None = None
    body: str


class Segments(BaseModel):
    model_config = ConfigDict(extra="allow")
    prefix: str
    suffix: str | None = None
    filepath: str | None = None
    git_url: str | None = None
    declarations: list[Snippet] | None = None
    relevant_snippets_from_changed_files: list[Snippet] | None = None
    relevant_snippets_from_recently_opened_files: list[Snippet] | None = None
    clipboard: str | None = None


class TabbyCompletionIn(BaseModel):
    model_config = ConfigDict(extra="allow", title="TabbyCompletionIn")
    language: str | None = None
    segments: Segments
    user: str | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    seed: CompletionSeed | None = None


class OpenAICompletionIn(BaseModel):
    """OpenAI's legacy completions body: prompt = the text before the cursor (one prompt)."""
    model_config = ConfigDict(extra="allow", json_schema_extra={"not": {"required": ["segments"]}})
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    suffix: str | None = None
    language: str | None = None
    filepath: str | None = None
    repository: str | None = None
    user: str | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=1e-6, le=1)] | None = None
    max_tokens: Annotated[int, Field(ge=1, le=512)] | None = None
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None = None
    n: Annotated[int, Field(ge=1, le=4)] | None = None
    seed: CompletionSeed | None = None
    stream: bool = False


class CompletionIn(RootModel[TabbyCompletionIn | OpenAICompletionIn]):
    """Tabby's body (has `segments`) or OpenAI's legacy body (has `prompt`)."""


class TabbyChoice(BaseModel):
    index: int
    text: str


class TabbyCompletionOut(BaseModel):
    id: str
    choices: list[TabbyChoice]


class OpenAIChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: str | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class OpenAICompletionOut(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[OpenAIChoice]
    usage: Usage


class CompletionOut(RootModel[TabbyCompletionOut | OpenAICompletionOut]):
    """In the dialect of the request."""


COMPLETION_STREAM = Stream({None: OpenAICompletionOut}, sentinel="[DONE]")


class EventIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["view", "select", "dismiss"]
    completion_id: Annotated[str, Field(min_length=1)]
    select_kind: Literal["line"] | None = None


class Empty(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HealthOut(BaseModel):
    """What Tabby's editor plugins ask for on start."""
    model: str
    device: str
    arch: str
    cpu_info: str
    cpu_count: int | None
    cuda_devices: list[str]
    version: dict[str, str]


class RepositoryIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=r"\S",
                               description="the repository's name or git_url")]
    path: Annotated[str, Field(min_length=1, pattern=r"^[^\x00]+$",
                               description="a folder on the server under COMPLETION_REPO_ROOTS")]


class JobPath(BaseModel):
    job_id: str


class RepositoryQueued(BaseModel):
    job_id: str
    status: str


class RepositoryJob(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["queued", "running", "done", "failed"]
    name: str | None = None
    num_chunks: int | None = None
    error: str | None = None


class KbJob(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["queued", "running", "done", "failed"]
    kind: Literal["kb"]
    fingerprint: str | None = Field(None, description="of the folder the index was built from")
    num_chunks: int | None = None
    num_articles: int | None = None
    error: str | None = None


# ---- batch jobs -------------------------------------------------------------------------------
class ChatTurn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant"]
    content: str


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_tokens: Annotated[int, Field(ge=1, le=1024)] = 128
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    stop: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] | None = None
    seed: JobSeed | None = None


class PromptItem(_Sampling):
    prompt: Annotated[str, Field(min_length=1, max_length=16000)]


class ChatItem(_Sampling):
    messages: Annotated[list[ChatTurn], Field(min_length=1, description="at most 16000 characters in all")]


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    requests: Annotated[list[PromptItem | ChatItem], Field(min_length=1, max_length=1000)]


class IdempotencyHeader(BaseModel):
    idempotency_key: str = Field(None, min_length=1, max_length=200, alias="Idempotency-Key",
                                 description="the same key again returns the first job (200)")


class JobView(BaseModel):
    job_id: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    done: int
    total: int
    error: str | None = None


class JobCancelled(BaseModel):
    job_id: str
    status: Literal["cancelled"]


def error_responses(model: type[BaseModel], *statuses: int) -> dict[int, Any]:
    return {s: model for s in statuses}

