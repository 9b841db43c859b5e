"""Live event fan-out (app/live_events.py) on both backends: the in-process buffers and Redis
Streams on the real Redis (db 15, flushed per test), and the SSE response on a small Flask app."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
import redis
from flask import Flask, request

from app.errors import PlainError, render
from app.live_events import (
    Event,
    InProcessEvents,
    LiveEvents,
    RedisStreamEvents,
    conversation_channel,
    live_events_for,
    sse_response,
    tenant_channel,
)
from tests.helpers.net import die_with_parent, free_port, stop_process

REDIS_URL = "redis://127.0.0.1:6379/15"
CHANNEL = conversation_channel("acme", "c1")


@pytest.fixture(params=["in_process", "redis"])
def make_events(request):
    """A factory of instances of one backend; Redis instances share one flushed db, like web workers."""
    if request.param == "redis":
        request.getfixturevalue("redis_server")
        redis.Redis.from_url(REDIS_URL).flushdb()
    made: list[LiveEvents] = []

    def make() -> LiveEvents:
        made.append(InProcessEvents() if request.param == "in_process" else RedisStreamEvents(REDIS_URL))
        return made[-1]
    make.backend = request.param
    yield make
    for events in made:
        events.close()


def take(stream, n: int) -> list[Event]:
    """The first n events of a stream (heartbeats skipped); the stream's max_s bounds the wait."""
    out = []
    for event in stream:
        if event is not None:
            out.append(event)
            if len(out) == n:
                break
    return out


def test_channels_are_per_tenant_and_cannot_be_forged():
    assert conversation_channel("a:b", "c") != conversation_channel("a", "b:c")
    assert tenant_channel("acme") != tenant_channel("acme2") != conversation_channel("acme", "")
    assert isinstance(live_events_for(None), InProcessEvents)


def test_stream_without_last_id_sees_only_later_events(make_events):
    events = make_events()
    events.publish(CHANNEL, "message", {"text": "before"})
    stream = events.stream(CHANNEL, None, max_s=3, heartbeat_s=5)
    later = events.publish(CHANNEL, "message", {"text": "after", "n": 1})
    [event] = take(stream, 1)
    assert event == Event(later, "message", {"text": "after", "n": 1})


def test_stream_from_last_id_replays_what_followed_in_order(make_events):
    events = make_events()
    ids = [events.publish(CHANNEL, "typing" if i % 2 else "message", {"i": i}) for i in range(4)]
    events.publish(conversation_channel("acme", "other"), "message", {"i": 99})
    assert len(set(ids)) == 4
    replay = take(events.stream(CHANNEL, ids[0], max_s=3, heartbeat_s=5), 3)
    assert [(e.id, e.kind, e.data) for e in replay] == [(ids[i], "typing" if i % 2 else "message", {"i": i})
                                                       for i in (1, 2, 3)]


def test_an_unknown_last_event_id_is_treated_as_none(make_events):
    events = make_events()
    events.publish(CHANNEL, "message", {"i": 0})
    stream = events.stream(CHANNEL, "not-an-id", max_s=3, heartbeat_s=5)
    new = events.publish(CHANNEL, "message", {"i": 1})
    assert [e.id for e in take(stream, 1)] == [new]


def test_heartbeats_when_idle_and_the_stream_ends_after_max_s(make_events):
    events = make_events()
    started = time.monotonic()
    items = list(events.stream(CHANNEL, None, max_s=1.0, heartbeat_s=0.3))
    elapsed = time.monotonic() - started
    assert items and all(item is None for item in items)
    assert 2 <= len(items) <= 4
    assert 1.0 <= elapsed < 2.0


def test_close_ends_a_blocked_stream_promptly(make_events):
    events = make_events()
    ended = threading.Event()

    def follow():
        list(events.stream(CHANNEL, None, max_s=30, heartbeat_s=30))
        ended.set()
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.3)                                  # blocked in its wait by now
    closed_at = time.monotonic()
    events.close()
    assert ended.wait(2.0)
    assert time.monotonic() - closed_at < 1.0
    thread.join(1.0)
    assert list(events.stream(CHANNEL, None, max_s=30)) == []     # streams opened after close end at once


def test_a_subscriber_in_another_thread_gets_the_event_within_a_second(make_events):
    publisher = make_events()
    subscriber = make_events() if make_events.backend == "redis" else publisher   # Redis: two web workers
    stream = subscriber.stream(CHANNEL, None, max_s=5, heartbeat_s=10)
    got: list[tuple[float, Event]] = []

    def follow():
        for event in take(stream, 1):
            got.append((time.monotonic(), event))
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.3)
    sent_at = time.monotonic()
    event_id = publisher.publish(CHANNEL, "handoff", {"conversation": "c1"})
    thread.join(5.0)
    [(received_at, event)] = got
    assert event.id == event_id and event.kind == "handoff"
    print(f"{make_events.backend}: delivered in {(received_at - sent_at) * 1000:.1f} ms")
    assert received_at - sent_at < 1.0, f"delivered in {received_at - sent_at:.3f} s"


