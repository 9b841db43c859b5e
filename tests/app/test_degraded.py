"""The web tier with no inference endpoint answering: completions come back empty at once
(marked degraded), the breaker opens and /metrics shows it."""
from __future__ import annotations

import time

from app import create_app
from pipelines.inference_client import HttpClient
from pipelines.resilience import BreakerPolicy, Endpoint, FallbackClient, make_breaker
from tests.helpers.net import free_port

AUTH = {"Authorization": "Bearer demo-api-key"}


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_completion_degrades_to_an_empty_answer_and_the_breaker_shows(tmp_path):
    client = FallbackClient([Endpoint("primary", HttpClient(dead_url(), connect_s=1),
                                      make_breaker("primary", BreakerPolicy(fail_max=1, reset_timeout_s=60)))])
    web = create_app({"KB_CACHE_DIR": str(tmp_path), "REDIS_URL": None}, client=client).test_client()
    tabby = {"language": "python", "segments": {"prefix": "def add(a, b):\n    "}}
    resp = web.post("/v1/completions", json=tabby, headers=AUTH)
    assert resp.status_code == 200 and resp.headers["X-Inference-Degraded"] == "1"
    assert [c["text"] for c in resp.get_json()["choices"]] == [""]
    t0 = time.perf_counter()
    streamed = web.post("/v1/completions", json={"prompt": "x = ", "n": 2, "stream": True}, headers=AUTH)
    assert time.perf_counter() - t0 < 0.5                       # breaker open: no connect attempt
    body = streamed.get_data(as_text=True)
    assert streamed.status_code == 200 and body.rstrip().endswith("data: [DONE]") and '"text": ""' in body
    metrics = web.get("/metrics").get_data(as_text=True)
    assert 'inference_breaker_state{endpoint="primary"} 2.0' in metrics
    assert 'inference_fallbacks_total{endpoint="primary",reason="open"}' in metrics
    assert 'completion_requests_total{language="python",outcome="degraded"} 1.0' in \
        web.get("/v1/metrics").get_data(as_text=True)
    assert web.post("/v1/completions", json={"prompt": 3}, headers=AUTH).status_code == 400   # still validated
