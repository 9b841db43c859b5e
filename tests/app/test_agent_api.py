"""The agent API end to end through the app (the real chat pipeline on the tiny engine, the real
conversation database): a customer hands off, an agent claims, replies, resolves; the customer
sees it and rates. Tenant isolation, conflicts and bad input each get a clear 4xx."""
from __future__ import annotations

import base64
import json
import threading
import time

import pytest

from app import create_app
from app.agent.accounts import AgentAccounts
from tests.app.test_chat_api import TENANTS

KEY = {"X-Site-Key": "demo-site-key"}
OTHER_KEY = {"X-Site-Key": "other-site-key"}
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def app(tiny_client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent-api")
    (tmp / "tenants.yaml").write_text(TENANTS, encoding="utf-8")
    app = create_app({"TENANTS_PATH": str(tmp / "tenants.yaml"), "KB_CACHE_DIR": str(tmp / "kbcache"),
                      "CHAT_MAX_TOKENS": 16, "CHAT_PROMPT_BUDGET": 900, "REDIS_URL": None,
                      "DATABASE_URL": f"sqlite:///{tmp / 'conversations.db'}", "SSE_MAX_S": 5.0,
                      "FAQ_PATH": str(tmp / "faq"),
                      "AGENT_LOGIN_LIMIT": "1000 per minute"}, client=tiny_client)
    accounts = AgentAccounts(app.extensions["db"])
    accounts.add("demo", "dana@northwind.test", PASSWORD, name="Dana")
    accounts.add("demo", "lee@northwind.test", PASSWORD, name="Lee")
    accounts.add("other", "olga@other.test", PASSWORD, name="Olga")
    return app


def agent(app, email: str):
    client = app.test_client()
    resp = client.post("/api/agent/login", json={"email": email, "password": PASSWORD})
    assert resp.status_code == 200, resp.get_json()
    client.csrf = {"X-CSRF-Token": resp.get_json()["csrf_token"]}
    return client


def handed_off(app) -> str:
    customer = app.test_client()
    sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    assert customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY,
                         json={"content": "Where is my order NW-1234?"}).status_code == 200
    handoff = customer.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY).get_json()
    assert handoff["status"] == "pending_human" and handoff["waiting"]["queue_position"] >= 1
    return sid


def test_a_handoff_from_request_to_rating(app):
    sid = handed_off(app)
    customer, dana, lee = app.test_client(), agent(app, "dana@northwind.test"), agent(app, "lee@northwind.test")
    inbox = dana.get("/api/agent/conversations?status=pending_human").get_json()["conversations"]
    item = next(c for c in inbox if c["id"] == sid)
    assert item["status"] == "pending_human" and item["assignee"] is None and item["queue_position"] >= 1
    # while waiting the bot is silent: the message is stored and the reply says where it waits
    waiting = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "hello?"}).get_json()
    assert waiting["reply"] is None and waiting["status"] == "pending_human"
    assert waiting["waiting"]["queue_position"] >= 1 and waiting["waiting"]["offer_email"] is False
    claimed = dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)
    assert claimed.status_code == 200 and claimed.get_json()["assignee"]["name"] == "Dana"
    second = lee.post(f"/api/agent/conversations/{sid}/claim", headers=lee.csrf)
    assert second.status_code == 409 and "Dana" in second.get_json()["error"]
    sent = dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf,
                     json={"content": "Hi, Dana here. Mail me at dana.private@gmail.com if needed."})
    assert sent.status_code == 201
    message = sent.get_json()["message"]
    assert message["role"] == "agent" and "dana.private@gmail.com" not in message["content"]
    seen = customer.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()
    assert seen["status"] == "human" and seen["assignee"] == {"name": "Dana"}
    assert seen["messages"][-1]["role"] == "agent" and seen["messages"][-1]["author"] == {"name": "Dana"}
    assert seen["waiting"] is None
    human = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "thanks!"}).get_json()
    assert human["reply"] is None and human["status"] == "human" and human["waiting"] is None
    assert lee.post(f"/api/agent/conversations/{sid}/messages", headers=lee.csrf,
                    json={"content": "me too"}).status_code == 409           # not Lee's conversation
    early = customer.post(f"/api/chat/sessions/{sid}/csat", headers=KEY, json={"rating": 5})
    assert early.status_code == 409
    assert dana.post(f"/api/agent/conversations/{sid}/resolve", headers=dana.csrf).get_json()["status"] == "resolved"
    assert dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf).status_code == 409
    rated = customer.post(f"/api/chat/sessions/{sid}/csat", headers=KEY, json={"rating": 5, "comment": "fast!"})
    assert rated.status_code == 200
    again = customer.post(f"/api/chat/sessions/{sid}/csat", headers=KEY, json={"rating": 1})
    assert again.status_code == 409 and "already rated" in again.get_json()["error"]
    detail = dana.get(f"/api/agent/conversations/{sid}").get_json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "user", "agent", "user"]
    assert {"kind": "csat", "rating": "5", "comment": "fast!"}.items() <= detail["feedback"][-1].items()
    # after the resolution the customer talks to the bot again
    again = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": "one more thing"})
    assert again.get_json()["reply"] and customer.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()[
        "status"] == "open"
    report = dana.get("/api/agent/reports").get_json()
    assert report["conversations"] >= 1 and report["csat_count"] >= 1 and report["handoff_rate"] > 0
    assert report["median_first_human_response_s"] is not None and len(report["daily"]) == 7
    assert report["outcomes"]["reopened"] >= 1 and report["resolution_window_h"] == 24     # resolved, then back


