"""A conversation's way to a human and back, in the conversation database.

    open ──request──▶ pending_human ──claim──▶ human ──resolve──▶ resolved
      ▲                 │   (agent may also claim an open one)       │
      └──── cancel ─────┘                 a new customer message ────┘ reopens it to the bot

Each transition is one conditional UPDATE (`... WHERE status IN (...)`), so of two agents who
claim at once exactly one changes the row; the other sees 0 rows changed and gets a Conflict.
Every agent action writes an audit event in the same transaction.
"""
from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.store.conversations import ConversationStore, message_view
from app.store.db import Database
from app.store.models import Agent, AuditEvent, Conversation, Handoff, utcnow


class Conflict(Exception):
    """The conversation is not in a state that allows this (HTTP 409)."""


class NotFound(Exception):
    """No such conversation for this tenant (HTTP 404)."""


def audit(s: Session, tenant: str, action: str, agent_id: int | None = None, sid: str | None = None,
          **detail) -> None:
    s.add(AuditEvent(tenant_id=tenant, agent_id=agent_id, conversation_id=sid, action=action, detail=detail))


def _open_handoff(s: Session, sid: str) -> Handoff | None:
    return s.scalar(select(Handoff).where(Handoff.conversation_id == sid, Handoff.resolved_at.is_(None))
                    .order_by(Handoff.id.desc()).limit(1))


def _transition(s: Session, tenant: str, sid: str, to: str, allowed: tuple[str, ...], **values) -> bool:
    done = s.execute(update(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant,
                                                Conversation.status.in_(allowed))
                     .values(status=to, updated_at=utcnow(), **values))
    return done.rowcount == 1


class Handoffs:
    def __init__(self, db: Database):
        self.db = db

    def _current(self, s: Session, tenant: str, sid: str) -> Conversation:
        conv = s.scalar(select(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant))
        if conv is None:
            raise NotFound("unknown conversation")
        return conv

    # ---- the customer's side

    def request(self, tenant: str, sid: str, reason: str = "customer") -> bool:
        """Ask for a human; False when one is already requested or at work."""
        with self.db.session() as s:
            if not _transition(s, tenant, sid, "pending_human", ("open", "resolved"), assignee_id=None):
                self._current(s, tenant, sid)
                return False
            s.add(Handoff(conversation_id=sid, tenant_id=tenant))
            audit(s, tenant, "handoff_requested", sid=sid, reason=reason)
            return True

    def cancel(self, tenant: str, sid: str) -> str:
        """The customer goes back to the bot while still waiting; returns the status after."""
        with self.db.session() as s:
            if _transition(s, tenant, sid, "open", ("pending_human",)):
                handoff = _open_handoff(s, sid)
                if handoff is not None:
                    handoff.resolved_at = utcnow()
                audit(s, tenant, "handoff_cancelled", sid=sid)
                return "open"
            return self._current(s, tenant, sid).status

    def reopen(self, tenant: str, sid: str) -> bool:
        """A resolved conversation the customer writes in again returns to the bot."""
        with self.db.session() as s:
            return _transition(s, tenant, sid, "open", ("resolved",), assignee_id=None)

    def waiting(self, tenant: str, sid: str) -> dict | None:
        """Queue place (1 = next) and seconds waited, while pending; else None."""
        with self.db.session(readonly=True) as s:
            conv = self._current(s, tenant, sid)
            if conv.status != "pending_human":
                return None
            handoff = _open_handoff(s, sid)
            position = ConversationStore._queue_positions(s, tenant).get(sid)
            waited = (utcnow() - handoff.requested_at).total_seconds() if handoff is not None else 0.0
            return {"queue_position": position, "waited_s": round(waited, 1)}

    # ---- the agent's side

    def claim(self, tenant: str, sid: str, agent_id: int) -> dict:
        """Take the conversation: status human, assignee this agent. Claiming one's own again
        is a no-op; one claimed by another agent, or resolved, is a Conflict."""
        with self.db.session() as s:
            now = utcnow()
            changed = _transition(s, tenant, sid, "human", ("pending_human", "open"), assignee_id=agent_id)
            if changed:
                handoff = _open_handoff(s, sid)
                if handoff is None:                           # an agent took over an open chat
                    handoff = Handoff(conversation_id=sid, tenant_id=tenant, requested_at=now)
                    s.add(handoff)
                handoff.claimed_by, handoff.claimed_at = agent_id, now
                audit(s, tenant, "claim", agent_id, sid)
            else:
                conv = self._current(s, tenant, sid)
                if conv.status == "resolved":
                    raise Conflict("the conversation is resolved")
                if conv.assignee_id != agent_id:
                    name = conv.assignee.name if conv.assignee is not None else "another agent"
                    raise Conflict(f"the conversation is already claimed by {name}")
            s.flush()
            conv = self._current(s, tenant, sid)
            s.refresh(conv)
            return {"id": sid, "status": conv.status, "assignee": {"id": agent_id, "name": conv.assignee.name},
                    "changed": changed}

    def reply(self, tenant: str, sid: str, agent_id: int, content: str) -> tuple[dict, float | None]:
        """Store the agent's (already cleaned) message; only the assignee of a claimed
        conversation may write. Returns the message and, for the handoff's first reply, the
        seconds since the customer asked for a human."""
        with self.db.session() as s:
            message = ConversationStore.add_message(s, tenant, sid, "agent", content, statuses=("human",),
                                                    assignee_id=agent_id, agent_id=agent_id)
            if message is None:
                conv = self._current(s, tenant, sid)
                raise Conflict("claim the conversation before replying" if conv.status != "resolved"
                               else "the conversation is resolved")
            handoff, first_wait = _open_handoff(s, sid), None
            if handoff is not None and handoff.first_reply_at is None:
                handoff.first_reply_at = message.created_at
                first_wait = (message.created_at - handoff.requested_at).total_seconds()
            audit(s, tenant, "reply", agent_id, sid, message_index=message.seq)
            message.agent = s.get(Agent, agent_id)
            return message_view(message), first_wait

    def resolve(self, tenant: str, sid: str, agent_id: int) -> dict:
        with self.db.session() as s:
            if not _transition(s, tenant, sid, "resolved", ("open", "pending_human", "human")):
                self._current(s, tenant, sid)
                raise Conflict("the conversation is already resolved")
            handoff = _open_handoff(s, sid)
            if handoff is not None:
                handoff.resolved_at = utcnow()
            audit(s, tenant, "resolve", agent_id, sid)
            return {"id": sid, "status": "resolved"}
