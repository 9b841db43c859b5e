"""The support-chat actions' call log in the conversation store (table action_calls): one row per
idempotency key, so a call is made once however often a confirmation is retried
(pipelines/actions.py CallLog). The arguments come from the customer's cleaned text (PII
redacted before the model saw it)."""
from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.store.conversations import iso
from app.store.db import Database
from app.store.models import ActionCall, utcnow


def call_view(c: ActionCall) -> dict:
    return {"id": c.id, "tenant_id": c.tenant_id, "conversation_id": c.conversation_id, "action": c.action,
            "arguments": dict(c.arguments or {}), "status": c.status, "http_status": c.http_status,
            "latency_ms": c.latency_ms, "reply": c.reply, "created_at": iso(c.created_at),
            "finished_at": iso(c.finished_at)}


class SqlCallLog:
    def __init__(self, db: Database):
        self.db = db

    def record(self, key: str, tenant_id: str, conversation_id: str | None, action: str, arguments: dict,
               status: str) -> dict | None:
        try:
            with self.db.session() as s:
                s.add(ActionCall(id=key, tenant_id=tenant_id, conversation_id=conversation_id, action=action,
                                 arguments=arguments, status=status, reply=""))
            return None
        except IntegrityError:
            return self.get(key)

    def claim(self, key: str, from_status: str) -> bool:
        """One statement, so two confirmations at once cannot both move it on."""
        with self.db.session() as s:
            moved = s.execute(update(ActionCall).where(ActionCall.id == key, ActionCall.status == from_status)
                              .values(status="running"))
            return moved.rowcount == 1

    def finish(self, key: str, status: str, http_status: int | None, latency_ms: float, reply: str) -> None:
        with self.db.session() as s:
            s.execute(update(ActionCall).where(ActionCall.id == key).values(
                status=status, http_status=http_status, latency_ms=round(latency_ms, 1), reply=reply,
                finished_at=utcnow()))

    def get(self, key: str) -> dict | None:
        with self.db.session(readonly=True) as s:
            row = s.get(ActionCall, key)
            return call_view(row) if row is not None else None

    def for_conversation(self, tenant_id: str, conversation_id: str) -> list[dict]:
        """The conversation's calls, oldest first (the agent console's audit view)."""
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(ActionCall).where(ActionCall.tenant_id == tenant_id,
                                                      ActionCall.conversation_id == conversation_id)
                             .order_by(ActionCall.created_at)).all()
            return [call_view(r) for r in rows]
