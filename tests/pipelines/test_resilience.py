"""The fallback chain against real endpoints: a port nothing listens on, the real inference
service (in a thread, and as a process killed with SIGKILL mid-stream), the in-process engine on
the tiny model as standby, breaker state in the real Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import requests
from werkzeug.serving import make_server

from inference.online_engine import OnlineEngine
from inference.server.app import ServerConfig, create_app
from pipelines.inference_client import (
    HttpClient,
    InferenceError,
    InProcessClient,
    RequestRejected,
)
from pipelines.resilience import (
    BreakerPolicy,
    Endpoint,
    FallbackClient,
    ReliabilityConfig,
    Timeouts,
    make_breaker,
)
from tests.helpers.net import free_port
from tests.helpers.paths import REPO_ROOT

HELLO = [{"role": "user", "content": "hello"}]



def chain(primary, standby, fail_max=2, reset_s=0.5, redis_url=None, namespace="breaker"):
    policy = BreakerPolicy(fail_max, reset_s)
    eps = [Endpoint("primary", primary, make_breaker("primary", policy, redis_url, namespace))]
    if standby is not None:
        eps.append(Endpoint("standby", standby, make_breaker("standby", policy, redis_url, namespace)))
    return FallbackClient(eps)


class Service:
    """The real inference service on the tiny model, in a thread on a chosen port."""

    def __init__(self, port: int, embedder):
        self.engine = OnlineEngine("random:tiny", dtype="float32", max_model_len=512, kv_cache_memory_bytes=16 << 20)
        app = create_app(lambda: self.engine, ServerConfig(served_model_name="tiny"))
        app.extensions["inference"]["embedder"] = embedder
        self.server = make_server("127.0.0.1", port, app, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.engine.shutdown()


def test_config_yaml_env_and_bad_values(tmp_path):
    cfg = ReliabilityConfig.load()                                   # the shipped configs/reliability.yaml
    assert cfg.primary_url is None and cfg.breaker.fail_max >= 1
    path = tmp_path / "r.yaml"
    path.write_text("standby_url: http://standby:8001\ntimeouts: {first_token_s: 5, total_s: 30}\n")
    cfg = ReliabilityConfig.load(path, env={"INFERENCE_URL": "http://main:8001", "BREAKER_FAIL_MAX": "7"})
    assert (cfg.primary_url, cfg.standby_url, cfg.timeouts.first_token_s, cfg.breaker.fail_max) == \
        ("http://main:8001", "http://standby:8001", 5, 7)
    with pytest.raises(ValueError, match="first_token_s .* exceeds total_s"):
        Timeouts(first_token_s=10, total_s=5)
    with pytest.raises(ValueError, match="fail_max"):
        BreakerPolicy(fail_max=0)
    path.write_text("breaker: {fail_mx: 3}\n")
    with pytest.raises(ValueError, match="fail_mx"):
        ReliabilityConfig.load(path, env={})
    path.write_text("standby: x\n")
    with pytest.raises(ValueError, match="unknown keys"):
        ReliabilityConfig.load(path, env={})


def test_dead_primary_falls_back_opens_and_recovers_by_itself(tiny_client, embedder):
    port = free_port()
    client = chain(HttpClient(f"http://127.0.0.1:{port}", connect_s=1), tiny_client, fail_max=2, reset_s=1.0)
    for _ in range(2):                                   # connection refused twice: the breaker opens
        assert "".join(client.chat_stream(HELLO, max_tokens=4, temperature=0))
        assert client.last_endpoint == "standby"
    assert client.breaker_states()["primary"] == "open"
    assert client.fallbacks[("primary", "error")] == 2
    assert "".join(client.chat_stream(HELLO, max_tokens=4, temperature=0))   # skipped without a connect
    assert client.fallbacks[("primary", "open")] == 1
    service = Service(port, embedder)                    # the primary comes back
    try:
        time.sleep(1.1)                                  # past reset_timeout: the next call probes it
        assert "".join(client.chat_stream(HELLO, max_tokens=4, temperature=0))
        assert client.last_endpoint == "primary" and client.breaker_states()["primary"] == "closed"
        assert client.embed(["hi"]).shape[0] == 1 and client.last_endpoint == "primary"
    finally:
        service.stop()


def test_a_refused_request_is_not_an_outage(tiny_client, embedder):
    """A prompt over the service's context is answered 400: the caller gets RequestRejected,
    the breaker stays closed however often it happens, and the standby is not asked."""
    port = free_port()
    service = Service(port, embedder)
    try:
        workers = chain(HttpClient(f"http://127.0.0.1:{port}", connect_s=1), tiny_client, fail_max=2, reset_s=30)
        too_long = [{"role": "user", "content": "word " * 2000}]
        for _ in range(3):
            with pytest.raises(RequestRejected, match="400"):
                list(workers.chat_stream(too_long, max_tokens=4))
        assert workers.breaker_states()["primary"] == "closed"
        assert sum(workers.fallbacks.values()) == 0
        assert "".join(workers.chat_stream(HELLO, max_tokens=4, temperature=0))      # still served
        assert workers.last_endpoint == "primary"
    finally:
        service.stop()


def test_no_endpoint_left_is_one_clear_error():
    client = chain(HttpClient(f"http://127.0.0.1:{free_port()}", connect_s=1),
                   HttpClient(f"http://127.0.0.1:{free_port()}", connect_s=1))
    with pytest.raises(InferenceError, match="no inference endpoint answered .*primary.*standby"):
        list(client.complete_stream("x", max_tokens=2, temperature=0, top_p=1, stop=[]))


def test_first_token_timeout_aborts_and_frees_blocks(embedder):
    slow = InProcessClient("random:tiny", first_token_s=1e-4, total_s=5, dtype="float32", max_model_len=256,
                           kv_cache_memory_bytes=8 << 20)
    slow._embedder = embedder
    try:
        with pytest.raises(InferenceError, match="no first token within"):
            list(slow.chat_stream(HELLO, max_tokens=64, temperature=0))
        deadline = time.time() + 5
        while slow.engine.num_unfinished and time.time() < deadline:
            time.sleep(0.01)
        assert slow.engine.num_unfinished == 0
    finally:
        slow.close()


def test_breaker_state_is_shared_through_redis(redis_server, tiny_client):
    ns = f"test-breaker-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{free_port()}"
    worker_a = chain(HttpClient(url, connect_s=1), tiny_client, fail_max=2, reset_s=30, redis_url=redis_server,
                     namespace=ns)
    worker_b = chain(HttpClient(url, connect_s=1), tiny_client, fail_max=2, reset_s=30, redis_url=redis_server,
                     namespace=ns)
    for _ in range(2):
        worker_a.count_tokens("hello")
    assert worker_b.breaker_states()["primary"] == "open"           # b never failed: it read a's state
    worker_b.count_tokens("hello")
    assert worker_b.fallbacks[("primary", "open")] == 1 and worker_b.fallbacks[("primary", "error")] == 0


def test_breakers_open_and_close_with_redis_down_from_the_start(tiny_client):
    """REDIS_URL set, nothing listening: the breaker is built, opens on failures and closes again
    from this process' own copy of its state."""
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    workers = chain(HttpClient(f"http://127.0.0.1:{free_port()}", connect_s=1), tiny_client, fail_max=2,
                    reset_s=0.5, redis_url=dead_redis)
    for _ in range(2):
        assert workers.count_tokens("hello") > 0                   # answered by the standby
    assert workers.breaker_states()["primary"] == "open"
    workers.count_tokens("hello")
    assert workers.fallbacks[("primary", "open")] == 1
    primary = workers.endpoints[0]
    primary.client = tiny_client                                    # the primary is back
    time.sleep(0.6)
    assert workers.count_tokens("hello") > 0
    assert workers.breaker_states()["primary"] == "closed"


