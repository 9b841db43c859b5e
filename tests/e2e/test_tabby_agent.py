"""Tabby's real editor agent (npm tabby-agent 1.5.0, the language server inside Tabby's IDE plugins)
against `python -m app serve` on the default model, Qwen2.5-Coder-0.5B: the agent is started over
stdio (its JSON-lines protocol), connects while the model is still loading, turns "ready", and
asks for inline completions in Python, JavaScript and Go. Every completion is non-empty and,
applied where the agent says, leaves the line correctly indented (the Python file compiles);
no request of the agent's is answered 404. `make test` installs the agent (make ide-clients)."""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time

import pytest
import requests

from tests.helpers.app_server import app_env, serving
from tests.helpers.net import stop_process
from tests.helpers.paths import REPO_ROOT

AGENT = REPO_ROOT / ".venv" / "ide-clients" / "node_modules" / "tabby-agent" / "dist" / "cli.js"
pytestmark = [pytest.mark.skipif(not AGENT.exists(), reason="tabby-agent missing: `make test` installs it"),
              pytest.mark.slow]

# (language, file, text before the cursor, text after it)
CASES = [
    ("python", "stats.py", "def mean(values):\n    total = 0\n    for v in values:\n        ",
     "\n    return total / len(values)\n"),
    ("python", "calc.py", "def add(a, b):\n    return ", "\n\n\nprint(add(1, 2))\n"),
    ("python", "greet.py", "def greet(name):\n    ", "\n\n\ngreet('Ada')\n"),
    ("javascript", "max.js", "function maxOf(xs) {\n  let best = xs[0];\n  for (const x of xs) {\n    ",
     "\n  }\n  return best;\n}\n"),
    ("javascript", "sum.js", "function sum(xs) {\n  return ", "\n}\n"),
    ("go", "main.go", "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tnames := []string{\"a\", \"b\"}\n\t",
     "\n}\n"),
    ("go", "max.go", "package main\n\nfunc maxOf(xs []int) int {\n\tbest := xs[0]\n\tfor _, x := range xs {\n\t\t",
     "\n\t}\n\treturn best\n}\n"),
]


class Agent:
    """tabby-agent's stdio protocol: a line [id, {func, args}] in, a line [id, result] out;
    events come as [0, event]."""

    def __init__(self, home):
        self.proc = subprocess.Popen(["node", str(AGENT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env={**os.environ, "HOME": str(home)})
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, func: str, *args, timeout: float = 60.0):
        rid = next(self.ids)
        self.proc.stdin.write(json.dumps([rid, {"func": func, "args": list(args)}]) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"tabby-agent exited ({self.proc.poll()}) during {func}")
            msg = json.loads(line)
            if msg[0] == rid:
                return msg[1]
            if msg[0] == 0:
                self.events.append(msg[1])
        raise AssertionError(f"tabby-agent did not answer {func} within {timeout} s")

    def close(self):
        stop_process(self.proc, timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tabby")
    with serving(tmp, app_env(tmp, MODEL="qwen2.5-coder-0.5b")) as base:     # the model may still be loading
        yield base, tmp


def _apply(text: str, choice: dict) -> str:
    r = choice["replaceRange"]
    return text[:r["start"]] + choice["text"] + text[r["end"]:]


def test_tabby_agent_completes_python_javascript_and_go(server):
    base, tmp = server
    agent = Agent(tmp)
    try:
        assert agent.call("initialize", {
            "config": {"server": {"endpoint": base, "token": "demo-api-key"},
                       "anonymousUsageTracking": {"disable": True}, "logs": {"level": "silent"}},
            "clientProperties": {"session": {"client": "pytest", "ide": {"kind": "test"}}}}) is True
        deadline = time.monotonic() + 180
        while agent.call("getStatus") != "ready":          # health is 503 until the model has loaded
            assert time.monotonic() < deadline, f"agent not ready: {agent.call('getStatus')}"
            time.sleep(0.5)
        assert requests.get(base + "/v1/health", timeout=5).status_code == 200
        seen = []
        for language, filepath, before, after in CASES:
            text = before + after
            t0 = time.monotonic()
            out = agent.call("provideCompletions", {"filepath": filepath, "language": language, "text": text,
                                                    "position": len(before), "manually": True})
            seen.append((filepath, time.monotonic() - t0, out["choices"]))
            assert out["choices"], f"{filepath}: no completion"
            choice = out["choices"][0]
            assert choice["text"].strip(), f"{filepath}: empty completion"
            applied = _apply(text, choice)
            line = applied[applied.rfind("\n", 0, len(before)) + 1:].split("\n", 1)[0]
            indent = re.match(r"[ \t]*", before.rsplit("\n", 1)[-1]).group()
            if not before.rsplit("\n", 1)[-1].strip():      # a blank indented line: the indentation stays
                assert re.match(r"[ \t]*", line).group() == indent, f"{filepath}: {line!r}"
            assert "\n" not in choice["text"][:1] and not line.endswith(" \n"), f"{filepath}: {choice['text']!r}"
            if language == "python":
                compile(applied, filepath, "exec")                  # correctly indented
            assert agent.call("postEvent", {"type": "view", "completion_id": out["id"], "choice_index": 0}) is True
        assert agent.call("getStatus") == "ready", agent.call("getIssues")
        metrics = requests.get(base + "/metrics", timeout=5).text
        not_found = [m for m in metrics.splitlines() if m.startswith("http_requests_total") and 'status="404"' in m]
        assert not not_found, not_found
        print("\n".join(f"{f}: {s:.2f} s {c[0]['text']!r}" for f, s, c in seen))
    finally:
        agent.close()
