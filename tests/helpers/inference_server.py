"""A real `python -m inference serve` subprocess for tests, on a free loopback port, and what its
tests read from it: /metrics as a snapshot, and waits for a condition or for an idle engine."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.net import free_port
from tests.helpers.paths import REPO_ROOT

# ---- the server process ------------------------------------------------------------------------
# Loaded here, not in the forked child: a dlopen between fork and exec can deadlock.
_LIBC = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:       # no orphan server even if pytest itself is killed
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)                      # PR_SET_PDEATHSIG


class Server:
    def __init__(self, *args: str, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.loading: dict[str, httpx.Response] = {}     # responses seen while /ready was 503
        self.http = httpx.Client(timeout=60)               # keep-alive for the many small checks
        self._log = tempfile.TemporaryFile()              # a file, not a pipe: a full pipe would block it
        cmd = [sys.executable, "-m", "inference", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent)

    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-8000:]

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode} before /ready:\n{self.output()}")
            try:
                r = httpx.get(f"{self.url}/ready", timeout=5)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                return
            if "ready" not in self.loading:           # caught it loading: record what clients see then
                self.loading["ready"] = r
                self.loading["health"] = httpx.get(f"{self.url}/health", timeout=5)
                self.loading["models"] = httpx.get(f"{self.url}/v1/models", headers=self.headers(), timeout=5)
            time.sleep(0.02)
        self.stop()
        pytest.fail(f"server not ready after {timeout:.0f} s:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.http.close()
        self._log.close()

    def client(self, api_key: str | None = None, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key or self.api_key or "none",
                             max_retries=0, timeout=120, **kwargs)

    def post(self, path: str, body, **kwargs) -> httpx.Response:
        return self.http.post(f"{self.url}{path}", json=body, headers=self.headers(), **kwargs)

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"server died:\n{self.output()}"


@contextlib.contextmanager
def running_server(*args: str, api_key: str | None = None):
    server = Server(*args, api_key=api_key)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def metrics_snapshot(server: Server) -> dict[tuple, float]:
    """(sample name, (label, value)...) without model_name -> value."""
    r = server.http.get(f"{server.url}/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "le")))
            if "le" not in s.labels:
                out[(s.name, labels)] = s.value
    return out


def metric(snapshot: dict, name: str, **labels) -> float:
    return snapshot.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_idle(server: Server, timeout: float = 15.0) -> dict:
    """Metrics once no request runs or waits and every KV block is free."""
    snap = {}

    def idle():
        nonlocal snap
        snap = metrics_snapshot(server)
        return (metric(snap, "inference:num_requests_running") == 0
                and metric(snap, "inference:num_requests_waiting") == 0
                and metric(snap, "inference:kv_cache_usage_perc") == 0)
    try:
        wait_for(idle, timeout, "the engine to go idle")
    except AssertionError:
        raise AssertionError(f"engine not idle: running={metric(snap, 'inference:num_requests_running')} "
                             f"waiting={metric(snap, 'inference:num_requests_waiting')} "
                             f"kv={metric(snap, 'inference:kv_cache_usage_perc')}") from None
    return snap
