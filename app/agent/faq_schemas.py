"""Request and response models of the FAQ drafts API (app/agent/faq_api.py)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.agent.schemas import _AgentIn
from app.store.models import FAQ_STATUSES
from httpkit.validation import Errors

FAQ_STATUS = Literal[FAQ_STATUSES]


class FaqDraftQuery(_AgentIn):
    model_config = ConfigDict(extra="forbid", strict=False)
    status: Annotated[FAQ_STATUS, Errors("status: must be one of pending, approved, rejected")] = "pending"
    limit: Annotated[int, Field(ge=1, le=200), Errors("limit: must be an integer from 1 to 200")] = 100


class FaqDraftPath(BaseModel):
    draft_id: int = Field(description="the draft's id")


class FaqApproveIn(_AgentIn):
    question: Annotated[str | None, Field(min_length=1, max_length=300, pattern=r"\S",
                                          description="the question as it will be published (default: the draft's)"),
                        Errors("question: a non-empty string of at most 300 characters")] = None
    answer: Annotated[str | None, Field(min_length=1, max_length=2000, pattern=r"\S",
                                        description="the answer as it will be published (default: the draft's)"),
                      Errors("answer: a non-empty string of at most 2,000 characters")] = None


class FaqDraftOut(BaseModel):
    id: int
    question: str
    answer: str
    conversation_id: str | None = Field(description="the resolved conversation it was drafted from")
    status: FAQ_STATUS
    merged: int = Field(description="near-duplicate drafts folded into this one")
    created_at: str | None
    decided_at: str | None


class FaqDraftList(BaseModel):
    drafts: list[FaqDraftOut]
