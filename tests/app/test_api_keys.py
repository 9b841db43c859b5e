"""API keys of the completion API: tenants list only SHA-256 hashes; a key is accepted when its
hash is listed, a plaintext key in the config is refused at start-up, env keys are hashed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from app import create_app
from app.tenants import TenantRegistry, hash_api_key
from tests.helpers.paths import REPO_ROOT


def tenants(tmp_path, keys) -> str:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme:\n    site_key: s-acme\n    system_prompt: A\n"
                    f"    api_keys: {keys!r}\n  other:\n    site_key: s-other\n    system_prompt: B\n")
    return str(path)


def test_hashed_keys_authenticate_and_name_the_tenant(tmp_path, tiny_client):
    path = tenants(tmp_path, [hash_api_key("acme-secret-1")])
    registry = TenantRegistry(path)
    assert registry.by_api_key("acme-secret-1").tenant.tenant_id == "acme"
    assert registry.by_api_key("acme-secret-2") is None
    web = create_app({"TENANTS_PATH": path, "KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None,
                      "COMPLETION_API_KEYS": ["ops-key"]}, client=tiny_client)
    client = web.test_client()
    view = {"type": "view", "completion_id": "c"}
    for key, status in (("acme-secret-1", 200), ("ops-key", 200), ("acme-secret-2", 401), ("", 401)):
        resp = client.post("/v1/events", json=view, headers={"Authorization": f"Bearer {key}"} if key else {})
        assert resp.status_code == status, key
        if status == 401:
            assert "api key" in resp.get_json()["error"]["message"].lower()
    assert web.config["COMPLETION_API_KEYS"] is None                  # env keys are kept as hashes only
    assert web.config["COMPLETION_API_KEY_HASHES"] == [hash_api_key("ops-key")]


def test_a_plaintext_key_in_the_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="sha256:<64 hex>' hashes"):
        TenantRegistry(tenants(tmp_path, ["acme-secret-1"]))


def test_hash_key_cli():
    out = subprocess.run([sys.executable, "-m", "app", "hash-key", "abc"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == hash_api_key("abc")
    assert hash_api_key("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
