"""Loopback helpers for tests that start real servers."""
from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def die_with_parent() -> None:
    """Popen's preexec_fn: on Linux the child gets SIGTERM when the thread that started it exits,
    so a test run that is killed (no fixture teardown) leaves no server behind. A leftover Celery
    worker on the tests' Redis takes the next run's jobs and runs them with its own settings."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
