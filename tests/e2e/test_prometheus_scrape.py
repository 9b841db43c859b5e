"""A real Prometheus server (Debian's `prometheus`) scrapes the running web app and inference
service on loopback; its HTTP API shows their series, and they move with traffic."""
from __future__ import annotations

import shutil
import subprocess
import threading
import time

import pytest
import requests
from werkzeug.serving import make_server

from app import create_app
from inference.online_engine import OnlineEngine
from inference.server.app import ServerConfig
from inference.server.app import create_app as create_inference_app
from tests.helpers.net import free_port

PROMETHEUS = shutil.which("prometheus")
KEY = {"X-Site-Key": "demo-site-key"}



def serve(app) -> tuple[str, object]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"127.0.0.1:{server.server_port}", server


def query(base: str, expr: str) -> float | None:
    """The first sample's value; None while Prometheus is still starting or has no such series."""
    try:
        data = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5).json()
    except requests.ConnectionError:
        return None
    assert data["status"] == "success", data
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_for(fn, timeout=30.0, step=0.5):
    deadline = time.time() + timeout
    value = fn()
    while not value and time.time() < deadline:
        time.sleep(step)
        value = fn()
    return value


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus missing: `make test` installs Debian's prometheus")
def test_prometheus_scrapes_web_and_inference(tiny_client, embedder, tmp_path):
    engine = OnlineEngine("random:tiny", dtype="float32", max_model_len=512, kv_cache_memory_bytes=16 << 20)
    inference_app = create_inference_app(lambda: engine, ServerConfig(served_model_name="tiny"))
    inference_app.extensions["inference"]["embedder"] = embedder
    web_app = create_app({"KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None, "CHAT_MAX_TOKENS": 8},
                         client=tiny_client)
    web, web_server = serve(web_app)
    inf, inf_server = serve(inference_app)
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: web
    static_configs: [{{targets: ["{web}"]}}]
  - job_name: inference
    static_configs: [{{targets: ["{inf}"]}}]
""")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: query(base, 'sum(up{job=~"web|inference"})') == 2), "targets not up"
        sid = requests.post(f"http://{web}/api/chat/sessions", headers=KEY, timeout=30).json()["session_id"]
        for text in ("How long do refunds take?", "Where is my order?"):
            requests.post(f"http://{web}/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": text},
                          timeout=60).raise_for_status()
        requests.post(f"http://{inf}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4},
                      timeout=60).raise_for_status()
        series = 'http_requests_total{job="web",endpoint="/api/chat/sessions/<sid>/messages",status="200"}'
        assert wait_for(lambda: query(base, series) == 2), query(base, series)
        assert wait_for(lambda: query(base, "chat_first_token_seconds_count") == 2)
        assert wait_for(lambda: query(base, 'inference:ready{job="inference"}') == 1)
        before = wait_for(lambda: query(base, 'sum(inference:generation_tokens_total{job="inference"})'))
        assert before and before > 0
        requests.post(f"http://{inf}/v1/completions", json={"model": "tiny", "prompt": "again", "max_tokens": 6,
                                                           "ignore_eos": True}, timeout=60).raise_for_status()
        assert wait_for(lambda: (query(base, 'sum(inference:generation_tokens_total{job="inference"})') or 0)
                        >= before + 6), "the counter did not move"
    finally:
        proc.terminate()
        proc.wait(10)
        web_server.shutdown()
        inf_server.shutdown()
        engine.shutdown()
