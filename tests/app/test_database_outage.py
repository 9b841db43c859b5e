"""The conversation database unreachable: every route that needs it answers 503 with
Retry-After (never a 4xx, never a bare 500), /readyz names it, and once it is back the next
request migrates it and is served."""
from __future__ import annotations

from app import create_app
from app.store.db import head_revision
from tests.helpers.net import free_port

KEY = {"X-Site-Key": "demo-site-key"}


def test_postgres_down_is_a_503_with_retry_after(tiny_client, tmp_path):
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"          # nothing listens there
    app = create_app({"DATABASE_URL": url, "KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None},
                     client=tiny_client)
    web = app.test_client()
    for resp in (web.post("/api/chat/sessions", headers=KEY),
                 web.post("/api/agent/login", json={"email": "a@b.test", "password": "whatever-long"})):
        assert resp.status_code == 503 and int(resp.headers["Retry-After"]) >= 1
        assert "database is unavailable" in resp.get_json()["error"]
    deps = web.get("/readyz").get_json()["dependencies"]
    assert deps["database"] == {"state": "down", "backend": "postgresql"}


def test_the_database_coming_back_is_migrated_and_served(tiny_client, tmp_path):
    folder = tmp_path / "not-yet"                   # SQLite cannot open a file in a missing folder
    app = create_app({"DATABASE_URL": f"sqlite:///{folder / 'c.db'}", "KB_CACHE_DIR": str(tmp_path / "kb"),
                      "REDIS_URL": None, "CHAT_MAX_TOKENS": 4}, client=tiny_client)
    web = app.test_client()
    assert web.post("/api/chat/sessions", headers=KEY).status_code == 503
    folder.mkdir()
    created = web.post("/api/chat/sessions", headers=KEY)
    assert created.status_code == 201
    sid = created.get_json()["session_id"]
    assert web.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "hi"}).status_code == 200
    assert app.extensions["db"].current() == head_revision()
