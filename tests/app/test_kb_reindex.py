"""Knowledge-base re-indexing as a Celery job: after the help centre's articles change, the job
embeds them into the shared cache; the chat then cites the new article. In the embedded default
the task runs on a thread of the web process; with Redis a real worker process does the
embedding and the web process only loads the cache."""
from __future__ import annotations

import shutil
import time

import pytest
import redis

from app import create_app
from tests.helpers.celery_worker import start_worker, stop_worker
from tests.helpers.paths import REPO_ROOT

REDIS_URL = "redis://127.0.0.1:6379/11"
AUTH = {"Authorization": "Bearer demo-api-key"}
KEY = {"X-Site-Key": "demo-site-key"}
ARTICLE = ("# Lost luggage tags\n\n## Replacing a tag\n\nIf your Voyager suitcase lost its luggage tag, we post a "
           "replacement tag free of charge within 5 days. Reply with the suitcase's serial number.\n")


@pytest.fixture()
def kb_dir(tmp_path):
    folder = tmp_path / "kb"
    shutil.copytree(REPO_ROOT / "configs" / "kb", folder)
    return folder


def wait_job(web, job_id: str, timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = web.get(f"/v1/kb/jobs/{job_id}", headers=AUTH).get_json()
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} still {job['status']}")


def test_reindex_picks_up_a_new_article_and_the_chat_cites_it(tiny_client, kb_dir, tmp_path):
    app = create_app({"REDIS_URL": None, "KB_PATH": str(kb_dir), "KB_CACHE_DIR": str(tmp_path / "cache"),
                      "CHAT_MAX_TOKENS": 8}, client=tiny_client)
    web = app.test_client()
    sid = web.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    before = web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY,
                      json={"content": "My suitcase lost its luggage tag, can I get a new one?"}).get_json()
    assert "kb/luggage-tags.md" not in [c["source"] for c in before["citations"]]
    (kb_dir / "luggage-tags.md").write_text(ARTICLE)
    resp = web.post("/v1/kb/reindex", headers=AUTH)
    assert resp.status_code == 202
    job = wait_job(web, resp.get_json()["job_id"])
    kb = app.extensions["support_chat"]["services"].chat.kb
    assert job["status"] == "done" and job["fingerprint"] == kb.fingerprint
    assert job["num_articles"] == len(list(kb_dir.glob("*.md")))
    after = web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY,
                     json={"content": "My suitcase lost its luggage tag, can I get a new one?"}).get_json()
    assert "kb/luggage-tags.md" in [c["source"] for c in after["citations"]]
    # again, unchanged: a cache hit, nothing embedded
    builds = kb.num_builds
    assert wait_job(web, web.post("/v1/kb/reindex", headers=AUTH).get_json()["job_id"])["status"] == "done"
    assert kb.num_builds == builds


def test_a_folder_without_articles_fails_the_job_visibly_and_keeps_the_index(tiny_client, kb_dir, tmp_path):
    app = create_app({"REDIS_URL": None, "KB_PATH": str(kb_dir), "KB_CACHE_DIR": str(tmp_path / "cache")},
                     client=tiny_client)
    web = app.test_client()
    kb = app.extensions["support_chat"]["services"].chat.kb
    chunks = len(kb.chunks)
    for article in kb_dir.glob("*.md"):
        article.unlink()
    job = wait_job(web, web.post("/v1/kb/reindex", headers=AUTH).get_json()["job_id"])
    assert job["status"] == "failed" and "no Markdown articles" in job["error"]
    assert len(kb.chunks) == chunks                       # searches keep the previous index
    assert web.post("/v1/kb/reindex").status_code == 401
    assert web.get("/v1/kb/jobs/" + "0" * 32, headers=AUTH).status_code == 404
    assert web.get("/v1/kb/jobs/nope", headers=AUTH).status_code == 404


@pytest.fixture()
def worker(redis_server, kb_dir, tmp_path):
    redis.Redis.from_url(REDIS_URL).flushdb()
    proc = start_worker({"REDIS_URL": REDIS_URL, "MODEL": "random:tiny", "KB_PATH": str(kb_dir),
                         "KB_CACHE_DIR": str(tmp_path / "cache"), "WORKER_METRICS_PORT": "0"})
    yield proc
    stop_worker(proc)


def test_a_real_worker_embeds_and_the_web_process_only_loads_the_cache(worker, tiny_client, kb_dir, tmp_path):
    (kb_dir / "luggage-tags.md").write_text(ARTICLE)
    app = create_app({"REDIS_URL": REDIS_URL, "KB_PATH": str(kb_dir), "KB_CACHE_DIR": str(tmp_path / "cache")},
                     client=tiny_client)
    assert not app.extensions["celery"].conf.task_always_eager
    web = app.test_client()
    job = wait_job(web, web.post("/v1/kb/reindex", headers=AUTH).get_json()["job_id"], timeout=180)
    assert worker.poll() is None, worker.stdout.read()
    assert job["status"] == "done", job
    assert (tmp_path / "cache" / f"{job['fingerprint']}.npy").exists()
    kb = app.extensions["support_chat"]["services"].chat.kb      # built now, in this process
    assert kb.fingerprint == job["fingerprint"] and kb.num_builds == 0, "the web process embedded the articles"
