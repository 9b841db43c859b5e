"""Live events (agent replies, typing, new handoffs, customer messages) fanned out to the agent
console's and the chat widget's Server-Sent Events streams:

    events.publish(conversation_channel(tid, cid), "message", {...})   # after the database commit
    return sse_response(events, tenant_channel(tid), request.headers.get("Last-Event-ID"), max_s=300)

Best-effort: the database is the record, so a failed publish is logged and counted, never raised.
Each channel keeps a short buffer that a client reconnecting with Last-Event-ID replays. Without
Redis one process holds the buffers (the embedded default); with Redis all workers share Redis
Streams, so events and replays cross workers. Ids are opaque: only their backend compares them.
"""
from __future__ import annotations

import abc
import collections
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote

import redis
from flask import Response

from app.errors import PlainError
from pipelines.redis_client import connect

log = logging.getLogger(__name__)

_ID = re.compile(r"^(\d+)-(\d+)$")        # "<ms>-<seq>", Redis Streams' id format, used by both backends


@dataclass(frozen=True)
class Event:
    id: str          # increases per channel; the SSE id, sent back as Last-Event-ID
    kind: str        # "message", "typing", "status", "handoff", ...
    data: dict


def conversation_channel(tenant_id: str, conversation_id: str) -> str:
    """Where the customer's widget listens. Parts are quoted so that no tenant id containing a
    ':' can name another tenant's channel."""
    return f"conv:{quote(tenant_id, safe='')}:{quote(conversation_id, safe='')}"


def tenant_channel(tenant_id: str) -> str:
    """Where the tenant's agents listen."""
    return f"tenant:{quote(tenant_id, safe='')}"


def _parse_id(event_id: str | None) -> tuple[int, int] | None:
    """The id as a comparable pair, or None for no id or one we did not make (a client's garbage
    Last-Event-ID is treated as no id: only new events, rather than an error)."""
    match = _ID.match(event_id or "")
    return (int(match[1]), int(match[2])) if match else None


class LiveEvents(abc.ABC):
    """Publish to channels and follow them. stream() is shared: it resolves where to start when
    called (so "only new events" means those published after the call, not after the first
    next()), then waits on the backend in slices, adding heartbeats and ending at max_s or close()."""

    def __init__(self) -> None:
        self.num_publish_failures = 0
        self._closed = threading.Event()
        self._count_lock = threading.Lock()

    @abc.abstractmethod
    def publish(self, channel: str, kind: str, data: dict) -> str | None:
        """The new event's id, or None when the backend is down (logged, counted); never raises
        for an outage: the caller has already committed what the event announces."""

    @abc.abstractmethod
    def _start(self, channel: str, last_id: str | None):
        """The cursor a stream starts from: after last_id, or after the newest event when None."""

    @abc.abstractmethod
    def _wait(self, channel: str, cursor, timeout_s: float) -> tuple[object, list[Event]]:
        """Events after cursor (waiting up to timeout_s for one) and the cursor after them."""

    def stream(self, channel: str, last_id: str | None, *, max_s: float,
               heartbeat_s: float = 15.0) -> Iterator[Event | None]:
        """Events after last_id (the buffered ones first), None as a heartbeat after heartbeat_s
        without one; ends after max_s (the client reconnects with Last-Event-ID) or on close()."""
        deadline = time.monotonic() + max_s
        return self._follow(channel, self._start(channel, last_id), deadline, heartbeat_s)

    def _follow(self, channel: str, cursor, deadline: float, heartbeat_s: float) -> Iterator[Event | None]:
        beat = time.monotonic() + heartbeat_s
        while not self._closed.is_set():
            now = time.monotonic()
            if now >= deadline:
                return
            if now >= beat:
                yield None
                beat = time.monotonic() + heartbeat_s
                continue
            cursor, events = self._wait(channel, cursor, min(deadline, beat) - now)
            yield from events
            if events:
                beat = time.monotonic() + heartbeat_s

    def close(self) -> None:
        """Wakes and ends every open stream (graceful shutdown); new streams end at once."""
        self._closed.set()

    def _publish_failed(self, channel: str, exc: Exception) -> None:
        with self._count_lock:
            self.num_publish_failures += 1
        log.warning("live event to %s not published (%s); %d failed so far", channel, exc, self.num_publish_failures)


