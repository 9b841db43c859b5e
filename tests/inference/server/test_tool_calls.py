"""Tool calling through the real `openai` SDK against `python -m inference serve` on the default
model (Qwen2.5-Coder-0.5B, whose chat template renders tools): forced and named calls held to the
tools' schemas, a call chosen by the model, streamed calls reassembled by the SDK, the tool's
result taken in the next turn, and bad tool requests answered 400 naming the field."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from inference.server.tool_calls import parse_calls, safe_prefix, template_messages
from tests.helpers.inference_server import running_server

MODEL = "qwen2.5-coder-0.5b"
ORDER = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"}},
         "required": ["order_id"], "additionalProperties": False}
RETURN = {"type": "object", "properties": {"order_id": {"type": "string"},
                                           "items": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["order_id", "items"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_order_status", "description": "Where an order is",
                                           "parameters": ORDER}},
         {"type": "function", "function": {"name": "start_return", "description": "Return items of an order",
                                           "parameters": RETURN}}]
ASK = [{"role": "user", "content": "Where is my order AB1234?"}]


def test_calls_are_parsed_from_the_text_and_held_back_while_streaming():
    content, calls = parse_calls('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    assert content == "Sure." and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert parse_calls("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    assert safe_prefix("Hello <tool_") == len("Hello ") and safe_prefix("Hi <tool_call>{") == 3
    bare = '{"name": "get_order_status", "arguments": {"order_id": "AB1234"}}'
    assert parse_calls(bare, {"get_order_status"})[0] is None and safe_prefix(bare[:10]) == 0
    assert parse_calls(bare, {"other"}) == (bare, [])
    msgs = template_messages([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}])
    assert msgs[0]["content"] == "" and msgs[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


@pytest.fixture(scope="module")
def server():
    with running_server("--model", MODEL, "--max-model-len", "2048") as s:
        yield s


def _call(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", ASK), tools=TOOLS,
                                          max_tokens=120, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_and_named_calls_match_the_schema(server, temperature):
    client = server.client()
    for choice, name in (("required", None), ({"type": "function", "function": {"name": "start_return"}},
                                              "start_return")):
        out = _call(client, tool_choice=choice, temperature=temperature, seed=11).choices[0]
        assert out.finish_reason == "tool_calls" and len(out.message.tool_calls) == 1, out
        call = out.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        assert name is None or call.function.name == name
        schema = ORDER if call.function.name == "get_order_status" else RETURN
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.slow
def test_the_model_calls_a_tool_on_its_own_and_reads_the_result(server):
    client = server.client()
    first = _call(client, temperature=0).choices[0]
    assert first.finish_reason == "tool_calls", first.message
    call = first.message.tool_calls[0]
    assert call.function.name == "get_order_status" and json.loads(call.function.arguments) == {"order_id": "AB1234"}
    turn = [*ASK, first.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped", "eta": "Friday"}'}]
    answer = _call(client, messages=turn, temperature=0).choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    assert "shipped" in answer.message.content.lower() or "friday" in answer.message.content.lower()


@pytest.mark.slow
def test_streamed_calls_reassemble(server):
    stream = _call(server.client(), tool_choice="required", temperature=0, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            assert not (c.delta.content or "").count("<tool_call>")
            for tc in c.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name or "") if tc.function else ""
                slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish == "tool_calls" and len(calls) == 1 and calls[0]["id"]
    assert calls[0]["name"] in ("get_order_status", "start_return") and json.loads(calls[0]["arguments"])


@pytest.mark.slow
@pytest.mark.parametrize("extra, param", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}, "tool_choice"),    # no name
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400s(server, extra, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": ASK, "max_tokens": 4, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)
