"""The pipelines' inference client over HTTP against the real inference service (the tiny random
model): streamed chat, embeddings identical to the in-process ones, token counts, context length,
and clear InferenceErrors when the service is down or refuses."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import requests
from werkzeug.serving import make_server

from inference.online_engine import OnlineEngine
from inference.server.app import ServerConfig, create_app
from pipelines.inference_client import HttpClient, InferenceError


@pytest.fixture(scope="module")
def service(embedder):
    engine = OnlineEngine("random:tiny", dtype="float32", max_model_len=512, kv_cache_memory_bytes=16 << 20)
    app = create_app(lambda: engine, ServerConfig(served_model_name="tiny", api_keys=("k1",)))
    app.extensions["inference"]["embedder"] = embedder          # the same model, loaded once per run
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    deadline = time.monotonic() + 60                  # the engine loads off the request path
    while time.monotonic() < deadline and requests.get(f"{url}/ready", timeout=5).status_code != 200:
        time.sleep(0.1)
    yield url, engine
    server.shutdown()
    engine.shutdown()


def test_chat_embed_and_tokenize_over_http(service, embedder):
    url, engine = service
    client = HttpClient(url, api_key="k1")
    pieces = list(client.chat_stream([{"role": "user", "content": "hello"}], temperature=0, max_tokens=12))
    assert pieces and all(isinstance(p, str) for p in pieces)
    texts = ["Where is my order?", "退款多久到账"]
    assert np.abs(client.embed(texts) - embedder.embed(texts)).max() < 1e-5
    assert client.count_tokens("hello") == len(engine.tokenizer.encode("hello"))
    assert client.max_model_len() == 512


def test_errors_are_inference_errors(service):
    url, _ = service
    with pytest.raises(InferenceError, match="401"):
        list(HttpClient(url, api_key="wrong").chat_stream([{"role": "user", "content": "hi"}]))
    with pytest.raises(InferenceError, match="400"):
        HttpClient(url, api_key="k1").embed([""])
    with pytest.raises(InferenceError, match="unreachable"):
        HttpClient("http://127.0.0.1:9", connect_s=2).embed(["hi"])


def test_completion_over_http_with_usage_and_abort(service):
    url, engine = service
    client = HttpClient(url, api_key="k1")
    text = "".join(client.complete_stream("def add(a, b):", max_tokens=6, temperature=0, top_p=1, stop=[],
                                          request_id="c1"))
    prompt_tokens, generated, cached = client.usage("c1")
    assert prompt_tokens == len(engine.tokenizer.encode("def add(a, b):")) and 0 < generated <= 6
    long = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(8))    # the service's prefix cache:
    for rid in ("c3", "c4"):                                                   # the second one hits it
        "".join(client.complete_stream(long, max_tokens=2, temperature=0, top_p=1, stop=[], request_id=rid))
    assert client.usage("c3")[2] == 0 < client.usage("c4")[2] < len(engine.tokenizer.encode(long))
    assert isinstance(text, str)
    # a superseded completion: abort() closes its stream, which ends quietly, and the service
    # frees the request
    stream = client.complete_stream("x = ", max_tokens=400, temperature=1.0, top_p=1, stop=[], request_id="c2")
    assert next(stream) is not None
    client.abort("c2")
    assert len(list(stream)) < 400
    deadline = time.time() + 10
    while engine.num_unfinished and time.time() < deadline:
        time.sleep(0.02)
    assert engine.num_unfinished == 0
