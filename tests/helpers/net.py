"""Loopback helpers for tests that start real servers."""
from __future__ import annotations

import ctypes
import os
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


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """A preexec_fn for Popen: on Linux the child is killed when the thread that started it exits,
    so a test run that is killed (no fixture teardown) leaves no server behind. A leftover Celery
    worker on the tests' Redis takes the next run's jobs and runs them with its own settings.
    prctl is looked up at import and the parent's pid taken here, so the forked child only calls
    prctl and getppid (and exits if its parent died before the prctl took hold)."""
    parent = os.getpid()

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
    return preexec
