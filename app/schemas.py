"""Request and response models of the web app's three APIs (support chat, code completion, batch
jobs). The views parse request bodies with them (`validate_body` in app/errors.py for /api,
`validate_request` in httpkit/errors.py for /v1) and /openapi.json is generated from them
(httpkit/openapi.py), so what the document says is what the app enforces; the `Errors` markers
keep the per-field messages users see (httpkit/validation.py). The schemathesis test
(tests/app/test_openapi.py) holds the app to it: what these models call valid is accepted, what
they call invalid gets a 4xx. The completion API's models are in app/completion/schemas.py, its
request bodies in the pipeline (pipelines/completion_schemas.py).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, RootModel, Tag, field_validator
from pydantic_core import PydanticCustomError

from httpkit.openapi import Body, Stream
from httpkit.validation import Errors, InvalidRequest

SESSION_ID = r"^[A-Za-z0-9_-]{16,64}$"
JOB_ID = r"^[0-9a-f]{32}$"
MAX_MESSAGE_CHARS = 4000            # the default of the app's MAX_MESSAGE_CHARS (passed as context "max_chars")
MAX_ITEMS = 1000                    # requests per batch job
MAX_PROMPT_CHARS = 16000            # per batch item, prompt or messages in all
JSONL = Body("application/x-ndjson", description="one JSON object per line")
METRICS = Body("text/plain", description="Prometheus text exposition format")
# SamplingParams: seed + n - 1 < 2**63; items sample once
JobSeed = Annotated[int, Field(ge=0, le=2**63 - 2)]
BODY = "request body must be a JSON object"


class _In(BaseModel):
    """A request body: strict JSON types; unknown fields ignored."""
    model_config = ConfigDict(extra="allow", strict=True)
    error_messages: ClassVar[Errors] = Errors(body=BODY)


class Error(BaseModel):
    """The chat API's and the web app's error body."""
    error: str


class ApiErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = Field(None, description="the request field at fault, when one is")
    code: str | None = None


class ApiError(BaseModel):
    """The completion, job and knowledge-base APIs' error body (OpenAI's shape, httpkit/errors.py)."""
    error: ApiErrorDetail


class Status(BaseModel):
    status: str


class Readyz(BaseModel):
    """/readyz (app/readiness.py): status ready | degraded | warming | unavailable."""
    status: Literal["ready", "degraded", "warming", "unavailable"]
    degraded: list[str] = Field(default_factory=list, description="the dependencies that are down")
    error: str | None = None
    dependencies: dict[str, dict[str, Any]] = Field(
        description="inference_primary, inference_standby, embeddings, kb_index, redis, celery_broker: "
                    "each a state and details")


# ---- support chat ------------------------------------------------------------------------------
class SessionPath(BaseModel):
    sid: str = Field(description="a session id from POST /api/chat/sessions (unknown or expired: 404)")


class SessionCreated(BaseModel):
    session_id: Annotated[str, Field(pattern=SESSION_ID)]


class Citation(BaseModel):
    title: str
    source: str


class Author(BaseModel):
    name: str


class ActionOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = Field(None, description="the call's idempotency key (POST .../actions/<id> answers a "
                                             "confirmation)")
    name: str = Field(description="the tenant's action (configs/actions/)")
    status: Literal["needs_input", "needs_confirmation", "running", "succeeded", "failed", "timeout",
                    "unreachable", "declined"]
    arguments: dict[str, Any] | None = None
    missing: str | None = Field(None, description="the parameter asked for (status needs_input)")


class ActionPath(BaseModel):
    sid: str = Field(description="a session id from POST /api/chat/sessions (unknown or expired: 404)")
    key: str = Field(description="the action's id from the reply that asked to confirm it")


class ActionAnswerIn(_In):
    confirm: Annotated[bool, Field(description="true: go ahead; false: cancel"),
                       Errors("confirm: must be true or false")]


class StoredMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int
    role: Literal["user", "assistant", "agent", "system"]
    content: str
    created_at: str = Field(description="ISO 8601, UTC")
    citations: list[Citation] | None = None
    intent: str | None = None
    grounding: str | None = None
    degraded: bool | None = None
    blocked: bool | None = None
    action: ActionOut | None = Field(None, description="the action a bot reply took or asks about")
    author: Author | None = Field(None, description="the agent who wrote it (role agent)")


CONVERSATION_STATUS = Literal["open", "pending_human", "human", "resolved"]


class Waiting(BaseModel):
    queue_position: int | None = Field(description="1: the next conversation an agent takes")
    waited_s: float
    offer_email: bool = Field(description="waited past HANDOFF_WAIT_S: offer to leave an email")
    offer_bot: bool = Field(description="waited past HANDOFF_WAIT_S: offer to go back to the assistant")
    outside_hours: bool = Field(False, description="the team is away (the tenant's business_hours): the email "
                                "offer comes at once")
    opens_at: str | None = Field(None, description="when the team is back (ISO 8601, UTC), outside hours")


class SessionView(BaseModel):
    messages: list[StoredMessage]
    status: CONVERSATION_STATUS = Field(description="open (the bot answers), pending_human (waiting for an "
                                                    "agent), human (an agent answers), resolved")
    assignee: Author | None = Field(None, description="the agent answering, while status is human")
    waiting: Waiting | None = Field(None, description="queue place and time waited, while pending_human")


class HumanTurnOut(BaseModel):
    reply: None = Field(description="the bot stays silent while a human is asked for or answering (also when "
                                    "an agent took the conversation while the reply was written)")
    status: CONVERSATION_STATUS
    message_index: int
    waiting: Waiting | None = None


class CsatIn(_In):
    rating: Annotated[int, Field(ge=1, le=5), Errors("rating: must be an integer from 1 to 5")]
    comment: Annotated[str, Field(max_length=2000), Errors("comment: must be a string of at most 2000 characters")] = ""


class ContactIn(_In):
    email: Annotated[str, Field(max_length=254,
                                pattern=r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$"),
                     Errors("email: must be an email address")]


class SeenIn(_In):
    index: Annotated[int, Field(ge=0, le=1_000_000), Errors("index: the index of the last message shown, 0 or more")]


class StatusOut(BaseModel):
    status: CONVERSATION_STATUS


class HandoffOut(BaseModel):
    status: CONVERSATION_STATUS
    waiting: Waiting | None = Field(None, description="queue place and time waited, while pending_human")


class MessageIn(_In):
    content: Annotated[str, Field(min_length=1, pattern=r"\S", json_schema_extra={"maxLength": MAX_MESSAGE_CHARS},
                                  description="the customer's message (PII is redacted before it is stored)"),
                       Errors("content: must be a non-empty string")]
    stream: Annotated[bool, Field(description="true: server-sent events (token ..., then done)"),
                      Errors("stream: must be true or false")] = False

    @field_validator("content")
    @classmethod
    def _fits(cls, content: str, info) -> str:
        if not content.strip():
            raise InvalidRequest("content: must be a non-empty string")
        limit = (info.context or {}).get("max_chars", MAX_MESSAGE_CHARS)
        if len(content) > limit:
            raise InvalidRequest(f"content: {len(content)} characters, at most {limit}", status=413)
        return content


class ChatReplyOut(BaseModel):
    reply: str
    intent: str
    confidence: float
    citations: list[Citation]
    handoff: bool
    degraded: bool = Field(description="true when the model was unavailable and the reply is a KB excerpt")
    grounding: Literal["quoted", "verified_generated", "sentence_dropped", "unanswerable", "clarified",
                       "free"] | None = Field(
        None, description="how the reply is grounded in the help centre (null for canned replies: handoff, "
                          "greeting, refusals, degraded excerpts, actions)")
    action: ActionOut | None = Field(None, description="the action this reply took, or asks a parameter or a "
                                                       "confirmation for")
    message_index: int


class ChatTurnOut(RootModel[ChatReplyOut | HumanTurnOut]):
    """The bot's reply, or (while a human is asked for or answering) the note that it stays silent."""


