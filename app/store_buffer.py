"""The Redis session store, made to ride out Redis being down: chat keeps answering and no
accepted message is lost.

    up     every call goes to Redis (RedisStore); the sessions this process touched are
           mirrored here (the latest `mirror_size`, least recently used dropped first)
    down   a call failed with a Redis error: reads are answered from the mirror, writes go to
           the mirror and to a queue, in order, each append with its operation id; a session
           the mirror does not hold raises StoreUnavailable (the routes answer 503, Retry-After)
    back   a probe thread pings Redis every `probe_interval_s`; once it answers, the queue is
           replayed in order, then calls go to Redis again

Replays are idempotent: appends and feedback carry the operation id they were given when the
customer sent them (RedisStore's append-once script), a created session keeps its id and meta,
and meta updates are plain overwrites. A replay cut off by Redis failing again resumes where it
stopped. What the queue holds lives in this process: a web process killed while Redis is down
loses its queued writes (the log says how many were queued).
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from redis.exceptions import RedisError

from app.store import RedisStore, new_op_id, new_session_meta

log = logging.getLogger(__name__)


class StoreUnavailable(RuntimeError):
    """The session store cannot answer for this session now (Redis is down and the session is
    not mirrored in this process)."""


class BufferedRedisStore:
    def __init__(self, url: str, ttl: int = 7 * 24 * 3600, mirror_size: int = 4096, probe_interval_s: float = 0.5):
        # two quick tries, not the default ~4 s of retries: an outage is buffered instead
        self.redis = RedisStore(url, ttl, retries=2, connect_timeout_s=0.5, timeout_s=2.0)
        self.ttl, self.mirror_size, self.probe_interval_s = ttl, mirror_size, probe_interval_s
        # (tenant, sid) -> {"meta", "messages", "feedback"}
        self._mirror: collections.OrderedDict[tuple[str, str], dict] = collections.OrderedDict()
        self._queue: collections.deque[tuple] = collections.deque()  # (op, tenant, sid, *args) not yet in Redis
        self._lock = threading.RLock()
        self._down = False
        self._probe: threading.Thread | None = None
        self.num_replayed = 0

    # ---- state -----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Redis answers and nothing waits to be replayed."""
        return not self._down

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def _mark_down(self, exc: Exception) -> None:
        with self._lock:
            if not self._down:
                log.warning("session store: Redis unavailable (%s); buffering writes in this process", exc)
            self._down = True
            if self._probe is None or not self._probe.is_alive():
                self._probe = threading.Thread(target=self._recover, name="store-probe", daemon=True)
                self._probe.start()

    def _recover(self) -> None:
        while True:
            time.sleep(self.probe_interval_s)
            try:
                self.redis.r.ping()
                self._replay()
            except RedisError:
                continue
            with self._lock:
                if not self._queue:
                    self._down = False
                    log.warning("session store: Redis is back; %d buffered writes replayed", self.num_replayed)
                    return

    def _replay(self) -> None:
        """Send the queued writes in order; a Redis error stops it with the rest still queued."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                op = self._queue[0]
            kind, tenant, sid, *args = op
            if kind == "create":
                self.redis.create(tenant, sid, args[0])
            elif kind == "append":
                self.redis.append(tenant, sid, args[0], op_id=args[1])
            elif kind == "meta":
                self.redis.set_meta(tenant, sid, **args[0])
            else:
                self.redis.add_feedback(tenant, sid, args[0], op_id=args[1])
            with self._lock:
                self._queue.popleft()
                self.num_replayed += 1

    # ---- mirror ----------------------------------------------------------------------------
    def _mirrored(self, tenant: str, sid: str) -> dict:
        item = self._mirror.get((tenant, sid))
        if item is None:
            raise StoreUnavailable("the session store (Redis) is unavailable; retry shortly")
        self._mirror.move_to_end((tenant, sid))
        return item

    def _remember(self, tenant: str, sid: str, **parts) -> None:
        with self._lock:
            item = self._mirror.setdefault((tenant, sid), {"meta": {"status": "open"}, "messages": [], "feedback": []})
            item.update(parts)
            self._mirror.move_to_end((tenant, sid))
            while len(self._mirror) > self.mirror_size:
                self._mirror.popitem(last=False)

    def _read(self, tenant: str, sid: str, part: str, fetch):
        """`part` of a session from Redis (refreshing the mirror), else from the mirror."""
        if not self._down:
            try:
                value = fetch()
                if value or (tenant, sid) in self._mirror:
                    self._remember(tenant, sid, **{part: value})
                return value
            except RedisError as exc:
                self._mark_down(exc)
        with self._lock:
            value = self._mirrored(tenant, sid)[part]
            return [dict(v) for v in value] if isinstance(value, list) else dict(value)

    def _write(self, op: tuple, direct):
        """Run `direct()` against Redis while it is up and nothing is queued; else queue `op`.
        Returns what direct returned, or None when queued."""
        if not self._down:
            try:
                return direct()
            except RedisError as exc:
                self._mark_down(exc)
        with self._lock:
            self._queue.append(op)
        return None

    # ---- the store interface (app/store.py) ------------------------------------------------
    def create(self, tenant: str) -> str:
        sid, meta = new_session_meta()
        self._remember(tenant, sid, meta=dict(meta), messages=[], feedback=[])
        self._write(("create", tenant, sid, meta), lambda: self.redis.create(tenant, sid, meta))
        return sid

    def exists(self, tenant: str, sid: str) -> bool:
        if not self._down:
            try:
                found = self.redis.exists(tenant, sid)
                if found:
                    self._remember(tenant, sid)      # mirrored from now on (its reads fill it in)
                return found
            except RedisError as exc:
                self._mark_down(exc)
        with self._lock:
            return self._mirrored(tenant, sid) is not None

    def meta(self, tenant: str, sid: str) -> dict | None:
        return self._read(tenant, sid, "meta", lambda: self.redis.meta(tenant, sid)) or None

    def messages(self, tenant: str, sid: str) -> list[dict]:
        return self._read(tenant, sid, "messages", lambda: self.redis.messages(tenant, sid))

    def feedback(self, tenant: str, sid: str) -> list[dict]:
        return self._read(tenant, sid, "feedback", lambda: self.redis.feedback(tenant, sid))

    def append(self, tenant: str, sid: str, message: dict) -> int:
        op_id = new_op_id()
        index = self._write(("append", tenant, sid, dict(message), op_id),
                            lambda: self.redis.append(tenant, sid, message, op_id=op_id))
        with self._lock:
            item = self._mirror.get((tenant, sid))
            if item is not None:
                item["messages"].append(dict(message))
                if index is None:                 # queued: its place as far as this process knows
                    index = len(item["messages"]) - 1
        return -1 if index is None else index

    def set_meta(self, tenant: str, sid: str, **fields: str) -> None:
        self._write(("meta", tenant, sid, dict(fields)), lambda: self.redis.set_meta(tenant, sid, **fields))
        with self._lock:
            item = self._mirror.get((tenant, sid))
            if item is not None:
                item["meta"].update(fields)

    def add_feedback(self, tenant: str, sid: str, record: dict) -> None:
        op_id = new_op_id()
        self._write(("feedback", tenant, sid, dict(record), op_id),
                    lambda: self.redis.add_feedback(tenant, sid, record, op_id=op_id))
        with self._lock:
            item = self._mirror.get((tenant, sid))
            if item is not None:
                item["feedback"].append(dict(record))

    def ping(self) -> bool:
        """Redis answers now (readiness; does not change the store's state)."""
        try:
            return bool(self.redis.r.ping())
        except RedisError:
            return False
