"""A handoff summary produced by a real Celery worker over real Redis: the web app queues the
task, a separate worker process runs it (on the tiny random model) and writes the summary."""
from __future__ import annotations

import time

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from tests.helpers.celery_worker import start_worker, stop_worker

REDIS_URL = "redis://127.0.0.1:6379/13"
METRICS_PORT = 19808
KEY = {"X-Site-Key": "demo-site-key"}


@pytest.fixture()
def worker(redis_server):
    redis.Redis.from_url(REDIS_URL).flushdb()
    proc = start_worker({"REDIS_URL": REDIS_URL, "MODEL": "random:tiny", "WORKER_METRICS_PORT": str(METRICS_PORT)})
    yield proc
    stop_worker(proc)


def test_handoff_summary_is_written_by_a_real_worker(worker, tiny_client, tmp_path):
    app = create_app({"REDIS_URL": REDIS_URL, "KB_CACHE_DIR": str(tmp_path / "kb")}, client=tiny_client)
    assert not app.extensions["celery"].conf.task_always_eager
    web = app.test_client()
    sid = web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "My kettle arrived with a crack"})
    handed = web.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY).get_json()
    assert handed["status"] == "pending_human" and handed["waiting"]["queue_position"] >= 1
    store = app.extensions["support_chat"]["store"]
    deadline = time.time() + 90
    while time.time() < deadline and worker.poll() is None and not store.meta("demo", sid).get("handoff_summary"):
        time.sleep(0.5)
    assert worker.poll() is None, worker.stdout.read()
    assert store.meta("demo", sid).get("handoff_summary"), "the worker wrote no summary"
    assert web.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()["status"] == "pending_human"

    # the store is written inside the task; its postrun signal (success, duration) follows at once
    def samples() -> dict:
        text = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}
    task = ("task", "app.tasks.summarize_handoff")
    done = ("celery_tasks_total", (("state", "succeeded"), task))
    deadline = time.time() + 10
    got = samples()
    while time.time() < deadline and done not in got:
        time.sleep(0.1)
        got = samples()
    assert got.get(done) == 1 and got[("celery_tasks_total", (("state", "started"), task))] == 1
    assert got[("celery_task_duration_seconds_count", (task,))] == 1
    assert got[("celery_queue_length", (("queue", "celery"),))] == 0