def test_agents_see_only_their_tenant(app):
    sid = handed_off(app)
    olga = agent(app, "olga@other.test")
    assert olga.get(f"/api/agent/conversations/{sid}").status_code == 404
    assert olga.post(f"/api/agent/conversations/{sid}/claim", headers=olga.csrf).status_code == 404
    assert sid not in [c["id"] for c in olga.get("/api/agent/conversations").get_json()["conversations"]]
    # and the demo tenant's conversation is untouched
    dana = agent(app, "dana@northwind.test")
    assert dana.get(f"/api/agent/conversations/{sid}").get_json()["status"] == "pending_human"


def test_bad_requests_change_nothing(app):
    sid = handed_off(app)
    dana = agent(app, "dana@northwind.test")
    anonymous = app.test_client()
    assert anonymous.get("/api/agent/conversations").status_code == 401
    assert anonymous.get("/api/agent/conversations", headers=KEY).status_code == 401      # a site key is no login
    no_csrf = dana.post(f"/api/agent/conversations/{sid}/claim")
    assert no_csrf.status_code == 400 and "CSRF" in no_csrf.get_json()["error"]
    assert dana.get(f"/api/agent/conversations/{sid}").get_json()["status"] == "pending_human"
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)
    empty = dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": "   "})
    huge = dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": "x" * 5000})
    wrong = dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": 5})
    assert (empty.status_code, huge.status_code, wrong.status_code) == (400, 413, 400)
    assert all("content" in r.get_json()["error"] for r in (empty, huge, wrong))
    assert dana.get("/api/agent/conversations?status=lost").status_code == 400
    assert dana.get("/api/agent/conversations?limit=0").status_code == 400
    assert dana.get("/api/agent/conversations?before=%%%").status_code == 400
    assert dana.get("/api/agent/reports?from=2026-02-30").status_code == 400
    assert dana.get("/api/agent/reports?from=2026-12-09&to=2026-12-01").status_code == 400
    far = dana.get("/api/agent/reports?from=9999-12-30&to=9999-12-31")
    assert far.status_code == 400 and "to:" in far.get_json()["error"]
    assert dana.get("/api/agent/reports?from=9999-12-01&to=9999-12-30").status_code == 200
    naive = base64.urlsafe_b64encode(b"2026-12-01T10:00:00|AAAAAAAAAAAAAAAAAAAAAA").decode()
    assert dana.get(f"/api/agent/conversations?before={naive}").status_code == 200
    huge_year = base64.urlsafe_b64encode(b"9999-12-31T23:59:59-23:00|AAAAAAAAAAAAAAAAAAAAAA").decode()
    assert dana.get(f"/api/agent/conversations?before={huge_year}").status_code == 400
    assert dana.get("/api/agent/conversations/not-an-id").status_code == 404
    assert dana.post("/api/agent/conversations/AAAAAAAAAAAAAAAAAAAAAA/claim", headers=dana.csrf).status_code == 404
    customer = app.test_client()
    assert customer.post(f"/api/chat/sessions/{sid}/csat", headers=KEY, json={"rating": 9}).status_code == 400
    assert customer.post(f"/api/chat/sessions/{sid}/contact", headers=KEY, json={"email": "nope"}).status_code == 400
    messages = dana.get(f"/api/agent/conversations/{sid}").get_json()["messages"]
    assert [m["role"] for m in messages].count("agent") == 0


