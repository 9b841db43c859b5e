"""`python -m inference chat` (what `make run` starts) and `generate`, driven as a user would."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _run(args, stdin: str = "", timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "inference", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_chat_streams_replies_and_quits_on_empty_line():
    proc = _run(["chat", "--model", "random:tiny", "--max-tokens", "6", "--temperature", "0"],
                stdin="hello\n/reset\nagain\n\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("bot> ") == 2
    assert proc.stderr.count("(6 tokens") == 2


def test_generate_and_bad_model_exit_codes():
    ok = _run(["generate", "--model", "random:tiny", "--max-tokens", "3", "hi"])
    assert ok.returncode == 0, ok.stderr
    bad = _run(["generate", "--model", "no-such-model", "hi"])
    assert bad.returncode == 2 and "error: model:" in bad.stderr


@pytest.mark.slow
def test_chat_with_default_model_answers():
    proc = _run(["chat", "--max-tokens", "20", "--temperature", "0"], stdin="What is 2+2?\n\n", timeout=300)
    assert proc.returncode == 0, proc.stderr
    reply = proc.stdout.split("bot> ", 1)[1]
    assert len(reply.strip()) > 0
