"""The web app's request models (app/schemas.py, pipelines/completion_schemas.py) parse every body:
inputs the old isinstance chains never looked at (wrong types deep inside, unknown fields, the
exact boundaries) get a 4xx that names the field, in each API's shape: {"error": message} for
/api/chat, OpenAI's {"error": {message, type, param, code}} for the /v1 routes."""
from __future__ import annotations

import pytest

from app import create_app
from app.schemas import BatchIn
from httpkit.validation import InvalidRequest
from pipelines.completion import MAX_SEED, parse_openai, parse_tabby

CHAT, API = {"X-Site-Key": "demo-site-key"}, {"Authorization": "Bearer demo-api-key"}
UNLIMITED = {"per_ip": "100000 per second", "per_site_key": "100000 per second", "per_api_key": "100000 per second"}


@pytest.fixture(scope="module")
def web(tiny_client, tmp_path_factory):
    app = create_app({"KB_CACHE_DIR": str(tmp_path_factory.mktemp("kb")), "REDIS_URL": None, "CHAT_MAX_TOKENS": 4,
                      "MAX_MESSAGE_CHARS": 10, "RATE_LIMITS": UNLIMITED}, client=tiny_client)
    return app.test_client()


@pytest.fixture(scope="module")
def sid(web):
    return web.post("/api/chat/sessions", headers=CHAT).get_json()["session_id"]


def v1_error(resp, status: int, param: str | None) -> str:
    assert resp.status_code == status, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] == param, err
    return err["message"]


# ---- /api/chat: {"error": message} ---------------------------------------------------------------
def test_the_message_limit_is_the_configured_one(web, sid):
    url = f"/api/chat/sessions/{sid}/messages"
    too_long = web.post(url, json={"content": "x" * 11}, headers=CHAT)
    assert too_long.status_code == 413 and too_long.get_json() == {"error": "content: 11 characters, at most 10"}
    ok = web.post(url, json={"content": "x" * 10, "unknown": {"is": "ignored"}}, headers=CHAT)
    assert ok.status_code == 200, ok.get_data(as_text=True)


@pytest.mark.parametrize("body, error", [
    ({"content": ["hi"]}, "content: must be a non-empty string"),
    ({"content": " \x1c "}, "content: must be a non-empty string"),        # Python's whitespace, not the regex's
    ({"content": "hi", "stream": 1}, "stream: must be true or false"),
    ({"content": "hi", "stream": None}, "stream: must be true or false"),
])
def test_chat_message_errors(web, sid, body, error):
    resp = web.post(f"/api/chat/sessions/{sid}/messages", json=body, headers=CHAT)
    assert resp.status_code == 400 and resp.get_json() == {"error": error}


def test_feedback_index_type_and_range(web, sid):
    index = web.post(f"/api/chat/sessions/{sid}/messages", json={"content": "hello"}, headers=CHAT).get_json()[
        "message_index"]
    url = f"/api/chat/sessions/{sid}/feedback"
    # a float, a string, past the end, a user turn
    for bad in (float(index), str(index), index + 1, -1, index - 1):
        resp = web.post(url, json={"message_index": bad, "rating": "up"}, headers=CHAT)
        assert resp.get_json() == {"error": "message_index: must be the index of an assistant message in this session"}
    resp = web.post(url, json={"message_index": index, "rating": "up", "comment": "x" * 2001}, headers=CHAT)
    assert resp.get_json() == {"error": "comment: must be a string of at most 2000 characters"}
    ok = web.post(url, json={"message_index": index, "rating": "down", "comment": "x" * 2000, "extra": 1}, headers=CHAT)
    assert ok.status_code == 200 and ok.get_json() == {"ok": True}


# ---- /v1: OpenAI's error body ---------------------------------------------------------------------
@pytest.mark.parametrize("body, param, message", [
    ({"segments": {"prefix": "a", "declarations": [{"body": "b", "filepath": 5}]}}, "segments",
     "segments.declarations[0].filepath: must be a string"),
    ({"segments": {"prefix": "a", "relevant_snippets_from_changed_files": [{"filepath": "f"}]}}, "segments",
     "segments.relevant_snippets_from_changed_files[0]: must be an object with a string body"),
    ({"segments": {"prefix": "a", "declarations": ["def f(): ..."]}}, "segments",
     "segments.declarations[0]: must be an object with a string body"),
    ({"segments": {"prefix": None}}, "segments", "segments.prefix: required"),
    ({"segments": {"prefix": "a", "git_url": 1}}, "segments", "segments.git_url: must be a string, got int"),
    ({"segments": {"prefix": "a"}, "temperature": 2.0000001}, "temperature",
     "temperature: must be in [0.0, 2.0], got 2.0000001"),
    ({"segments": {"prefix": "a"}, "seed": MAX_SEED + 1}, "seed",
     f"seed: must be in [0, {MAX_SEED}], got {MAX_SEED + 1}"),
    ({"prompt": "x", "n": 5}, "n", "n: must be in [1, 4], got 5"),
    ({"prompt": "x", "max_tokens": 513}, "max_tokens", "max_tokens: must be in [1, 512], got 513"),
    ({"prompt": "x", "top_p": 0}, "top_p", "top_p: must be in [1e-06, 1.0], got 0"),
    ({"prompt": "x", "n": 2.0}, "n", "n: must be an integer, got 2.0"),
    ({"prompt": ["a", "b"]}, "prompt", "prompt: required, a string (one prompt per request)"),
    ({"prompt": "x", "stop": ["a", ""]}, "stop",
     "stop: must be a non-empty string or a list of at most 4 non-empty strings"),
    (["x"], None, "request body must be a JSON object"),
])
def test_completion_errors_name_the_field(web, body, param, message):
    assert v1_error(web.post("/v1/completions", json=body, headers=API), 400, param) == message


