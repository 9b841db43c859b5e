"""Request and response models of the webhooks API (app/agent/webhooks_api.py)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.agent.schemas import _AgentIn
from app.store.models import DELIVERY_STATUSES, WEBHOOK_EVENTS
from httpkit.validation import Errors

WEBHOOK_EVENT = Literal[WEBHOOK_EVENTS]


class WebhookIn(_AgentIn):
    url: Annotated[str, Field(min_length=1, max_length=2000, description="http(s) URL on a public address"),
                   Errors("url: required, an http or https URL of at most 2,000 characters")]
    events: Annotated[list[WEBHOOK_EVENT], Field(min_length=1, max_length=5),
                      Errors("events: a non-empty list of conversation.created, message.created, "
                             "handoff.requested, conversation.resolved, csat.submitted")]


class WebhookPath(BaseModel):
    webhook_id: int = Field(description="the webhook's id")


class WebhookOut(BaseModel):
    id: int
    url: str
    events: list[WEBHOOK_EVENT]
    active: bool
    created_at: str | None
    secret_hint: str = Field(description="the signing secret's last four characters")


class WebhookCreated(WebhookOut):
    secret: str = Field(description="the HMAC-SHA256 signing secret, shown this once")


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class DeliveryQuery(_AgentIn):
    model_config = ConfigDict(extra="forbid", strict=False)
    limit: Annotated[int, Field(ge=1, le=200), Errors("limit: must be an integer from 1 to 200")] = 50


class DeliveryOut(BaseModel):
    id: str
    webhook_id: int
    event: WEBHOOK_EVENT
    status: Literal[DELIVERY_STATUSES]
    attempts: int
    last_status_code: int | None
    last_error: str
    created_at: str | None
    finished_at: str | None


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]
