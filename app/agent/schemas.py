"""Request and response models of the agent console's API (/api/agent). As in app/schemas.py, the
views parse bodies with them (`validate_body`) and /openapi.json is generated from them, so the
document states what the app enforces.

    sign-in (app/agent/auth.py)     AgentLoginIn -> AgentSessionOut; CsrfHeader on every
                                    state-changing request after login
    inbox (app/agent/api.py)        ConversationListQuery -> ConversationList, ConversationDetail,
                                    ClaimOut, AgentMessageIn -> MessageOut, ReportQuery -> ReportOut,
                                    AGENT_EVENTS (the SSE stream)
    knowledge gaps                  GapsQuery -> GapsOut

The improvement loop's APIs keep their models beside this file: faq_schemas.py,
webhook_schemas.py, experiment_schemas.py.
"""
from __future__ import annotations

import datetime as dt
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.schemas import BODY, ActionOut
from httpkit.openapi import Stream
from httpkit.validation import Errors, InvalidRequest

CSRF_HEADER = "X-CSRF-Token"


class _AgentIn(BaseModel):
    """A request body: strict JSON types; unknown fields ignored (as app/schemas.py's `_In`)."""
    model_config = ConfigDict(extra="allow", strict=True)
    error_messages: ClassVar[Errors] = Errors(body=BODY)


# ---- sign-in (app/agent/auth.py) ---------------------------------------------------------------
class AgentLoginIn(_AgentIn):
    email: Annotated[str, Field(min_length=1, max_length=254), Errors("email: required, a string")]
    password: Annotated[str, Field(min_length=1, max_length=1024),
                        Errors("password: required, a string of at most 1024 characters")]


class AgentOut(BaseModel):
    id: int
    email: str
    name: str
    tenant: str = Field(description="the tenant whose conversations the agent answers")


class AgentSessionOut(BaseModel):
    """The signed-in agent, with the token its state-changing requests send in X-CSRF-Token."""
    agent: AgentOut
    csrf_token: str = Field(description=f"send it in the {CSRF_HEADER} header of every POST, PUT, PATCH "
                                        "and DELETE of the agent API")


class CsrfHeader(BaseModel):
    """The header a state-changing agent request must carry (`headers=` of `@documented`)."""
    model_config = ConfigDict(populate_by_name=True)
    csrf_token: str = Field(alias=CSRF_HEADER, description="the csrf_token of POST /api/agent/login or "
                                                           "GET /api/agent/session")


# ---- the inbox and conversations (app/agent/api.py) ---------------------------------------------
STATUS = Literal["open", "pending_human", "human", "resolved"]


class ConversationPath(BaseModel):
    cid: str = Field(description="the conversation's id (the widget's session id)")


class ConversationListQuery(_AgentIn):
    model_config = ConfigDict(extra="forbid", strict=False)       # query strings are text
    status: Annotated[STATUS | None, Errors("status: must be one of open, pending_human, human, resolved")] = None
    limit: Annotated[int, Field(ge=1, le=100), Errors("limit: must be an integer from 1 to 100")] = 50
    before: Annotated[str | None, Field(max_length=200),
                      Errors("before: the `next` cursor of the previous page")] = None


class Assignee(BaseModel):
    id: int
    name: str


class ConversationItem(BaseModel):
    id: str
    status: STATUS
    summary: str = Field(description="the handoff summary written for the agent ('' until written)")
    first_question: str = Field(description="the customer's first message: the inbox title ('' if none)")
    last_message: str
    updated_at: str = Field(description="ISO 8601, UTC")
    assignee: Assignee | None
    queue_position: int | None = Field(description="1: the next waiting conversation (pending_human only)")


class ConversationList(BaseModel):
    conversations: list[ConversationItem]
    next: str | None = Field(description="pass as `before` for the next page; null on the last page")


class AgentView(BaseModel):
    name: str


class CitationView(BaseModel):
    model_config = ConfigDict(extra="allow")
    title: str | None = None
    url: str | None = None


class MessageView(BaseModel):
    index: int
    role: Literal["user", "assistant", "agent", "system"]
    content: str
    created_at: str
    citations: list[CitationView]
    grounding: str | None
    intent: str | None
    degraded: bool
    blocked: bool
    action: ActionOut | None = Field(None, description="the support-chat action the reply is about (docs/actions.md)")
    author: AgentView | None = Field(description="the agent who wrote it (role agent)")


class FeedbackView(BaseModel):
    kind: Literal["message", "csat"]
    rating: str = Field(description="up | down for a message; 1..5 for the conversation (csat)")
    comment: str
    message_index: int | None
    created_at: str


class ConversationDetail(BaseModel):
    id: str
    status: STATUS
    summary: str
    assignee: Assignee | None
    contact_email: str | None = Field(description="left by the customer while waiting")
    created_at: str
    updated_at: str
    messages: list[MessageView]
    feedback: list[FeedbackView]


