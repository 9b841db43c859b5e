"""A handoff summary produced by a real Celery worker over real Redis: the web app queues the
task, a separate worker process runs it (on the tiny random model) and writes the summary."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from app import create_app

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/13"
KEY = {"X-Site-Key": "demo-site-key"}


@pytest.fixture()
def worker(redis_server):
    redis.Redis.from_url(REDIS_URL).flushdb()
    env = {**os.environ, "REDIS_URL": REDIS_URL, "MODEL": "random:tiny", "PYTHONPATH": str(ROOT)}
    env.pop("INFERENCE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "app.worker", "worker", "--pool=solo",
                             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_handoff_summary_is_written_by_a_real_worker(worker, tiny_client, tmp_path):
    app = create_app({"REDIS_URL": REDIS_URL, "KB_CACHE_DIR": str(tmp_path / "kb")}, client=tiny_client)
    assert not app.extensions["celery"].conf.task_always_eager
    web = app.test_client()
    sid = web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "My kettle arrived with a crack"})
    assert web.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY).get_json() == {"status": "pending_human"}
    store = app.extensions["support_chat"]["store"]
    deadline = time.time() + 90
    while time.time() < deadline and worker.poll() is None and not store.meta("demo", sid).get("handoff_summary"):
        time.sleep(0.5)
    assert worker.poll() is None, worker.stdout.read()
    assert store.meta("demo", sid).get("handoff_summary"), "the worker wrote no summary"
    assert web.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()["status"] == "pending_human"
