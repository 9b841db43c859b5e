"""Request rate limits (Flask-Limiter), one Limiter per app:

    every /api/chat and /v1 route   per client IP           limits.per_ip
    /api/chat                       per site key (tenant)   limits.per_site_key
    /v1 (completion)                per API key             limits.per_api_key

A request over a limit gets 429 with a JSON body saying which limit and a Retry-After header.
Counters are in Redis when REDIS_URL is set, shared by every web worker; if Redis is
unreachable the limiter falls back to in-process counters instead of failing the request.
Keys are hashed before they reach the storage, so no API key is stored in the clear.

TurnSlot caps the model turns in flight (chat replies and agent drafts share CHAT_MAX_TURNS).
"""
from __future__ import annotations

import hashlib
import os
import threading

import yaml
from flask import Flask, request
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from limits import parse_many

from app.errors import PlainError, error_response
from configs import resolve, shipped

DEFAULT_PATH = shipped("limits.yaml")
KINDS = {"per_ip": "RATE_LIMIT_PER_IP", "per_site_key": "RATE_LIMIT_PER_SITE_KEY",
         "per_api_key": "RATE_LIMIT_PER_API_KEY"}
UNLIMITED_PATHS = ("/v1/health", "/v1/metrics")


def load_limits(path: str | os.PathLike | None = None, env: dict | None = None) -> dict[str, str]:
    """kind -> limit string, validated (a bad string is a startup error, not a silent no-limit)."""
    env = os.environ if env is None else env
    path = resolve("limits.yaml", path, "LIMITS_PATH", env)
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    unknown = set(raw) - set(KINDS)
    if unknown:
        raise ValueError(f"limits: unknown keys {sorted(unknown)} in {path} (known: {sorted(KINDS)})")
    out = {}
    for kind, var in KINDS.items():
        value = env.get(var) or raw.get(kind)
        if not value:
            raise ValueError(f"limits: {kind} is not set in {path} or {var}")
        try:
            parse_many(str(value))
        except ValueError as exc:
            raise ValueError(f"limits: {kind} = {value!r} is not a rate limit like '10 per minute'") from exc
        out[kind] = str(value)
    return out


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def _site_key() -> str:
    return "site:" + _digest(request.headers.get("X-Site-Key", ""))


def _api_key() -> str:
    auth = request.headers.get("Authorization", "")
    return "key:" + _digest(auth.removeprefix("Bearer ").strip())


def init_limits(app: Flask, chat_bps: tuple, *api_bps) -> Limiter:
    """Attach the limits to the chat blueprints (site key) and the API-key ones (call before
    registering them)."""
    limits = app.config.get("RATE_LIMITS") or load_limits(app.config.get("LIMITS_PATH"))
    app.config["RATE_LIMITS"] = limits
    storage = app.config.get("REDIS_URL") or "memory://"
    limiter = Limiter(get_remote_address, app=app, storage_uri=storage, strategy="moving-window",
                      headers_enabled=True, swallow_errors=True, in_memory_fallback_enabled=True,
                      key_prefix=app.config.get("RATELIMIT_KEY_PREFIX", "ratelimit"))

    def skip():
        return request.path in UNLIMITED_PATHS or request.method == "OPTIONS"

    # shared limits: one counter per key across all of a blueprint's routes
    for bp in (*chat_bps, *api_bps):
        limiter.shared_limit(limits["per_ip"], scope=f"{bp.name}-ip", exempt_when=skip)(bp)
    for bp in chat_bps:                                  # one site key: one budget over the chat API
        limiter.shared_limit(limits["per_site_key"], scope="chat-site", key_func=_site_key, exempt_when=skip)(bp)
    for bp in api_bps:                                   # one API key: one budget over all of them
        limiter.shared_limit(limits["per_api_key"], scope="api-key", key_func=_api_key, exempt_when=skip)(bp)

    @app.errorhandler(429)
    def _too_many(exc):
        limit = getattr(exc, "limit", None)
        what = f" ({limit.limit})" if limit is not None else ""
        return error_response(429, f"rate limit exceeded{what}: retry after the Retry-After seconds",
                              code="rate_limit_exceeded")

    def _retry_after_only_when_refused(resp):
        # Flask-Limiter puts Retry-After (the window's reset, computed when the request came in)
        # on every response: on a slow 200 it went negative. It belongs to refusals only. (Hooks
        # run last-registered first: placed first, this one runs after the limiter's.)
        if resp.status_code not in (429, 503):
            resp.headers.pop("Retry-After", None)
        else:
            value = resp.headers.get("Retry-After")
            if value is not None and value.lstrip("-").isdigit() and int(value) < 1:
                resp.headers["Retry-After"] = "1"
        return resp
    app.after_request_funcs.setdefault(None, []).insert(0, _retry_after_only_when_refused)

    app.extensions["limiter"] = limiter
    return limiter


class TurnSlot:
    """One of CHAT_MAX_TURNS chat turns in flight, taken now or 503 + Retry-After: a turn holds a
    request thread while it generates, and past that many, new customers and every other call
    would queue behind them. Released once, however many paths release it."""

    def __init__(self, slots: threading.BoundedSemaphore):
        if not slots.acquire(blocking=False):
            raise PlainError(503, "too many conversations in progress; retry after the Retry-After seconds",
                           retry_after=2)
        self._slots, self._lock, self._held = slots, threading.Lock(), True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._slots.release()
