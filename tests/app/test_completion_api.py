"""The IDE completion endpoint end to end on the embedded engine (tiny random model): both request
shapes, SSE, auth, events and health, bad input, and cancellation of a superseded request that
frees its KV blocks at once."""
from __future__ import annotations

import json
import threading
import time

import pytest

from app import create_app
from tests.conftest import assert_all_blocks_free

AUTH = {"Authorization": "Bearer demo-api-key"}


@pytest.fixture(scope="module")
def web(tiny_client, tmp_path_factory):
    app = create_app({"KB_CACHE_DIR": str(tmp_path_factory.mktemp("kb")), "REDIS_URL": None}, client=tiny_client)
    return app.test_client()


def wait_idle(engine, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline and engine.num_unfinished:
        time.sleep(0.01)


def test_tabby_shape(web):
    body = {"language": "python", "segments": {"prefix": "def add(a, b):\n    ", "suffix": "\n", "filepath": "m.py"},
            "user": "alice"}
    resp = web.post("/v1/completions", json=body, headers=AUTH)
    assert resp.status_code == 200
    out = resp.get_json()
    assert out["id"].startswith("cmpl-") and [c["index"] for c in out["choices"]] == [0]
    assert isinstance(out["choices"][0]["text"], str)


def test_openai_shape_plain_and_streamed(web, tiny_client):
    body = {"model": "x", "prompt": "for i in range(", "suffix": "):\n", "max_tokens": 8, "temperature": 0}
    out = web.post("/v1/completions", json=body, headers=AUTH).get_json()
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "stop"
    usage = out["usage"]
    assert usage["prompt_tokens"] == len(tiny_client.engine.tokenizer.encode("for i in range("))
    assert 0 < usage["completion_tokens"] <= 8 and usage["total_tokens"] == usage["prompt_tokens"] + usage[
        "completion_tokens"]
    streamed = web.post("/v1/completions", json={**body, "stream": True}, headers=AUTH)
    assert streamed.mimetype == "text/event-stream"
    chunks = [line[6:] for line in streamed.get_data(as_text=True).splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]" and json.loads(chunks[0])["choices"][0]["text"] == out["choices"][0]["text"]


def test_auth_events_and_health(web):
    assert web.post("/v1/completions", json={"prompt": "x"}).status_code == 401
    assert web.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer no"}).status_code == 401
    assert web.get("/v1/health").get_json()["model"]
    cid = web.post("/v1/completions", json={"language": "go", "segments": {"prefix": "func main() {"}},
                   headers=AUTH).get_json()["id"]
    for event in ({"type": "view", "completion_id": cid},
                  {"type": "select", "completion_id": cid, "select_kind": "line"}):
        assert web.post("/v1/events", json=event, headers=AUTH).status_code == 200
    stats = web.application.extensions["completion"]["stats"]
    assert stats.events[("go", "view")] == 1 and stats.events[("go", "select_line")] == 1
    assert stats.acceptance()["go"] == 1.0
    assert web.post("/v1/events", json={"type": "like", "completion_id": cid}, headers=AUTH).status_code == 400


def test_bad_input(web):
    cases = [({"segments": {"suffix": "x"}}, 400), ({"prompt": 5}, 400), ({"prompt": "a", "max_tokens": "9"}, 400),
             (["list"], 400)]
    for body, status in cases:
        resp = web.post("/v1/completions", json=body, headers=AUTH)
        assert resp.status_code == status and resp.get_json()["error"]["message"]
    assert web.post("/v1/completions", data="{oops",
                    headers={**AUTH, "Content-Type": "application/json"}).status_code == 400
    # unknown language: generic rules; a huge prefix: cut to the budget, never a 5xx
    big = {"language": "klingon", "segments": {"prefix": "x = 1\n" * 30000 + "y = ", "suffix": "z\n" * 30000}}
    assert web.post("/v1/completions", json=big, headers=AUTH).status_code == 200


def test_a_newer_keystroke_cancels_the_older_request_and_frees_its_blocks(web, tiny_client):
    engine = tiny_client.engine
    wait_idle(engine)
    slow = {"prompt": "a = [", "max_tokens": 500, "temperature": 1.0, "user": "bob", "filepath": "f.py", "seed": 1}
    first: dict = {}

    def run_first():
        t0 = time.perf_counter()
        first["body"] = web.post("/v1/completions", json=slow, headers=AUTH).get_json()
        first["s"] = time.perf_counter() - t0

    th = threading.Thread(target=run_first)
    th.start()
    deadline = time.time() + 10
    while time.time() < deadline and not engine.num_unfinished:
        time.sleep(0.005)
    time.sleep(0.05)                                   # it is generating now
    second = web.post("/v1/completions", json={**slow, "prompt": "a = [1", "max_tokens": 4}, headers=AUTH)
    th.join(20)
    assert second.status_code == 200
    assert first["body"]["choices"][0]["text"] == ""   # superseded: empty, and quickly
    assert web.application.extensions["completion"]["service"].num_cancelled >= 1
    wait_idle(engine)

    class Holder:                                      # assert_all_blocks_free wants an LLM-like object
        pass
    holder = Holder()
    holder.engine = engine.engine
    assert_all_blocks_free(holder)


def test_repository_indexing_job_feeds_completion_context(tiny_client, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "geometry.py").write_text(
        "def polygon_area(points):\n    \"\"\"Shoelace formula.\"\"\"\n    return 0.5 * abs(sum(x0 * y1 - x1 * y0 for "
        "(x0, y0), (x1, y1) in zip(points, points[1:] + points[:1])))\n", encoding="utf-8")
    (repo / "node_modules").mkdir()
    (repo / "node_modules" / "junk.js").write_text("function polygon_area() {}\n", encoding="utf-8")
    app = create_app({"KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None, "CODE_INDEX_DIR": str(tmp_path / "idx"),
                      "COMPLETION_REPO_ROOTS": [str(tmp_path)]}, client=tiny_client)
    web = app.test_client()
    assert web.post("/v1/repositories", json={"name": "demo", "path": "/etc"}, headers=AUTH).status_code == 403
    assert web.post("/v1/repositories", json={"name": "demo"}, headers=AUTH).status_code == 400
    assert web.get("/v1/repositories/nope", headers=AUTH).status_code == 404
    resp = web.post("/v1/repositories", json={"name": "https://git.example/demo.git", "path": str(repo)}, headers=AUTH)
    assert resp.status_code == 202
    job = resp.get_json()["job_id"]
    deadline = time.time() + 30
    while time.time() < deadline and web.get(f"/v1/repositories/{job}", headers=AUTH).get_json()["status"] != "done":
        time.sleep(0.1)
    status = web.get(f"/v1/repositories/{job}", headers=AUTH).get_json()
    assert status["status"] == "done" and status["num_chunks"] == 1        # node_modules skipped
    body = {"language": "python",
            "segments": {"prefix": "from pkg.geometry import polygon_area\n\narea = polygon_area(",
                         "filepath": "main.py", "git_url": "https://git.example/demo.git"}}
    assert web.post("/v1/completions", json=body, headers=AUTH).status_code == 200
    service = app.extensions["completion"]["service"]
    from pipelines.completion import parse_tabby
    prompt, _ = service.build_prompt(parse_tabby(body))
    assert "# Path: pkg/geometry.py" in prompt and prompt.endswith("area = polygon_area(")


def test_metrics_count_requests_cache_hits_and_events(web):
    body = {"prompt": "total = sum(", "max_tokens": 4, "temperature": 0, "language": "python"}
    first = web.post("/v1/completions", json=body, headers=AUTH).get_json()
    web.post("/v1/completions", json=body, headers=AUTH)
    web.post("/v1/events", json={"type": "view", "completion_id": first["id"]}, headers=AUTH)
    text = web.get("/v1/metrics").get_data(as_text=True)
    assert 'completion_latency_seconds_count{language="python"}' in text
    assert 'completion_events_total{language="python",type="view"} 1.0' in text
    if first["choices"][0]["text"]:                       # an empty completion is not cached
        assert 'completion_cache_hits_total{kind="exact"}' in text


@pytest.mark.slow
def test_the_default_model_completes_and_typing_its_start_is_a_forward_cache_hit(qwen_client, tmp_path):
    web = create_app({"KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None}, client=qwen_client).test_client()
    body = {"prompt": "def mean(xs):\n    return ", "suffix": "\n\n\nprint(mean([1, 2]))\n",
            "max_tokens": 16, "temperature": 0, "language": "python"}
    text = web.post("/v1/completions", json=body, headers=AUTH).get_json()["choices"][0]["text"]
    assert text == "sum(xs) / len(xs)"                    # usable, on the cursor's line, no extra space
    service = web.application.extensions["completion"]["service"]
    assert service.template.family == "qwen2.5-coder"
    forward_before = service.cache.forward_hits
    typed = {**body, "prompt": body["prompt"] + text[:2]}
    again = web.post("/v1/completions", json=typed, headers=AUTH).get_json()["choices"][0]["text"]
    assert again == text[2:] and service.cache.forward_hits == forward_before + 1


def test_with_redis_configured_the_cache_is_shared(tiny_client, tmp_path, redis_server):
    import redis
    redis.Redis.from_url("redis://127.0.0.1:6379/11").flushdb()
    app = create_app({"KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": "redis://127.0.0.1:6379/11"},
                     client=tiny_client)
    web = app.test_client()
    body = {"prompt": "answer = compute(", "max_tokens": 6, "temperature": 0}
    assert web.post("/v1/completions", json=body, headers=AUTH).status_code == 200
    assert app.extensions["completion"]["service"].cache.redis is not None


def test_inputs_schemathesis_found_get_a_4xx_or_a_plain_empty_completion(web):
    """Each once a 500 or a false outage (tests/app/test_openapi.py found them)."""
    from pipelines.completion import MAX_SEED
    body = {"segments": {"prefix": "x = "}, "temperature": 0}
    assert web.post("/v1/completions", json={**body, "seed": MAX_SEED}, headers=AUTH).status_code == 200
    resp = web.post("/v1/completions", json={**body, "seed": 2**63 - 1}, headers=AUTH)
    assert resp.status_code == 400 and "seed" in resp.get_json()["error"]["message"]
    # an empty file: an empty completion, not a degraded one (which would count against the breaker)
    resp = web.post("/v1/completions", json={"segments": {"prefix": ""}}, headers=AUTH)
    assert resp.status_code == 200 and "X-Inference-Degraded" not in resp.headers
    assert [c["text"] for c in resp.get_json()["choices"]] == [""]
    for stop in (0, False, {}):                    # falsy, but not a stop list
        resp = web.post("/v1/completions", json={"prompt": "x", "stop": stop}, headers=AUTH)
        assert resp.status_code == 400 and "stop" in resp.get_json()["error"]["message"]
    resp = web.post("/v1/repositories", json={"name": "r", "path": "/tmp/\x00x"}, headers=AUTH)
    assert resp.status_code == 400 and "NUL" in resp.get_json()["error"]["message"]
