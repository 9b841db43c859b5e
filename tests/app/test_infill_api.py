"""llama.cpp's /infill on the web app (the engine on the tiny random model: its text is noise, so
these check the protocol), Tabby's settings route, health while the model loads, and that no
successful response carries a Retry-After."""
from __future__ import annotations

import json
import threading
import time

import pytest

from app import create_app
from pipelines.inference_client import InProcessClient

AUTH = {"Authorization": "Bearer demo-api-key"}

# llama.vscode's request (src/llama-server.ts, createRequestPayload): its default settings
LLAMA_VSCODE = {"input_prefix": "def mean(xs):\n", "input_suffix": "\n\nprint(mean([1, 2]))\n",
                "input_extra": [{"filename": "util.py", "text": "def total(xs):\n    return sum(xs)\n", "time": 1}],
                "prompt": "    return ", "n_predict": 12, "top_k": 40, "top_p": 0.99, "stream": False,
                "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
                "t_max_predict_ms": 1000, "n_indent": 4}


@pytest.fixture(scope="module")
def web(tiny_client, tmp_path_factory):
    app = create_app({"KB_CACHE_DIR": str(tmp_path_factory.mktemp("kb")), "REDIS_URL": None}, client=tiny_client)
    return app.test_client()


def test_llama_vscode_request_gets_the_fields_it_reads(web):
    resp = web.post("/infill", json=LLAMA_VSCODE, headers=AUTH)
    assert resp.status_code == 200 and "Retry-After" not in resp.headers
    out = resp.get_json()
    assert isinstance(out["content"], str) and out["stop"] is True and out["stop_type"] in ("eos", "limit")
    assert 0 < out["tokens_predicted"] <= 12 and out["tokens_evaluated"] > 0 and out["truncated"] is False
    t = out["timings"]
    assert t["prompt_n"] == out["tokens_evaluated"] - out["tokens_cached"]
    assert t["predicted_n"] == out["tokens_predicted"]
    assert t["prompt_ms"] > 0 and t["predicted_per_second"] >= 0
    assert out["generation_settings"]["temperature"] == 0.0            # no temperature sampler: greedy
    again = web.post("/infill", json=LLAMA_VSCODE, headers=AUTH).get_json()
    assert again["content"] == out["content"]                           # greedy is repeatable


def test_typing_on_reuses_the_prompt_and_says_so(web):
    """llama.vim shows tokens_cached and prompt_n: the next keystroke's prompt starts like this one's,
    so its start comes from the prefix cache and only the rest is evaluated."""
    body = {**LLAMA_VSCODE, "input_prefix": "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(6)),
            "prompt": "def g(", "n_predict": 4}
    web.post("/infill", json=body, headers=AUTH)
    out = web.post("/infill", json={**body, "prompt": "def g(xs"}, headers=AUTH).get_json()
    assert out["tokens_cached"] >= 16 and out["tokens_cached"] < out["tokens_evaluated"]
    assert out["timings"]["prompt_n"] == out["tokens_evaluated"] - out["tokens_cached"]


