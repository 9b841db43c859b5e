"""A/B experiments: sticky weighted assignment, the statistics, and an experiment run through
the app (answer mode per arm on the real chat pipeline), with its results and bad input."""
from __future__ import annotations

import datetime as dt
import math
import secrets

import pytest
from sqlalchemy import select

from app.reports.experiments import arm_results
from app.reports.significance import required_per_arm, two_proportions, wilson
from app.store.conversations import ConversationStore
from app.store.experiments import ExperimentStore, pick_arm
from app.store.handoffs import Conflict, NotFound
from app.store.models import Conversation, Message, utcnow
from tests.app.test_chat_api import TENANTS
from tests.helpers.agent_app import agent_app, signed_in
from tests.helpers.databases import BACKENDS, migrated_database

KEY = {"X-Site-Key": "demo-site-key"}
ARMS = [{"name": "control", "weight": 0.3, "value": "extractive"}, {"name": "free", "weight": 0.7, "value": "free"}]


def test_assignment_follows_the_weights_and_sticks():
    ids = [secrets.token_urlsafe(16) for _ in range(20000)]
    arms = [pick_arm(7, i, ARMS) for i in ids]
    assert abs(arms.count("control") / len(ids) - 0.3) < 0.015
    assert [pick_arm(7, i, ARMS) for i in ids[:200]] == arms[:200]                  # sticky
    other = [pick_arm(8, i, ARMS) for i in ids[:2000]]
    assert sum(a != b for a, b in zip(arms[:2000], other)) > 600                    # a new experiment reshuffles


def test_the_statistics_match_the_textbook():
    got = two_proportions(50, 100, 60, 100)
    assert math.isclose(got["difference"], 0.1)
    assert math.isclose(got["p_value"], 0.1552, abs_tol=5e-4)                       # z = 1.421, pooled
    assert math.isclose(got["ci_low"], 0.1 - 1.96 * math.sqrt(0.25 / 100 + 0.24 / 100), abs_tol=1e-3)
    assert two_proportions(0, 0, 1, 2) is None
    low, high = wilson(0, 10)
    assert low == 0.0 and math.isclose(high, 0.2775, abs_tol=5e-4)
    assert 380 <= required_per_arm(0.5, 0.6) <= 390                                 # 80% power, alpha 0.05


@pytest.fixture(scope="module")
def app(tiny_client, tmp_path_factory):
    app = agent_app(tiny_client, tmp_path_factory.mktemp("experiments"), TENANTS, CHAT_MAX_TOKENS=8)
    app.extensions["experiments"].cache_s = 0.0
    return app


