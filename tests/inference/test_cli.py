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


def test_serve_exits_non_zero_at_once_on_a_model_that_cannot_load(tmp_path):
    """A configuration error cannot heal: no endpoint that never becomes ready (as vLLM exits)."""
    unknown = _run(["serve", "--model", "qwen2.5-coder-0.5", "--port", "1"], timeout=60)
    assert unknown.returncode == 2 and "unknown model 'qwen2.5-coder-0.5'" in unknown.stderr
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 40)             # a header, then nothing
    from tests.helpers.net import free_port
    cut = _run(["serve", "--model", str(broken), "--port", str(free_port())], timeout=120)
    assert cut.returncode == 2 and "model cannot load" in cut.stderr
