"""Which live events each step of a handoff sends, and to whom (app/live_events.py carries them).

    customer's widget   conversation_channel(tenant, id): message (an agent's), typing, status
    tenant's agents     tenant_channel(tenant): handoff (a new one), message (a customer's, in a
                        conversation that waits for or has a human), status (claimed, resolved...)

Events are sent after the database commit; a missed one costs nothing but latency: the widget
and the console re-read the conversation when their stream reconnects.
"""
from __future__ import annotations

from flask import current_app

from app.live_events import conversation_channel, tenant_channel


def _publish(channel: str, kind: str, data: dict) -> None:
    current_app.extensions["live_events"].publish(channel, kind, data)


def handoff_requested(tenant: str, sid: str) -> None:
    item = current_app.extensions["support_chat"]["store"].list_item(tenant, sid)
    if item is not None:
        _publish(tenant_channel(tenant), "handoff", {"conversation": item})
        status_changed(tenant, sid, item["status"], None, item["queue_position"])


def customer_message(tenant: str, sid: str, message: dict) -> None:
    _publish(tenant_channel(tenant), "message", {"conversation_id": sid, "message": message})


def agent_message(tenant: str, sid: str, message: dict) -> None:
    _publish(conversation_channel(tenant, sid), "message", message)
    _publish(tenant_channel(tenant), "message", {"conversation_id": sid, "message": message})


def agent_typing(tenant: str, sid: str, name: str, typing: bool) -> None:
    _publish(conversation_channel(tenant, sid), "typing", {"typing": typing, "name": name})


def status_changed(tenant: str, sid: str, status: str, assignee: dict | None,
                   queue_position: int | None = None) -> None:
    """The widget sees the agent's name only; the console sees the assignee's id too."""
    _publish(conversation_channel(tenant, sid), "status",
             {"status": status, "assignee": {"name": assignee["name"]} if assignee else None,
              "queue_position": queue_position})
    _publish(tenant_channel(tenant), "status", {"conversation_id": sid, "status": status, "assignee": assignee})
