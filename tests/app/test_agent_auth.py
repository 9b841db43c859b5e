"""Agent sign-in (app/agent/auth.py) through the real app: Flask's test client, a real SQLite
file per test, the engine on the tiny random model behind the app (never reached here)."""
from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import stat

import pytest
from flask import Blueprint, jsonify

from app import create_app
from app.agent.auth import agent_required, current_agent, instance_secret_key
from httpkit.openapi import build_spec

EMAIL, PASSWORD = "ana@northwind.test", "correct horse battery"
REDIS_URL = "redis://127.0.0.1:6379/14"


def build(tiny_client, tmp_path, **config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = {"DATABASE_URL": f"sqlite:///{tmp_path / 'agents.db'}", "SECRET_KEY": "test-secret-key",
              "REDIS_URL": None, "KB_CACHE_DIR": str(tmp_path / "kbcache"), **config}
    app = create_app(config, client=tiny_client)
    app.extensions["agent_accounts"].add("demo", EMAIL, PASSWORD, name="Ana Silva")
    return app


@pytest.fixture
def app(tiny_client, tmp_path):
    return build(tiny_client, tmp_path)


@pytest.fixture
def client(app):
    return app.test_client()


def login(client, email=EMAIL, password=PASSWORD, **kw):
    return client.post("/api/agent/login", json={"email": email, "password": password}, **kw)


def set_cookie(resp) -> str:
    [cookie] = [h for h in resp.headers.getlist("Set-Cookie") if h.startswith("session=")]
    return cookie


def test_wrong_credentials_get_one_401_and_the_password_is_never_logged(client, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = login(client, password="not the password 123")
    unknown = login(client, email="nobody@northwind.test", password="not the password 123")
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.get_json() == unknown.get_json() == {"error": "wrong email or password"}
    assert not wrong.headers.getlist("Set-Cookie")
    assert "not the password 123" not in caplog.text and caplog.records          # it did log the failures
    assert client.get("/api/agent/session").status_code == 401


def test_login_sets_an_httponly_samesite_cookie_for_12_hours(client):
    resp = login(client, email="  ANA@Northwind.test")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["agent"] == {"id": 1, "email": EMAIL, "name": "Ana Silva", "tenant": "demo"}
    assert body["csrf_token"]
    cookie = set_cookie(resp)
    attrs = [a.strip().lower() for a in cookie.split(";")]
    assert "httponly" in attrs and "samesite=lax" in attrs
    assert "secure" not in attrs                                   # plain http to localhost (make run)
    expires = client.get_cookie("session").expires
    assert dt.timedelta(hours=11, minutes=59) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=12)
    session = client.get("/api/agent/session")
    assert session.status_code == 200 and session.get_json()["agent"] == body["agent"]
    assert session.get_json()["csrf_token"]


def test_logout_needs_the_csrf_token(client):
    token = login(client).get_json()["csrf_token"]
    for headers in ({}, {"X-CSRF-Token": "forged"}, {"X-CSRF-Token": token + "x"}):
        refused = client.post("/api/agent/logout", headers=headers)
        assert refused.status_code == 400 and refused.get_json() == {"error": "missing or invalid CSRF token"}
        assert client.get("/api/agent/session").status_code == 200                  # nothing changed
    # the token of /session is as good as the login's
    fresh = client.get("/api/agent/session").get_json()["csrf_token"]
    out = client.post("/api/agent/logout", headers={"X-CSRF-Token": fresh})
    assert out.status_code == 200 and out.get_json() == {"ok": True}
    gone = client.get("/api/agent/session")
    assert gone.status_code == 401 and gone.get_json() == {"error": "not logged in"}
    # the old token died with the session
    assert client.post("/api/agent/logout", headers={"X-CSRF-Token": token}).status_code == 400


def test_a_login_replaces_the_earlier_session_and_its_token(client, app):
    first = login(client).get_json()["csrf_token"]
    app.extensions["agent_accounts"].add("demo", "bo@northwind.test", PASSWORD)
    second = login(client, email="bo@northwind.test").get_json()
    assert second["agent"]["email"] == "bo@northwind.test" and second["csrf_token"] != first
    assert client.post("/api/agent/logout", headers={"X-CSRF-Token": first}).status_code == 400
    assert client.get("/api/agent/session").get_json()["agent"]["email"] == "bo@northwind.test"


def test_site_and_api_keys_never_authenticate_an_agent(client):
    for headers in ({"X-Site-Key": "demo-site-key"}, {"Authorization": "Bearer demo-api-key"}):
        resp = client.get("/api/agent/session", headers=headers)
        assert resp.status_code == 401 and resp.get_json() == {"error": "not logged in"}


def test_a_disabled_agent_is_signed_out_on_its_next_request(client, app):
    assert login(client).status_code == 200
    app.extensions["agent_accounts"].disable(EMAIL)
    assert client.get("/api/agent/session").status_code == 401
    assert login(client).status_code == 401


def test_malformed_login_bodies_are_400(client):
    for body in (None, [], {"email": EMAIL}, {"email": 1, "password": PASSWORD}, {"email": EMAIL, "password": ""},
                 {"email": EMAIL, "password": "x" * 1025}):
        resp = client.post("/api/agent/login", json=body) if body is not None else \
            client.post("/api/agent/login", data="not json")
        assert resp.status_code == 400 and "error" in resp.get_json(), body


def test_secure_cookies(tiny_client, tmp_path):
    def cookie_attrs(app, **kw):
        return [a.strip().lower() for a in set_cookie(login(app.test_client(), **kw)).split(";")]
    auto = build(tiny_client, tmp_path)
    assert "secure" in cookie_attrs(auto, base_url="https://localhost")
    assert "secure" in cookie_attrs(auto, base_url="http://support.example.com")                 # not loopback
    assert "secure" in cookie_attrs(auto, headers={"X-Forwarded-Proto": "https"})                # behind a proxy
    assert "secure" not in cookie_attrs(auto, base_url="http://127.0.0.1:8000")
    forced = build(tiny_client, tmp_path / "on", AGENT_COOKIE_SECURE=True)
    assert "secure" in cookie_attrs(forced)
    off = build(tiny_client, tmp_path / "off", AGENT_COOKIE_SECURE=False)
    assert "secure" not in cookie_attrs(off, base_url="https://support.example.com")


@pytest.mark.parametrize("storage", ["memory", "redis"])
def test_login_attempts_are_rate_limited_per_ip_and_per_email(tiny_client, tmp_path, redis_server, storage):
    config = {"AGENT_LOGIN_LIMIT": "3 per minute", "RATELIMIT_KEY_PREFIX": f"t{secrets.token_hex(4)}"}
    if storage == "redis":
        config.update(REDIS_URL=REDIS_URL, CELERY={"task_always_eager": True})
    app = build(tiny_client, tmp_path, **config)
    client = app.test_client()
    ip = {"environ_base": {"REMOTE_ADDR": "10.0.0.1"}}
    assert [login(client, password=f"wrong password {i}", **ip).status_code for i in range(3)] == [401] * 3
    limited = login(client, **ip)                                # the right password: still over the limit
    assert limited.status_code == 429 and limited.get_json()["error"].startswith("rate limit exceeded (3 per 1 minute)")
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    # the same email from another address: its own budget is spent
    assert login(client, environ_base={"REMOTE_ADDR": "10.0.0.2"}).status_code == 429
    # the first address, other emails: the address's budget is spent
    assert login(client, email="bo@northwind.test", **ip).status_code == 429
    # a fresh address and email is not affected
    app.extensions["agent_accounts"].add("demo", "bo@northwind.test", PASSWORD)
    assert login(client, email="bo@northwind.test", environ_base={"REMOTE_ADDR": "10.0.0.3"}).status_code == 200


def test_a_bad_login_limit_is_a_startup_error(tiny_client, tmp_path):
    with pytest.raises(ValueError, match="AGENT_LOGIN_LIMIT = 'lots' is not a rate limit"):
        build(tiny_client, tmp_path, AGENT_LOGIN_LIMIT="lots")


bp = Blueprint("guarded", __name__, url_prefix="/api/agent/test")
bp.before_request(agent_required)


@bp.route("/whoami", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def whoami():
    return jsonify({"email": current_agent().email})


def test_agent_required_guards_other_blueprints_and_views(app, client):
    @app.post("/api/agent/test-view")
    @agent_required
    def guarded_view():
        return jsonify({"id": current_agent().id})
    app.register_blueprint(bp)
    assert client.get("/api/agent/test/whoami").get_json() == {"error": "not logged in"}
    assert client.post("/api/agent/test-view").status_code == 401
    token = login(client).get_json()["csrf_token"]
    assert client.get("/api/agent/test/whoami").get_json() == {"email": EMAIL}
    for method in ("post", "put", "patch", "delete"):
        call = getattr(client, method)
        assert call("/api/agent/test/whoami").status_code == 400
        assert call("/api/agent/test/whoami", headers={"X-CSRF-Token": token}).get_json() == {"email": EMAIL}
    assert client.post("/api/agent/test-view").get_json() == {"error": "missing or invalid CSRF token"}
    assert client.post("/api/agent/test-view", headers={"X-CSRF-Token": token}).get_json() == {"id": 1}


def test_the_routes_are_documented(app):
    # as /openapi.json builds it (tests/app/test_openapi.py checks the whole document)
    paths = build_spec(app, title="t", version="1", prefix="/api/agent/")["paths"]
    login_op = paths["/api/agent/login"]["post"]
    assert "security" not in login_op
    assert set(login_op["responses"]) >= {"200", "400", "401", "429"}
    assert {p["name"] for p in paths["/api/agent/logout"]["post"]["parameters"]} == {"X-CSRF-Token"}
    assert "get" in paths["/api/agent/session"]


def test_the_instance_secret_key_is_made_once_and_private(tmp_path):
    key = instance_secret_key(tmp_path / "instance")
    path = tmp_path / "instance" / "secret_key"
    assert len(key) == 64 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert instance_secret_key(tmp_path / "instance") == key
    assert os.listdir(tmp_path / "instance") == ["secret_key"]                     # no temporary left behind
