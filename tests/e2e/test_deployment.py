"""The deployment files: docker-compose.yml parses (Debian's docker-compose, no engine needed)
and wires the stack as the README says; the Dockerfiles and mounted files it names exist;
gunicorn accepts its config and the app entry point."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import REPO_ROOT

COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="docker-compose missing: `make test` installs it")


def compose(*args: str, file: Path = REPO_ROOT / "docker-compose.yml", env: dict | None = None
            ) -> subprocess.CompletedProcess:
    env = {**os.environ, "SECRET_KEY": "compose-test-secret", **(env or {})}
    return subprocess.run([COMPOSE, "-f", str(file), *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


@needs_compose
def test_compose_file_is_valid_and_complete():
    out = compose("config", "-q")
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(compose("config").stdout)
    services = cfg["services"]
    assert {"redis", "postgres", "migrate", "inference", "inference-standby", "web", "worker", "beat", "prometheus",
            "grafana"} <= set(services)
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no health check"
    assert services["migrate"]["command"] == ["python", "-m", "app", "db", "upgrade"]
    assert any("/var/lib/postgresql/data" in str(v) for v in services["postgres"]["volumes"])
    gpu = services["inference"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and gpu["count"] == 1
    for name in ("web", "worker"):
        env = services[name]["environment"]
        assert env["REDIS_URL"].startswith("redis://redis:") and env["INFERENCE_URL"] == "http://inference:8001"
        assert env["INFERENCE_STANDBY_URL"] == "http://inference-standby:8001"
        assert env["DATABASE_URL"].startswith("postgresql+psycopg://") and "@postgres:5432/" in env["DATABASE_URL"]
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            assert (REPO_ROOT / build.get("dockerfile", "Dockerfile")).is_file(), name
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else vol.split(":")[0]
            if source.startswith(("/", ".")):
                assert Path(source).exists(), f"{name} mounts missing {source}"
    prom = yaml.safe_load((REPO_ROOT / "monitoring" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert {t.split(":")[0] for t in targets} <= set(services)        # it scrapes services that exist


@needs_compose
def test_a_broken_compose_file_is_rejected(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    compose_text = (REPO_ROOT / "docker-compose.yml").read_text()
    bad.write_text(compose_text.replace("    healthcheck:\n", "    healthcheck: [\n", 1))
    assert compose("config", "-q", file=bad).returncode != 0


@needs_compose
def test_compose_refuses_to_start_without_a_secret_key():
    """Agent sessions are signed with SECRET_KEY: every web replica must share one, so it is required."""
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    out = subprocess.run([COMPOSE, "-f", str(REPO_ROOT / "docker-compose.yml"), "config", "-q"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "SECRET_KEY" in out.stderr


def test_gunicorn_accepts_the_config_and_entry_point():
    out = subprocess.run([sys.executable, "-m", "gunicorn", "--check-config", "-c", "app/gunicorn_conf.py",
                          "app:create_app()"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "REDIS_URL": ""})
    assert out.returncode == 0, out.stdout + out.stderr
