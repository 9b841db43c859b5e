"""Webhooks for the agent console and API (same session and CSRF rules as app/agent/api.py):
a tenant's subscriptions to conversation events (app/webhook_events.py) and their delivery log.

    GET    /api/agent/webhooks                          the tenant's webhooks (secrets hidden)
    POST   /api/agent/webhooks  {"url", "events"}       201, with the signing secret, shown once
    DELETE /api/agent/webhooks/<id>
    GET    /api/agent/webhooks/<id>/deliveries?limit=   newest first: status, attempts, last error
"""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request

from app.agent.auth import agent_required, current_agent
from app.agent.webhook_schemas import (
    DeliveryList,
    DeliveryQuery,
    WebhookCreated,
    WebhookIn,
    WebhookList,
    WebhookPath,
)
from app.errors import PlainError, render, validate_body
from app.schemas import Error, Ok, error_responses
from app.store.handoffs import NotFound
from app.store.webhooks import TooMany
from httpkit.openapi import documented
from httpkit.webhooks import UnsafeURL, check_url

bp = Blueprint("agent_webhooks", __name__, url_prefix="/api/agent/webhooks")
bp.register_error_handler(PlainError, render)
bp.before_request(agent_required)
_ERRORS = error_responses(Error, 400, 401, 429, 503)
_ONE = {**_ERRORS, **error_responses(Error, 404)}


def _store():
    return current_app.extensions["webhooks"]


@bp.get("")
@documented(responses={200: WebhookList, **_ERRORS}, tags=("agent",))
def webhooks():
    """The tenant's webhooks; each secret shows its last four characters only."""
    return jsonify({"webhooks": _store().list(current_agent().tenant_id)})


@bp.post("")
@documented(body=WebhookIn, responses={201: WebhookCreated, **_ERRORS, **error_responses(Error, 409)},
            tags=("agent",))
def add():
    """Subscribe a URL to events. The URL must be http(s) on a public address (a private,
    loopback or link-local one only if WEBHOOK_ALLOW_HOSTS names it). The response carries the
    signing secret, this once."""
    body = validate_body(WebhookIn, request.get_json(silent=True))
    allow = current_app.config["WEBHOOK_ALLOW_HOSTS"].split(",")
    try:
        url = check_url(body.url, allow)
    except UnsafeURL as exc:
        raise PlainError(400, str(exc)) from None
    try:
        created = _store().add(current_agent().tenant_id, url, list(dict.fromkeys(body.events)))
    except TooMany as exc:
        raise PlainError(409, str(exc)) from None
    return jsonify(created), 201


@bp.delete("/<int:webhook_id>")
@documented(path=WebhookPath, responses={200: Ok, **_ONE}, tags=("agent",))
def remove(webhook_id: int):
    """Delete a webhook and its delivery log; queued deliveries are dropped."""
    try:
        _store().remove(current_agent().tenant_id, webhook_id)
    except NotFound:
        raise PlainError(404, f"unknown webhook {webhook_id}") from None
    return jsonify({"ok": True})


@bp.get("/<int:webhook_id>/deliveries")
@documented(path=WebhookPath, query=DeliveryQuery, responses={200: DeliveryList, **_ONE}, tags=("agent",))
def deliveries(webhook_id: int):
    """The webhook's delivery log, newest first."""
    query = validate_body(DeliveryQuery, request.args.to_dict())
    try:
        rows = _store().deliveries(current_agent().tenant_id, webhook_id, query.limit)
    except NotFound:
        raise PlainError(404, f"unknown webhook {webhook_id}") from None
    return jsonify({"deliveries": rows})
