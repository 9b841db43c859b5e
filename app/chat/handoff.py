"""The customer's side of a handoff to a human (same site-key auth, origins and limits as the
chat API in app/chat/routes.py):

    GET  /api/chat/sessions/<id>/events          SSE: the agent's messages, typing, status
                                                 (?site_key=... for EventSource; Last-Event-ID)
    POST /api/chat/sessions/<id>/handoff/cancel  back to the assistant while waiting
    POST /api/chat/sessions/<id>/contact         {"email"}: "reply to me by email"
    POST /api/chat/sessions/<id>/seen            {"index"}: the widget showed the messages up to it
    POST /api/chat/sessions/<id>/csat            {"rating": 1..5, "comment"} once resolved
"""
from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request

from app import handoff_events
from app.chat.routes import _IN_SESSION, _cors, _ext, _session, _tenant_and_origin
from app.errors import PlainError, render, validate_body
from app.live_events import conversation_channel, sse_response
from app.schemas import CHAT_EVENTS, ContactIn, CsatIn, Error, Ok, SeenIn, SessionPath, StatusOut, error_responses
from app.webhook_events import emit
from httpkit.openapi import documented

bp = Blueprint("chat_handoff", __name__, url_prefix="/api/chat")
bp.register_error_handler(PlainError, render)
bp.before_request(_tenant_and_origin)
bp.after_request(_cors)


@bp.get("/sessions/<sid>/events")
@documented(path=SessionPath, responses={200: CHAT_EVENTS, **_IN_SESSION}, tags=("chat",))
def events(sid: str):
    """Live events of this conversation while a human handles it: `message` (an agent's reply),
    `typing`, `status`. Reconnect with Last-Event-ID to get what was missed."""
    tid = g.tenant.tenant.tenant_id
    _session(sid)
    return sse_response(current_app.extensions["live_events"], conversation_channel(tid, sid),
                        request.headers.get("Last-Event-ID"), max_s=current_app.config["SSE_MAX_S"],
                        slots=current_app.extensions["sse_slots"])


@bp.post("/sessions/<sid>/handoff/cancel")
@documented(path=SessionPath, responses={200: StatusOut, **_IN_SESSION}, tags=("chat",))
def cancel_handoff(sid: str):
    """Stop waiting for an agent and go back to the assistant (only while still waiting)."""
    tid = g.tenant.tenant.tenant_id
    _session(sid)
    status = _ext()["handoffs"].cancel(tid, sid)
    if status == "open":
        current_app.extensions["web_metrics"].handoffs.labels("cancelled").inc()
        handoff_events.status_changed(tid, sid, "open", None)
    return jsonify({"status": status})


@bp.post("/sessions/<sid>/contact")
@documented(path=SessionPath, body=ContactIn, responses={200: Ok, **_IN_SESSION}, tags=("chat",))
def contact(sid: str):
    """Leave an email address for the agents to answer later."""
    tid = g.tenant.tenant.tenant_id
    _session(sid)
    body = validate_body(ContactIn, request.get_json(silent=True))
    _ext()["store"].set_contact(tid, sid, body.email.strip().lower())
    return jsonify({"ok": True})


@bp.post("/sessions/<sid>/seen")
@documented(path=SessionPath, body=SeenIn, responses={200: Ok, **_IN_SESSION}, tags=("chat",))
def seen(sid: str):
    """The widget showed the customer the messages up to `index` (the panel open, the page
    visible): agent replies seen here are not mailed by the email fallback."""
    tid = g.tenant.tenant.tenant_id
    _session(sid)
    body = validate_body(SeenIn, request.get_json(silent=True))
    _ext()["store"].mark_seen(tid, sid, body.index)
    return jsonify({"ok": True})


@bp.post("/sessions/<sid>/csat")
@documented(path=SessionPath, body=CsatIn, responses={200: Ok, **_IN_SESSION, **error_responses(Error, 409)},
            tags=("chat",))
def csat(sid: str):
    """Rate the conversation (1-5, with an optional comment) once it is resolved; once per
    resolution (a second rating is 409)."""
    tid = g.tenant.tenant.tenant_id
    store = _ext()["store"]
    _session(sid)
    body = validate_body(CsatIn, request.get_json(silent=True))
    outcome = store.add_csat(tid, sid, body.rating, _ext()["services"].clean(body.comment))
    if outcome == "not_resolved":
        raise PlainError(409, "the conversation can be rated once it is resolved")
    if outcome == "rated":
        raise PlainError(409, "this conversation is already rated")
    current_app.extensions["web_metrics"].csat.labels(str(body.rating)).inc()
    emit(tid, "csat.submitted", {"conversation_id": sid, "rating": body.rating,
                                 "comment": _ext()["services"].clean(body.comment)})
    return jsonify({"ok": True})
