"""Webhook subscriptions and their delivery log in the conversation store (tables webhooks and
webhook_deliveries). The secret is shown once, when the webhook is created; lists show its last
four characters only."""
from __future__ import annotations

import secrets
import threading
import time

from sqlalchemy import delete, select, update

from app.store.conversations import iso
from app.store.db import Database
from app.store.handoffs import NotFound
from app.store.models import Webhook, WebhookDelivery, utcnow

MAX_WEBHOOKS = 10                    # per tenant


def webhook_view(w: Webhook, secret: bool = False) -> dict:
    out = {"id": w.id, "url": w.url, "events": list(w.events or []), "active": w.active,
           "created_at": iso(w.created_at), "secret_hint": "…" + w.secret[-4:]}
    if secret:
        out["secret"] = w.secret
    return out


def delivery_view(d: WebhookDelivery) -> dict:
    return {"id": d.id, "webhook_id": d.webhook_id, "event": d.event, "status": d.status, "attempts": d.attempts,
            "last_status_code": d.last_status_code, "last_error": d.last_error, "created_at": iso(d.created_at),
            "finished_at": iso(d.finished_at)}


class TooMany(Exception):
    """The tenant has MAX_WEBHOOKS already (HTTP 409)."""


class WebhookStore:
    def __init__(self, db: Database, cache_s: float = 2.0):
        """`cache_s`: how long a tenant's subscriber list is reused (every chat message asks for
        it); this process's own changes clear it at once."""
        self.db, self.cache_s = db, cache_s
        self._cache: dict[str, tuple[float, list]] = {}
        self._lock = threading.Lock()

    def add(self, tenant: str, url: str, events: list[str]) -> dict:
        """A new webhook with a fresh signing secret (returned this once)."""
        with self.db.session() as s:
            count = len(s.scalars(select(Webhook.id).where(Webhook.tenant_id == tenant)).all())
            if count >= MAX_WEBHOOKS:
                raise TooMany(f"a tenant has at most {MAX_WEBHOOKS} webhooks; delete one first")
            hook = Webhook(tenant_id=tenant, url=url, secret="whsec_" + secrets.token_urlsafe(32),
                           events=list(events), active=True)
            s.add(hook)
            s.flush()
            view = webhook_view(hook, secret=True)
        self._cache.pop(tenant, None)
        return view

    def list(self, tenant: str) -> list[dict]:
        with self.db.session(readonly=True) as s:
            return [webhook_view(w) for w in s.scalars(select(Webhook).where(Webhook.tenant_id == tenant)
                                                        .order_by(Webhook.id)).all()]

    def remove(self, tenant: str, webhook_id: int) -> None:
        with self.db.session() as s:
            gone = s.execute(delete(Webhook).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant))
            if gone.rowcount != 1:
                raise NotFound(str(webhook_id))
        self._cache.pop(tenant, None)

    def subscribers(self, tenant: str, event: str) -> list[tuple[int, str, str]]:
        """(id, url, secret) of the tenant's active webhooks that take `event`."""
        with self._lock:
            cached = self._cache.get(tenant)
        if cached is None or time.monotonic() - cached[0] > self.cache_s:
            with self.db.session(readonly=True) as s:
                rows = s.execute(select(Webhook.id, Webhook.url, Webhook.secret, Webhook.events).where(
                    Webhook.tenant_id == tenant, Webhook.active.is_(True))).all()
            cached = (time.monotonic(), [tuple(r) for r in rows])
            with self._lock:
                self._cache[tenant] = cached
        return [(i, url, secret) for i, url, secret, events in cached[1] if event in (events or [])]

    def enqueue(self, webhook_id: int, event: str, payload: dict) -> str:
        delivery_id = "whd_" + secrets.token_hex(12)
        with self.db.session() as s:
            s.add(WebhookDelivery(id=delivery_id, webhook_id=webhook_id, event=event, payload=payload,
                                  status="pending", attempts=0, last_error=""))
        return delivery_id

    def delivery(self, delivery_id: str) -> tuple[dict, str, str] | None:
        """(the delivery, its webhook's URL, secret), or None when the webhook was deleted."""
        with self.db.session(readonly=True) as s:
            row = s.execute(select(WebhookDelivery, Webhook.url, Webhook.secret).join(
                Webhook, Webhook.id == WebhookDelivery.webhook_id).where(WebhookDelivery.id == delivery_id)).first()
            if row is None:
                return None
            d, url, secret = row
            return {**delivery_view(d), "payload": d.payload}, url, secret

    def record(self, delivery_id: str, ok: bool, final: bool, status_code: int | None, error: str) -> None:
        """One attempt's outcome: delivered, failed for good (`final`), or pending a retry."""
        status = "delivered" if ok else ("failed" if final else "pending")
        with self.db.session() as s:
            s.execute(update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(
                attempts=WebhookDelivery.attempts + 1, status=status, last_status_code=status_code,
                last_error=error[:500], finished_at=utcnow() if ok or final else None))

    def deliveries(self, tenant: str, webhook_id: int, limit: int = 50) -> list[dict]:
        with self.db.session(readonly=True) as s:
            if s.scalar(select(Webhook.id).where(Webhook.id == webhook_id, Webhook.tenant_id == tenant)) is None:
                raise NotFound(str(webhook_id))
            rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
                             .order_by(WebhookDelivery.created_at.desc()).limit(limit)).all()
            return [delivery_view(d) for d in rows]