def test_fan_out_and_replay_across_redis_workers(redis_server):
    redis.Redis.from_url(REDIS_URL).flushdb()
    worker_a, worker_b = RedisStreamEvents(REDIS_URL), RedisStreamEvents(REDIS_URL)
    try:
        stream_b = worker_b.stream(tenant_channel("acme"), None, max_s=3, heartbeat_s=5)
        first = worker_a.publish(tenant_channel("acme"), "handoff", {"conversation": "c1"})
        second = worker_b.publish(tenant_channel("acme"), "handoff", {"conversation": "c2"})
        assert [e.id for e in take(stream_b, 2)] == [first, second]
        # a client that reconnects to the other worker with Last-Event-ID gets what followed
        assert [e.data for e in take(worker_a.stream(tenant_channel("acme"), first, max_s=3), 1)] == [
            {"conversation": "c2"}]
        assert 0 < redis.Redis.from_url(REDIS_URL).ttl(f"live:{tenant_channel('acme')}") <= 86400
    finally:
        worker_a.close()
        worker_b.close()


def test_redis_down_publish_returns_none_and_streams_stay_alive():
    events = RedisStreamEvents(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    assert events.publish(CHANNEL, "message", {"text": "hi"}) is None
    assert events.publish(CHANNEL, "message", {"text": "hi"}) is None
    assert events.num_publish_failures == 2
    assert time.monotonic() - started < 3.0
    items = list(events.stream(CHANNEL, None, max_s=1.0, heartbeat_s=0.3))
    assert items and all(item is None for item in items)
    events.close()


def start_redis(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, preexec_fn=die_with_parent())
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.02)
    stop_process(proc)
    raise RuntimeError("redis-server did not start")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_stream_rides_out_a_redis_restart():
    port = free_port()
    server = start_redis(port)
    events = RedisStreamEvents(f"redis://127.0.0.1:{port}/0")
    try:
        stream = events.stream(CHANNEL, events.publish(CHANNEL, "message", {"n": 0}), max_s=8, heartbeat_s=0.2)
        stop_process(server)                         # down, and back empty (no persistence)
        down = [next(stream) for _ in range(3)]
        assert down == [None, None, None]
        server = start_redis(port)
        sent = events.publish(CHANNEL, "message", {"n": 1})
        assert sent is not None
        assert [(e.id, e.data) for e in take(stream, 1)] == [(sent, {"n": 1})]
    finally:
        events.close()
        stop_process(server)


def test_in_process_buffer_and_idle_channels_are_bounded():
    events = InProcessEvents(buffer_size=4, idle_s=0.05)
    ids = [events.publish("a", "message", {"i": i}) for i in range(10)]
    assert [e.data["i"] for e in take(events.stream("a", ids[0], max_s=2), 4)] == [6, 7, 8, 9]
    time.sleep(0.1)
    events.publish("b", "message", {})
    assert events.num_channels == 1                  # "a" was idle and dropped


@pytest.fixture()
def web():
    events, slots = InProcessEvents(), threading.BoundedSemaphore(1)
    app = Flask(__name__)
    app.register_error_handler(PlainError, render)

    @app.get("/events")
    def stream():
        return sse_response(events, CHANNEL, request.headers.get("Last-Event-ID"), max_s=float(request.args["max_s"]),
                            slots=slots, heartbeat_s=0.3)
    yield app.test_client(), events, slots
    events.close()


def test_sse_body_has_retry_events_and_pings(web):
    client, events, _ = web
    start = events.publish(CHANNEL, "message", {"text": "old"})
    first = events.publish(CHANNEL, "message", {"text": "héllo"})
    second = events.publish(CHANNEL, "status", {"state": "agent"})
    with client.get("/events?max_s=0.8", headers={"Last-Event-ID": start}) as resp:
        body = resp.get_data(as_text=True)
    assert resp.status_code == 200 and resp.mimetype == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache" and resp.headers["X-Accel-Buffering"] == "no"
    assert body.startswith("retry: 2000\n\n"
                           f"id: {first}\nevent: message\ndata: {{\"text\": \"héllo\"}}\n\n"
                           f"id: {second}\nevent: status\ndata: {{\"state\": \"agent\"}}\n\n"
                           ": ping\n\n")
    assert body.count(": ping\n\n") >= 1 and "old" not in body


def test_sse_slots_503_with_retry_after_and_released(web):
    client, _, slots = web
    held = client.get("/events?max_s=5", buffered=False)          # open, its body not read yet
    assert held.status_code == 200
    refused = client.get("/events?max_s=5")
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
    assert "too many" in refused.get_json()["error"]
    held.close()                                                    # the client went away
    with client.get("/events?max_s=0.2") as resp:                   # read to its end
        assert resp.get_data(as_text=True).startswith("retry: 2000\n\n")
    assert slots.acquire(blocking=False)                            # released both times
    slots.release()
