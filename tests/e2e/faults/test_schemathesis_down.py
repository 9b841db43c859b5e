"""Schemathesis against the chat and completion APIs while the inference service is down (its
URL points at a port nothing listens on): every operation, valid and invalid cases, 0 5xx. A
503 may only come with Retry-After, and the chat still answers (degraded) on real sessions."""
from __future__ import annotations

import json
import os

import pytest
import schemathesis
from schemathesis.core.parameters import ParameterLocation

from app import create_app
from tests.helpers.fuzz import fuzz
from tests.helpers.net import free_port

CHAT_KEY, API_KEY = {"X-Site-Key": "demo-site-key"}, {"Authorization": "Bearer demo-api-key"}
EXAMPLES_PER_OPERATION = 40

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def down_app(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("INFERENCE_URL", f"http://127.0.0.1:{free_port()}")
    mp.delenv("INFERENCE_STANDBY_URL", raising=False)
    mp.delenv("STANDBY_MODEL", raising=False)
    repo = tmp_path_factory.mktemp("repo")
    (repo / "util.py").write_text("def add(a, b):\n    return a + b\n")
    app = create_app({"KB_CACHE_DIR": str(tmp_path_factory.mktemp("kb")), "REDIS_URL": None, "CHAT_MAX_TOKENS": 4,
                      "CHAT_BUILD_WAIT_S": 1.0, "SSE_MAX_S": 0.05, "COMPLETION_REPO_ROOTS": [str(repo)],
                      "CODE_INDEX_DIR": str(tmp_path_factory.mktemp("idx"))})
    services = app.extensions["support_chat"]["services"]
    services.start()
    assert services.wait_first_attempt(30)
    assert services.pipeline_state == "lexical", services.last_build_error
    yield app
    services.stop()
    mp.undo()


def test_chat_and_completion_answer_degraded_while_down(down_app):
    client = down_app.test_client()
    sid = client.post("/api/chat/sessions", headers=CHAT_KEY).get_json()["session_id"]
    r = client.post(f"/api/chat/sessions/{sid}/messages", json={"content": "How long do refunds take?"},
                    headers=CHAT_KEY)
    assert r.status_code == 200 and r.get_json()["degraded"] and r.get_json()["citations"]
    r = client.post("/v1/completions", json={"prompt": "def f():\n    return", "max_tokens": 4}, headers=API_KEY)
    assert r.status_code == 200 and r.headers["X-Inference-Degraded"] == "1"
    assert r.get_json()["choices"][0]["text"] == ""
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["status"] == "degraded"


@pytest.mark.parametrize("api", ["chat", "completion"])
def test_no_server_errors_while_inference_is_down(down_app, api):
    schema = schemathesis.openapi.from_wsgi("/openapi.json", down_app)
    client = down_app.test_client()
    sids = [client.post("/api/chat/sessions", headers=CHAT_KEY).get_json()["session_id"] for _ in range(2)]
    shed = []

    def prepare(case):
        if "sid" in (case.path_parameters or {}) and case.meta is not None \
                and not case.meta.is_negative_at(ParameterLocation.PATH):
            case.path_parameters["sid"] = sids[hash(repr(case.body)) % 2]

    def after(case, response):
        if response.status_code == 503:
            shed.append(case.operation.label)
            assert response.headers.get("Retry-After"), (case.operation.label, response.text)
    chat = api == "chat"
    counts = fuzz(schema, EXAMPLES_PER_OPERATION, prepare, {**CHAT_KEY, **API_KEY},
                  lambda p: p.startswith("/api/chat") if chat else p.startswith("/v1/"), after)
    assert sum(counts.values()) >= 200, dict(counts)
    if os.environ.get("FAULTS_SCHEMATHESIS_OUT"):           # bench/cpu/faults.py's row
        with open(os.environ["FAULTS_SCHEMATHESIS_OUT"], "a") as f:
            f.write(json.dumps({"api": api, "cases": dict(counts), "shed": len(shed)}) + "\n")
