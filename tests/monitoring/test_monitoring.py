"""Monitoring as shipped: the Prometheus config and alert rules pass promtool (config, rules and
the rule unit tests), and every metric the dashboard and the alerts query is one the web app, the
inference service or the worker really exports."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from prometheus_client import generate_latest

from app import create_app
from monitoring.engine_metrics import EngineMetrics, _MemoryCollector
from monitoring.worker_metrics import WorkerMetrics
from tests.helpers.paths import REPO_ROOT

MON = REPO_ROOT / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool missing: `make test` installs Debian's prometheus")
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "clamp_min", "max", "deriv", "and", "or",
                "on", "group_left", "absent", "le", "up", "bool", "without", "min", "count", "vector"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=MON, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_config_rules_and_rule_tests():
    for args in (("check", "config", "prometheus.yml"), ("check", "rules", "alerts.yml"),
                 ("test", "rules", "tests/alerts_test.yml")):
        out = promtool(*args)
        assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_a_broken_rule_is_caught(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text((MON / "alerts.yml").read_text().replace("> 0.8", "> > 0.8", 1))
    assert promtool("check", "rules", str(bad)).returncode != 0


def exported_names(tiny_client, tmp_path) -> set[str]:
    web = create_app({"KB_CACHE_DIR": str(tmp_path), "REDIS_URL": None}, client=tiny_client).test_client()
    sid = web.post("/api/chat/sessions", headers={"X-Site-Key": "demo-site-key"}).get_json()["session_id"]
    web.post(f"/api/chat/sessions/{sid}/messages", headers={"X-Site-Key": "demo-site-key"}, json={"content": "hi"})
    text = web.get("/metrics").get_data(as_text=True)
    engine = EngineMetrics("m")
    text += engine.render(ready=True)[0].decode()
    text += "\n".join(f.name for f in _MemoryCollector("inference", "m").describe())     # GPU ones: CUDA only
    text += generate_latest(WorkerMetrics().registry).decode() + "\ncelery_queue_length\n"
    names = set()
    for line in text.splitlines():
        m = re.match(r"^(?:# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
        if m:
            names.add(m.group(1))
    return names


def queried_names(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', "", expr)                              # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)                            # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                           # ranges
    expr = re.sub(r"\b(by|without|on|group_left|ignoring)\s*\([^)]*\)", "", expr)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {t for t in tokens if t not in PROMQL_WORDS and not re.fullmatch(r"e\d*", t)}


def test_dashboard_and_alerts_query_only_exported_metrics(tiny_client, tmp_path):
    import yaml
    dash = json.loads((MON / "grafana" / "dashboard.json").read_text())
    assert dash["uid"] and dash["panels"]
    exprs = []
    for p in dash["panels"]:
        assert p["title"] and p["datasource"]["uid"] == "prometheus" and p["targets"], p
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        exprs += [t["expr"] for t in p["targets"]]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    rules = yaml.safe_load((MON / "alerts.yml").read_text())["groups"][0]["rules"]
    exprs += [r["expr"] for r in rules]
    names = exported_names(tiny_client, tmp_path)
    missing = {}
    for e in exprs:
        for n in queried_names(e):
            base = re.sub(r"_(bucket|count|sum)$", "", n)
            if n not in names and base not in names:
                missing.setdefault(n, e)
    assert not missing, f"queried but never exported: {missing}"
    wanted = {"ChatLatencyHigh", "WebErrorRateHigh", "InferenceBreakerOpen", "GpuMemoryHigh", "InferenceQueueGrowing",
              "JobQueueGrowing", "NoReadyInferenceReplica", "ChatAnswersDegraded", "TasksBufferedInProcess",
              "ConversationDatabaseDown"}
    assert wanted <= {r["alert"] for r in rules}