def test_logout_ends_the_session_on_the_server(app):
    """A copy of the session cookie (another tab, or a stolen one) stops working at logout."""
    dana = agent(app, "dana@northwind.test")
    copy = app.test_client()
    cookie = dana.get_cookie("session")
    copy.set_cookie("session", cookie.value)
    assert copy.get("/api/agent/session").status_code == 200
    assert dana.post("/api/agent/logout", headers=dana.csrf).status_code == 200
    assert copy.get("/api/agent/session").status_code == 401
    assert copy.get("/api/agent/conversations").status_code == 401


def test_two_agents_claim_at_once_exactly_one_wins(app):
    sid = handed_off(app)
    agents = [agent(app, e) for e in ("dana@northwind.test", "lee@northwind.test")]
    barrier, codes = threading.Barrier(2), []

    def claim(client):
        barrier.wait(10)
        codes.append(client.post(f"/api/agent/conversations/{sid}/claim", headers=client.csrf).status_code)
    threads = [threading.Thread(target=claim, args=(c,)) for c in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(codes) == [200, 409]


def read_events(resp, into: list, stop: threading.Event) -> None:
    """Parse a streamed SSE response body into (event, data, received_at) until it ends."""
    buffer = ""
    for chunk in resp.response:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        while "\n\n" in buffer:
            block, buffer = buffer.split("\n\n", 1)
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "event" in fields:
                into.append((fields["event"], json.loads(fields["data"]), time.monotonic()))
        if stop.is_set():
            break


def test_live_events_reach_the_customer_and_the_agents(app):
    dana = agent(app, "dana@northwind.test")
    inbox_events: list = []
    stop = threading.Event()
    inbox = dana.get("/api/agent/events", buffered=False)
    assert inbox.status_code == 200 and inbox.mimetype == "text/event-stream"
    reader = threading.Thread(target=read_events, args=(inbox, inbox_events, stop), daemon=True)
    reader.start()
    time.sleep(0.2)
    sid = handed_off(app)
    customer_events: list = []
    widget = app.test_client().get(f"/api/chat/sessions/{sid}/events?site_key=demo-site-key", buffered=False)
    assert widget.status_code == 200
    threading.Thread(target=read_events, args=(widget, customer_events, stop), daemon=True).start()
    time.sleep(0.2)
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)
    sent_at = time.monotonic()
    dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf, json={"content": "Hello from Dana"})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(e[0] == "message" for e in customer_events):
        time.sleep(0.01)
    got = [e for e in customer_events if e[0] == "message"]
    assert got and got[0][1]["content"] == "Hello from Dana" and got[0][1]["author"] == {"name": "Dana"}
    assert got[0][2] - sent_at < 1.0                       # the bound: within 1 s
    assert any(e[0] == "status" and e[1]["status"] == "human" for e in customer_events)
    kinds = [(e[0], e[1].get("conversation", {}).get("id") or e[1].get("conversation_id")) for e in inbox_events]
    assert ("handoff", sid) in kinds and ("status", sid) in kinds
    stop.set()
    assert app.test_client().get(f"/api/chat/sessions/{sid}/events").status_code == 401        # no site key


