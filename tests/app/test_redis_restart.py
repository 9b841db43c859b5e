"""Redis restarted during chat traffic: requests in flight ride the restart out (rate limits fall
back to in-process counters), the conversation (in the database) loses nothing, and no request
gets a 5xx."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
import redis

from app import create_app
from tests.helpers.net import free_port

KEY = {"X-Site-Key": "demo-site-key"}
REDIS = shutil.which("redis-server")



def start_redis(port: int, data_dir) -> subprocess.Popen:
    proc = subprocess.Popen([REDIS, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
                             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                            stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(200):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError("redis-server did not start")


@pytest.mark.skipif(REDIS is None, reason="redis-server is not installed")
def test_chat_keeps_answering_through_a_redis_restart(tiny_client, tmp_path):
    port = free_port()
    server = start_redis(port, tmp_path)
    app = create_app({"REDIS_URL": f"redis://127.0.0.1:{port}/0", "KB_CACHE_DIR": str(tmp_path / "kb"),
                      "CHAT_MAX_TOKENS": 4, "CELERY": {"task_always_eager": True}}, client=tiny_client)
    web = app.test_client()
    sid = web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    statuses, restarted = [], threading.Event()

    def restart():
        nonlocal server
        server.terminate()
        server.wait(10)
        time.sleep(0.5)                        # down for a moment, as in a rolling restart
        server = start_redis(port, tmp_path)
        restarted.set()

    try:
        for i in range(40):
            if i == 8:
                threading.Thread(target=restart, daemon=True).start()
            resp = web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": f"order {i}?"})
            statuses.append(resp.status_code)
            if restarted.is_set() and i > 20:
                break
        assert restarted.wait(20)
        assert all(s < 500 for s in statuses), statuses
        assert statuses.count(200) == len(statuses)                 # the session survived the restart
        history = web.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()["messages"]
        assert len(history) == 2 * len(statuses)
    finally:
        server.kill()
        server.wait(10)
