"""Loopback helpers for tests that start real servers."""
from __future__ import annotations

import socket
import subprocess


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
