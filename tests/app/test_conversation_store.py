"""The conversation store and the handoff lifecycle on both databases the product runs on:
SQLite (the embedded default) and the machine's real PostgreSQL."""
from __future__ import annotations

import datetime as dt
import threading

import pytest

from app.reports.queries import report
from app.store.conversations import ConversationStore
from app.store.handoffs import Conflict, Handoffs, NotFound
from app.store.models import Agent, Conversation, utcnow
from tests.helpers.databases import BACKENDS, fresh_database_url, migrated_database


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


def add_agent(db, tenant: str, email: str, name: str) -> int:
    with db.session() as s:
        agent = Agent(tenant_id=tenant, email=email, name=name, password_hash="scrypt:unused")
        s.add(agent)
        s.flush()
        return agent.id


def test_messages_keep_their_order_fields_and_tenant(db):
    store = ConversationStore(db)
    sid = store.create("demo")
    assert store.append("demo", sid, {"role": "user", "content": "Where is my order?"}) == 0
    assert store.append("demo", sid, {"role": "assistant", "content": "It ships in 2 days.", "intent": "order_status",
                                      "citations": [{"title": "Shipping", "url": "/kb/shipping.md"}],
                                      "grounding": "quoted", "degraded": False}) == 1
    got = store.messages("demo", sid)
    assert [(m["index"], m["role"]) for m in got] == [(0, "user"), (1, "assistant")]
    assert got[1]["citations"] == [{"title": "Shipping", "url": "/kb/shipping.md"}] and got[1]["grounding"] == "quoted"
    assert got[0]["created_at"].endswith("Z")
    # another tenant's id space: the same id opens nothing, and writes there are refused
    assert not store.exists("other", sid) and store.messages("other", sid) == [] and store.meta("other", sid) is None
    assert store.append("other", sid, {"role": "user", "content": "x"}) == -1
    assert store.detail("other", sid) is None and len(store.messages("demo", sid)) == 2


def test_the_email_fallback_sends_replies_neither_seen_nor_mailed(db):
    store = ConversationStore(db)
    sid = store.create("demo")
    for role, text in [("user", "Where is my parcel?"), ("agent", "It left."), ("agent", "Code NW-1."),
                       ("agent", "Tomorrow.")]:
        store.append("demo", sid, {"role": role, "content": text})
    assert store.unmailed_replies("demo", sid)[0] is None                 # no address left
    store.set_contact("demo", sid, "me@example.org")
    assert [i for i, _m in store.unmailed_replies("demo", sid)[1]] == [1, 2, 3]
    assert store.mark_seen("demo", sid, 1) and not store.mark_seen("other", sid, 3)
    store.mark_seen("demo", sid, 0)                                         # never moves back
    assert [i for i, _m in store.unmailed_replies("demo", sid)[1]] == [2, 3]
    store.mark_emailed("demo", sid, 2)
    to, replies, messages = store.unmailed_replies("demo", sid)
    assert to == "me@example.org" and [m["content"] for _i, m in replies] == ["Tomorrow."] and len(messages) == 4
    store.mark_seen("demo", sid, 99)                                        # clamped to the last message
    assert store.unmailed_replies("demo", sid)[1] == [] and store.unmailed_replies("other", sid) == (None, [], [])


def test_concurrent_writers_get_distinct_consecutive_indexes(db):
    store = ConversationStore(db)
    sid = store.create("demo")
    got: list[int] = []
    lock = threading.Lock()

    def write(n: int):
        for i in range(8):
            index = store.append("demo", sid, {"role": "user", "content": f"writer {n} message {i}"})
            with lock:
                got.append(index)
    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(32))
    assert [m["index"] for m in store.messages("demo", sid)] == list(range(32))


def test_the_handoff_lifecycle_and_queue(db):
    store, handoffs = ConversationStore(db), Handoffs(db)
    dana, lee = add_agent(db, "demo", "dana@x.test", "Dana"), add_agent(db, "demo", "lee@x.test", "Lee")
    first, second = store.create("demo"), store.create("demo")
    for sid in (first, second):
        store.append("demo", sid, {"role": "user", "content": "I want a human"})
    assert handoffs.request("demo", first) and not handoffs.request("demo", first)   # once
    assert handoffs.request("demo", second)
    assert handoffs.waiting("demo", first)["queue_position"] == 1
    assert handoffs.waiting("demo", second)["queue_position"] == 2
    with pytest.raises(Conflict):                       # nobody may write before claiming
        handoffs.reply("demo", first, dana, "hello")
    assert handoffs.claim("demo", first, dana)["assignee"] == {"id": dana, "name": "Dana"}
    assert handoffs.claim("demo", first, dana)["status"] == "human"                  # again: a no-op
    with pytest.raises(Conflict, match="Dana"):
        handoffs.claim("demo", first, lee)
    assert handoffs.waiting("demo", second)["queue_position"] == 1                    # moved up
    message, first_wait = handoffs.reply("demo", first, dana, "Hi, I'm Dana. Let me check.")
    assert message["role"] == "agent" and message["author"] == {"name": "Dana"} and first_wait >= 0
    assert handoffs.reply("demo", first, dana, "Found it.")[1] is None               # only the first counts
    with pytest.raises(Conflict):
        handoffs.reply("demo", first, lee, "not mine")
    assert handoffs.resolve("demo", first, dana) == {"id": first, "status": "resolved"}
    with pytest.raises(Conflict, match="resolved"):
        handoffs.resolve("demo", first, dana)
    with pytest.raises(Conflict, match="resolved"):
        handoffs.claim("demo", first, lee)
    assert handoffs.reopen("demo", first) and store.status("demo", first) == "open"
    assert handoffs.cancel("demo", second) == "open" and handoffs.waiting("demo", second) is None
    with pytest.raises(NotFound):
        handoffs.claim("other", second, dana)
    detail = store.detail("demo", first)
    assert [m["role"] for m in detail["messages"]] == ["user", "agent", "agent"]