class ClaimOut(BaseModel):
    id: str
    status: Literal["human"]
    assignee: Assignee
    changed: bool = Field(description="false when this agent already held the conversation (a no-op)")


class ResolveOut(BaseModel):
    id: str
    status: Literal["resolved"]


class AgentMessageIn(_AgentIn):
    content: Annotated[str, Field(min_length=1, pattern=r"\S", json_schema_extra={"maxLength": 4000},
                                  description="the reply; PII is masked before it is stored and sent"),
                       Errors("content: must be a non-empty string")]

    @field_validator("content")
    @classmethod
    def _fits(cls, content: str, info) -> str:
        if not content.strip():
            raise InvalidRequest("content: must be a non-empty string")
        limit = (info.context or {}).get("max_chars", 4000)
        if len(content) > limit:
            raise InvalidRequest(f"content: {len(content)} characters, at most {limit}", status=413)
        return content


class MessageOut(BaseModel):
    message: MessageView


class TypingIn(_AgentIn):
    typing: Annotated[bool, Errors("typing: must be true or false")]


class SuggestionOut(BaseModel):
    suggestion: str = Field(description="a draft for the agent to edit; '' when the bot has none")
    citations: list[CitationView]
    grounding: str | None


class ReportQuery(_AgentIn):
    model_config = ConfigDict(extra="forbid", strict=False, populate_by_name=True)
    start: Annotated[dt.date | None,
                     Field(alias="from", description="first day, YYYY-MM-DD (default: 6 days before `to`)"),
                     Errors("from: must be a date YYYY-MM-DD")] = None
    end: Annotated[dt.date | None, Field(alias="to", description="last day, YYYY-MM-DD (default: today, UTC)"),
                   Errors("to: must be a date YYYY-MM-DD")] = None

    @model_validator(mode="after")
    def _range(self):
        self.end = self.end or dt.datetime.now(dt.UTC).date()
        self.start = self.start or self.end - dt.timedelta(days=6)
        if self.end >= dt.date.max:
            raise InvalidRequest(f"to: must be before {dt.date.max.isoformat()}")
        if self.start > self.end:
            raise InvalidRequest("from: must not be after to")
        if (self.end - self.start).days > 366:
            raise InvalidRequest("from, to: at most 366 days")
        return self


class ReportDay(BaseModel):
    date: str
    conversations: int
    handoffs: int
    csat_average: float | None
    resolution_rate: float | None


class ReportOutcomes(BaseModel):
    bot_resolved: int
    handed_off: int
    human_resolved: int
    abandoned: int
    reopened: int


class ReportOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    start: str = Field(alias="from")
    end: str = Field(alias="to")
    conversations: int
    handoffs: int
    handoff_rate: float | None = Field(description="share of conversations that asked for a human (0..1)")
    bot_resolved_share: float | None = Field(description="share the bot handled alone (0..1)")
    median_first_human_response_s: float | None
    csat_average: float | None
    csat_count: int
    resolution_rate: float | None = Field(description="bot_resolved over the decided conversations (0..1): "
                                          "Intercom Fin's rule, see docs/agent-console.md")
    outcomes: ReportOutcomes = Field(description="conversations per outcome")
    undecided: int = Field(description="conversations still inside the resolution window")
    resolution_window_h: float
    daily: list[ReportDay]


class GapsQuery(ReportQuery):
    limit: Annotated[int, Field(ge=1, le=200, description="at most this many clusters (default 50)"),
                     Errors("limit: must be an integer from 1 to 200")] = 50


class GapReasons(BaseModel):
    unanswerable: int = Field(description="questions the help centre had nothing on")
    low_support: int = Field(description="generated replies that lost unsupported sentences")
    handed_off: int = Field(description="questions after which the customer asked for a human")


class GapCluster(BaseModel):
    id: str = Field(description="the cluster's id: the same label keeps the same id across ranges")
    label: str = Field(description="the question nearest the cluster's centre")
    size: int = Field(description="questions in the cluster")
    conversations: int
    examples: list[str] = Field(description="up to 5 distinct questions, newest first")
    last_seen: str = Field(description="when the newest was asked (ISO 8601, UTC)")
    reasons: GapReasons


class GapsOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    start: str = Field(alias="from")
    end: str = Field(alias="to")
    questions: int = Field(description="gap questions in the range (the newest 2,000 are clustered)")
    method: str = Field(description="embeddings, or words while the embedder is unavailable")
    clusters: list[GapCluster] = Field(description="largest first")


class HandoffEvent(BaseModel):
    conversation: ConversationItem


class AgentMessageEvent(BaseModel):
    conversation_id: str
    message: MessageView


class AgentStatusEvent(BaseModel):
    conversation_id: str
    status: STATUS
    assignee: Assignee | None


AGENT_EVENTS = Stream({"handoff": HandoffEvent, "message": AgentMessageEvent, "status": AgentStatusEvent})