class _Channel:
    def __init__(self, lock: threading.Lock, buffer_size: int):
        self.buffer: collections.deque[tuple[tuple[int, int], Event]] = collections.deque(maxlen=buffer_size)
        self.cond = threading.Condition(lock)     # one lock for all channels, a condition per channel
        self.num_waiting = 0
        self.last_active = time.monotonic()


class InProcessEvents(LiveEvents):
    """One process's channels (no Redis): a ring buffer each and a condition that wakes only its
    own streams. A channel nobody published to or waited on for idle_s is dropped, so memory is
    bounded by the channels active recently, not by every conversation ever seen. Ids are
    "<ms>-<seq>" from the wall clock, so a client reconnecting after a restart still gets the
    events published since."""

    def __init__(self, buffer_size: int = 256, idle_s: float = 600.0):
        super().__init__()
        self.buffer_size, self.idle_s = buffer_size, idle_s
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}         # channel name -> its buffer and waiters
        self._last_id = (0, 0)
        self._last_sweep = time.monotonic()

    def publish(self, channel: str, kind: str, data: dict) -> str | None:
        data = json.loads(json.dumps(data))             # a copy, JSON-shaped as Redis would return it
        with self._lock:
            ms = max(int(time.time() * 1000), self._last_id[0])
            self._last_id = (ms, self._last_id[1] + 1 if ms == self._last_id[0] else 0)
            event = Event(f"{ms}-{self._last_id[1]}", kind, data)
            ch = self._channel(channel)
            ch.buffer.append((self._last_id, event))
            ch.cond.notify_all()
            self._sweep()
        return event.id

    def _start(self, channel: str, last_id: str | None) -> tuple[int, int]:
        return _parse_id(last_id) or self._last_id       # ids are instance-wide: >= any one buffered

    def _wait(self, channel: str, cursor: tuple[int, int], timeout_s: float) -> tuple[object, list[Event]]:
        with self._lock:
            ch = self._channel(channel)
            if not (ch.buffer and ch.buffer[-1][0] > cursor) and not self._closed.is_set():
                ch.num_waiting += 1
                try:
                    ch.cond.wait(timeout_s)
                finally:
                    ch.num_waiting -= 1
            newer = [(key, e) for key, e in ch.buffer if key > cursor]
        return (newer[-1][0] if newer else cursor), [e for _, e in newer]

    def close(self) -> None:
        super().close()
        with self._lock:
            for ch in self._channels.values():
                ch.cond.notify_all()

    @property
    def num_channels(self) -> int:
        return len(self._channels)

    def _channel(self, name: str) -> _Channel:
        ch = self._channels.get(name)
        if ch is None:
            ch = self._channels[name] = _Channel(self._lock, self.buffer_size)
        ch.last_active = time.monotonic()
        return ch

    def _sweep(self) -> None:
        """Drops idle channels; at most every idle_s / 10, so publish stays O(1) amortized."""
        now = time.monotonic()
        if now - self._last_sweep < self.idle_s / 10:
            return
        self._last_sweep = now
        idle = [n for n, ch in self._channels.items() if not ch.num_waiting and now - ch.last_active > self.idle_s]
        for name in idle:
            del self._channels[name]