def test_two_agents_claiming_at_once_exactly_one_wins(db):
    store, handoffs = ConversationStore(db), Handoffs(db)
    agents = [add_agent(db, "demo", f"a{i}@x.test", f"Agent {i}") for i in range(4)]
    for _ in range(5):
        sid = store.create("demo")
        handoffs.request("demo", sid)
        barrier = threading.Barrier(len(agents))
        outcomes: list[str] = []

        def claim(agent_id: int, sid=sid, barrier=barrier, outcomes=outcomes):
            barrier.wait(10)
            try:
                handoffs.claim("demo", sid, agent_id)
                outcomes.append("won")
            except Conflict:
                outcomes.append("409")
        threads = [threading.Thread(target=claim, args=(a,)) for a in agents]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(outcomes) == ["409"] * (len(agents) - 1) + ["won"]


def test_inbox_pages_newest_first_with_a_cursor(db):
    store, handoffs = ConversationStore(db), Handoffs(db)
    ids = []
    for i in range(7):
        sid = store.create("demo")
        store.append("demo", sid, {"role": "user", "content": f"question {i}"})
        ids.append(sid)
    handoffs.request("demo", ids[2])
    store.create("other")
    seen, cursor = [], None
    while True:
        rows, cursor = store.list("demo", limit=3, before=cursor)
        seen += rows
        if cursor is None:
            break
    expected = [ids[2]] + [sid for sid in ids[::-1] if sid != ids[2]]      # the handoff updated it last
    assert [r["id"] for r in seen] == expected and len(seen) == 7
    assert seen[-1]["last_message"] == "question 0"
    pending, _ = store.list("demo", status="pending_human")
    assert [r["id"] for r in pending] == [ids[2]] and pending[0]["queue_position"] == 1


def test_the_inbox_title_is_the_customer_s_first_question(db):
    store = ConversationStore(db)
    sid = store.create("demo")
    for role, text, blocked in [("assistant", "Hi! How can I help?", False), ("user", "spam spam", True),
                                ("user", "Can I change the delivery address of my order?", False),
                                ("assistant", "Until it ships, yes.", False), ("user", "You're on it, right?", False)]:
        store.append("demo", sid, {"role": role, "content": text, "blocked": blocked})
    item = store.list_item("demo", sid)
    assert item["first_question"] == "Can I change the delivery address of my order?"
    assert item["last_message"] == "You're on it, right?"
    assert store.list("demo")[0][0]["first_question"] == item["first_question"]


def test_retention_deletes_old_conversations_with_their_rows(db):
    store, handoffs = ConversationStore(db), Handoffs(db)
    old, new = store.create("demo"), store.create("demo")
    for sid in (old, new):
        store.append("demo", sid, {"role": "user", "content": "hi"})
        store.add_feedback("demo", sid, {"kind": "message", "message_index": 0, "rating": "up"})
    handoffs.request("demo", old)
    with db.session() as s:
        s.get(Conversation, old).updated_at = utcnow() - dt.timedelta(days=40)
    assert store.delete_older_than(30) == 1
    assert not store.exists("demo", old) and store.exists("demo", new)
    assert store.messages("demo", old) == [] and len(store.feedback("demo", new)) == 1
    assert store.delete_older_than(30) == 0