def test_completion_edges_and_unknown_fields_pass():
    tabby = parse_tabby({"segments": {"prefix": "a", "cursor": 3, "declarations": [{"body": "b", "kind": "x"}]},
                         "temperature": 2, "seed": MAX_SEED, "mode": "standard"})
    assert (tabby.temperature, tabby.seed, [s.filepath for s in tabby.snippets]) == (2.0, MAX_SEED, ["snippet"])
    openai = parse_openai({"prompt": ["p"], "n": 4, "max_tokens": 512, "top_p": 1e-6, "stop": "", "echo": True})
    assert (openai.n, openai.max_tokens, openai.top_p, openai.stop) == (4, 512, 1e-6, [])
    with pytest.raises(InvalidRequest) as info:                 # a ValueError, for the pipeline's callers
        parse_openai({"prompt": "p", "stream": "no"})
    assert (str(info.value), info.value.param) == ("stream: must be true or false", "stream")


@pytest.mark.parametrize("body, param, message", [
    ({"type": "select", "completion_id": "c", "select_kind": "word"}, "select_kind",
     "select_kind: must be 'line' when given"),
    ({"type": "view", "completion_id": ""}, "completion_id", "completion_id: required, a string"),
    ({"type": ["view"], "completion_id": "c"}, "type", "type: must be one of ['view', 'select', 'dismiss']"),
])
def test_event_errors(web, body, param, message):
    assert v1_error(web.post("/v1/events", json=body, headers=API), 400, param) == message


def test_repository_name_boundary(web):
    message = v1_error(web.post("/v1/repositories", json={"name": "n" * 201, "path": "/x"}, headers=API), 400, "name")
    assert message == "name: required, a string (the repository's name or git_url)"
    assert v1_error(web.post("/v1/repositories", json={"name": "n" * 200, "path": "/"}, headers=API), 403, "path")


@pytest.mark.parametrize("body, message", [
    ({"requests": [{"prompt": "a"},
                   {"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]}]},
     "requests[1].messages: a non-empty list of {role: system|user|assistant, content: str}"),
    ({"requests": [{"prompt": "a", "x": 1, "n": 2}]}, "requests[0]: unknown fields ['n', 'x']"),
    ({"requests": [{"role": "user", "content": "x"}]}, "requests[0]: unknown fields ['content', 'role']"),
    ({"requests": [{}]}, "requests[0]: give exactly one of prompt or messages"),
    ({"requests": ["a"]}, "requests[0]: must be an object"),
    ({"requests": [{"prompt": "a", "stop": None}]}, "requests[0].stop: out of range or of the wrong type"),
    ({"requests": [{"prompt": "a", "seed": 2**63 - 1}]}, "requests[0].seed: out of range or of the wrong type"),
    ({"requests": [{"prompt": "a", "max_tokens": 1025}]}, "requests[0].max_tokens: out of range or of the wrong type"),
    ({"requests": [{"messages": [{"role": "user", "content": "x" * 8000}, {"role": "user", "content": "y" * 8001}]}]},
     "requests[0].messages: more than 16000 characters in all"),
])
def test_batch_errors(web, body, message):
    assert v1_error(web.post("/v1/jobs", json=body, headers=API), 400, "requests") == message


def test_batch_edges_pass_and_the_idempotency_key_is_checked(web):
    BatchIn.model_validate({"requests": [{"prompt": "p" * 16000, "max_tokens": 1024, "temperature": 2, "top_p": 1,
                                          "seed": 2**63 - 2, "stop": ["a"] * 4}] * 1000, "extra": "ignored"})
    BatchIn.model_validate({"requests": [{"messages": [{"role": "system", "content": "x" * 16000, "name": "n"}]}]})
    resp = web.post("/v1/jobs", json={"requests": [{"prompt": "a"}]}, headers={**API, "Idempotency-Key": "k" * 201})
    assert v1_error(resp, 400, "Idempotency-Key") == "Idempotency-Key: 1 to 200 characters"