class RedisStreamEvents(LiveEvents):
    """A Redis Stream per channel (XADD with approximate MAXLEN, EXPIRE so an idle conversation's
    key goes away), followed with XREAD BLOCK by every worker. Reads block in slices of
    SLICE_S because Redis cannot be told to end another thread's blocked XREAD: close() is
    seen within a slice. Few retries and short time-outs (pipelines/redis_client.py): an event
    that waits out an outage is late anyway, and a stream rides it out with heartbeats."""

    SLICE_S = 0.5

    def __init__(self, url: str, maxlen: int = 256, ttl_s: int = 86400, retries: int = 1):
        super().__init__()
        self.maxlen, self.ttl_s = maxlen, ttl_s
        self._redis = connect(url, retries=retries, connect_timeout_s=0.5, timeout_s=self.SLICE_S + 2.0)
        self._last_warning = 0.0

    def publish(self, channel: str, kind: str, data: dict) -> str | None:
        fields = {"kind": kind, "data": json.dumps(data, ensure_ascii=False)}
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.xadd(f"live:{channel}", fields, maxlen=self.maxlen, approximate=True)
            pipe.expire(f"live:{channel}", self.ttl_s)
            event_id, _ = pipe.execute()
        except redis.RedisError as exc:
            self._publish_failed(channel, exc)
            return None
        return event_id

    def _start(self, channel: str, last_id: str | None) -> str | None:
        if _parse_id(last_id) is not None:
            return last_id
        try:                                          # "$" would skip events published between reads
            newest = self._redis.xrevrange(f"live:{channel}", count=1)
        except redis.RedisError as exc:
            self._read_failed(channel, exc)
            return None                               # resolved by the first read that reaches Redis
        return newest[0][0] if newest else "0-0"

    def _wait(self, channel: str, cursor: str | None, timeout_s: float) -> tuple[object, list[Event]]:
        slice_s = min(timeout_s, self.SLICE_S)
        cursor = cursor or self._start(channel, None)
        if cursor is None:                            # Redis was down when the stream started
            self._closed.wait(slice_s)
            return None, []
        try:
            reply = self._redis.xread({f"live:{channel}": cursor}, count=100, block=max(1, int(slice_s * 1000)))
        except redis.RedisError as exc:
            self._read_failed(channel, exc)
            self._closed.wait(slice_s)                # the backoff; close() still ends it at once
            return cursor, []
        events = [Event(eid, f["kind"], json.loads(f["data"])) for _, entries in reply for eid, f in entries]
        return (events[-1].id if events else cursor), events

    def _read_failed(self, channel: str, exc: Exception) -> None:
        if time.monotonic() - self._last_warning > 10.0:   # one line per outage, not one per slice per stream
            self._last_warning = time.monotonic()
            log.warning("live events of %s unreadable (%s); streams keep alive and retry", channel, exc)


def live_events_for(redis_url: str | None) -> LiveEvents:
    return RedisStreamEvents(redis_url) if redis_url else InProcessEvents()


def _slot_release(slots: threading.BoundedSemaphore | None) -> Callable[[], None]:
    """Takes one of `slots` now or raises 503 + Retry-After; the release it returns frees it once,
    however many of the stream's ends (finished, client gone, never started) call it."""
    if slots is None:
        return lambda: None
    if not slots.acquire(blocking=False):
        raise PlainError(503, "too many live streams open; retry after the Retry-After seconds", retry_after=5)
    once = threading.Lock()

    def release() -> None:
        if once.acquire(blocking=False):
            slots.release()
    return release


def sse_response(events: LiveEvents, channel: str, last_event_id: str | None, *, max_s: float,
                 slots: threading.BoundedSemaphore | None = None, retry_ms: int = 2000,
                 heartbeat_s: float = 15.0) -> Response:
    """The channel as text/event-stream. Each open stream holds a request thread, so `slots`
    bounds them per process; heartbeats keep proxies from timing the stream out and are how a
    client that went away is noticed (the write fails and the server closes the response)."""
    release = _slot_release(slots)
    try:
        stream = events.stream(channel, last_event_id or None, max_s=max_s, heartbeat_s=heartbeat_s)

        def body() -> Iterator[str]:
            try:
                yield f"retry: {retry_ms}\n\n"
                for event in stream:
                    if event is None:
                        yield ": ping\n\n"
                    else:
                        data = json.dumps(event.data, ensure_ascii=False)
                        yield f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"
            finally:
                release()
        resp = Response(body(), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    except BaseException:
        release()
        raise
    resp.call_on_close(release)                      # a response closed before its body started
    return resp