def test_an_agent_who_claims_while_the_bot_writes_silences_the_reply(app, monkeypatch):
    """The claim lands between the bot's generation and the storing of its turn: the customer's
    message is kept for the agent, the bot's reply is dropped, and the answer says who has it."""
    customer, dana = app.test_client(), agent(app, "dana@northwind.test")
    chat = app.extensions["support_chat"]["services"].chat
    original, claim_in = type(chat).respond, []

    def respond_then_claimed(self, *args, **kwargs):
        for kind, value in original(self, *args, **kwargs):
            if kind == "done":
                assert dana.post(f"/api/agent/conversations/{claim_in[-1]}/claim", headers=dana.csrf).status_code == 200
            yield kind, value
    monkeypatch.setattr(type(chat), "respond", respond_then_claimed)
    for stream in (False, True):
        sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
        claim_in.append(sid)
        resp = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY,
                             json={"content": "Do you ship to Canada?", "stream": stream})
        done = json.loads(resp.get_data(as_text=True).split("event: done\ndata: ")[1].split("\n")[0]) \
            if stream else resp.get_json()
        assert done["reply"] is None and done["status"] == "human" and done["message_index"] == 0, done
        messages = dana.get(f"/api/agent/conversations/{sid}").get_json()["messages"]
        assert [(m["role"], m["content"]) for m in messages] == [("user", "Do you ship to Canada?")]
    again = dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf).get_json()
    assert again["changed"] is False and again["status"] == "human"


def test_a_draft_waits_for_a_turn_slot_and_names_a_missing_tenant(app):
    sid = handed_off(app)
    dana = agent(app, "dana@northwind.test")
    slots = app.extensions["support_chat"]["turn_slots"]
    taken = 0
    while slots.acquire(blocking=False):
        taken += 1
    try:
        busy = dana.get(f"/api/agent/conversations/{sid}/suggestion")
        assert busy.status_code == 503 and busy.headers["Retry-After"]
    finally:
        for _ in range(taken):
            slots.release()
    assert dana.get(f"/api/agent/conversations/{sid}/suggestion").status_code == 200
    AgentAccounts(app.extensions["db"]).add("gone", "gil@gone.test", PASSWORD, name="Gil")
    gil = agent(app, "gil@gone.test")
    store = app.extensions["support_chat"]["store"]
    gone = store.create("gone")
    store.append("gone", gone, {"role": "user", "content": "hello"})
    missing = gil.get(f"/api/agent/conversations/{gone}/suggestion")
    assert missing.status_code == 404 and "gone" in missing.get_json()["error"]


def test_knowledge_gaps_cluster_what_the_bot_could_not_answer(app):
    """Customers ask what the help centre lacks, in different words; the agents of that tenant see
    one cluster, as JSON and as a CSV download; another tenant sees none of it."""
    asked = ["Do you sell refurbished laptops?", "can i buy a refurbished notebook from you"]
    customer = app.test_client()
    for question in asked:
        sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
        reply = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": question})
        assert reply.get_json()["grounding"] == "unanswerable", reply.get_json()
    dana, olga = agent(app, "dana@northwind.test"), agent(app, "olga@other.test")
    gaps = dana.get("/api/agent/knowledge-gaps").get_json()
    assert gaps["method"] == "embeddings" and gaps["questions"] >= 2
    refurbished = next(c for c in gaps["clusters"] if set(asked) <= set(c["examples"]))
    assert refurbished["size"] >= 2 and refurbished["reasons"]["unanswerable"] >= 2
    assert not any("refurbished" in e for c in olga.get("/api/agent/knowledge-gaps").get_json()["clusters"]
                   for e in c["examples"])
    export = dana.get("/api/agent/knowledge-gaps.csv?limit=5")
    assert export.status_code == 200 and export.mimetype == "text/csv"
    assert "attachment" in export.headers["Content-Disposition"]
    rows = export.get_data(as_text=True).splitlines()
    assert rows[0].startswith("rank,id,size,conversations,label") and any("refurbished" in r for r in rows[1:])
    for bad in ("limit=0", "limit=201", "limit=many", "from=2026-02-30", "to=2026-13-01"):
        resp = dana.get(f"/api/agent/knowledge-gaps?{bad}")
        assert resp.status_code == 400 and bad.split("=")[0] in resp.get_json()["error"], bad
    assert app.test_client().get("/api/agent/knowledge-gaps").status_code == 401


