"""SIGTERM to the real product process (`python -m app serve`, a random 135M model): the chat reply that
is streaming finishes, new requests are refused with 503 while it drains, and the process exits 0."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import requests

from httpkit.shutdown import GracefulShutdown
from tests.helpers.net import free_port
from tests.helpers.paths import REPO_ROOT

KEY = {"X-Site-Key": "demo-site-key"}



def test_sigterm_drains_the_stream_and_exits(tmp_path):
    port = free_port()
    # a 135M-parameter random model generates slowly enough on the CPU (~4 s for 120 tokens) that
    # the reply is still being generated when the signal arrives
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MODEL": "random:smollm2-135m", "CHAT_MAX_TOKENS": "120",
           "KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": "", "SHUTDOWN_DRAIN_S": "60"}
    env.pop("INFERENCE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", str(port)], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get(f"{base}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.3)
        sid = requests.post(f"{base}/api/chat/sessions", headers=KEY, timeout=120).json()["session_id"]
        resp = requests.post(f"{base}/api/chat/sessions/{sid}/messages", headers=KEY, stream=True, timeout=120,
                             json={"content": "How long do refunds take?", "stream": True})
        lines = resp.iter_lines(decode_unicode=True)
        first = next(line for line in lines if line.startswith("event:"))
        assert first == "event: token"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = requests.get(f"{base}/healthz", timeout=5)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        rest = list(lines)                                          # the reply streams to its end
        assert "event: done" in rest
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_drain_is_bounded():
    exits = []
    release = threading.Event()

    def slow_app(environ, start_response):
        start_response("200 OK", [])
        release.wait(5)
        return [b"late"]

    shutdown = GracefulShutdown(slow_app, drain_s=0.2, exit=exits.append, flush_s=0.0)
    worker = threading.Thread(target=lambda: shutdown({}, lambda *a: None))
    worker.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    shutdown.draining = True
    shutdown.drain_and_exit()                    # the request is still running: gives up after drain_s
    assert exits == [0] and 0.15 < time.monotonic() - t0 < 2 and shutdown.in_flight == 1
    release.set()
    worker.join()
