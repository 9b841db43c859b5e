"""Signing agents in to the agent console: a session cookie (Flask-Login over Flask's signed cookie
session) and a CSRF token for every state-changing request.

    POST /api/agent/login     {"email", "password"} -> {"agent": {...}, "csrf_token"} + session cookie
    POST /api/agent/logout    (X-CSRF-Token) -> {"ok": true}
    GET  /api/agent/session   -> {"agent": {...}, "csrf_token"}, or 401

The other agent blueprints protect themselves with `bp.before_request(agent_required)` (or
`@agent_required` on a view) and read `current_agent()`. Only the session cookie authenticates an
agent: the public widget's X-Site-Key and the /v1 API keys never do, and CSRFProtect is not
installed app-wide, so the chat and /v1 APIs are untouched.

Why these choices:
- The cookie is HttpOnly and SameSite=Lax (a cross-site POST carries no session), and a request
  that changes state must also send the token from login or /session in X-CSRF-Token
  (Flask-WTF's signed, session-bound tokens).
- Secure cookies: AGENT_COOKIE_SECURE=1/0 forces them on/off; unset, the cookie is Secure unless
  the request is plain http to a loopback host (127.0.0.1, ::1, localhost) with no proxy in
  between (no X-Forwarded-Proto / Forwarded header). So `make run` works on http://127.0.0.1:8000,
  while a deployment behind a TLS-terminating proxy gets Secure cookies without trusting proxy
  headers for anything else.
- Sessions last 12 h from the last request (a shift). The cookie is signed with SECRET_KEY; unset,
  a random key is created once in the instance folder (`secret_key`, mode 0600) so sessions
  survive a restart. Replicas that do not share an instance folder must share SECRET_KEY.
- A disabled agent is refused on its next request: the agent is loaded from the database on each.
- Login attempts are limited per client IP and per email (AGENT_LOGIN_LIMIT, "10 per minute"),
  counted in the app's limiter storage (Redis when REDIS_URL is set); over it: 429 + Retry-After.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from pathlib import Path
from urllib.parse import urlsplit

from flask import Blueprint, Flask, abort, current_app, g, jsonify, request, session
from flask.sessions import SecureCookieSessionInterface
from flask_login import LoginManager, UserMixin, current_user, login_user, logout_user
from flask_wtf.csrf import generate_csrf, validate_csrf
from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from wtforms import ValidationError

from app.agent.accounts import AgentAccounts, AgentInfo, normalize_email
from app.agent.schemas import CSRF_HEADER, AgentLoginIn, AgentSessionOut, CsrfHeader
from app.agent.sessions import AgentSessions
from app.errors import PlainError, error_response, render, validate_body
from app.schemas import Error, Ok, error_responses
from httpkit.openapi import documented

log = logging.getLogger(__name__)
bp = Blueprint("agent_auth", __name__, url_prefix="/api/agent")
bp.register_error_handler(PlainError, render)

SESSION_LIFETIME = timedelta(hours=12)
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
SECRET_KEY_FILE = "secret_key"
NOT_LOGGED_IN = "not logged in"
BAD_CSRF = "missing or invalid CSRF token"
BAD_CREDENTIALS = "wrong email or password"        # unknown email and wrong password alike
# the OpenAPI security scheme of the agent API (for build_spec's security_schemes)
AUTH_SCHEME = {"agentSession": {
    "type": "apiKey", "in": "cookie", "name": "session",
    "description": "the session cookie POST /api/agent/login sets (HttpOnly, SameSite=Lax). Every POST, PUT, "
                   f"PATCH and DELETE must also send the login's or GET /api/agent/session's csrf_token in the "
                   f"{CSRF_HEADER} header (400 without it)"}}


class AgentUser(UserMixin):
    """Flask-Login's user: one agent, loaded through its server-side session on each request
    (the cookie holds the session's token, not the agent's id: app/agent/sessions.py)."""

    def __init__(self, info: AgentInfo, token: str):
        self.info, self.token = info, token
        self.id = info.id

    def get_id(self) -> str:
        return self.token

    @property
    def is_active(self) -> bool:
        return self.info.active


class AgentSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie session, with the Secure flag decided per request (module docstring)."""

    def get_cookie_secure(self, app: Flask) -> bool:
        configured = app.config.get("AGENT_COOKIE_SECURE")
        if configured is not None:
            return bool(configured)
        if app.config.get("SESSION_COOKIE_SECURE"):
            return True
        proxied = "X-Forwarded-Proto" in request.headers or "Forwarded" in request.headers
        host = urlsplit(f"//{request.host}").hostname or ""
        return request.is_secure or proxied or host not in LOOPBACK_HOSTS


