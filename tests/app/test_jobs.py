"""Batch generation jobs: submit (JSON and JSONL), poll, download, cancel, idempotency keys,
tenant isolation, bad input; and a real Celery worker killed mid-job whose job then completes
exactly once on a restarted worker."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import redis

from app import create_app
from app.tenants import hash_api_key
from tests.helpers.celery_worker import start_worker
from tests.helpers.paths import REPO_ROOT

TENANTS = f"""tenants:
  acme: {{site_key: s-acme, system_prompt: A, api_keys: ["{hash_api_key('key-acme')}"]}}
  other: {{site_key: s-other, system_prompt: B, api_keys: ["{hash_api_key('key-other')}"]}}
"""
ACME = {"Authorization": "Bearer key-acme"}
OTHER = {"Authorization": "Bearer key-other"}


@pytest.fixture()
def web(tmp_path, tiny_client):
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    app = create_app({"TENANTS_PATH": str(tmp_path / "tenants.yaml"), "KB_CACHE_DIR": str(tmp_path / "kb"),
                      "REDIS_URL": None}, client=tiny_client)
    return app.test_client()


def wait_done(web, job_id, headers=ACME, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        view = web.get(f"/v1/jobs/{job_id}", headers=headers).get_json()
        if view["status"] in ("done", "failed", "cancelled"):
            return view
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {view}")


def test_submit_poll_download(web):
    items = [{"prompt": "def add(a, b):", "max_tokens": 6}, {"messages": [{"role": "user", "content": "hi"}],
                                                             "max_tokens": 5, "temperature": 0.5},
             {"prompt": "x = ", "max_tokens": 3, "stop": ["\n"], "seed": 7}]
    resp = web.post("/v1/jobs", json={"requests": items}, headers=ACME)
    assert resp.status_code == 202 and resp.get_json()["total"] == 3
    job_id = resp.get_json()["job_id"]
    assert wait_done(web, job_id) == {"job_id": job_id, "status": "done", "done": 3, "total": 3}
    out = web.get(f"/v1/jobs/{job_id}/results", headers=ACME)
    assert out.mimetype == "application/x-ndjson"
    rows = [json.loads(line) for line in out.get_data(as_text=True).splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2] and all(isinstance(r["text"], str) for r in rows)
    assert web.post(f"/v1/jobs/{job_id}/cancel", headers=ACME).status_code == 409          # already done
    # another tenant cannot see it; an unknown id is the same 404
    assert web.get(f"/v1/jobs/{job_id}", headers=OTHER).status_code == 404
    assert web.get(f"/v1/jobs/{job_id}/results", headers=OTHER).status_code == 404
    assert web.get("/v1/jobs/" + "0" * 32, headers=ACME).status_code == 404


def test_jsonl_and_idempotency_key(web):
    body = "\n".join(json.dumps({"prompt": f"line {i}", "max_tokens": 2}) for i in range(4)) + "\n"
    headers = {**ACME, "Content-Type": "application/x-ndjson", "Idempotency-Key": "nightly-42"}
    first = web.post("/v1/jobs", data=body, headers=headers)
    again = web.post("/v1/jobs", data=body, headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert again.get_json()["job_id"] == first.get_json()["job_id"]
    other = web.post("/v1/jobs", data=body, headers={**headers, **OTHER})     # keys are per tenant
    assert other.status_code == 202 and other.get_json()["job_id"] != first.get_json()["job_id"]
    assert wait_done(web, first.get_json()["job_id"])["done"] == 4


@pytest.mark.parametrize("body,message", [
    ({"requests": []}, "1 to 1000 items"),
    ({"requests": [{"prompt": "a", "messages": []}]}, "exactly one of prompt or messages"),
    ({"requests": [{"prompt": ""}]}, "requests[0].prompt"),
    ({"requests": [{"prompt": "a", "max_tokens": 0}]}, "requests[0].max_tokens"),
    ({"requests": [{"prompt": "a", "temperature": "hot"}]}, "requests[0].temperature"),
    ({"requests": [{"messages": [{"role": "robot", "content": "x"}]}]}, "requests[0].messages"),
    ({"requests": [{"prompt": "a", "n": 2}]}, "unknown fields ['n']"),
    ({"requests": "a"}, "body:"),
    ({"requests": [{"prompt": "a"}] * 1001}, "1 to 1000 items"),
])
def test_bad_batches_are_400s(web, body, message):
    resp = web.post("/v1/jobs", json=body, headers=ACME)
    assert resp.status_code == 400 and message in resp.get_json()["error"]["message"]


def test_bad_jsonl_line_and_auth(web):
    resp = web.post("/v1/jobs", data='{"prompt": "a"}\n{oops\n',
                    headers={**ACME, "Content-Type": "application/x-ndjson"})
    assert resp.status_code == 400 and "line 2" in resp.get_json()["error"]["message"]
    assert web.post("/v1/jobs", json={"requests": [{"prompt": "a"}]}).status_code == 401


REDIS_URL = "redis://127.0.0.1:6379/12"


def test_worker_killed_mid_job_completes_exactly_once(redis_server, tmp_path, tiny_client):
    redis.Redis.from_url(REDIS_URL).flushdb()
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    env = {**os.environ, "REDIS_URL": REDIS_URL, "PYTHONPATH": str(REPO_ROOT),
           "TENANTS_PATH": str(tmp_path / "tenants.yaml"),
           "MODEL": "random:smollm2-135m", "CELERY_VISIBILITY_TIMEOUT_S": "3", "WORKER_METRICS_PORT": "0"}
    env.pop("INFERENCE_URL", None)
    app = create_app({"REDIS_URL": REDIS_URL, "TENANTS_PATH": str(tmp_path / "tenants.yaml"),
                      "KB_CACHE_DIR": str(tmp_path / "kb")}, client=tiny_client)
    web = app.test_client()
    items = [{"prompt": f"item {i}:", "max_tokens": 24, "temperature": 0} for i in range(12)]
    job_id = web.post("/v1/jobs", json={"requests": items}, headers=ACME).get_json()["job_id"]
    store = app.extensions["completion"]["batches"]
    worker = start_worker(env, capture=False)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (store.get(job_id).get("done", 0) < 2) and worker.poll() is None:
            time.sleep(0.1)
        assert store.get(job_id)["done"] >= 2, "the worker made no progress"
        worker.send_signal(signal.SIGKILL)                    # mid-job: its message is not acknowledged
        worker.wait(10)
        assert store.get(job_id)["status"] == "running" and store.get(job_id)["done"] < 12
        # the broker redelivers after visibility_timeout
        worker = start_worker(env, capture=False)
        view = wait_done(web, job_id, timeout=180)
        assert view["status"] == "done" and view["done"] == 12
        job = store.get(job_id)
        assert job["finished_times"] == 1 and job["attempts"] >= 2
        rows = [json.loads(line) for line in web.get(f"/v1/jobs/{job_id}/results", headers=ACME).get_data(
            as_text=True).splitlines()]
        assert [r["index"] for r in rows] == list(range(12))  # every item once, none twice
    finally:
        worker.kill()
        worker.wait(10)
