"""Support-chat actions (pipelines/actions.py): the specs, the argument planner, and the runner
against the real demo order service on loopback, with the call log in a real SQLite database."""
from __future__ import annotations

import threading

import pytest
from flask import Flask

from app.chat.demo_orders import init_demo_orders
from app.store.action_log import SqlCallLog
from app.store.db import Database
from configs import shipped
from pipelines.actions import FAILED, ActionRunner, ActionSpec, grounded, load_actions, plan
from pipelines.inference_client import InferenceError
from tests.helpers.http_servers import serving_wsgi, slow_server
from tests.helpers.net import free_port

SPECS = load_actions(shipped("actions", "northwind.yaml"))
BY_NAME = {s.name: s for s in SPECS}


def _spec(**over) -> dict:
    base = {"name": "lookup", "description": "d", "intents": ["order_status"],
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
            "endpoint": {"url": "{base}/o/{order_id}"}, "reply": "ok"}
    base.update(over)
    return base


def test_the_shipped_actions_load_and_bad_files_name_what_is_wrong(tmp_path):
    assert [s.name for s in SPECS] == ["get_order_status", "change_shipping_address", "start_return"]
    assert BY_NAME["change_shipping_address"].confirm and not BY_NAME["get_order_status"].confirm
    cases = {
        "url": (_spec(endpoint={"url": "{base}/o/{order}"}), "endpoint.url uses fields that are not parameters"),
        "confirm": (_spec(confirm=True), "confirm_prompt is required"),
        "schema": (_spec(parameters={"type": "object", "properties": {"a": {"type": "strin"}}}), "not a JSON Schema"),
        "ask": (_spec(ask={"zip": "?"}), "ask names parameters"),
        "name": (_spec(name="Get Order"), "name"),
        "requests": (_spec(requests=["where is (my order"]), "not a regular expression"),
    }
    import yaml
    for label, (item, message) in cases.items():
        path = tmp_path / f"{label}.yaml"
        path.write_text(yaml.safe_dump([item]))
        with pytest.raises(ValueError, match=message):
            load_actions(path)
    (tmp_path / "map.yaml").write_text("name: x\n")
    with pytest.raises(ValueError, match="must be a YAML list"):
        load_actions(tmp_path / "map.yaml")


def test_an_argument_counts_only_if_the_customer_wrote_it():
    said = "Hi, where is  order nw-4417302? I moved to 5 Park Row, Leeds."
    assert grounded("NW-4417302", said) and grounded("5 park row, leeds", said)
    assert not grounded("NW-4417303", said) and not grounded("", said) and not grounded("Leeds LS1", said)
    assert grounded(["5 Park Row"], said) and not grounded(["5 Park Row", "kettle"], said) and not grounded([], said)
    assert grounded(5, said) and not grounded(4417, said) and not grounded(True, said)


def _model(answer):
    """The model's side of plan(): a fixed call, as a constrained decode would give it."""
    calls = []

    def call_tool(messages, tools, name):
        calls.append((messages, [t["function"]["name"] for t in tools], name))
        if isinstance(answer, Exception):
            raise answer
        return answer
    return call_tool, calls


def test_plan_drops_invented_arguments_and_asks_only_when_asked():
    call_tool, calls = _model(("get_order_status", {"order_id": "NW-1234567"}))      # not in the message
    p = plan(call_tool, SPECS, "order_status", [], "Where is my order?")
    assert p.spec.name == "get_order_status" and p.arguments == {} and p.missing == ["order_id"]
    assert calls[0][1] == ["get_order_status"] and calls[0][2] == "get_order_status"   # only the one asked for
    assert plan(call_tool, SPECS, "order_status", [], "How do I track an order?") is None     # general: the KB
    assert plan(call_tool, SPECS, "shipping", [], "Where is my order?") is None               # no action for it

    call_tool, _ = _model(("get_order_status", {"order_id": "NW-4417302"}))
    p = plan(call_tool, SPECS, "order_status", [], "has NW-4417302 shipped?")
    assert p.arguments == {"order_id": "NW-4417302"} and p.missing == []