def instance_secret_key(instance_path: str | os.PathLike) -> str:
    """The instance folder's session key, created on first use. Web workers that start together
    agree on one: each writes a complete file under a private name and links it into place, and
    whoever loses the race reads the winner's."""
    path = Path(instance_path) / SECRET_KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{SECRET_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise RuntimeError(f"{path} is empty: delete it (a new key is made; agents sign in again) or set SECRET_KEY")
    return key


def init_agent_auth(app: Flask) -> LoginManager:
    """Sessions, the login manager and the accounts (app.extensions["agent_accounts"]); call
    after init_db."""
    app.config.setdefault("AGENT_COOKIE_SECURE", None)
    app.config.setdefault("AGENT_LOGIN_LIMIT", "10 per minute")
    try:
        parse_many(app.config["AGENT_LOGIN_LIMIT"])
    except ValueError as exc:
        raise ValueError(f"AGENT_LOGIN_LIMIT = {app.config['AGENT_LOGIN_LIMIT']!r} is not a rate limit like "
                         "'10 per minute'") from exc
    if not app.config.get("SECRET_KEY"):
        app.config["SECRET_KEY"] = instance_secret_key(app.instance_path)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax",
                      PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
                      # no remember-me cookie is issued; should one ever be, it gets the same rules
                      REMEMBER_COOKIE_HTTPONLY=True, REMEMBER_COOKIE_SAMESITE="Lax",
                      REMEMBER_COOKIE_DURATION=SESSION_LIFETIME,
                      REMEMBER_COOKIE_SECURE=app.config["AGENT_COOKIE_SECURE"] is not False,
                      # a token is good for the whole session, not Flask-WTF's default hour
                      WTF_CSRF_TIME_LIMIT=int(SESSION_LIFETIME.total_seconds()))
    app.session_interface = AgentSessionInterface()
    accounts = AgentAccounts(app.extensions["db"])
    app.extensions["agent_accounts"] = accounts
    sessions = AgentSessions(app.extensions["db"], SESSION_LIFETIME)
    app.extensions["agent_sessions"] = sessions
    # login attempts still count when the shared limiter storage (Redis) is down
    app.extensions["agent_login_fallback"] = MovingWindowRateLimiter(MemoryStorage())
    manager = LoginManager()
    manager.init_app(app)

    @manager.user_loader
    def _load(token: str) -> AgentUser | None:
        info = sessions.agent(token) if isinstance(token, str) and 0 < len(token) <= 128 else None
        return AgentUser(info, token) if info is not None else None

    @manager.unauthorized_handler
    def _unauthorized():
        return error_response(401, NOT_LOGGED_IN)

    return manager


def _accounts() -> AgentAccounts:
    return current_app.extensions["agent_accounts"]


def _csrf_denied():
    """400 for a state-changing request without a valid X-CSRF-Token, else None."""
    if request.method not in STATE_CHANGING:
        return None
    try:
        validate_csrf(request.headers.get(CSRF_HEADER, ""))
    except ValidationError:
        return error_response(400, BAD_CSRF)
    return None


def _denied():
    if not current_user.is_authenticated:
        return error_response(401, NOT_LOGGED_IN)
    return _csrf_denied()


