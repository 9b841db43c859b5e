"""An app for agent-API tests: the real chat pipeline on the tiny engine, SQLite in a tmp folder,
the two tenants of tests/app/test_chat_api.py, an agent per tenant, and signed-in clients."""
from __future__ import annotations

from app import create_app
from app.agent.accounts import AgentAccounts

PASSWORD = "correct horse battery"
AGENTS = (("demo", "dana@northwind.test", "Dana"), ("other", "olga@other.test", "Olga"))


def agent_app(tiny_client, tmp, tenants: str, **config):
    (tmp / "tenants.yaml").write_text(tenants, encoding="utf-8")
    app = create_app({"TENANTS_PATH": str(tmp / "tenants.yaml"), "KB_CACHE_DIR": str(tmp / "kbcache"),
                      "CHAT_MAX_TOKENS": 16, "CHAT_PROMPT_BUDGET": 900, "REDIS_URL": None,
                      "DATABASE_URL": f"sqlite:///{tmp / 'conversations.db'}", "FAQ_PATH": str(tmp / "faq"),
                      "AGENT_LOGIN_LIMIT": "1000 per minute", **config}, client=tiny_client)
    accounts = AgentAccounts(app.extensions["db"])
    for tenant, email, name in AGENTS:
        accounts.add(tenant, email, PASSWORD, name=name)
    return app


def signed_in(app, email: str):
    """A test client with the agent's session cookie; `.csrf` holds the header to send."""
    client = app.test_client()
    resp = client.post("/api/agent/login", json={"email": email, "password": PASSWORD})
    assert resp.status_code == 200, resp.get_json()
    client.csrf = {"X-CSRF-Token": resp.get_json()["csrf_token"]}
    return client