@pytest.mark.parametrize("intent,question", [
    ("refund", "Once my return arrives at your warehouse, how long until you issue the refund?"),
    ("refund", "Can you send my refund to a different card than the one I paid with?"),
    ("refund", "can i just drop my return off at ur warehouse instead of posting it"),
    ("refund", "Can I return a pack of socks I've opened?"),
    ("order_status", "my order says out for delivery, does that mean its coming today or what"),
    ("order_status", "Tracking says my parcel was delivered but I can't find it. How long should I wait?"),
    ("cancel_order", "my package already shipped n i put the wrong address, can u still fix it"),
    ("cancel_order", "Can I collect my order in person from one of your shops?"),
])
def test_questions_about_how_things_work_get_no_action_and_no_model_call(intent, question):
    """Questions that speak of the customer's own order but ask how something works are the help
    centre's (they were answered "what is your order number?" while "my" alone opened an action)."""
    call_tool, calls = _model(("start_return", {"order_id": "NW-1234567", "items": ["x"]}))
    assert plan(call_tool, SPECS, intent, [], question) is None and calls == []
    earlier = [{"role": "user", "content": "where is my order NW-1234567?"},
               {"role": "assistant", "content": "Order NW-1234567 is in transit.",
                "action": {"name": "get_order_status", "status": "succeeded"}}]
    assert plan(call_tool, SPECS, intent, earlier, question) is None and calls == []   # its number, said before


@pytest.mark.parametrize("intent,message,action", [
    ("order_status", "wheres my parcel??", "get_order_status"),
    ("order_status", "can u check on my order", "get_order_status"),
    ("refund", "I'd like to send back the kettle I bought", "start_return"),
    ("refund", "could you start a return for me", "start_return"),
    ("cancel_order", "I need to update my shipping address", "change_shipping_address"),
    ("refund", "我想退货", "start_return"),
])
def test_requests_without_an_order_number_ask_for_it(intent, message, action):
    call_tool, _ = _model((action, {}))
    p = plan(call_tool, SPECS, intent, [], message)
    assert p.spec.name == action and p.arguments == {} and p.missing[0] == "order_id"


def test_plan_reads_an_answer_to_its_question_and_finds_patterns_without_the_model():
    pending = {"name": "change_shipping_address", "arguments": {"address": "5 Park Row, Leeds LS2 8AA"}}
    call_tool, calls = _model(("change_shipping_address", {"order_id": "NW-5520018", "address": "x" * 9}))
    history = [{"role": "user", "content": "Please send my order to 5 Park Row, Leeds LS2 8AA"},
               {"role": "assistant", "content": "Which order?", "action": {**pending, "status": "needs_input"}}]
    p = plan(call_tool, SPECS, "greeting", history, "it's NW-5520018", pending)
    assert p.spec.name == "change_shipping_address" and p.missing == []
    assert p.arguments == {"order_id": "NW-5520018", "address": "5 Park Row, Leeds LS2 8AA"}
    assert calls[0][2] == "change_shipping_address"          # the pending action's call, forced

    call_tool, _ = _model(("start_return", {"order_id": "NW-3108842", "items": ["Blender", "blender ", "jug"]}))
    p = plan(call_tool, SPECS, "refund", [], "I want to return the blender and the jug from NW-3108842")
    assert p.arguments == {"order_id": "NW-3108842", "items": ["Blender", "jug"]}      # repeats dropped

    call_tool, _ = _model(("start_return", {"order_id": "NW-3108842", "items": ["Blender", "Slicer", "Blender"]}))
    p = plan(call_tool, SPECS, "refund", [], "I want to return the blender from order NW-3108842")
    assert p.arguments == {"order_id": "NW-3108842", "items": ["Blender"]}             # an item never named goes
    call_tool, _ = _model(("start_return", {"order_id": "NW-3108842", "items": ["Slicer"]}))
    assert plan(call_tool, SPECS, "refund", [], "return order NW-3108842").missing == ["items"]

    call_tool, _ = _model(InferenceError("engine down"))
    p = plan(call_tool, SPECS, "order_status", [], "status of NW-3108842 please")
    assert p.spec.name == "get_order_status" and p.arguments == {"order_id": "NW-3108842"}


