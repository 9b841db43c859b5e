"""A real Celery worker process for the tests that need one (solo pool: one task at a time)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.net import die_with_parent, stop_process
from tests.helpers.paths import REPO_ROOT


def start_worker(env: dict[str, str], capture: bool = True) -> subprocess.Popen:
    """`env` is added to this process's environment (REDIS_URL at least); INFERENCE_URL is
    dropped so the worker runs its own engine. capture: its output is readable from proc.stdout."""
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    full.pop("INFERENCE_URL", None)
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "app.worker", "worker", "--pool=solo",
                             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            cwd=REPO_ROOT, env=full, stdout=out, stderr=subprocess.STDOUT if capture else out,
                            text=True,
                            preexec_fn=die_with_parent())     # a killed test run leaves no worker behind


def stop_worker(proc: subprocess.Popen) -> None:
    stop_process(proc, timeout=20)
