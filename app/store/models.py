"""The conversation store's tables (SQLAlchemy 2.x declarative models). Alembic migrations in
app/store/migrations/ create and change them; `python -m app db upgrade` applies them.

    agents        a tenant's support agents (email, scrypt password hash, active flag)
    agent_sessions  each sign-in (only the token's hash); logout revokes it on the server
    conversations one customer chat: status open | pending_human | human | resolved, the
                  handoff summary, the assignee, when it changed
    messages      its turns in order: role user | assistant | agent | system, redacted text,
                  the citations and grounding outcome of a bot reply, the agent who wrote one
    handoffs      each request for a human: when asked, claimed, first answered, resolved
    feedback      thumbs on a bot reply (kind "message") and the end-of-chat rating (kind "csat")
    audit_events  who did what (logins, claims, replies, resolutions, account changes)
    action_calls  each support-chat action (pipelines/actions.py): its idempotency key, arguments
                  (from cleaned text), status, the endpoint's HTTP status, latency and the reply

Only cleaned text (PII redacted, banned terms masked) is ever written here. Times are UTC.
"""
from __future__ import annotations

import datetime as dt

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

STATUSES = ("open", "pending_human", "human", "resolved")
ROLES = ("user", "assistant", "agent", "system")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite stores it naive)."""
    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(dt.UTC) if value is not None else None

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value


class Base(DeclarativeBase):
    pass


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)           # stored lower-case
    name: Mapped[str] = mapped_column(String(120))
    password_hash: Mapped[str] = mapped_column(String(255))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_login_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AgentSession(Base):
    __tablename__ = "agent_sessions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)       # sha256 of the cookie's token
    agent_id: Mapped[int] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Conversation(Base):
    __tablename__ = "conversations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)          # the widget's session id
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="open")
    summary: Mapped[str] = mapped_column(Text, default="")                  # the handoff summary
    assignee_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    contact_email: Mapped[str | None] = mapped_column(String(254), nullable=True)
    # the email fallback: the last message the customer's widget showed them (POST .../seen) and
    # the last agent reply mailed; replies after both are what the next email carries
    customer_seen: Mapped[int | None] = mapped_column(Integer, nullable=True)
    emailed_through: Mapped[int | None] = mapped_column(Integer, nullable=True)
    num_messages: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # the A/B experiment arm the conversation was assigned to (app/store/experiments.py), if any
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    arm: Mapped[str | None] = mapped_column(String(32), nullable=True)
    assignee: Mapped[Agent | None] = relationship(lazy="joined")
    __table_args__ = (Index("ix_conversations_tenant_status_updated", "tenant_id", "status", "updated_at"),
                      Index("ix_conversations_updated", "updated_at"),
                      Index("ix_conversations_experiment_arm", "experiment_id", "arm"))


class Message(Base):
    __tablename__ = "messages"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)                               # 0, 1, 2 ... in the conversation
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    citations: Mapped[list] = mapped_column(JSON, default=list)
    intent: Mapped[str | None] = mapped_column(String(64), nullable=True)
    grounding: Mapped[str | None] = mapped_column(String(32), nullable=True)
    degraded: Mapped[bool] = mapped_column(Boolean, default=False)
    blocked: Mapped[bool] = mapped_column(Boolean, default=False)
    agent_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    action: Mapped[dict | None] = mapped_column(JSON, nullable=True)        # the bot reply's action, if any
    first_token_ms: Mapped[float | None] = mapped_column(Float, nullable=True)   # a bot reply's first text
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    agent: Mapped[Agent | None] = relationship(lazy="joined")
    __table_args__ = (UniqueConstraint("conversation_id", "seq", name="uq_messages_conversation_seq"),)


class Handoff(Base):
    __tablename__ = "handoffs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    requested_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    claimed_by: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    first_reply_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resolved_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    __table_args__ = (Index("ix_handoffs_tenant_requested", "tenant_id", "requested_at"),)


class Feedback(Base):
    __tablename__ = "feedback"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))                           # "message" | "csat"
    message_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rating: Mapped[str] = mapped_column(String(8))                          # "up" | "down" | "1".."5"
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditEvent(Base):
    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    agent_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    conversation_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    action: Mapped[str] = mapped_column(String(32))
    detail: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    __table_args__ = (Index("ix_audit_tenant_created", "tenant_id", "created_at"),)


ACTION_STATUSES = ("awaiting_confirmation", "running", "succeeded", "failed", "timeout", "unreachable", "declined")


class ActionCall(Base):
    __tablename__ = "action_calls"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)           # the idempotency key
    tenant_id: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"),
                                                        nullable=True, index=True)
    action: Mapped[str] = mapped_column(String(64))
    arguments: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(24))
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    reply: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    __table_args__ = (Index("ix_action_calls_tenant_created", "tenant_id", "created_at"),)


FAQ_STATUSES = ("pending", "approved", "rejected")


class FaqDraft(Base):
    """A help-centre entry drafted from an agent's answer (pipelines/faq_draft.py), kept pending
    until an agent approves (possibly edited) or rejects it; approved ones become articles."""
    __tablename__ = "faq_drafts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str | None] = mapped_column(ForeignKey("conversations.id", ondelete="SET NULL"),
                                                        nullable=True)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    merged: Mapped[int] = mapped_column(Integer, default=0)                # near-duplicate drafts folded in
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    decided_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    decided_by: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="SET NULL"), nullable=True)
    __table_args__ = (Index("ix_faq_drafts_tenant_status", "tenant_id", "status"),)


WEBHOOK_EVENTS = ("conversation.created", "message.created", "handoff.requested", "conversation.resolved",
                  "csat.submitted")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


class Webhook(Base):
    """A tenant's subscription: events POSTed, HMAC-signed, to a URL (app/webhook_events.py)."""
    __tablename__ = "webhooks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(128))
    events: Mapped[list] = mapped_column(JSON, default=list)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook, with its attempts' outcome: the console's delivery log."""
    __tablename__ = "webhook_deliveries"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    __table_args__ = (Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at"),)


EXPERIMENT_FACTORS = ("answer_mode", "system_prompt", "max_tokens")


class Experiment(Base):
    """A tenant's A/B test: conversations are split between arms by weight, each arm changing one
    factor of the chat (app/store/experiments.py); results in app/reports/experiments.py."""
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(80))
    factor: Mapped[str] = mapped_column(String(32))
    arms: Mapped[list] = mapped_column(JSON, default=list)          # [{"name", "weight", "value"}], control first
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    stopped_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
