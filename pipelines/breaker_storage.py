"""Circuit-breaker state shared by every web worker through Redis, that keeps working when Redis
does not.

pybreaker's own Redis storage needs Redis at construction (it raises, so a web process could not
boot with Redis down) and answers "closed" while Redis is unreachable (so no breaker could open
during a Redis outage). This one keeps a process-local copy beside Redis:

- every write goes to the local copy and, best effort, to Redis;
- reads come from Redis while it answers (and refresh the local copy), else from the local copy;
- after a failed Redis call, Redis is left alone for `retry_s`, so a hung or absent Redis costs
  one time-out per `retry_s` and not one per breaker read.

Keys, under `namespace`: state, fail_counter, success_counter, opened_at (Unix seconds).
"""
from __future__ import annotations

import calendar
import logging
import threading
import time
from datetime import UTC, datetime

import pybreaker
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class SharedBreakerStorage(pybreaker.CircuitBreakerStorage):
    def __init__(self, redis, namespace: str, state: str = pybreaker.STATE_CLOSED, retry_s: float = 1.0):
        super().__init__("redis")
        self._redis, self._ns, self.retry_s = redis, namespace, retry_s
        self._local = pybreaker.CircuitMemoryStorage(state)
        self._lock = threading.Lock()
        self._skip_until = 0.0             # time.monotonic() before which Redis is not tried
        self._down = False
        self._call(self._init_keys)

    def _key(self, name: str) -> str:
        return f"{self._ns}:{name}"

    def _init_keys(self, r) -> None:
        r.setnx(self._key("fail_counter"), 0)
        r.setnx(self._key("success_counter"), 0)
        r.setnx(self._key("state"), self._local.state)

    def _call(self, fn):
        """fn(redis)'s result, or None when Redis is unreachable (or was, under retry_s ago)."""
        if time.monotonic() < self._skip_until:
            return None
        try:
            result = fn(self._redis)
        except RedisError as exc:
            with self._lock:
                self._skip_until = time.monotonic() + self.retry_s
                if not self._down:
                    self._down = True
                    log.warning("breaker state %s: Redis unreachable (%s); using this process' copy", self._ns, exc)
            return None
        if self._down:
            with self._lock:
                self._down = False
            log.warning("breaker state %s: Redis answers again", self._ns)
            self._call(self._init_keys)
        return result

    # ---- state -------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        raw = self._call(lambda r: r.get(self._key("state")))
        if raw is not None:
            self._local.state = raw.decode() if isinstance(raw, bytes) else str(raw)
        return self._local.state

    @state.setter
    def state(self, state: str) -> None:
        self._local.state = str(state)
        self._call(lambda r: r.set(self._key("state"), str(state)))

    # ---- counters ----------------------------------------------------------------------------
    def _counter(self, name: str, local_value: int) -> int:
        raw = self._call(lambda r: r.get(self._key(name)))
        return int(raw) if raw is not None else local_value

    @property
    def counter(self) -> int:
        return self._counter("fail_counter", self._local.counter)

    @property
    def success_counter(self) -> int:
        return self._counter("success_counter", self._local.success_counter)

    def increment_counter(self) -> None:
        self._local.increment_counter()
        self._call(lambda r: r.incr(self._key("fail_counter")))

    def reset_counter(self) -> None:
        self._local.reset_counter()
        self._call(lambda r: r.set(self._key("fail_counter"), 0))

    def increment_success_counter(self) -> None:
        self._local.increment_success_counter()
        self._call(lambda r: r.incr(self._key("success_counter")))

    def reset_success_counter(self) -> None:
        self._local.reset_success_counter()
        self._call(lambda r: r.set(self._key("success_counter"), 0))

    # ---- opened_at ---------------------------------------------------------------------------
    @property
    def opened_at(self) -> datetime | None:
        raw = self._call(lambda r: r.get(self._key("opened_at")))
        if raw is not None:
            return datetime.fromtimestamp(int(raw), tz=UTC)
        return self._local.opened_at

    @opened_at.setter
    def opened_at(self, now: datetime) -> None:
        self._local.opened_at = now
        # the latest opening wins across workers (a stale one must not shorten the reset time-out)
        seconds = int(calendar.timegm(now.utctimetuple()))
        self._call(lambda r: r.eval(_SET_IF_GREATER, 1, self._key("opened_at"), seconds))


_SET_IF_GREATER = """
local current = tonumber(redis.call('GET', KEYS[1]))
if current == nil or tonumber(ARGV[1]) > current then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""