def agent_required(view: Callable | None = None):
    """The agent API's guard: 401 {"error": "not logged in"} without a signed-in, active agent;
    400 for a state-changing request without a valid X-CSRF-Token. Two uses:

        bp.before_request(agent_required)       # every route of a blueprint (called with no view)

        @agent_required                         # one view
        def claim(cid): ...
    """
    if view is None:
        return _denied()

    @wraps(view)
    def guarded(*args, **kwargs):
        denied = _denied()
        return denied if denied is not None else view(*args, **kwargs)
    return guarded


def current_agent() -> AgentInfo:
    """The signed-in agent of this request (401 if there is none: use behind agent_required)."""
    if not current_user.is_authenticated:
        abort(401, NOT_LOGGED_IN)
    return current_user.info


def _session_body(info: AgentInfo) -> dict:
    return {"agent": {"id": info.id, "email": info.email, "name": info.name, "tenant": info.tenant_id},
            "csrf_token": generate_csrf()}


def _login_rate_limited(email: str):
    """429 when this IP or this email is over AGENT_LOGIN_LIMIT (each attempt counts), else None."""
    items = parse_many(current_app.config["AGENT_LOGIN_LIMIT"])
    prefix = current_app.config.get("RATELIMIT_KEY_PREFIX", "ratelimit")
    digest = hashlib.sha256(normalize_email(email).encode()).hexdigest()[:32]    # no email in the storage
    keys = [(prefix, "agent-login", f"ip:{request.remote_addr or '-'}"), (prefix, "agent-login", f"email:{digest}")]
    try:
        strategy = current_app.extensions["limiter"].limiter
        over = [(item, key) for item in items for key in keys if not strategy.hit(item, *key)]
    except Exception as exc:                                   # the shared storage is down
        log.warning("login rate limit: shared storage unavailable (%s); counting in this process", exc)
        strategy = current_app.extensions["agent_login_fallback"]
        over = [(item, key) for item in items for key in keys if not strategy.hit(item, *key)]
    if not over:
        return None
    item, key = over[0]
    try:
        reset = strategy.get_window_stats(item, *key).reset_time
    except Exception:
        reset = time.time() + item.get_expiry()
    retry_after = max(1, math.ceil(reset - time.time()))
    return error_response(429, f"rate limit exceeded ({item}): retry after the Retry-After seconds",
                          {"Retry-After": str(retry_after)}, code="rate_limit_exceeded")


@bp.post("/login")
@documented(body=AgentLoginIn, responses={200: AgentSessionOut, **error_responses(Error, 400, 401, 413, 429, 503)},
            security=(), tags=("agent",))
def login():
    """Sign in with email and password: sets the session cookie and returns the CSRF token."""
    body = validate_body(AgentLoginIn, request.get_json(silent=True))
    limited = _login_rate_limited(body.email)
    if limited is not None:
        return limited
    info = _accounts().authenticate(body.email, body.password)
    if info is None:
        raise PlainError(401, BAD_CREDENTIALS)
    session.clear()                   # nothing of an earlier session (or its CSRF token) carries over
    g.pop("csrf_token", None)
    login_user(AgentUser(info, current_app.extensions["agent_sessions"].open(info.id)))
    session.permanent = True          # expires after SESSION_LIFETIME, not when the browser closes
    return jsonify(_session_body(info))


@bp.post("/logout")
@documented(headers=CsrfHeader, responses={200: Ok, **error_responses(Error, 400, 503)}, tags=("agent",))
def logout():
    """Sign out: clears the session (CSRF token required; no live session needed, so that the
    session of a disabled agent can still be cleared)."""
    denied = _csrf_denied()
    if denied is not None:
        return denied
    token = session.get("_user_id")
    if isinstance(token, str) and token:
        current_app.extensions["agent_sessions"].revoke(token)     # a copy of the cookie stops working too
    logout_user()
    session.clear()
    return jsonify({"ok": True})


@bp.get("/session")
@documented(responses={200: AgentSessionOut, **error_responses(Error, 401, 503)}, tags=("agent",))
@agent_required
def get_session():
    """The signed-in agent and a CSRF token (what the console asks when it loads)."""
    return jsonify(_session_body(current_agent()))