def _wait_for_ping(client, timeout: float = 10) -> None:
    import redis
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def test_breaker_keeps_its_state_through_a_redis_outage(tmp_path, tiny_client):
    """Redis goes away while the breaker is open: it stays open (no reset to closed), and the
    shared state is read again once Redis is back."""
    import shutil

    import redis
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    direct = redis.Redis(port=port)
    try:
        _wait_for_ping(direct)
        workers = chain(HttpClient(f"http://127.0.0.1:{free_port()}", connect_s=1), tiny_client, fail_max=2,
                        reset_s=30, redis_url=f"redis://127.0.0.1:{port}/0", namespace="outage")
        for _ in range(2):
            workers.count_tokens("hello")
        assert direct.get("outage:primary:state") == b"open"
        proc.kill()
        proc.wait(10)
        assert workers.breaker_states()["primary"] == "open"       # from the local copy
        workers.count_tokens("hello")
        assert workers.fallbacks[("primary", "open")] == 1
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)     # back, empty
        _wait_for_ping(direct)
        time.sleep(1.1)                                             # past the storage's retry_s
        workers.breaker_states()
        assert direct.get("outage:primary:state") is not None       # keys set up again
    finally:
        proc.kill()
        proc.wait(10)


def test_inference_process_killed_mid_stream(tiny_client, tmp_path):
    """SIGKILL the service while it streams: that stream ends with an InferenceError (the caller
    degrades), later calls go to the standby, the breaker opens, and a restart closes it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    cmd = [sys.executable, "-m", "inference", "serve", "--model", "random:tiny", "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "1024"]

    def start():
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    return proc
            except requests.RequestException:
                pass
            time.sleep(0.2)
        proc.kill()
        pytest.fail("the inference service did not start")

    proc = start()
    client = chain(HttpClient(f"http://127.0.0.1:{port}", connect_s=1), tiny_client, fail_max=2, reset_s=1.0)
    try:
        stream = client.chat_stream(HELLO, max_tokens=900, temperature=1.0)
        assert next(stream) and client.last_endpoint == "primary"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(InferenceError):
            for _ in stream:
                pass
        assert "".join(client.chat_stream(HELLO, max_tokens=4, temperature=0))    # the standby answers
        assert client.last_endpoint == "standby" and client.breaker_states()["primary"] == "open"
        proc = start()
        time.sleep(1.1)
        assert "".join(client.chat_stream(HELLO, max_tokens=4, temperature=0))
        assert client.last_endpoint == "primary" and client.breaker_states()["primary"] == "closed"
    finally:
        proc.kill()
        proc.wait(10)