def test_typing_on_a_line_takes_the_moved_suffix_from_the_last_request(qwen_client, tmp_path):
    """Shifted reuse on the default model: the code after the cursor moves when a line above it
    changes, and the next request takes its KV instead of computing it (llama.cpp's
    --cache-reuse); `cache_prompt: false` computes the prompt exactly."""
    web = create_app({"KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None}, client=qwen_client).test_client()
    suffix = "\n" + "".join(f"def check_{i}(values):\n    return [v * {i} for v in values if v]\n\n"
                            for i in range(8))
    body = {**LLAMA_VSCODE, "input_prefix": "import math\n\n\ndef norm(xs):\n", "input_suffix": suffix,
            "input_extra": [], "prompt": "    total = ", "n_predict": 8}
    web.post("/infill", json=body, headers=AUTH)
    out = web.post("/infill", json={**body, "prompt": "    total = sum("}, headers=AUTH).get_json()
    assert out["tokens_evaluated"] > 60
    assert out["timings"]["prompt_n"] <= 12, out          # the new tokens and the FIM middle marker
    assert out["content"].strip()
    exact = web.post("/infill", json={**body, "prompt": "    total = math.", "cache_prompt": False},
                     headers=AUTH).get_json()
    assert exact["timings"]["prompt_n"] > 40              # past the prefix-cache hit, the suffix again


def test_warm_up_request_and_stream(web):
    warm = web.post("/infill", json={"input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "n_predict": 0,
                                     "samplers": [], "t_max_predict_ms": 1}, headers=AUTH)
    assert warm.status_code == 200 and warm.get_json()["content"] == ""
    streamed = web.post("/infill", json={**LLAMA_VSCODE, "stream": True}, headers=AUTH)
    assert streamed.mimetype == "text/event-stream"
    lines = streamed.get_data(as_text=True).splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False, True] and "timings" in events[-1]


@pytest.mark.parametrize("body, field", [
    ({"input_prefix": 3}, "input_prefix"), ({"n_predict": 100000}, "n_predict"),
    ({"input_extra": [{"filename": "a"}]}, "input_extra"), ({"input_extra": "x"}, "input_extra"),
    ({"stop": [""]}, "stop"), ({"samplers": 5}, "samplers"), (["x"], "body"),
])
def test_bad_bodies_say_what_is_wrong(web, body, field):
    resp = web.post("/infill", json=body, headers=AUTH)
    assert resp.status_code == 400 and field in resp.get_json()["error"]["message"]


def test_infill_needs_the_api_key(web):
    assert web.post("/infill", json=LLAMA_VSCODE).status_code == 401


def test_tabby_server_setting_and_health_version(web):
    resp = web.get("/v1beta/server_setting", headers=AUTH)
    assert resp.status_code == 200 and resp.get_json() == {"disable_client_side_telemetry": True}
    assert web.get("/v1beta/server_setting").status_code == 401
    version = web.get("/v1/health").get_json()["version"]
    assert version["git_describe"].startswith("v") and set(version) >= {"build_date", "git_sha"}


def test_health_is_503_until_the_model_has_loaded(tmp_path, embedder):
    client = InProcessClient("random:tiny", dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20)
    client._embedder = embedder
    web = create_app({"KB_CACHE_DIR": str(tmp_path), "REDIS_URL": None}, client=client).test_client()
    try:
        first = web.get("/v1/health")
        assert first.status_code == 503 and first.headers["Retry-After"] == "5"
        assert "loading" in first.get_json()["error"]["message"]
        client._warming.join(120)                        # the probe started the load
        assert web.get("/v1/health").status_code == 200
    finally:
        client.close()


def _start(web, body, **kw) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        out["body"] = web.post("/infill", json=body, headers=AUTH, **kw).get_json()
    th = threading.Thread(target=run)
    th.start()
    return th, out


def _generating(engine, timeout=10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not engine.num_unfinished:
        time.sleep(0.005)
    time.sleep(0.05)


def test_the_editors_next_request_cancels_its_last_but_a_warm_up_does_not(web, tiny_client, monkeypatch):
    """llama.vscode sends a request per keystroke and only shows the last: the older one from the same
    editor (API key and address) answers "" at once. Its context warm-ups (n_predict 0) cancel
    nothing, nor does another editor's request."""
    service = lambda: web.application.extensions["completion"]["service"]         # noqa: E731
    slow = {**LLAMA_VSCODE, "n_predict": 400, "samplers": ["temperature"], "temperature": 1.0, "seed": 3,
            "t_max_predict_ms": 0, "n_indent": 0}
    web.post("/infill", json={**LLAMA_VSCODE, "n_predict": 1}, headers=AUTH)         # the service exists
    engine = tiny_client.engine
    # the tiny model writes 400 tokens in well under a second: a step of 30 ms keeps the first
    # request in flight while the others arrive, on any machine
    step = engine.engine.step
    monkeypatch.setattr(engine.engine, "step", lambda: (time.sleep(0.03), step())[1])
    before = service().num_cancelled
    th, first = _start(web, slow)
    _generating(engine)
    warm = web.post("/infill", json={**LLAMA_VSCODE, "n_predict": 0}, headers=AUTH)
    other = web.post("/infill", json={**LLAMA_VSCODE, "n_predict": 2}, headers=AUTH,
                     environ_base={"REMOTE_ADDR": "10.0.0.7"})
    assert warm.status_code == other.status_code == 200
    assert service().num_cancelled == before and th.is_alive()
    web.post("/infill", json={**LLAMA_VSCODE, "prompt": "    return s", "n_predict": 2}, headers=AUTH)
    th.join(20)
    assert first["body"]["content"] == "" and service().num_cancelled == before + 1
