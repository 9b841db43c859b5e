"""Support-chat actions through the chat API: the default model (Qwen2.5-Coder-0.5B) picks the
action and fills its arguments under the grammar, and the demo order service this app serves
answers on a real loopback socket. Conversations that look an order up, ask for a missing order
number, confirm or decline a change, retry a confirmation, and meet an endpoint that is down."""
from __future__ import annotations

import pytest

from app import create_app
from tests.helpers.http_servers import serving_wsgi
from tests.helpers.net import free_port

KEY = {"X-Site-Key": "demo-site-key"}


@pytest.fixture(scope="module")
def served(qwen_client, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("actions")
    app = create_app({"KB_CACHE_DIR": str(tmp / "kb"), "DATABASE_URL": f"sqlite:///{tmp / 'c.db'}",
                      "REDIS_URL": None, "CHAT_MAX_TOKENS": 64}, client=qwen_client)
    with serving_wsgi(app) as base:
        app.config["ACTIONS_BASE_URL"] = base          # read when the chat pipeline is built
        services = app.extensions["support_chat"]["services"]
        services.start()
        assert services.wait_first_attempt(120) and services.pipeline_state == "full"
        yield app, app.test_client()
        services.stop()


def _turns(client, *messages):
    sid = client.post("/api/chat/sessions", headers=KEY).get_json()["session_id"]
    replies = []
    for text in messages:
        resp = client.post(f"/api/chat/sessions/{sid}/messages", headers=KEY, json={"content": text})
        assert resp.status_code == 200, resp.get_data(as_text=True)
        replies.append(resp.get_json())
    return sid, replies


def _answer(client, sid, key, confirm):
    return client.post(f"/api/chat/sessions/{sid}/actions/{key}", headers=KEY, json={"confirm": confirm})


def test_a_status_question_is_answered_from_the_order_system(served):
    app, client = served
    sid, [r] = _turns(client, "Hi, where is my order NW-4417302?")
    assert r["action"]["name"] == "get_order_status" and r["action"]["status"] == "succeeded"
    assert r["reply"].startswith("Order NW-4417302 is in transit.") and "9 December" in r["reply"]
    stored = client.get(f"/api/chat/sessions/{sid}", headers=KEY).get_json()["messages"][-1]
    assert stored["action"]["id"] == r["action"]["id"]
    calls = app.extensions["support_chat"]["services"].call_log.for_conversation("demo", sid)
    assert [(c["action"], c["arguments"], c["status"], c["http_status"]) for c in calls] == \
        [("get_order_status", {"order_id": "NW-4417302"}, "succeeded", 200)]
    agent = app.test_client()                                      # the agent sees what the bot did
    app.extensions["agent_accounts"].add("demo", "ana@northwind.test", "correct horse battery", name="Ana")
    assert agent.post("/api/agent/login", json={"email": "ana@northwind.test",
                                                "password": "correct horse battery"}).status_code == 200
    shown = agent.get(f"/api/agent/conversations/{sid}").get_json()["messages"][-1]["action"]
    assert shown["name"] == "get_order_status" and shown["status"] == "succeeded"


def test_a_missing_order_number_is_asked_for_and_a_general_question_stays_with_the_help_centre(served):
    _, client = served
    _, [ask, answer] = _turns(client, "Where is my order?", "It's NW-3108842")
    assert ask["action"] == {"name": "get_order_status", "status": "needs_input", "arguments": {},
                             "missing": "order_id"}
    assert ask["reply"].startswith("What is your order number?")
    assert answer["action"]["status"] == "succeeded" and answer["reply"].startswith("Order NW-3108842 is delivered.")
    _, [general] = _turns(client, "How do I track an order?")
    assert general["action"] is None and general["citations"]


def test_a_change_waits_for_confirmation_and_runs_once(served):
    app, client = served
    book = app.extensions["demo_orders"]
    before = len(book.view("NW-5520018")["history"])
    sid, [r] = _turns(client, "Please change the delivery address of order NW-5520018 to 5 Park Row, Leeds LS2 8AA")
    action = r["action"]
    assert action["name"] == "change_shipping_address" and action["status"] == "needs_confirmation"
    assert action["arguments"] == {"order_id": "NW-5520018", "address": "5 Park Row, Leeds LS2 8AA"}
    assert len(book.view("NW-5520018")["history"]) == before           # nothing changed before the yes
    first = _answer(client, sid, action["id"], True)
    assert first.status_code == 200 and first.get_json()["action"]["status"] == "succeeded"
    assert first.get_json()["reply"] == "Done: order NW-5520018 will now be delivered to 5 Park Row, Leeds LS2 8AA."
    retried = _answer(client, sid, action["id"], True)                 # the widget's retry, a double click
    assert retried.status_code == 200 and retried.get_json()["reply"] == first.get_json()["reply"]
    assert len(book.view("NW-5520018")["history"]) == before + 1
    assert book.view("NW-5520018")["address"] == "5 Park Row, Leeds LS2 8AA"


def test_a_declined_change_changes_nothing_and_bad_answers_get_4xx(served):
    app, client = served
    book = app.extensions["demo_orders"]
    sid, [r] = _turns(client, "I want to return the blender from order NW-3108842")
    action = r["action"]
    assert action["name"] == "start_return" and action["status"] == "needs_confirmation"
    assert action["arguments"]["order_id"] == "NW-3108842"
    assert [i.lower() for i in action["arguments"]["items"]] == ["blender"]
    bad = _answer(client, sid, action["id"], "maybe")
    assert bad.status_code == 400 and "confirm" in bad.get_json()["error"]
    assert _answer(client, sid, "not-a-call", True).status_code == 404
    other_sid, _ = _turns(client, "hello")
    assert _answer(client, other_sid, action["id"], True).status_code == 404      # not that conversation's
    declined = _answer(client, sid, action["id"], False).get_json()
    assert declined["action"]["status"] == "declined" and "haven't changed anything" in declined["reply"]
    assert _answer(client, sid, action["id"], True).get_json()["action"]["status"] == "declined"   # stays declined
    assert not any(h["change"] == "return" for h in book.view("NW-3108842")["history"])


def test_a_typed_yes_confirms_and_an_endpoint_that_is_down_offers_a_human(served):
    app, client = served
    chat = app.extensions["support_chat"]["services"].chat
    sid, [ask, done] = _turns(client, "Can you change the address of order NW-5520018 to 9 Quay Street, Hull HU1 1AA?",
                              "yes please")
    assert ask["action"]["status"] == "needs_confirmation"
    assert done["action"]["status"] == "succeeded" and "9 Quay Street, Hull HU1 1AA" in done["reply"]
    runner = chat.actions.runner
    up, runner.base_url = runner.base_url, f"http://127.0.0.1:{free_port()}"        # the order system is down
    try:
        _, [r] = _turns(client, "where is my order NW-4417302")
    finally:
        runner.base_url = up
    assert r["action"]["status"] == "unreachable" and "human agent" in r["reply"]