def test_an_agents_answer_becomes_an_faq_the_bot_then_answers_with(app):
    """The FAQ loop: the bot cannot answer, the customer asks for a human, the agent answers and
    resolves; a pending draft appears, the agent approves it edited, and the bot answers the same
    question from the new article. Bad decisions get a 4xx and change nothing."""
    question = "Can you engrave a name on a wooden cutting board?"
    customer, dana, olga = app.test_client(), agent(app, "dana@northwind.test"), agent(app, "olga@other.test")
    sid = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    first = customer.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": question}).get_json()
    assert "20 characters" not in first["reply"], first
    customer.post(f"/api/chat/sessions/{sid}/handoff", headers=KEY)
    dana.post(f"/api/agent/conversations/{sid}/claim", headers=dana.csrf)
    dana.post(f"/api/agent/conversations/{sid}/messages", headers=dana.csrf,
              json={"content": "Hi, this is Dana. We engrave up to 20 characters on any wooden cutting board, "
                               "and engraving adds 3 business days to delivery."})
    assert dana.post(f"/api/agent/conversations/{sid}/resolve", headers=dana.csrf).status_code == 200
    deadline, draft = time.monotonic() + 60, None
    while draft is None and time.monotonic() < deadline:
        drafts = dana.get("/api/agent/faq-drafts").get_json()["drafts"]
        draft = next((d for d in drafts if d["conversation_id"] == sid), None)
        time.sleep(0.2)
    assert draft is not None and draft["status"] == "pending"
    assert "20 characters" in draft["answer"] and "Dana" not in draft["answer"]
    assert dana.get("/api/agent/faq-drafts?status=maybe").status_code == 400
    approve = f"/api/agent/faq-drafts/{draft['id']}/approve"
    assert olga.post(approve, headers=olga.csrf).status_code == 404                  # another tenant's
    assert dana.post(approve).status_code == 400                                      # no CSRF token
    assert dana.post(approve, headers=dana.csrf, json={"answer": "  "}).status_code == 400
    assert dana.post("/api/agent/faq-drafts/999999/approve", headers=dana.csrf).status_code == 404
    assert dana.get("/api/agent/faq-drafts").get_json()["drafts"][0]["status"] == "pending"
    approved = dana.post(approve, headers=dana.csrf, json={"question": "Can you engrave a cutting board?"})
    assert approved.status_code == 200 and approved.get_json()["question"] == "Can you engrave a cutting board?"
    assert dana.post(approve, headers=dana.csrf).status_code == 409
    assert dana.post(f"/api/agent/faq-drafts/{draft['id']}/reject", headers=dana.csrf).status_code == 409
    article = app.test_client().get("/kb/approved-faq/demo.md")
    assert article.status_code == 200 and "## Can you engrave a cutting board?" in article.get_data(as_text=True)
    started, reply = time.monotonic(), None
    while time.monotonic() - started < 30:
        again = customer.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
        reply = customer.post(f"/api/chat/sessions/{again}/messages", headers=KEY,
                              json={"content": question}).get_json()
        if any(c["source"].startswith("approved-faq/") for c in reply["citations"]):
            break
        time.sleep(0.5)
    assert "20 characters" in reply["reply"], reply