class TokenEvent(BaseModel):
    text: str


class StreamError(BaseModel):
    error: str = Field(description="the exception's type; the turn is not stored")


CHAT_STREAM = Stream({"token": TokenEvent, "done": (ChatReplyOut, HumanTurnOut), "error": StreamError})


class TypingEvent(BaseModel):
    typing: bool
    name: str = Field(description="the agent's name")


class ConversationStatusEvent(BaseModel):
    status: CONVERSATION_STATUS
    assignee: Author | None
    queue_position: int | None


CHAT_EVENTS = Stream({"message": StoredMessage, "typing": TypingEvent, "status": ConversationStatusEvent})


class FeedbackIn(_In):
    message_index: Annotated[int, Field(ge=0, description="index of an assistant message in this session"),
                             Errors("message_index: must be the index of an assistant message in this session")]
    rating: Annotated[Literal["up", "down"], Errors("rating: must be 'up' or 'down'")]
    comment: Annotated[str, Field(max_length=2000), Errors("comment: must be a string of at most 2000 characters")] = ""

    @field_validator("message_index")
    @classmethod
    def _an_assistant_message(cls, index: int, info) -> int:
        messages = (info.context or {}).get("messages")          # the session's, from the view
        if messages is not None and (index >= len(messages) or messages[index]["role"] != "assistant"):
            raise InvalidRequest("message_index: must be the index of an assistant message in this session")
        return index


