"""The web app's /openapi.json against the app itself: schemathesis generates requests from the
spec (valid ones and, in negative mode, ones the spec calls invalid) and every response must be a
non-5xx, documented status, content type and body; data the spec rejects must get a 4xx. The
engine behind it is the real one on the tiny random model. At least 5,000 cases run in all, most
of them with real session ids and credentials so they reach the handlers, not just the 404/401s.
"""
from __future__ import annotations

import random
import re
from collections import Counter

import pytest
import schemathesis
from schemathesis.core.parameters import ParameterLocation

from app import create_app
from app.agent.accounts import AgentAccounts
from tests.helpers.fuzz import fuzz

CHAT_KEY, API_KEY = {"X-Site-Key": "demo-site-key"}, {"Authorization": "Bearer demo-api-key"}
EXAMPLES_PER_OPERATION = 210             # per mode (valid, invalid); 13 operations take input
MIN_CASES = 5000
AGENT_PASSWORD = "fuzzing agent password"
CASES: Counter = Counter()                 # API -> cases run


@pytest.fixture(scope="module")
def web_app(tiny_client, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    (repo / "util.py").write_text("def add(a, b):\n    return a + b\n")
    app = create_app({"KB_CACHE_DIR": str(tmp_path_factory.mktemp("kb")), "REDIS_URL": None, "CHAT_MAX_TOKENS": 4,
                      "COMPLETION_REPO_ROOTS": [str(repo)], "CODE_INDEX_DIR": str(tmp_path_factory.mktemp("idx")),
                      "SSE_MAX_S": 0.05,                  # live-event streams end at once: one case each
                      "AGENT_LOGIN_LIMIT": "100000 per minute"},
                     client=tiny_client)
    # the database outlives the module: an xdist worker may build this fixture again for later cases
    accounts = AgentAccounts(app.extensions["db"])
    if not any(a.email == "fuzz@northwind.test" for a in accounts.list("demo")):
        accounts.add("demo", "fuzz@northwind.test", AGENT_PASSWORD, name="Fuzz")
    return app


@pytest.fixture(scope="module")
def agent_headers(web_app):
    """The agent API's credentials as headers: the session cookie and its CSRF token."""
    client = web_app.test_client()
    resp = client.post("/api/agent/login", json={"email": "fuzz@northwind.test", "password": AGENT_PASSWORD})
    assert resp.status_code == 200
    cookie = resp.headers["Set-Cookie"].split(";", 1)[0]
    return {"Cookie": cookie, "X-CSRF-Token": resp.get_json()["csrf_token"]}


@pytest.fixture(scope="module")
def web_schema(web_app):
    return schemathesis.openapi.from_wsgi("/openapi.json", web_app)


@pytest.fixture(scope="module")
def live_ids(web_app):
    """Ids that exist, so generated cases get past the 404s: sessions (one with messages) and a
    finished batch job."""
    client = web_app.test_client()
    sids = [client.post("/api/chat/sessions", headers=CHAT_KEY).get_json()["session_id"] for _ in range(4)]
    for sid in sids[:2]:
        assert client.post(f"/api/chat/sessions/{sid}/messages", json={"content": "How long do refunds take?"},
                           headers=CHAT_KEY).status_code == 200
    job = client.post("/v1/jobs", json={"requests": [{"prompt": "hi", "max_tokens": 2}]}, headers=API_KEY).get_json()
    for sid in sids[1:3]:
        client.post(f"/api/chat/sessions/{sid}/handoff", headers=CHAT_KEY)
    return {"sid": sids, "job_id": [job["job_id"]], "cid": sids}


def test_the_spec_is_generated_from_the_routes(web_app):
    spec = web_app.test_client().get("/openapi.json").get_json()
    assert spec["openapi"].startswith("3.1")
    documented = {(p, m.upper()) for p, ops in spec["paths"].items() for m in ops}
    for rule in web_app.url_map.iter_rules():
        if rule.rule.startswith(("/api/", "/v1/")):
            path = re.sub(r"<(?:[a-z_]+:)?(\w+)>", r"{\1}", rule.rule)      # "<int:id>" -> "{id}"
            for method in rule.methods - {"HEAD", "OPTIONS"}:
                assert (path, method) in documented, f"{method} {rule.rule} is not in /openapi.json"
    body = spec["paths"]["/api/chat/sessions/{sid}/messages"]["post"]["requestBody"]["content"]["application/json"]
    assert spec["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]["properties"]["content"][
        "maxLength"] == 4000


def _prepare(live_ids):
    def prepare(case):
        rng = random.Random(repr(case.path_parameters) + repr(case.body)[:200])
        # most cases address a real resource, so that their body (valid or not) reaches the handler
        valid_path = case.meta is None or not case.meta.is_negative_at(ParameterLocation.PATH)
        for name, ids in live_ids.items():
            if valid_path and name in (case.path_parameters or {}) and rng.random() < 0.8:
                case.path_parameters[name] = rng.choice(ids)
    return prepare


@pytest.mark.parametrize("api,prefix", [("chat", "/api/chat"), ("completion", "/v1/"), ("jobs", "/v1/jobs"),
                                        ("agent", "/api/agent"), ("operations", "/")])
def test_no_server_errors_and_responses_match_the_spec(web_app, web_schema, live_ids, agent_headers, api, prefix):
    client = web_app.test_client()

    def after(case, response):                   # a job's eager thread would compete for the CPU
        if case.path == "/v1/jobs" and response.status_code == 202:
            client.post(f"/v1/jobs/{response.json()['job_id']}/cancel", headers=API_KEY)

    def select(path: str) -> bool:
        groups = {"chat": path.startswith("/api/chat"), "jobs": path.startswith("/v1/jobs"),
                  "agent": path.startswith("/api/agent") and path != "/api/agent/logout"}
        groups["completion"] = path.startswith("/v1/") and not groups["jobs"]
        groups["operations"] = not any(groups.values())
        return groups[api]
    headers = agent_headers if api == "agent" else {**CHAT_KEY, **API_KEY}
    counts = fuzz(web_schema, EXAMPLES_PER_OPERATION, _prepare(live_ids), headers, select, after)
    assert counts, f"no operations under {prefix}"
    CASES[api] += sum(counts.values())
    print(api, dict(counts))


def test_enough_cases_ran():
    assert sum(CASES.values()) >= MIN_CASES, dict(CASES)
    assert min(CASES[api] for api in ("chat", "completion", "jobs", "agent")) >= 1000, dict(CASES)
