"""Rate limits per site key, per API key and per IP: 429 with a JSON reason and Retry-After,
tenants counted apart, health and metrics never limited; counters in memory and in Redis."""
from __future__ import annotations

import uuid

import pytest

from app import create_app
from app.limits import load_limits

TENANTS = """tenants:
  a: {site_key: key-a, allowed_origins: ["*"], system_prompt: A}
  b: {site_key: key-b, allowed_origins: ["*"], system_prompt: B}
"""


@pytest.fixture(params=["memory", "redis"])
def make_web(request, tmp_path, tiny_client, redis_server):
    (tmp_path / "tenants.yaml").write_text(TENANTS)

    def make(**limits):
        config = {"TENANTS_PATH": str(tmp_path / "tenants.yaml"), "KB_CACHE_DIR": str(tmp_path / "kb"),
                  "COMPLETION_API_KEYS": ["k1", "k2"], "REDIS_URL": redis_server if request.param == "redis" else None,
                  "RATELIMIT_KEY_PREFIX": f"test-{uuid.uuid4().hex[:8]}",      # fresh counters per app
                  "RATE_LIMITS": {"per_ip": "100 per minute", "per_site_key": "100 per minute",
                                  "per_api_key": "100 per minute", **limits}}
        if request.param == "redis":
            config["CELERY"] = {"task_always_eager": True}
        return create_app(config, client=tiny_client).test_client()
    return make


def event(web, key):
    return web.post("/v1/events", json={"type": "view", "completion_id": "cmpl-x"},
                    headers={"Authorization": f"Bearer {key}"})


def test_per_site_key(make_web):
    web = make_web(per_site_key="3 per minute")
    codes = [web.post("/api/chat/sessions", headers={"X-Site-Key": "key-a"}).status_code for _ in range(4)]
    assert codes == [201, 201, 201, 429]
    over = web.post("/api/chat/sessions", headers={"X-Site-Key": "key-a"})
    assert over.status_code == 429 and int(over.headers["Retry-After"]) > 0
    assert "rate limit exceeded" in over.get_json()["error"] and "3 per 1 minute" in over.get_json()["error"]
    assert web.post("/api/chat/sessions", headers={"X-Site-Key": "key-b"}).status_code == 201   # another tenant


def test_per_api_key_and_unlimited_health(make_web):
    web = make_web(per_api_key="2 per minute")
    assert [event(web, "k1").status_code for _ in range(3)] == [200, 200, 429]
    assert event(web, "k2").status_code == 200
    assert all(web.get("/v1/health").status_code == 200 for _ in range(5))
    assert web.get("/v1/metrics", headers={"Authorization": "Bearer k1"}).status_code == 200


def test_per_ip_across_keys(make_web):
    web = make_web(per_ip="3 per minute")
    codes = [web.post("/api/chat/sessions", headers={"X-Site-Key": k}).status_code
             for k in ("key-a", "key-b", "key-a", "key-b")]
    assert codes == [201, 201, 201, 429]


def test_bad_limit_config(tmp_path):
    path = tmp_path / "limits.yaml"
    path.write_text("per_ip: lots\nper_site_key: 1 per second\nper_api_key: 1 per second\n")
    with pytest.raises(ValueError, match="per_ip = 'lots' is not a rate limit"):
        load_limits(path, env={})
    path.write_text("per_ip: 1 per second\nper_tenant: 1 per second\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_limits(path, env={})
    assert load_limits(env={"RATE_LIMIT_PER_IP": "5 per hour"})["per_ip"] == "5 per hour"
