"""The events a tenant's webhooks receive, queued for delivery (the `deliver_webhook` task,
HMAC-signed, retried with backoff, each attempt in the delivery log):

    conversation.created    {"conversation_id"}
    message.created         {"conversation_id", "message": {"index", "role", "content", ...}}
    handoff.requested       {"conversation_id", "reason"}
    conversation.resolved   {"conversation_id", "agent": {"name"}}
    csat.submitted          {"conversation_id", "rating", "comment"}

Emitting never fails or slows the request that caused it: with no webhook it is one cached
lookup; otherwise a delivery row and a queued task, and any error is logged and dropped.
"""
from __future__ import annotations

import datetime as dt
import logging

from flask import current_app

log = logging.getLogger(__name__)


def emit(tenant: str, event: str, data: dict) -> None:
    try:
        store = current_app.extensions["webhooks"]
        subscribers = store.subscribers(tenant, event)
        if not subscribers:
            return
        from app.jobs.tasks import deliver_webhook, start_or_queue
        payload = {"event": event, "tenant": tenant, "created_at": dt.datetime.now(dt.UTC).isoformat(), "data": data}
        for webhook_id, _url, _secret in subscribers:
            start_or_queue(deliver_webhook, store.enqueue(webhook_id, event, payload))
    except Exception:                          # noqa: BLE001 - a webhook never breaks a chat turn
        log.exception("webhook event %s for tenant %s not queued", event, tenant)
