"""The inference service's /openapi.json against the service itself (in process, the real engine
on the tiny random model): schemathesis sends valid and invalid requests to every documented
operation; no 5xx, every response documented (status, content type, body, each SSE event), and
data the spec calls invalid gets a 4xx. At least 5,000 cases; most valid ones name the served
model, so they reach the engine instead of stopping at the 404 for an unknown model."""
from __future__ import annotations

import random
import time

import pytest
import schemathesis

from inference.server.app import ServerConfig, create_app
from tests.conftest import assert_all_blocks_free
from tests.helpers.fuzz import fuzz

EXAMPLES_PER_OPERATION = 630      # per mode; 4 operations take a body: > 5,000 cases


@pytest.fixture(scope="module")
def engine_client(embedder):
    from pipelines.inference_client import InProcessClient
    # a short context keeps the longest generations short: max_tokens is unbounded in OpenAI's API
    client = InProcessClient("random:tiny", dtype="float32", max_model_len=64, kv_cache_memory_bytes=16 << 20)
    yield client
    client.close()


@pytest.fixture(scope="module")
def server_app(engine_client, embedder):
    app = create_app(lambda: engine_client.engine, ServerConfig(served_model_name="tiny"))
    app.extensions["inference"]["embedder"] = embedder          # the real one, loaded once per run
    client = app.test_client()
    deadline = time.time() + 30
    while client.get("/ready").status_code != 200 and time.time() < deadline:
        time.sleep(0.05)
    return app


def test_the_spec_covers_every_route(server_app):
    spec = server_app.test_client().get("/openapi.json").get_json()
    documented = {(p, m.upper()) for p, ops in spec["paths"].items() for m in ops}
    for rule in server_app.url_map.iter_rules():
        if rule.endpoint != "static" and rule.rule != "/openapi.json":
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                assert (rule.rule, method) in documented, f"{method} {rule.rule} is not in /openapi.json"


def test_no_server_errors_and_responses_match_the_spec(server_app, engine_client):
    schema = schemathesis.openapi.from_wsgi("/openapi.json", server_app)

    def prepare(case):
        rng = random.Random(repr(case.body)[:300])
        positive = case.meta is None or not case.meta.generation.mode.is_negative
        if positive and isinstance(case.body, dict) and "model" in case.body and rng.random() < 0.8:
            case.body["model"] = "tiny"
    counts = fuzz(schema, EXAMPLES_PER_OPERATION, prepare, {})
    print(dict(counts))
    assert sum(counts.values()) >= 5000, dict(counts)
    engine = engine_client.engine
    deadline = time.time() + 10                # streams the checks closed early are aborted
    while engine.num_unfinished and time.time() < deadline:
        time.sleep(0.05)
    assert_all_blocks_free(engine)