def test_an_experiment_splits_conversations_and_reports_each_arm(app):
    dana, olga, customer = signed_in(app, "dana@northwind.test"), signed_in(app, "olga@other.test"), app.test_client()
    before = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]   # started before: outside
    bad = [({"name": "x", "factor": "answer_mode", "arms": [{**ARMS[0], "weight": 0.5}, ARMS[1]]}, "sum to 1"),
           ({"name": "x", "factor": "answer_mode", "arms": [ARMS[0], {**ARMS[1], "value": "poetry"}]}, "answer mode"),
           ({"name": "x", "factor": "answer_mode", "arms": [ARMS[0], {**ARMS[1], "name": "control"}]}, "own name"),
           ({"name": "x", "factor": "model", "arms": ARMS}, "factor"),
           ({"name": "x", "factor": "max_tokens", "arms": [{**ARMS[0], "value": "64"}, {**ARMS[1], "value": "4096"}]},
            "token budget"), ({"name": "x", "factor": "answer_mode",
                                                                        "arms": ARMS[:1]}, "arms")]
    for body, why in bad:
        resp = dana.post("/api/agent/experiments", headers=dana.csrf, json=body)
        assert resp.status_code == 400 and why in resp.get_json()["error"], (body, resp.get_json())
    started = dana.post("/api/agent/experiments", headers=dana.csrf,
                        json={"name": "Quote or generate", "factor": "answer_mode", "arms": ARMS})
    assert started.status_code == 201
    experiment = started.get_json()
    again = dana.post("/api/agent/experiments", headers=dana.csrf,
                      json={"name": "Another", "factor": "answer_mode", "arms": ARMS})
    assert again.status_code == 409 and "running" in again.get_json()["error"]

    sessions = []
    for _ in range(12):
        sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
        for question in ("How long do refunds take?", "And to a gift card?"):
            customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": question})
        sessions.append(sid)
    customer.post(f"/api/chat/sessions/{before}/messages", headers=KEY, json={"content": "How long do refunds take?"})
    with app.extensions["db"].session(readonly=True) as s:
        arm_of = dict(s.execute(select(Conversation.id, Conversation.arm).where(
            Conversation.id.in_([*sessions, before]))).all())
        replies = s.execute(select(Message.conversation_id, Message.grounding, Message.first_token_ms).where(
            Message.conversation_id.in_(sessions), Message.role == "assistant")).all()
    assert arm_of[before] is None and {arm_of[s] for s in sessions} <= {"control", "free"}
    for sid, grounding, first_ms in replies:                 # each arm answered in its own mode, every turn
        if grounding in ("quoted", "free"):
            assert grounding == ("quoted" if arm_of[sid] == "control" else "free"), (sid, grounding)
        assert first_ms is not None and first_ms >= 0

    listed = dana.get("/api/agent/experiments").get_json()["experiments"]
    results = {r["arm"]: r for r in listed[0]["results"]}
    assert listed[0]["id"] == experiment["id"] and listed[0]["status"] == "running"
    assert sum(r["conversations"] for r in results.values()) == 12
    assert results["control"]["conversations"] == sum(arm_of[s] == "control" for s in sessions)
    assert results["control"]["vs_control"] is None and results["free"]["first_text_p50_ms"] is not None
    assert set(results["free"]["vs_control"]) == {"resolution", "handoff", "resolution_significant",
                                                   "handoff_significant"}
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert f'chat_experiment_turns_total{{arm="free",experiment="{experiment["id"]}"}}' in metrics

    assert olga.post(f"/api/agent/experiments/{experiment['id']}/stop", headers=olga.csrf).status_code == 404
    stopped = dana.post(f"/api/agent/experiments/{experiment['id']}/stop", headers=dana.csrf)
    assert stopped.status_code == 200 and stopped.get_json()["status"] == "stopped"
    assert dana.post(f"/api/agent/experiments/{experiment['id']}/stop", headers=dana.csrf).status_code == 409
    late = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    customer.post(f"/api/chat/sessions/{late}/messages", headers=KEY, json={"content": "How long do refunds take?"})
    with app.extensions["db"].session(readonly=True) as s:
        assert s.scalar(select(Conversation.arm).where(Conversation.id == late)) is None


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


def test_arms_and_their_results_on_both_databases(db):
    """Assignment, stickiness and per-arm results on SQLite and PostgreSQL (the compose stack's)."""
    store, experiments = ConversationStore(db), ExperimentStore(db, cache_s=0.0)
    early = store.create("demo")
    experiment = experiments.start("demo", "budget", "max_tokens",
                                   [{"name": "long", "weight": 0.5, "value": "256"},
                                    {"name": "short", "weight": 0.5, "value": "64"}])
    with pytest.raises(Conflict):
        experiments.start("demo", "again", "max_tokens", experiment["arms"])
    assert experiments.arm_of("demo", early) is None                      # began before the start
    sids = [store.create("demo") for _ in range(40)]
    arms = {}
    for sid in sids:
        _, arm = experiments.arm_of("demo", sid)
        arms[sid] = arm["name"]
        assert experiments.arm_of("demo", sid)[1]["name"] == arm["name"]    # sticky
        store.append("demo", sid, {"role": "user", "content": "a question"})
        store.append("demo", sid, {"role": "assistant", "content": "an answer", "grounding": "quoted",
                                   "first_token_ms": 100.0 if arm["name"] == "long" else 40.0})
    assert set(arms.values()) == {"long", "short"}
    later = utcnow() + dt.timedelta(days=2)                                   # past the resolution window
    results = {r["arm"]: r for r in arm_results(db, "demo", experiments.get("demo", experiment["id"]), now=later)}
    assert results["long"]["conversations"] + results["short"]["conversations"] == 40
    assert results["long"]["resolution_rate"] == 1.0 and results["short"]["first_text_p50_ms"] == 40.0
    assert results["short"]["vs_control"]["resolution"]["p_value"] == 1.0
    stopped = experiments.stop("demo", experiment["id"])
    assert stopped["status"] == "stopped" and experiments.arm_of("demo", store.create("demo")) is None
    with pytest.raises(NotFound):
        experiments.stop("other", experiment["id"])
