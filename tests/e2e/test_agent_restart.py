"""`python -m app serve` on the embedded default, stopped and started again on the same SQLite
file: the demo agent's password is printed on the first start only, and conversations, their
handoff state and the agent's session all survive the restart."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests

from tests.helpers.net import free_port, stop_process
from tests.helpers.paths import REPO_ROOT

KEY = {"X-Site-Key": "demo-site-key"}
PASSWORD_LINE = re.compile(r"agent@northwind\.test, password: (\S+); shown once")

pytestmark = pytest.mark.e2e


def start(tmp, port: int, db_url: str, name: str) -> tuple[subprocess.Popen, object]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "INFERENCE_URL", "TENANTS_PATH")}
    env.update(MODEL="random:tiny", CHAT_MAX_TOKENS="8", KB_CACHE_DIR=str(tmp / "kbcache"), PYTHONUNBUFFERED="1",
               DATABASE_URL=db_url, AGENT_COOKIE_SECURE="0")
    log = tmp / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if requests.get(base + "/readyz", timeout=2).status_code == 200:
                return proc, log
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            stop_process(proc, timeout=10)
            pytest.fail(f"server not ready within 90 s:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def test_conversations_and_agent_sessions_survive_a_restart(tmp_path):
    port, db_url = free_port(), f"sqlite:///{tmp_path / 'conversations.db'}"
    base = f"http://127.0.0.1:{port}"
    proc, log = start(tmp_path, port, db_url, "first")
    try:
        found = PASSWORD_LINE.search(log.read_text())
        assert found, log.read_text()[-2000:]
        agent = requests.Session()
        login = agent.post(f"{base}/api/agent/login", json={"email": "agent@northwind.test",
                                                             "password": found.group(1)}, timeout=10)
        assert login.status_code == 200
        csrf = {"X-CSRF-Token": login.json()["csrf_token"]}
        sid = requests.post(f"{base}/api/chat/sessions", headers=KEY, timeout=10).json()["session_id"]
        assert requests.post(f"{base}/api/chat/sessions/{sid}/messages", headers=KEY, timeout=60,
                             json={"content": "How long do refunds take?"}).status_code == 200
        requests.post(f"{base}/api/chat/sessions/{sid}/handoff", headers=KEY, timeout=10)
        assert agent.post(f"{base}/api/agent/conversations/{sid}/claim", headers=csrf, timeout=10).ok
        assert agent.post(f"{base}/api/agent/conversations/{sid}/messages", headers=csrf, timeout=10,
                          json={"content": "Hi, I can help with the refund."}).status_code == 201
    finally:
        stop_process(proc, timeout=30)
    proc, log = start(tmp_path, port, db_url, "second")
    try:
        assert "password:" not in log.read_text()                  # printed once, at the first start
        assert agent.get(f"{base}/api/agent/session", timeout=10).status_code == 200
        detail = agent.get(f"{base}/api/agent/conversations/{sid}", timeout=10).json()
        assert detail["status"] == "human" and detail["assignee"]["name"]
        assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "agent"]
        seen = requests.get(f"{base}/api/chat/sessions/{sid}", headers=KEY, timeout=10).json()
        assert seen["messages"][-1]["content"] == "Hi, I can help with the refund." and seen["status"] == "human"
        inbox = agent.get(f"{base}/api/agent/conversations?status=human", timeout=10).json()["conversations"]
        assert [c["id"] for c in inbox] == [sid]
    finally:
        stop_process(proc, timeout=30)
