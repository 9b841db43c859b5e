"""Real processes on loopback for the fault-injection scenarios: the inference service
(`python -m inference serve`), the web app (`python -m app serve`) and Redis, each startable,
killable (SIGKILL), pausable (SIGSTOP / SIGCONT) and always cleaned up; plus a chat client
that tallies what customers saw."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.helpers.net import die_with_parent, free_port
from tests.helpers.paths import REPO_ROOT

SITE_KEY = {"X-Site-Key": "demo-site-key"}
API_KEY = {"Authorization": "Bearer demo-api-key"}
REDIS_BIN = shutil.which("redis-server")


class Process:
    """One child process with its output in a temporary file (a full pipe would block it)."""

    def __init__(self, name: str, port: int | None = None):
        self.name, self.port = name, port or free_port()
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def _spawn(self, cmd: list[str], env: dict | None = None) -> None:
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                     preexec_fn=die_with_parent())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self, tail: int = 6000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-tail:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (and SIGCONT first, should it be stopped)."""
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def close(self) -> None:
        self.stop()
        self._log.close()

    def _wait(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.output()}")
            try:
                if check():
                    return
            except (requests.RequestException, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: not {what} after {timeout:.0f} s:\n{self.output()}")


class InferenceService(Process):
    def __init__(self, model: str = "random:tiny", port: int | None = None):
        super().__init__(f"inference({model})", port)
        self.model = model

    def start(self, timeout: float = 180) -> float:
        """Start and wait until it answers chat and embeddings; returns time.monotonic() then."""
        self._spawn([sys.executable, "-m", "inference", "serve", "--model", self.model, "--dtype", "float32",
                     "--host", "127.0.0.1", "--port", str(self.port)])
        self._wait(lambda: requests.get(f"{self.url}/ready", timeout=2).status_code == 200, timeout, "ready")
        # the embedder loads on first use: that first call is part of coming back
        self._wait(lambda: requests.post(f"{self.url}/v1/embeddings", json={"input": ["warm up"]},
                                         timeout=60).status_code == 200, timeout, "embedding")
        return time.monotonic()


class RedisServer(Process):
    def __init__(self, port: int | None = None, data_dir: str | None = None):
        super().__init__("redis", port)
        self.data_dir = data_dir

    def start(self, timeout: float = 20) -> float:
        persist = ["--dir", self.data_dir, "--appendonly", "yes", "--appendfsync", "always"] if self.data_dir \
            else ["--appendonly", "no"]
        self._spawn([REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persist])
        import redis
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        self._wait(client.ping, timeout, "answering PING")
        return time.monotonic()

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


class WebApp(Process):
    """`python -m app serve` with fault-test settings: short breaker reset and time-outs."""

    BREAKER_RESET_S = 3.0

    def __init__(self, workdir: Path, inference_url: str, redis_url: str | None = None, threads: int = 32,
                 **env: str):
        super().__init__("web")
        self.threads = threads
        self.env = {"INFERENCE_URL": inference_url, "REDIS_URL": redis_url or "", "MODEL": "",
                    "KB_CACHE_DIR": str(workdir / "kb-cache"), "BREAKER_RESET_S": str(self.BREAKER_RESET_S),
                    "BREAKER_FAIL_MAX": "2", "TIMEOUT_CONNECT_S": "1", "TIMEOUT_FIRST_TOKEN_S": "10",
                    "TIMEOUT_TOTAL_S": "30", "CHAT_MAX_TOKENS": "8", "CHAT_TEMPERATURE": "0",
                    "CHAT_BUILD_WAIT_S": "1", "SHUTDOWN_DRAIN_S": "2",
                    "RATE_LIMIT_PER_IP": "100000 per second", "RATE_LIMIT_PER_SITE_KEY": "100000 per second",
                    "RATE_LIMIT_PER_API_KEY": "100000 per second", **env}

    @property
    def timeout_total_s(self) -> float:
        return float(self.env["TIMEOUT_TOTAL_S"])

    def start(self, timeout: float = 60) -> None:
        self._spawn([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                     "--threads", str(self.threads)], self.env)
        self._wait(lambda: requests.get(f"{self.url}/healthz", timeout=2).ok, timeout, "alive")

    def readyz(self) -> tuple[int, dict]:
        r = requests.get(f"{self.url}/readyz", timeout=5)
        return r.status_code, r.json()


@dataclass
class Tally:
    """What customers saw: every response's status, and the messages the app accepted."""
    requests: int = 0
    server_errors: int = 0            # 5xx, except a 503 that says when to retry
    shed: int = 0                     # 503 + Retry-After: refused at a limit or during an outage
    degraded: int = 0
    slowest_s: float = 0.0
    accepted: list[tuple[str, str]] = field(default_factory=list)    # (session id, content) answered 200
    errors: list[str] = field(default_factory=list)

    def record(self, status: int, headers, elapsed: float, note: str = "") -> None:
        self.requests += 1
        self.slowest_s = max(self.slowest_s, elapsed)
        if status == 503 and headers.get("Retry-After"):
            self.shed += 1
        elif status >= 500:
            self.server_errors += 1
            self.errors.append(f"{status} {note}"[:300])


class Customer:
    """A widget's calls, through `requests`, tallied."""

    def __init__(self, base: str, tally: Tally, timeout: float = 60):
        self.base, self.tally, self.timeout = base, tally, timeout
        self.http = requests.Session()

    def new_session(self) -> str | None:
        t0 = time.monotonic()
        r = self.http.post(f"{self.base}/api/chat/sessions", headers=SITE_KEY, timeout=self.timeout)
        self.tally.record(r.status_code, r.headers, time.monotonic() - t0, r.text)
        return r.json()["session_id"] if r.status_code == 201 else None

    def say(self, sid: str, content: str, stream: bool = False) -> dict | None:
        """One turn; the reply (the `done` event's data when streamed), or None if refused.
        A streamed reply that broke off carries "stream_error"."""
        t0 = time.monotonic()
        r = self.http.post(f"{self.base}/api/chat/sessions/{sid}/messages", headers=SITE_KEY, stream=stream,
                           json={"content": content, "stream": stream}, timeout=self.timeout)
        if r.status_code != 200:
            self.tally.record(r.status_code, r.headers, time.monotonic() - t0, r.text)
            return None
        as_json = not stream or r.headers.get("Content-Type", "").startswith("application/json")   # a human's turn
        reply = r.json() if as_json else done_event(r.iter_lines(decode_unicode=True))
        self.tally.record(200, r.headers, time.monotonic() - t0)
        if reply.get("degraded"):
            self.tally.degraded += 1
        if "stream_error" not in reply:
            self.tally.accepted.append((sid, content))
        return reply

    def transcript(self, sid: str) -> list[dict] | None:
        r = self.http.get(f"{self.base}/api/chat/sessions/{sid}", headers=SITE_KEY, timeout=self.timeout)
        return r.json()["messages"] if r.status_code == 200 else None


def done_event(lines) -> dict:
    """The `done` event's data from an SSE stream's lines, or {"stream_error": ...}."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event in ("done", "error"):
            data = json.loads(line[6:])
            return data if event == "done" else {"stream_error": data}
    return {"stream_error": "the stream ended without a done event"}


def lost_messages(customer: Customer, accepted: list[tuple[str, str]]) -> int:
    """Accepted customer messages missing from their session's transcript."""
    by_sid: dict[str, list[str]] = {}
    for sid, content in accepted:
        by_sid.setdefault(sid, []).append(content)
    lost = 0
    for sid, contents in by_sid.items():
        said = [m["content"] for m in (customer.transcript(sid) or []) if m["role"] == "user"]
        lost += sum(1 for c in contents if c not in said)
    return lost


def wait_until(check, timeout: float, interval: float = 0.25):
    """Poll `check()` until it returns something truthy; that value, or None at the time-out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (requests.RequestException, OSError):
            value = None
        if value:
            return value
        time.sleep(interval)
    return None


@dataclass
class ScenarioResult:
    """One row of bench/cpu/faults.py's table."""
    scenario: str
    requests: int = 0
    server_errors: int = 0             # 5xx other than a 503 with Retry-After
    shed: int = 0                      # 503 + Retry-After
    degraded: int = 0                  # answers marked degraded
    lost: int = 0                      # accepted customer messages missing afterwards
    recovery_s: float | None = None    # dependency back -> first full (not degraded) answer
    recovery_bound_s: float | None = None
    checks: dict = field(default_factory=dict)     # name -> bool: the scenario's own assertions
    details: dict = field(default_factory=dict)

    def take(self, tally: Tally) -> ScenarioResult:
        self.requests, self.server_errors, self.shed = tally.requests, tally.server_errors, tally.shed
        self.degraded = tally.degraded
        self.details.setdefault("slowest_response_s", round(tally.slowest_s, 3))
        if tally.errors:
            self.details["errors"] = tally.errors[:5]
        return self

    @property
    def failed_checks(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok]


def time_to_full_answer(customer: Customer, sid: str, since: float, timeout: float = 60) -> float | None:
    """Seconds from `since` until the first turn that the full (not degraded) pipeline answers
    was sent: a turn every 0.25 s, each sent when the one before it came back. The time is when
    the turn was sent, so the reply's own generation (seconds on this CPU) is not counted."""
    def full():
        sent = time.monotonic()
        reply = customer.say(sid, "How long do refunds take?")
        return sent if reply is not None and not reply.get("degraded") else None
    sent = wait_until(full, timeout)
    return round(sent - since, 2) if sent else None


def fill_embedding_cache(cache_dir: Path, embedder) -> float:
    """Embed the shipped knowledge base and intents into `cache_dir` as an earlier run (or the
    reindex task) would have, with the model the inference service serves. Returns seconds."""
    from pipelines.intent import IntentDetector, load_intents
    from pipelines.knowledge_base import KnowledgeBase
    t0 = time.monotonic()
    kb = KnowledgeBase(embedder.embed, None, cache_dir)
    assert kb.chunks                                         # builds the index now
    IntentDetector(load_intents(None), embedder.embed, cache_dir=kb.cache_dir)
    return round(time.monotonic() - t0, 2)