class Ok(BaseModel):
    ok: bool


class JobPath(BaseModel):
    job_id: str


class RepositoryQueued(BaseModel):
    job_id: str
    status: str


class KbJob(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Literal["queued", "running", "done", "failed"]
    kind: Literal["kb"]
    fingerprint: str | None = Field(None, description="of the folder the index was built from")
    num_chunks: int | None = None
    num_articles: int | None = None
    error: str | None = None


# ---- batch jobs -------------------------------------------------------------------------------
def _unknown_fields(v: Mapping[str, Any]) -> str:
    return f"{v['at']}: unknown fields {v['unknown']}"


class ChatTurn(_In):
    role: Literal["system", "user", "assistant"]
    content: str


class _Sampling(_In):
    model_config = ConfigDict(extra="forbid")
    error_messages: ClassVar[Errors] = Errors("{at}: out of range or of the wrong type",
                                              object="{at}: must be an object",
                                              extra_forbidden=_unknown_fields)
    max_tokens: Annotated[int, Field(ge=1, le=1024)] = 128
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    stop: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=4)] = None     # (null: refused)
    seed: JobSeed = None


class PromptItem(_Sampling):
    prompt: Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS),
                      Errors(f"{{at}}: a non-empty string of at most {MAX_PROMPT_CHARS} characters")]


class ChatItem(_Sampling):
    messages: Annotated[list[ChatTurn],
                        Field(min_length=1, description=f"at most {MAX_PROMPT_CHARS} characters in all"),
                        Errors("{at}: a non-empty list of {{role: system|user|assistant, content: str}}",
                               too_many_chars=f"{{at}}: more than {MAX_PROMPT_CHARS} characters in all")]

    @field_validator("messages")
    @classmethod
    def _fits(cls, messages: list[ChatTurn]) -> list[ChatTurn]:
        if sum(len(m.content) for m in messages) > MAX_PROMPT_CHARS:
            raise PydanticCustomError("too_many_chars", "too many characters in all")
        return messages


def _item_kind(item: Any) -> str | None:
    """Which model an item is: by its prompt or messages (neither, but unknown fields: PromptItem,
    which names them; both or neither: None, the "exactly one" error)."""
    if not isinstance(item, dict):
        return "PromptItem"                   # which then says it must be an object
    prompt, messages = "prompt" in item, "messages" in item
    if prompt != messages:
        return "PromptItem" if prompt else "ChatItem"
    return "PromptItem" if not prompt and set(item) - set(ChatItem.model_fields) else None


BatchItem = Annotated[Annotated[PromptItem, Tag("PromptItem")] | Annotated[ChatItem, Tag("ChatItem")],
                      Discriminator(_item_kind, custom_error_type="one_of_prompt_or_messages",
                                    custom_error_message="give exactly one of prompt or messages")]
REQUESTS = 'body: {"requests": [...]} as JSON, or JSONL with Content-Type application/x-ndjson'.replace("{", "{{") \
    .replace("}", "}}")                          # (a template: its braces doubled)


class BatchIn(_In):
    error_messages: ClassVar[Errors] = Errors(body=REQUESTS)
    requests: Annotated[list[BatchItem], Field(min_length=1, max_length=MAX_ITEMS),
                        Errors(list_type=REQUESTS, missing=REQUESTS,
                               too_short=f"requests: 1 to {MAX_ITEMS} items, got {{actual_length}}",
                               too_long=f"requests: 1 to {MAX_ITEMS} items, got {{actual_length}}",
                               one_of_prompt_or_messages="{item}: give exactly one of prompt or messages")]


class IdempotencyHeader(_In):
    idempotency_key: Annotated[str, Field(min_length=1, max_length=200, alias="Idempotency-Key",
                                                 description="the same key again returns the first job (200)"),
                               Errors("Idempotency-Key: 1 to 200 characters")] = None


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

