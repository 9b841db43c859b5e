"""`python -m app serve` as a real process for end-to-end tests: on a free loopback port, with its
log in the test's folder, stopped at the end."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers.net import free_port, stop_process
from tests.helpers.paths import REPO_ROOT


def app_env(tmp: Path, **overrides: str) -> dict:
    """The test process's environment without its Redis / inference / database URLs, with a KB
    cache and a SQLite database in `tmp`, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "INFERENCE_URL", "DATABASE_URL")}
    env.update(KB_CACHE_DIR=str(tmp / "kbcache"), PYTHONUNBUFFERED="1", FAQ_PATH=str(tmp / "faq"),
               DATABASE_URL=f"sqlite:///{tmp / 'conversations.db'}", **overrides)
    return env


@contextlib.contextmanager
def serving(tmp: Path, env: dict, timeout_s: float = 60.0) -> Iterator[str]:
    """The base URL once /healthz answers (the process listens; the model may still be loading)."""
    port = free_port()
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    tail = lambda: log_path.read_text(errors="replace")[-3000:]  # noqa: E731
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{tail()}")
            try:
                if requests.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not healthy within {timeout_s:.0f} s:\n{tail()}")
            time.sleep(0.2)
        yield base
    finally:
        stop_process(proc, timeout=10)
