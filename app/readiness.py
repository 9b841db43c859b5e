"""What /readyz reports: can this web process serve customers now, maybe degraded, and the state
of each dependency it uses.

    200 {"status": "ready"}      the full pipeline, every dependency answering
    200 {"status": "degraded"}   serving, with something down (answers quote the help centre,
                                 completions come back empty, writes wait in a buffer)
    503 {"status": "warming"}    the first build of the chat pipeline is still running
    503 {"status": "unavailable"} the chat pipeline cannot be built at all (a bad KB folder or
                                 intents file: a configuration error, see "error")

A web tier that reported unready whenever the GPU tier or Redis is down would be taken out of
the load balancer by its orchestrator: the site would go dark exactly when degraded answers and
a human handoff are what customers need. Dependencies are reported, not required; alert on
them (monitoring/) instead.

Probes are cheap (a Redis PING with a 0.5 s time-out, cached for `cache_s`), so the endpoint
can be polled every second.
"""
from __future__ import annotations

import threading
import time
from urllib.parse import urlparse


def _redis_ping(url: str) -> str:
    from redis.exceptions import RedisError

    from pipelines.redis_client import connect
    try:
        return "up" if connect(url, retries=0, connect_timeout_s=0.5, timeout_s=0.5).ping() else "down"
    except RedisError:
        return "down"


def _broker_state(celery_app) -> str:
    conf = celery_app.conf
    if conf.task_always_eager:
        return "in process (eager)"
    url = conf.broker_url or ""
    if urlparse(url).scheme in ("redis", "rediss"):
        return _redis_ping(url)
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=0.5)
        return "up"
    except Exception:                   # noqa: BLE001 - any failure to connect is "down"
        return "down"


def _target(client) -> str:
    return getattr(client, "base_url", None) or f"in-process {getattr(client, 'model', '')}".strip()


class Readiness:
    def __init__(self, app, cache_s: float = 1.0):
        self.app, self.cache_s = app, cache_s
        self._lock = threading.Lock()
        self._cached: tuple[float, dict] | None = None

    def probe(self) -> dict:
        """The dependencies' states (cached for cache_s)."""
        with self._lock:
            if self._cached and time.monotonic() - self._cached[0] < self.cache_s:
                return self._cached[1]
        ext = self.app.extensions
        services = ext["support_chat"]["services"]
        deps: dict[str, dict] = {}
        client = services.built_client
        for ep in getattr(client, "endpoints", []):
            deps[f"inference_{ep.name}"] = {"state": "down" if ep.breaker.current_state == "open" else "up",
                                            "breaker": ep.breaker.current_state, "target": _target(ep.client)}
        if client is not None and "inference_primary" not in deps:       # one client, no breaker chain
            deps["inference_primary"] = {"state": "up", "target": _target(client)}
        if "inference_standby" not in deps:
            deps["inference_standby"] = {"state": "not configured"}
        pipeline = services.pipeline_state
        deps["embeddings"] = {"state": {"full": "up", "lexical": "down", "building": "starting"}[pipeline]}
        if services.last_build_error and pipeline != "full":
            deps["embeddings"]["error"] = services.last_build_error[:300]
        kb = deps["kb_index"] = {"mode": {"full": "hybrid", "lexical": "lexical", "building": "lexical"}[pipeline]}
        try:
            kb["num_chunks"] = len(services.chat_now().kb.chunks)
            kb["state"] = "up"
        except ValueError as exc:               # the KB folder or intents file is unusable
            kb.update(state="down", error=str(exc)[:300])
        url = self.app.config.get("REDIS_URL")
        if url:
            deps["redis"] = {"state": _redis_ping(url)}
        else:
            deps["redis"] = {"state": "not configured (in-process limits and live events)"}
        db = ext["db"]
        deps["database"] = {"state": "up" if db.ping() else "down", "backend": db.url.get_backend_name()}
        deps["celery_broker"] = {"state": _broker_state(ext["celery"]),
                                 "outbox_pending": ext["outbox"].num_pending}
        with self._lock:
            self._cached = (time.monotonic(), deps)
        return deps

    def report(self) -> tuple[dict, int]:
        services = self.app.extensions["support_chat"]["services"]
        services.start()                       # nobody started the builder yet: the probe does
        deps = self.probe()
        if deps["kb_index"]["state"] == "down":
            return {"status": "unavailable", "error": deps["kb_index"]["error"], "dependencies": deps}, 503
        if not services.ready:
            return {"status": "warming", "dependencies": deps}, 503
        down = [name for name, d in deps.items() if d.get("state") == "down"]
        status = "degraded" if down or services.pipeline_state != "full" else "ready"
        return {"status": status, "degraded": down, "dependencies": deps}, 200
