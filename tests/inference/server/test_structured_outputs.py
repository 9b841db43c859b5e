"""Structured outputs through the real `openai` SDK against `python -m inference serve` on the
default model (Qwen2.5-Coder-0.5B): every output matches its JSON Schema (checked with
`jsonschema`, 30 schemas in structured_cases.py), regex, choice or grammar, at temperature 0 and 1;
bad constraints are 400s that name the field, and the server keeps serving."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.inference_server import running_server
from tests.inference.server.structured_cases import SCHEMAS

pytestmark = pytest.mark.slow
MODEL = "qwen2.5-coder-0.5b"

@pytest.fixture(scope="module")
def server():
    with running_server("--model", MODEL, "--max-model-len", "2048") as s:
        yield s


def _chat(client, content: str, temperature: float, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=200, temperature=temperature, seed=7, **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_are_valid(server, name, temperature):
    schema = SCHEMAS[name]
    out = _chat(server.client(), f"Reply with a JSON object for '{name}'.", temperature,
                response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                                        "strict": True}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_and_vllm_constraints(server):
    client = server.client()
    # a short object: a whole description can outgrow max_tokens, and a cut-off object is not JSON
    obj = _chat(client, "A bicycle as a JSON object with two keys: colour and wheels.", 0.0,
                response_format={"type": "json_object"})
    assert obj.choices[0].finish_reason == "stop", obj.choices[0]
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    phone = _chat(client, "A phone number?", 1.0, extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    assert re.fullmatch(r"\d{3}-\d{4}", phone.choices[0].message.content)
    pick = _chat(client, "Is the sky green?", 0.0, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert pick.choices[0].message.content in ("yes", "no")
    grammar = 'root ::= colour (", " colour){0,3}\ncolour ::= "red" | "green" | "blue"'
    words = client.completions.create(model=MODEL, prompt="Colours:", max_tokens=30, temperature=1.0, seed=3,
                                      extra_body={"structured_outputs": {"grammar": grammar}})
    assert re.fullmatch(r"(red|green|blue)(, (red|green|blue)){0,3}", words.choices[0].text)
    assert words.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("body, param", [
    ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": {"type": "objectx"}}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
])
def test_bad_constraints_are_400s_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith(param.split(".")[0]) and param.split(".")[-1] in (err["param"] + err["message"])
    ok = _chat(server.client(), "Say hi.", 0.0)                    # the engine kept running
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_streamed_structured_output_is_valid(server):
    schema = SCHEMAS["order_status"]
    chunks = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Order AB1234 status?"}], max_tokens=100, stream=True,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_sdk_raises_bad_request_for_an_invalid_schema(server):
    with pytest.raises(openai.BadRequestError):
        _chat(server.client(), "x", 0.0, response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}})
