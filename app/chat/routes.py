"""The support-chat API (what the widget and integrators call). Requests carry the tenant's site
key in X-Site-Key; browsers may only call from the tenant's allowed origins.

    POST /api/chat/sessions                      -> {"session_id"}
    POST /api/chat/sessions/<id>/messages        {"content", "stream"} -> reply JSON or SSE
    GET  /api/chat/sessions/<id>                 -> {"messages", "status"}
    POST /api/chat/sessions/<id>/feedback        {"message_index", "rating", "comment"}
    POST /api/chat/sessions/<id>/handoff         -> {"status": "pending_human"}
    POST /api/chat/sessions/<id>/actions/<key>   {"confirm": true|false} -> the action's reply
    (the live events, CSAT, contact and cancel routes of a handoff: app/chat/handoff.py)

While a human is asked for or answering (status pending_human | human) the bot stays silent: a
message is stored and shown to the agents, and the reply is {"reply": null, "status", ...}.
Conversations live in the database (app/store/conversations.py). Only cleaned text (PII redacted,
banned terms masked) is stored, logged or sent to the model.
Bodies are parsed by their models (app/schemas.py); every error is {"error": message}
(app/errors.py).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import re
import time
from dataclasses import asdict

from flask import (
    Blueprint,
    Response,
    current_app,
    g,
    jsonify,
    request,
    stream_with_context,
)

from app import handoff_events
from app.errors import PlainError, render, validate_body
from app.limits import TurnSlot
from app.schemas import (
    CHAT_STREAM,
    ActionAnswerIn,
    ActionPath,
    ChatReplyOut,
    ChatTurnOut,
    Error,
    FeedbackIn,
    HandoffOut,
    MessageIn,
    Ok,
    SessionCreated,
    SessionPath,
    SessionView,
    error_responses,
)
from app.webhook_events import emit
from httpkit.openapi import documented
from pipelines.query_translation import has_cjk
from pipelines.support_chat import ChatReply, MessageTooLong

log = logging.getLogger(__name__)
bp = Blueprint("chat", __name__, url_prefix="/api/chat")
_SID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
MAX_HISTORY = 40                # most recent messages a turn reads (the prompt trims further)


bp.register_error_handler(PlainError, render)


def _ext() -> dict:
    return current_app.extensions["support_chat"]


@bp.before_request
def _tenant_and_origin():
    origin = request.headers.get("Origin")
    registry = _ext()["tenants"]
    limit = current_app.config["CHAT_MAX_BODY_BYTES"]
    if (request.content_length or 0) > limit:
        raise PlainError(413, f"request body larger than {limit} bytes")
    if request.method == "OPTIONS":                  # CORS preflight: no site key is sent with it
        if origin and not registry.any_allows_origin(origin):
            raise PlainError(403, f"origin {origin} is not allowed")
        return Response(status=204)
    key = request.headers.get("X-Site-Key", "")
    if not key and request.method == "GET" and request.path.endswith("/events"):
        key = request.args.get("site_key", "")           # EventSource cannot send headers
    if not key:
        raise PlainError(401, "missing X-Site-Key header")
    tenant = registry.by_site_key(key)
    if tenant is None:
        raise PlainError(403, "invalid site key")
    if origin and not tenant.allows_origin(origin):
        raise PlainError(403, f"origin {origin} is not allowed for this site key")
    g.tenant = tenant


@bp.after_request
def _cors(resp: Response):
    origin = request.headers.get("Origin")
    if origin and (getattr(g, "tenant", None) is None or g.tenant.allows_origin(origin)) \
            and _ext()["tenants"].any_allows_origin(origin):
        resp.headers["Access-Control-Allow-Origin"] = origin
        resp.headers["Access-Control-Allow-Headers"] = "Content-Type, X-Site-Key"
        resp.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        resp.headers["Vary"] = "Origin"
    return resp


def _session(sid: str) -> str:
    if not _SID.match(sid) or not _ext()["store"].exists(g.tenant.tenant.tenant_id, sid):
        raise PlainError(404, "unknown or expired session")
    return sid


# every route: site key, origin, rate limit; the session store unavailable (Redis down, a session
# this process has not mirrored)
_ERRORS = error_responses(Error, 401, 403, 429, 503)
_IN_SESSION = {**_ERRORS, **error_responses(Error, 400, 404, 413)}


@bp.post("/sessions")
@documented(responses={201: SessionCreated, **_ERRORS, 413: Error}, tags=("chat",))
def create_session():
    """Start a conversation."""
    sid = _ext()["store"].create(g.tenant.tenant.tenant_id)
    emit(g.tenant.tenant.tenant_id, "conversation.created", {"conversation_id": sid})
    return jsonify({"session_id": sid}), 201


@bp.get("/sessions/<sid>")
@documented(path=SessionPath, responses={200: SessionView, **_IN_SESSION}, tags=("chat",))
def get_session(sid: str):
    """The conversation so far and its status."""
    tid = g.tenant.tenant.tenant_id
    store = _ext()["store"]
    _session(sid)
    item = store.list_item(tid, sid) or {}
    # (the handoff summary is for the agent, not for the customer's widget)
    assignee, status = item.get("assignee"), item.get("status", "open")
    return jsonify({"messages": store.messages(tid, sid), "status": status,
                    "assignee": {"name": assignee["name"]} if assignee else None,
                    "waiting": _waiting(tid, sid, status)})


@bp.post("/sessions/<sid>/messages")
@documented(path=SessionPath, body=MessageIn,
            responses={200: (ChatTurnOut, CHAT_STREAM), **_IN_SESSION}, tags=("chat",))
def post_message(sid: str):
    """Send the customer's message; the reply as JSON, or streamed as server-sent events. While
    a human is asked for or answering, the message goes to the agents and `reply` is null."""
    tid = g.tenant.tenant.tenant_id
    store, services = _ext()["store"], _ext()["services"]
    _session(sid)
    body = validate_body(MessageIn, request.get_json(silent=True),
                         context={"max_chars": current_app.config["MAX_MESSAGE_CHARS"]})
    status = store.status(tid, sid)
    if status in ("pending_human", "human"):
        return _to_human(tid, sid, status, services.clean(body.content.strip()))
    if status == "resolved" and _ext()["handoffs"].reopen(tid, sid):
        handoff_events.status_changed(tid, sid, "open", None)
    slot = TurnSlot(_ext()["turn_slots"])
    try:
        resp = _turn(sid, tid, store, services, body.content, body.stream, slot)
    except BaseException:
        slot.release()
        raise
    resp.call_on_close(slot.release)          # a stream the client dropped before it started
    return resp


def _experiment_arm(tid: str, sid: str, tenant):
    """The tenant as this conversation's experiment arm sees it, and (experiment id, arm) for the
    metrics; the tenant unchanged outside an experiment (app/store/experiments.py)."""
    try:
        assigned = current_app.extensions["experiments"].arm_of(tid, sid)
    except Exception:                             # noqa: BLE001 - the turn goes on without the experiment
        log.exception("experiment arm of %s not read", sid)
        return tenant, None
    if assigned is None:
        return tenant, None
    experiment, arm = assigned
    value = int(arm["value"]) if experiment["factor"] == "max_tokens" else arm["value"]
    return dataclasses.replace(tenant, **{experiment["factor"]: value}), (str(experiment["id"]), arm["name"])


def _to_human(tid: str, sid: str, status: str, clean: str) -> Response:
    """The customer writes while a human is asked for or answering: stored, sent to the agents."""
    index = _ext()["store"].append(tid, sid, {"role": "user", "content": clean})
    _message_created(tid, sid, index)
    return jsonify(_sent_to_agents(tid, sid, index, status))


def _message_created(tid: str, sid: str, *indexes: int | None) -> None:
    """The webhook event of each stored message (looked up only when a webhook takes it)."""
    if not current_app.extensions["webhooks"].subscribers(tid, "message.created"):
        return
    messages = _ext()["store"].messages(tid, sid)
    for i in indexes:
        if i is not None and 0 <= i < len(messages):
            emit(tid, "message.created", {"conversation_id": sid, "message": messages[i]})


def _waiting(tid: str, sid: str, status: str | None) -> dict | None:
    """Queue place and time waited while pending_human, with the offers made after HANDOFF_WAIT_S."""
    waiting = _ext()["handoffs"].waiting(tid, sid) if status == "pending_human" else None
    if waiting is not None:
        late = waiting["waited_s"] >= current_app.config["HANDOFF_WAIT_S"]
        waiting.update(offer_email=late, offer_bot=late)
        hours = g.tenant.hours
        now = dt.datetime.now(dt.UTC)
        if hours is not None and not hours.is_open(now):       # nobody to wait for: email at once
            opens = hours.next_open(now)
            waiting.update(offer_email=True, offer_bot=True, outside_hours=True,
                           opens_at=opens.isoformat() if opens else None)
    return waiting


def _sent_to_agents(tid: str, sid: str, index: int, status: str | None = None) -> dict:
    """The stored customer message `index` pushed to the agents, and the bot-silent reply body
    (status read now when not given: an agent took the chat while the bot wrote)."""
    store = _ext()["store"]
    messages = store.messages(tid, sid)
    if 0 <= index < len(messages):
        handoff_events.customer_message(tid, sid, messages[index])
    status = status or store.status(tid, sid) or "open"
    return {"reply": None, "status": status, "message_index": index, "waiting": _waiting(tid, sid, status)}


def _turn(sid: str, tid: str, store, services, content: str, stream: bool, slot: TurnSlot) -> Response:
    """One chat turn; the turn slot is released when the reply (or its stream) ends."""
    chat = services.chat
    clean, blocked = chat.clean_input(content.strip(), g.tenant.tenant)
    if blocked is None:
        try:
            chat.check_fits(clean)
        except MessageTooLong as exc:
            raise PlainError(413, str(exc)) from None
    history = store.messages(tid, sid)[-MAX_HISTORY:]
    asked_at = time.time()
    tenant, arm = _experiment_arm(tid, sid, g.tenant.tenant)
    events = chat.respond(tenant, history, clean, blocked, conversation_id=sid)

    metrics = current_app.extensions["web_metrics"]
    first_text = {"at": None}                                  # when the reply's first text went out

    def finish(reply: ChatReply) -> dict:
        metrics.turn(reply.intent, reply.degraded, reply.handoff, reply.blocked, reply.grounding)
        first_ms = ((first_text["at"] or time.time()) - asked_at) * 1000
        if arm is not None:
            metrics.experiment_turns.labels(*arm).inc()
            metrics.experiment_first_token.labels(*arm).observe(first_ms / 1000)
        # the turn is stored whole, once it is answered: a failed turn leaves no orphan message
        flag = {"blocked": True} if reply.blocked else {}
        record = {"role": "assistant", "content": reply.reply, "citations": reply.citations, "intent": reply.intent,
                  "degraded": reply.degraded, "grounding": reply.grounding, "action": reply.action,
                  "first_token_ms": round(first_ms, 1), **flag}
        asked, index = store.append_turn(tid, sid, {"role": "user", "content": clean, **flag}, record)
        _message_created(tid, sid, asked, index)
        if index is None:                     # a human took the conversation while the bot wrote
            return _sent_to_agents(tid, sid, asked)
        if reply.handoff:
            _start_handoff(tid, sid)
        out = {k: v for k, v in asdict(reply).items() if k != "blocked"}
        out["message_index"] = index
        return out

    if not stream:
        reply = None
        try:
            for kind, value in events:
                if kind == "done":
                    reply = value
        finally:
            slot.release()
        metrics.first_token.observe(time.time() - asked_at)          # the whole reply is its first text
        return jsonify(finish(reply))

    def sse():
        first = True
        try:
            for kind, value in events:
                if kind == "token":
                    if first:
                        first_text["at"] = time.time()
                        metrics.first_token.observe(first_text["at"] - asked_at)
                        first = False
                    yield f"event: token\ndata: {json.dumps({'text': value}, ensure_ascii=False)}\n\n"
                else:
                    yield f"event: done\ndata: {json.dumps(finish(value), ensure_ascii=False)}\n\n"
        except Exception as exc:                      # the stream has started: report in-band
            log.exception("chat turn failed")
            yield f"event: error\ndata: {json.dumps({'error': type(exc).__name__})}\n\n"
        finally:
            slot.release()                            # also when the client went away mid-stream

    return Response(stream_with_context(sse()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@bp.post("/sessions/<sid>/feedback")
@documented(path=SessionPath, body=FeedbackIn, responses={200: Ok, **_IN_SESSION}, tags=("chat",))
def feedback(sid: str):
    """Thumbs up or down on an assistant message."""
    tid = g.tenant.tenant.tenant_id
    store = _ext()["store"]
    _session(sid)
    body = validate_body(FeedbackIn, request.get_json(silent=True), context={"messages": store.messages(tid, sid)})
    comment = _ext()["services"].clean(body.comment)
    store.add_feedback(tid, sid, {"kind": "message", "message_index": body.message_index, "rating": body.rating,
                                  "comment": comment})
    current_app.extensions["web_metrics"].feedback.labels(body.rating).inc()
    return jsonify({"ok": True})


@bp.post("/sessions/<sid>/actions/<key>")
@documented(path=ActionPath, body=ActionAnswerIn,
            responses={200: ChatReplyOut, **_IN_SESSION, **error_responses(Error, 409)}, tags=("chat",))
def answer_action(sid: str, key: str):
    """Confirm or cancel an action the assistant asked about (a reply whose action has status
    needs_confirmation). It runs at most once: a repeated answer gets the first one's reply."""
    tid = g.tenant.tenant.tenant_id
    store, services = _ext()["store"], _ext()["services"]
    _session(sid)
    body = validate_body(ActionAnswerIn, request.get_json(silent=True))
    if store.status(tid, sid) != "open":
        raise PlainError(409, "the conversation is with a human agent; actions are answered there")
    chinese = any(has_cjk(m.get("content") or "") for m in store.messages(tid, sid)[-2:] if m.get("role") == "user")
    reply = services.chat.resolve_action(g.tenant.tenant, sid, key, body.confirm, chinese)
    if reply is None:
        raise PlainError(404, "no such action in this conversation")
    record = {"role": "assistant", "content": reply.reply, "citations": [], "intent": reply.intent,
              "action": reply.action}
    index = store.append(tid, sid, record)
    _message_created(tid, sid, index)
    current_app.extensions["web_metrics"].turn(reply.intent, False, False, None, None)
    out = {k: v for k, v in asdict(reply).items() if k != "blocked"}
    out["message_index"] = index
    return jsonify(out)


@bp.post("/sessions/<sid>/handoff")
@documented(path=SessionPath, responses={200: HandoffOut, **_IN_SESSION}, tags=("chat",))
def handoff(sid: str):
    """Ask for a human agent; the answer says where the conversation stands in the queue."""
    tid = g.tenant.tenant.tenant_id
    _session(sid)
    _start_handoff(tid, sid)
    status = _ext()["store"].status(tid, sid)
    return jsonify({"status": status, "waiting": _waiting(tid, sid, status)})


def _start_handoff(tid: str, sid: str) -> None:
    if not _ext()["handoffs"].request(tid, sid):
        return                                              # already waiting for or with a human
    current_app.extensions["web_metrics"].handoffs.labels("requested").inc()
    handoff_events.handoff_requested(tid, sid)
    emit(tid, "handoff.requested", {"conversation_id": sid})
    from app.jobs.tasks import start_or_queue, summarize_handoff
    start_or_queue(summarize_handoff, tid, sid)            # the broker down: sent once it is back
