"""Scenario 7: 600 slow clients hold connections open (half of them never finish sending their
request, half stream a reply and never read it) while other customers use the chat. Every
connection gets an answer (200, or 503 with Retry-After past CHAT_MAX_TURNS), none waits for a
time-out, and the other customers are served."""
from __future__ import annotations

import json
import select
import socket
import threading
import time
from pathlib import Path

from tests.e2e.faults.harness import (
    Customer,
    InferenceService,
    ScenarioResult,
    Tally,
    WebApp,
    fill_embedding_cache,
    lost_messages,
    wait_until,
)

NUM_IDLE, NUM_STREAMS, NUM_CUSTOMERS = 300, 300, 20
STATUS_WAIT_S = 60


def _stream_request(port: int, sid: str, content: str) -> bytes:
    body = json.dumps({"content": content, "stream": True}).encode()
    return (f"POST /api/chat/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"X-Site-Key: demo-site-key\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "\r\n").encode() + body


def _status_lines(socks, timeout: float) -> dict[socket.socket, bytes]:
    """The first bytes each socket receives (its status line), waiting at most `timeout` in all."""
    got: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(socks) and time.monotonic() < deadline:
        waiting = [s for s in socks if s not in got]
        readable, _, _ = select.select(waiting, [], [], 0.5)
        for s in readable:
            got[s] = s.recv(64)
    return got


def slow_clients(workdir: Path, service: InferenceService, embedder=None) -> ScenarioResult:
    result = ScenarioResult("7 600 slow clients holding connections")
    if embedder is not None:
        result.details["cache_filled_s"] = fill_embedding_cache(workdir / "kb-cache", embedder)
    web = WebApp(workdir, service.url, threads=64, CHAT_MAX_TURNS="32", CHAT_MAX_TOKENS="4")
    tally = Tally()
    socks: list[socket.socket] = []
    try:
        web.start()
        if not wait_until(lambda: web.readyz()[1]["status"] == "ready", 120):
            raise RuntimeError(f"the full pipeline never came up: {web.readyz()}")
        customer = Customer(web.url, tally)
        sids = [customer.new_session() for _ in range(10)]
        for _ in range(NUM_IDLE):                      # slowloris: headers never finished
            s = socket.create_connection(("127.0.0.1", web.port))
            s.sendall(b"POST /api/chat/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Site-Key: demo")
            socks.append(s)
        streams: dict[socket.socket, tuple[str, str]] = {}          # socket -> (session id, content)
        for i in range(NUM_STREAMS):                   # a streamed turn whose reply is never read
            s = socket.create_connection(("127.0.0.1", web.port))
            sid, content = sids[i % len(sids)], f"How long do refunds take? (slow client {i})"
            s.sendall(_stream_request(web.port, sid, content))
            socks.append(s)
            streams[s] = (sid, content)
        served: list[float] = []
        lock = threading.Lock()

        def other_customer():
            c = Customer(web.url, Tally(), timeout=30)
            t0 = time.monotonic()
            sid = c.new_session()
            for _ in range(30):                        # the widget retries after Retry-After
                if c.say(sid, "What does delivery to Canada cost?") is not None:
                    served.append(time.monotonic() - t0)
                    break
                time.sleep(1.0)
            with lock:
                tally.requests += c.tally.requests
                tally.server_errors += c.tally.server_errors
                tally.shed += c.tally.shed
                tally.errors += c.tally.errors
                tally.accepted += c.tally.accepted
        others = [threading.Thread(target=other_customer) for _ in range(NUM_CUSTOMERS)]
        for t in others:
            t.start()
        statuses = _status_lines(streams, STATUS_WAIT_S)
        for t in others:
            t.join(120)
        codes = {s: line[9:12].decode(errors="replace") for s, line in statuses.items()}
        ok = [streams[s] for s, code in codes.items() if code == "200"]
        shed = sum(1 for code in codes.values() if code == "503")
        tally.requests += len(streams)
        tally.shed += shed
        tally.server_errors += sum(1 for code in codes.values() if code.startswith("5") and code != "503")
        result.details.update(streams_200=len(ok), streams_503=shed, streams_no_answer=len(streams) - len(statuses),
                              customers_served=len(served), slowest_customer_s=round(max(served, default=0), 2))
        result.checks["every streamed request got a status line (no time-out)"] = len(statuses) == len(streams)
        result.checks["only 200 or 503 for the streams"] = all(c in ("200", "503") for c in codes.values())
        result.checks["the other customers were served"] = len(served) == NUM_CUSTOMERS
        alive = sum(1 for s in socks[:NUM_IDLE] if not select.select([s], [], [], 0)[0])
        result.details["idle_connections_still_open"] = alive
        for s in socks:
            s.close()
        socks.clear()
        time.sleep(1.0)
        tally.accepted += ok
        result.lost = lost_messages(customer, tally.accepted)
        return result.take(tally)
    finally:
        for s in socks:
            s.close()
        web.close()