@pytest.fixture()
def orders(tmp_path):
    app = Flask("orders")
    init_demo_orders(app)
    with serving_wsgi(app) as base:
        yield base, app.extensions["demo_orders"]


@pytest.fixture()
def call_log(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'calls.db'}")
    db.upgrade()
    yield SqlCallLog(db)
    db.dispose()


def test_a_lookup_replies_through_its_template_and_is_recorded(orders, call_log):
    base, _ = orders
    runner = ActionRunner(call_log, base)
    out = runner.run(BY_NAME["get_order_status"], {"order_id": "NW-4417302"}, "k1", "demo", None)
    assert out.ok and out.http_status == 200
    assert out.reply.startswith("Order NW-4417302 is in transit. It left our warehouse on 2 December")
    row = call_log.get("k1")
    assert row["status"] == "succeeded" and row["arguments"] == {"order_id": "NW-4417302"} and row["latency_ms"] > 0
    missing = runner.run(BY_NAME["get_order_status"], {"order_id": "NW-9999999"}, "k2", "demo", None)
    assert missing.status == "failed" and missing.http_status == 404
    assert missing.reply.startswith("I couldn't find an order numbered NW-9999999")


def test_a_change_runs_once_however_often_it_is_confirmed(orders, call_log):
    base, book = orders
    runner = ActionRunner(call_log, base)
    spec, args = BY_NAME["change_shipping_address"], {"order_id": "NW-5520018", "address": "5 Park Row, Leeds"}
    assert call_log.record("c1", "demo", None, spec.name, args, "awaiting_confirmation") is None
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        runner.run(spec, args, "c1", "demo", None, claim_from="awaiting_confirmation"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert any(r.ok for r in results) and all(r.ok or r.status == "running" for r in results)
    assert len(book.view("NW-5520018")["history"]) == 1                       # one change, four confirmations
    again = runner.run(spec, args, "c1", "demo", None, claim_from="awaiting_confirmation")
    assert again.ok and again.reply == "Done: order NW-5520018 will now be delivered to 5 Park Row, Leeds."
    # the endpoint itself answers a repeated Idempotency-Key with its first answer
    assert runner.request(spec, args, "c1").ok and len(book.view("NW-5520018")["history"]) == 1
    shipped_order = runner.run(spec, {**args, "order_id": "NW-4417302"}, "c2", "demo", None)
    assert shipped_order.http_status == 409 and "can no longer be changed" in shipped_order.reply


def test_time_outs_and_unreachable_endpoints_say_so_and_change_nothing(call_log):
    spec = ActionSpec.model_validate(_spec(endpoint={"url": "{base}/o/{order_id}", "timeout_s": 0.3}))
    with slow_server(2.0) as (base, seen):
        out = ActionRunner(call_log, base).run(spec, {"order_id": "A1"}, "t1", "demo", None)
    assert out.status == "timeout" and out.reply == FAILED and seen == ["/o/A1"]
    assert 250 < call_log.get("t1")["latency_ms"] < 1500 and call_log.get("t1")["status"] == "timeout"
    out = ActionRunner(call_log, f"http://127.0.0.1:{free_port()}").run(spec, {"order_id": "A1"}, "t2", "demo", None)
    assert out.status == "unreachable" and out.reply == FAILED
    # a retry of the same key reports the recorded failure instead of calling again
    assert ActionRunner.recorded(call_log.get("t2")).status == "unreachable"