def test_report_counts_handoffs_first_replies_and_csat(db):
    store, handoffs = ConversationStore(db), Handoffs(db)
    dana = add_agent(db, "demo", "dana@x.test", "Dana")
    sids = [store.create("demo") for _ in range(4)]
    for sid in sids:
        store.append("demo", sid, {"role": "user", "content": "hello"})
    store.create("demo")                                  # no message: not a conversation yet
    handoffs.request("demo", sids[0])
    handoffs.claim("demo", sids[0], dana)
    handoffs.reply("demo", sids[0], dana, "Hi")
    handoffs.resolve("demo", sids[0], dana)
    store.add_feedback("demo", sids[0], {"kind": "csat", "rating": 4, "comment": "quick"})
    store.add_feedback("demo", sids[1], {"kind": "csat", "rating": 2})
    now = utcnow()
    got = report(db, "demo", now - dt.timedelta(days=1), now + dt.timedelta(minutes=1))
    assert got["conversations"] == 4 and got["handoffs"] == 1
    assert got["handoff_rate"] == 0.25 and got["bot_resolved_share"] == 0.75
    assert got["csat_average"] == 3.0 and got["csat_count"] == 2
    assert 0 <= got["median_first_human_response_s"] < 60
    assert sum(d["conversations"] for d in got["daily"]) == 4
    assert report(db, "other", now - dt.timedelta(days=1), now)["conversations"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrations_upgrade_from_empty_then_downgrade(backend, tmp_path):
    from app.store.db import Database
    with fresh_database_url(backend, tmp_path) as url:
        db = Database(url)
        assert db.current() is None
        db.upgrade()
        assert db.current() == "0007"
        assert {"agents", "agent_sessions", "conversations", "messages", "handoffs", "feedback",
                "audit_events", "action_calls", "faq_drafts", "webhooks", "webhook_deliveries"} <= set(db.table_names())
        assert "experiments" in db.table_names()
        db.downgrade("0005")                              # the experiments go
        assert "experiments" not in db.table_names()
        db.downgrade("0004")                              # the webhooks go
        assert "webhooks" not in db.table_names() and "webhook_deliveries" not in db.table_names()
        db.downgrade("0003")                              # one step back: the FAQ drafts go
        assert db.current() == "0003" and "faq_drafts" not in db.table_names()
        db.downgrade("0002")                              # one step back: the action calls go
        assert db.current() == "0002" and "action_calls" not in db.table_names()
        db.downgrade("0001")                              # and the sessions table
        assert db.current() == "0001" and "agent_sessions" not in db.table_names()
        db.upgrade()
        db.upgrade()                                      # again: nothing to do
        db.downgrade("base")
        assert db.current() is None and set(db.table_names()) <= {"alembic_version"}
        db.dispose()


def test_each_conversation_gets_its_outcome_under_the_resolution_window(db):
    """Fin's rule: the bot resolved a conversation the customer confirmed (thumbs up) or left, after
    an answer, for the whole window; an agent's conversations are handed off, resolved or reopened."""
    store, handoffs = ConversationStore(db), Handoffs(db)
    dana = add_agent(db, "demo", "dana@x.test", "Dana")

    def chat(*replies):
        sid = store.create("demo")
        for reply in replies:
            store.append("demo", sid, {"role": "user", "content": "a question"})
            if reply is not None:
                store.append("demo", sid, {"role": "assistant", "content": "an answer", **reply})
        return sid
    answered = {"grounding": "quoted"}
    left_after_answer = chat(answered)
    chat({"grounding": "unanswerable"})                                 # the help centre had nothing
    chat(answered, None)                                                # the last question got no reply
    chat({"grounding": "verified_generated",
          "action": {"name": "get_order_status", "status": "needs_input"}})   # still asking, then gone
    confirmed = chat(answered)
    store.add_feedback("demo", confirmed, {"kind": "message", "message_index": 1, "rating": "up"})
    waiting = chat(answered)
    handoffs.request("demo", waiting)
    resolved = chat(answered)
    handoffs.request("demo", resolved)
    handoffs.claim("demo", resolved, dana)
    handoffs.resolve("demo", resolved, dana)
    back = chat(answered)
    handoffs.request("demo", back)
    handoffs.claim("demo", back, dana)
    handoffs.resolve("demo", back, dana)
    assert handoffs.reopen("demo", back)
    cancelled = chat(answered)
    handoffs.request("demo", cancelled)
    assert handoffs.cancel("demo", cancelled) == "open"

    start, now = utcnow() - dt.timedelta(hours=1), utcnow()
    soon = report(db, "demo", start, now + dt.timedelta(minutes=1), now=now + dt.timedelta(hours=1))
    assert soon["outcomes"] == {"bot_resolved": 1, "handed_off": 1, "human_resolved": 1, "abandoned": 0,
                                "reopened": 1}
    assert soon["undecided"] == 5 and soon["resolution_rate"] == round(1 / 4, 4)
    later = report(db, "demo", start, now + dt.timedelta(minutes=1), now=now + dt.timedelta(hours=25))
    assert later["outcomes"] == {"bot_resolved": 3, "handed_off": 1, "human_resolved": 1, "abandoned": 3,
                                 "reopened": 1}
    assert later["undecided"] == 0 and later["resolution_rate"] == round(3 / 9, 4)
    assert later["daily"][-1]["resolution_rate"] == round(3 / 9, 4)
    short = report(db, "demo", start, now + dt.timedelta(minutes=1), dt.timedelta(hours=2),
                   now=now + dt.timedelta(hours=3))
    assert short["outcomes"] == later["outcomes"] and short["resolution_window_h"] == 2
    assert left_after_answer and report(db, "other", start, now)["outcomes"]["bot_resolved"] == 0
