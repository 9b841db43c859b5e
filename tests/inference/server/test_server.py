"""The HTTP service end to end: a real `python -m inference serve` subprocess, the real `openai`
client (and raw httpx / sockets where the SDK would hide what is on the wire).

Servers (each module-scoped, one process each, terminated at teardown):
    tiny       random:tiny fp32, `--api-key k1 --max-body-bytes 65536`: protocol, bad input,
               auth, metrics, disconnects (fast: the model is a few MB)
    admission  random:tiny fp32, `--max-queue-len 2 --max-num-seqs 1`: 429 + Retry-After
    smol       SmolLM2 fp32 (slow): outputs compared with the offline `llm_fp32` engine
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from inference import SamplingParams
from inference.core.tokenizer import ByteTokenizer
from tests.helpers.inference_server import Server, running_server
from tests.helpers.inference_server import metric as _m
from tests.helpers.inference_server import metrics_snapshot as _metrics
from tests.helpers.inference_server import wait_for as _wait_for
from tests.helpers.inference_server import wait_idle as _wait_idle

TINY = "random:tiny"
TINY_LEN = 1024                       # random:tiny's context length
KEY = "k1"
MAX_BODY = 65536
BYTES = ByteTokenizer(512)            # the tokenizer a random:tiny server uses
TINY_ARGS = ["--model", TINY, "--dtype", "float32"]


@pytest.fixture(scope="module")
def tiny():
    with running_server(*TINY_ARGS, "--max-body-bytes", str(MAX_BODY), api_key=KEY) as server:
        yield server


@pytest.fixture(scope="module")
def admission():
    with running_server(*TINY_ARGS, "--max-queue-len", "2", "--max-num-seqs", "1") as server:
        yield server


@pytest.fixture(scope="module")
def smol():
    with running_server("--model", "smollm2", "--dtype", "float32", "--max-model-len", "1024",
                        "--kv-cache-memory-bytes", str(256 << 20)) as server:
        yield server


# ---- helpers -----------------------------------------------------------------------------------
def _unique(text: str = "") -> str:
    """A prompt no earlier request shares a prefix-cache block with."""
    return f"{uuid.uuid4().hex[:12]} {text}"


def _tiny_prompt_len(prompt: str) -> int:
    return 1 + len(prompt.encode())               # bos + UTF-8 bytes


def _tiny_chat_len(messages) -> int:
    return len(BYTES.apply_chat_template(messages, add_generation_prompt=True))


NO_EOS = {"ignore_eos": True}                     # random weights may sample eos at any step


def _read_stream(stream, chat: bool):
    """-> ({index: text}, {index: finish_reason}, usage or None, chunks)"""
    texts, finish, usage, chunks = {}, {}, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            piece = (c.delta.content or "") if chat else c.text
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason is not None:
                assert c.index not in finish, "two finish reasons for one choice"
                finish[c.index] = c.finish_reason
    return texts, finish, usage, chunks


def _assert_error(r: httpx.Response, status: int, param: str | None = "?") -> dict:
    assert r.status_code == status, f"{r.status_code} != {status}: {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    if param != "?":
        assert err["param"] == param, err
    return err


# ---- health, readiness, models -------------------------------------------------------------------
def test_health_ready_and_models(tiny):
    assert httpx.get(f"{tiny.url}/health").json() == {"status": "ok"}
    r = httpx.get(f"{tiny.url}/ready")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    models = tiny.client().models.list()
    assert [m.id for m in models.data] == [TINY]
    assert models.data[0].model_extra["max_model_len"] == TINY_LEN
    if tiny.loading:                              # hard to catch for a tiny model; checked when caught
        _assert_loading(tiny)


def _assert_loading(server: Server) -> None:
    assert server.loading["ready"].status_code == 503
    assert server.loading["ready"].json() == {"status": "loading"}
    assert server.loading["health"].status_code == 200
    models = server.loading["models"]
    if models.status_code != 200:                 # the model may have finished loading in between
        err = _assert_error(models, 503)
        assert err["code"] == "model_loading" and models.headers["retry-after"]


# ---- completions ---------------------------------------------------------------------------------
def test_completion_non_streaming_shape_and_usage(tiny):
    prompt = _unique("Hello there")
    out = tiny.client().completions.create(model=TINY, prompt=prompt, max_tokens=7, temperature=0, extra_body=NO_EOS)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == TINY
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length" and choice.logprobs is None
    assert isinstance(choice.text, str)
    assert out.usage.prompt_tokens == _tiny_prompt_len(prompt)
    assert out.usage.completion_tokens == 7
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7


def test_completion_default_max_tokens_is_16(tiny):
    out = tiny.client().completions.create(model=TINY, prompt=_unique(), temperature=0, extra_body=NO_EOS)
    assert out.usage.completion_tokens == 16 and out.choices[0].finish_reason == "length"


def test_completion_streaming_matches_non_streaming_with_usage(tiny):
    c, prompt = tiny.client(), _unique("stream me")
    full = c.completions.create(model=TINY, prompt=prompt, max_tokens=12, temperature=0, extra_body=NO_EOS)
    stream = c.completions.create(model=TINY, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                  stream_options={"include_usage": True}, extra_body=NO_EOS)
    texts, finish, usage, chunks = _read_stream(stream, chat=False)
    assert texts == {0: full.choices[0].text}
    assert finish == {0: "length"}
    assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None      # the usage chunk comes last
    assert all(ch.usage is None for ch in chunks[:-1])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        _tiny_prompt_len(prompt), 12, _tiny_prompt_len(prompt) + 12)


def test_stream_without_include_usage_has_no_usage_and_ends_with_done(tiny):
    body = {"model": TINY, "prompt": _unique(), "max_tokens": 5, "stream": True, **NO_EOS}
    with httpx.stream("POST", f"{tiny.url}/v1/completions", json=body, headers=tiny.headers(), timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks and all("usage" not in ch or ch["usage"] is None for ch in chunks)
    assert sum(1 for ch in chunks for c in ch["choices"] if c["finish_reason"]) == 1


def test_max_tokens_is_honoured(tiny):
    c = tiny.client()
    for n in (1, 3, 30):
        out = c.completions.create(model=TINY, prompt=_unique(), max_tokens=n, extra_body=NO_EOS)
        assert out.usage.completion_tokens == n and out.choices[0].finish_reason == "length"
    chat = c.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}],
                                     max_completion_tokens=4, extra_body=NO_EOS)
    assert chat.usage.completion_tokens == 4 and chat.choices[0].finish_reason == "length"


def test_seeds_reproduce_and_differ(tiny):
    c, prompt = tiny.client(), _unique("seeded")

    def run(seed):
        out = c.completions.create(model=TINY, prompt=prompt, max_tokens=24, temperature=1.0, seed=seed,
                                   extra_body=NO_EOS)
        return out.choices[0].text

    a, b, other = run(1234), run(1234), run(4321)
    assert a == b
    assert a != other


def test_seeded_sampling_same_streaming_or_not(tiny):
    c, prompt = tiny.client(), _unique()
    kw = dict(model=TINY, prompt=prompt, max_tokens=10, temperature=0.9, seed=7, n=2, extra_body=NO_EOS)
    full = c.completions.create(**kw)
    texts, finish, _, _ = _read_stream(c.completions.create(stream=True, **kw), chat=False)
    assert texts == {ch.index: ch.text for ch in full.choices}
    assert finish == {0: "length", 1: "length"}


def test_n_greater_than_one(tiny):
    c, prompt = tiny.client(), _unique("several")
    out = c.completions.create(model=TINY, prompt=prompt, max_tokens=6, n=3, temperature=1.0, seed=3,
                               extra_body=NO_EOS)
    assert [ch.index for ch in out.choices] == [0, 1, 2]
    assert len({ch.text for ch in out.choices}) == 3
    assert all(ch.finish_reason == "length" for ch in out.choices)
    assert out.usage.prompt_tokens == _tiny_prompt_len(prompt)          # the prompt counts once
    assert out.usage.completion_tokens == 18

    chat = c.chat.completions.create(model=TINY, messages=[{"role": "user", "content": prompt}], n=2,
                                     max_tokens=5, temperature=1.0, seed=3, extra_body=NO_EOS)
    assert [ch.index for ch in chat.choices] == [0, 1]
    assert chat.choices[0].message.content != chat.choices[1].message.content
    assert chat.usage.completion_tokens == 10


def test_several_prompts_times_n_choices(tiny):
    prompts = [_unique("a"), _unique("bb")]
    out = tiny.client().completions.create(model=TINY, prompt=prompts, max_tokens=3, n=2, temperature=0,
                                           extra_body=NO_EOS)
    assert [ch.index for ch in out.choices] == [0, 1, 2, 3]
    single = [tiny.client().completions.create(model=TINY, prompt=p, max_tokens=3, temperature=0,
                                               extra_body=NO_EOS).choices[0].text for p in prompts]
    assert [ch.text for ch in out.choices] == [single[0], single[0], single[1], single[1]]
    assert out.usage.prompt_tokens == sum(map(_tiny_prompt_len, prompts))
    assert out.usage.completion_tokens == 12


def test_token_id_prompts(tiny):
    c, text = tiny.client(), _unique("ids")
    ids = BYTES.encode(text)
    by_text = c.completions.create(model=TINY, prompt=text, max_tokens=5, temperature=0, extra_body=NO_EOS)
    by_ids = c.completions.create(model=TINY, prompt=ids, max_tokens=5, temperature=0, extra_body=NO_EOS)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    batch = c.completions.create(model=TINY, prompt=[ids, ids[:5]], max_tokens=2, temperature=0, extra_body=NO_EOS)
    assert len(batch.choices) == 2 and batch.usage.prompt_tokens == len(ids) + 5


def test_echo(tiny):
    c, prompt = tiny.client(), _unique("echo this")
    plain = c.completions.create(model=TINY, prompt=prompt, max_tokens=5, temperature=0, extra_body=NO_EOS)
    echoed = c.completions.create(model=TINY, prompt=prompt, max_tokens=5, temperature=0, echo=True,
                                  extra_body=NO_EOS)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    assert echoed.usage.completion_tokens == 5
    texts, _, _, _ = _read_stream(c.completions.create(model=TINY, prompt=prompt, max_tokens=5, temperature=0,
                                                       echo=True, stream=True, extra_body=NO_EOS), chat=False)
    assert texts == {0: prompt + plain.choices[0].text}


def test_completion_logprobs(tiny):
    c, prompt = tiny.client(), _unique("logprobs")
    out = c.completions.create(model=TINY, prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                               extra_body=NO_EOS)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0.0
        assert 1 <= len(top) <= 4                                  # top-3 plus the sampled token
        # greedy: nothing beats the sampled token. (Keys are token texts, and the byte tokenizer maps
        # several ids to one text, so the sampled token's own entry may be shadowed: SmolLM2 checks it.)
        assert max(top.values()) <= logprob + 1e-5
    echoed = c.completions.create(model=TINY, prompt=prompt, max_tokens=6, temperature=0, logprobs=1, echo=True,
                                  extra_body=NO_EOS)
    assert echoed.choices[0].logprobs.text_offset[0] >= len(prompt)
    texts, _, _, chunks = _read_stream(c.completions.create(model=TINY, prompt=prompt, max_tokens=6, temperature=0,
                                                            logprobs=3, stream=True, extra_body=NO_EOS), chat=False)
    streamed = [lp for ch in chunks for choice in ch.choices if choice.logprobs
                for lp in choice.logprobs.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_chat_logprobs(tiny):
    c = tiny.client()
    msgs = [{"role": "user", "content": _unique("chat logprobs")}]
    out = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                    top_logprobs=2, extra_body=NO_EOS)
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert entry.bytes == list(entry.token.encode())
    plain = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=5, temperature=0, extra_body=NO_EOS)
    assert plain.choices[0].logprobs is None
    only = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                     extra_body=NO_EOS)
    assert len(only.choices[0].logprobs.content) == 5
    assert all(e.top_logprobs == [] for e in only.choices[0].logprobs.content)
    _, _, _, chunks = _read_stream(c.chat.completions.create(model=TINY, messages=msgs, max_tokens=5, temperature=0,
                                                             logprobs=True, top_logprobs=2, stream=True,
                                                             extra_body=NO_EOS), chat=True)
    streamed = [e.logprob for ch in chunks for choice in ch.choices if choice.logprobs
                for e in choice.logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in content], abs=1e-5)


# ---- chat ----------------------------------------------------------------------------------------
def test_chat_non_streaming_and_streaming(tiny):
    c = tiny.client()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": _unique("hi")},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    out = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=8, temperature=0, extra_body=NO_EOS)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == _tiny_chat_len(msgs)
    assert out.usage.completion_tokens == 8

    stream = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body=NO_EOS)
    texts, finish, usage, chunks = _read_stream(stream, chat=True)
    assert texts == {0: msg.content} and finish == {0: "length"}
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role in (None, "assistant") for ch in chunks if ch.choices)
    assert (usage.prompt_tokens, usage.completion_tokens) == (_tiny_chat_len(msgs), 8)


def test_chat_content_parts(tiny):
    c, text = tiny.client(), _unique("parts")
    as_str = c.chat.completions.create(model=TINY, messages=[{"role": "user", "content": text}], max_tokens=4,
                                       temperature=0, extra_body=NO_EOS)
    as_parts = c.chat.completions.create(model=TINY, max_tokens=4, temperature=0, extra_body=NO_EOS,
                                         messages=[{"role": "user", "content": [{"type": "text", "text": text}]}])
    assert as_parts.choices[0].message.content == as_str.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_str.usage.prompt_tokens


def test_tools_on_a_byte_tokenizer_model_render_in_the_fallback_and_count(tiny):
    """A `random:` model has no chat template: tools go in the fallback system message, and an
    assistant turn that carries only tool calls (content null) renders too; never a 500."""
    c, tools = tiny.client(), [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": _unique("tools")}]
    plain = c.chat.completions.create(model=TINY, messages=msgs, max_tokens=2, extra_body=NO_EOS)
    out = c.chat.completions.create(model=TINY, messages=msgs, tools=tools, max_tokens=2, extra_body=NO_EOS)
    assert out.usage.prompt_tokens > plain.usage.prompt_tokens
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    turn = [*msgs, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    again = c.chat.completions.create(model=TINY, messages=turn, tools=tools, max_tokens=2, extra_body=NO_EOS)
    assert again.usage.prompt_tokens > out.usage.prompt_tokens and again.choices[0].finish_reason == "length"


# ---- API keys ------------------------------------------------------------------------------------
def test_api_key_required_on_v1(tiny):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k1"}, {"Authorization": "Basic k1"}):
        r = httpx.post(f"{tiny.url}/v1/completions", json={"model": TINY, "prompt": "hi", "max_tokens": 1},
                       headers=headers)
        err = _assert_error(r, 401)
        assert err["code"] == "invalid_api_key"
        _assert_error(httpx.get(f"{tiny.url}/v1/models", headers=headers), 401)
    with pytest.raises(openai.AuthenticationError) as info:
        tiny.client(api_key="wrong").completions.create(model=TINY, prompt="hi", max_tokens=1)
    assert info.value.status_code == 401
    _assert_error(info.value.response, 401)
    with pytest.raises(openai.AuthenticationError):
        tiny.client(api_key="wrong").chat.completions.create(model=TINY, messages=[{"role": "user", "content": "x"}])
    assert tiny.client(api_key=KEY).completions.create(model=TINY, prompt="hi",
                                                       max_tokens=1).usage.completion_tokens == 1
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{tiny.url}{path}").status_code == 200, path


# ---- bad input -----------------------------------------------------------------------------------
def C(**kw):
    """A completion body with the given fields changed (None removes one)."""
    body = {"model": TINY, "prompt": "hi", "max_tokens": 2}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


def H(**kw):
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


def raw(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


COMP, CHAT = "/v1/completions", "/v1/chat/completions"
_ = object()          # "any param"
BAD = [
    # the body itself
    ("invalid_json", COMP, raw('{"model": "random:tiny", "prompt": '), 400, _),
    ("empty_body", COMP, b"", 400, _),
    ("trailing_garbage", COMP, raw('{"model": "random:tiny", "prompt": "hi"} x'), 400, _),
    ("non_utf8", COMP, b'{"model": "random:tiny", "prompt": "\xff\xfe"}', 400, _),
    ("latin1", CHAT, '{"model": "random:tiny", "messages": [{"role": "user", "content": "caf\xe9"}]}'.encode("latin-1"),
     400, _),
    ("body_array", COMP, b"[1, 2]", 400, _),
    ("body_string", CHAT, b'"hello"', 400, _),
    ("body_null", COMP, b"null", 400, _),
    ("body_number", CHAT, b"42", 400, _),
    ("deep_nesting", COMP, b'{"model": "random:tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, _),
    ("huge_int_literal", COMP, b'{"model": "random:tiny", "prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", 400, _),
    ("nan_temperature", COMP, b'{"model": "random:tiny", "prompt": "hi", "temperature": NaN}', 400, "temperature"),
    ("infinite_top_p", COMP, b'{"model": "random:tiny", "prompt": "hi", "top_p": 1e999}', 400, "top_p"),
    # wrong types
    ("max_tokens_str", COMP, C(max_tokens="5"), 400, "max_tokens"),
    ("max_tokens_float", COMP, C(max_tokens=5.5), 400, "max_tokens"),
    ("max_tokens_bool", CHAT, H(max_tokens=True), 400, "max_tokens"),
    ("temperature_str", COMP, C(temperature="hot"), 400, "temperature"),
    ("temperature_str_chat", CHAT, H(temperature="hot"), 400, "temperature"),
    ("n_bool", COMP, C(n=True), 400, "n"),
    ("n_str", CHAT, H(n="2"), 400, "n"),
    ("top_p_str", COMP, C(top_p="x"), 400, "top_p"),
    ("stream_str", COMP, C(stream="yes"), 400, "stream"),
    ("seed_float", COMP, C(seed=1.5), 400, "seed"),
    ("seed_str", CHAT, H(seed="1"), 400, "seed"),
    ("echo_str", COMP, C(echo="yes"), 400, "echo"),
    ("suffix_int", COMP, C(suffix=5), 400, "suffix"),
    ("user_int", CHAT, H(user=5), 400, "user"),
    ("priority_str", COMP, C(priority="high"), 400, "priority"),
    ("logprobs_bool_completion", COMP, C(logprobs=True), 400, "logprobs"),
    ("logprobs_int_chat", CHAT, H(logprobs=5), 400, "logprobs"),
    ("top_logprobs_str", CHAT, H(logprobs=True, top_logprobs="2"), 400, "top_logprobs"),
    ("max_completion_tokens_str", CHAT, H(max_completion_tokens="3"), 400, "max_completion_tokens"),
    ("stream_options_str", COMP, C(stream=True, stream_options="yes"), 400, "stream_options"),
    ("stop_int", COMP, C(stop=5), 400, "stop"),
    ("stop_int_list", CHAT, H(stop=[1, 2]), 400, "stop"),
    ("stop_empty_string", COMP, C(stop=[""]), 400, "stop"),
    ("stop_dict", COMP, C(stop={"a": 1}), 400, "stop"),
    ("stop_too_many", COMP, C(stop=[f"s{i}" for i in range(17)]), 400, "stop"),
    ("stop_token_ids_negative", COMP, C(stop_token_ids=[-1]), 400, "stop_token_ids"),
    ("stop_token_ids_beyond_vocab", COMP, C(stop_token_ids=[10 ** 6]), 400, "stop_token_ids"),
    ("model_int", COMP, C(model=5), 400, "model"),
    ("model_missing", CHAT, H(model=None), 400, "model"),
    ("model_empty", COMP, C(model=""), 400, "model"),
    # unknown fields
    ("unknown_field", COMP, C(foo=1), 400, "foo"),
    ("unknown_field_chat", CHAT, H(bar={"x": 1}), 400, "bar"),
    ("messages_in_completion", COMP, C(messages=[{"role": "user", "content": "x"}]), 400, "messages"),
    ("prompt_in_chat", CHAT, H(prompt="x"), 400, "prompt"),
    # out of range
    ("max_tokens_negative", COMP, C(max_tokens=-1), 400, "max_tokens"),
    ("max_tokens_zero", COMP, C(max_tokens=0), 400, "max_tokens"),
    ("max_tokens_zero_chat", CHAT, H(max_tokens=0), 400, "max_tokens"),
    ("max_completion_tokens_negative", CHAT, H(max_completion_tokens=-3), 400, "max_completion_tokens"),
    ("max_tokens_huge", COMP, C(max_tokens=10 ** 30), 400, "prompt"),
    ("max_tokens_int64", COMP, C(max_tokens=2 ** 63), 400, "prompt"),
    ("max_tokens_huge_chat", CHAT, H(max_tokens=10 ** 9), 400, "messages"),
    ("n_zero", COMP, C(n=0), 400, "n"),
    ("n_negative", CHAT, H(n=-1), 400, "n"),
    ("n_huge", COMP, C(n=10 ** 6), 400, "n"),
    ("temperature_negative", COMP, C(temperature=-0.5), 400, "temperature"),
    ("top_p_zero", COMP, C(top_p=0), 400, "top_p"),
    ("top_p_zero_chat", CHAT, H(top_p=0.0), 400, "top_p"),
    ("top_p_above_one", COMP, C(top_p=1.5), 400, "top_p"),
    ("top_k_negative", COMP, C(top_k=-2), 400, "top_k"),
    ("top_k_int64", COMP, C(top_k=2 ** 63), 400, "top_k"),         # overflowed the sampler's tensor (fuzzer)
    ("min_p_above_one", COMP, C(min_p=2), 400, "min_p"),
    ("presence_penalty_big", CHAT, H(presence_penalty=3), 400, "presence_penalty"),
    ("frequency_penalty_small", COMP, C(frequency_penalty=-3), 400, "frequency_penalty"),
    ("repetition_penalty_zero", COMP, C(repetition_penalty=0), 400, "repetition_penalty"),
    ("seed_negative", COMP, C(seed=-1), 400, "seed"),
    ("seed_huge", CHAT, H(seed=2 ** 64), 400, "seed"),
    ("min_tokens_above_max", COMP, C(min_tokens=5, max_tokens=2), 400, "min_tokens"),
    ("logprobs_too_large", COMP, C(logprobs=6), 400, "logprobs"),
    ("logprobs_negative", COMP, C(logprobs=-1), 400, "logprobs"),
    ("top_logprobs_too_large", CHAT, H(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("top_logprobs_negative", CHAT, H(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
    ("top_logprobs_without_logprobs", CHAT, H(top_logprobs=2), 400, "top_logprobs"),
    ("best_of_unsupported", COMP, C(best_of=3), 400, "best_of"),
    ("stream_options_without_stream", COMP, C(stream_options={"include_usage": True}), 400, "stream_options"),
    ("stream_options_stream_false", CHAT, H(stream=False, stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("stream_options_unknown_key", COMP, C(stream=True, stream_options={"bogus": 1}), 400, "stream_options"),
    # prompts
    ("prompt_missing", COMP, C(prompt=None), 400, "prompt"),
    ("prompt_empty", COMP, C(prompt=""), 400, "prompt"),
    ("prompt_empty_in_list", COMP, C(prompt=["ok", ""]), 400, "prompt"),
    ("prompt_empty_list", COMP, C(prompt=[]), 400, "prompt"),
    ("prompt_empty_id_list", COMP, C(prompt=[[]]), 400, "prompt"),
    ("prompt_int", COMP, C(prompt=5), 400, "prompt"),
    ("prompt_dict", COMP, C(prompt={"text": "hi"}), 400, "prompt"),
    ("prompt_mixed_list", COMP, C(prompt=[1, "a"]), 400, "prompt"),
    ("prompt_bool_ids", COMP, C(prompt=[True, False]), 400, "prompt"),
    ("prompt_id_beyond_vocab", COMP, C(prompt=[1, 512]), 400, "prompt"),
    ("prompt_id_negative", COMP, C(prompt=[1, -1]), 400, "prompt"),
    ("prompt_lone_surrogate", COMP, raw('{"model": "random:tiny", "prompt": "a\\ud800b", "max_tokens": 2}'), 400, _),
    ("context_exceeded_by_prompt", COMP, C(prompt="x" * 1100, max_tokens=1), 400, "prompt"),
    ("context_exceeded_chat_default", CHAT, H(messages=[{"role": "user", "content": "x" * 1100}], max_tokens=None),
     400, "messages"),
    # messages
    ("messages_missing", CHAT, H(messages=None), 400, "messages"),
    ("messages_empty", CHAT, H(messages=[]), 400, "messages"),
    ("messages_string", CHAT, H(messages="hi"), 400, "messages"),
    ("messages_not_objects", CHAT, H(messages=[1, 2]), 400, "messages"),
    ("role_unknown", CHAT, H(messages=[{"role": "robot", "content": "x"}]), 400, "messages"),
    ("role_missing", CHAT, H(messages=[{"content": "x"}]), 400, "messages"),
    ("role_int", CHAT, H(messages=[{"role": 1, "content": "x"}]), 400, "messages"),
    ("content_missing", CHAT, H(messages=[{"role": "user"}]), 400, "messages"),
    ("content_int", CHAT, H(messages=[{"role": "user", "content": 5}]), 400, "messages"),
    ("content_image_part", CHAT, H(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]), 400, "messages"),
    # /tokenize: messages win, but a prompt beside them must still be a string (found by schemathesis)
    ("tokenize_prompt_not_a_string", "/tokenize", {"messages": [{"role": "user", "content": "x"}], "prompt": {}},
     400, "prompt"),
    ("content_lone_surrogate", CHAT,
     raw('{"model": "random:tiny", "messages": [{"role": "user", "content": "\\udc80"}], "max_tokens": 2}'), 400, _),
]


@pytest.mark.parametrize("path, body, status, param", [pytest.param(*case[1:], id=case[0]) for case in BAD])
def test_bad_input_is_a_4xx_and_harmless(tiny, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = tiny.http.post(f"{tiny.url}{path}", content=content,
                       headers={**tiny.headers(), "Content-Type": "application/json"})
    _assert_error(r, status, "?" if param is _ else param)
    _assert_still_serving(tiny)


def _assert_still_serving(server: Server) -> None:
    server.assert_alive()
    assert server.http.get(f"{server.url}/health").status_code == 200
    assert server.http.get(f"{server.url}/ready").status_code == 200
    ok = server.post(COMP, {"model": TINY, "prompt": "ok", "max_tokens": 1})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 1


def test_context_length_error_names_both_numbers(tiny):
    prompt = "x" * 1000                                       # 1001 tokens with bos
    for max_tokens in (100, 24):
        r = tiny.post(COMP, C(prompt=prompt, max_tokens=max_tokens))
        err = _assert_error(r, 400, "prompt")
        assert err["code"] == "context_length_exceeded"
        assert str(TINY_LEN) in err["message"] and str(1001 + max_tokens) in err["message"], err
        assert "1001" in err["message"] and str(max_tokens) in err["message"], err
    ok = tiny.post(COMP, C(prompt=prompt, max_tokens=23, ignore_eos=True))     # exactly fills the context
    assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] == TINY_LEN
    msgs = [{"role": "user", "content": "y" * 1000}]
    err = _assert_error(tiny.post(CHAT, H(messages=msgs, max_tokens=500)), 400, "messages")
    assert str(TINY_LEN) in err["message"] and str(_tiny_chat_len(msgs) + 500) in err["message"], err
    _assert_still_serving(tiny)


def test_unknown_model_is_404(tiny):
    for path, body in ((COMP, C(model="gpt-4")), (CHAT, H(model="no-such-model"))):
        err = _assert_error(tiny.post(path, body), 404, "model")
        assert err["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        tiny.client().completions.create(model="gpt-4", prompt="hi", max_tokens=1)
    _assert_still_serving(tiny)


def test_openai_client_raises_bad_request(tiny):
    c = tiny.client()
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model=TINY, prompt="hi", max_tokens=-5)
    assert info.value.param == "max_tokens" and info.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=TINY, messages=[])
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "x"}], top_p=0)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=TINY, prompt="hi", extra_body={"not_a_field": 1})


def test_oversized_body_is_413(tiny):
    big = b'{"model": "random:tiny", "prompt": "' + b"a" * (MAX_BODY + 10) + b'", "max_tokens": 1}'
    _assert_error(httpx.post(f"{tiny.url}{COMP}", content=big, timeout=30,
                             headers={**tiny.headers(), "Content-Type": "application/json"}), 413)

    def chunked():                                 # no Content-Length: the limit must hold while reading
        yield big[:1000]
        for i in range(1000, len(big), 8192):
            yield big[i:i + 8192]
    _assert_error(httpx.post(f"{tiny.url}{CHAT}", content=chunked(), timeout=30,
                             headers={**tiny.headers(), "Content-Type": "application/json"}), 413)
    _assert_still_serving(tiny)


@pytest.mark.parametrize("method, path, status", [
    ("GET", COMP, 405), ("GET", CHAT, 405), ("PUT", CHAT, 405), ("DELETE", "/v1/models", 405),
    ("POST", "/health", 405), ("POST", "/ready", 405), ("POST", "/metrics", 405),
    ("GET", "/v1/nope", 404), ("POST", "/v1/engines/x/completions", 404), ("GET", "/nope", 404), ("GET", "/v1", 404),
])
def test_wrong_method_or_path(tiny, method, path, status):
    r = httpx.request(method, f"{tiny.url}{path}", headers=tiny.headers(), json={} if method != "GET" else None)
    _assert_error(r, status)
    _assert_still_serving(tiny)


# ---- disconnects ---------------------------------------------------------------------------------
def test_disconnect_mid_stream_aborts_and_frees_blocks(tiny):
    before = _wait_idle(tiny)
    body = {"model": TINY, "prompt": _unique(), "max_tokens": 1000, "stream": True, "temperature": 0, **NO_EOS}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{tiny.url}{COMP}", json=body, headers=tiny.headers()) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(3)]
            assert got[0].startswith("data: ")
            during = _metrics(tiny)                  # the request is running now and holds blocks
        # leaving the block closes the connection mid-stream
    assert _m(during, "inference:num_requests_running") == 1
    assert _m(during, "inference:kv_cache_usage_perc") > 0
    _wait_for(lambda: _m(_metrics(tiny), "inference:request_success_total", finished_reason="abort")
              == _m(before, "inference:request_success_total", finished_reason="abort") + 1, what="one abort")
    after = _wait_idle(tiny)
    generated = _m(after, "inference:generation_tokens_total") - _m(before, "inference:generation_tokens_total")
    assert 1 <= generated < 500, f"{generated:.0f} of 1000 tokens generated although the client left"
    assert _m(after, "inference:request_success_total", finished_reason="length") == \
        _m(before, "inference:request_success_total", finished_reason="length")
    _assert_still_serving(tiny)


def test_disconnect_raw_socket_mid_stream(tiny):
    before = _wait_idle(tiny)
    body = json.dumps({"model": TINY, "messages": [{"role": "user", "content": _unique()}], "max_tokens": 900,
                       "stream": True, **NO_EOS}).encode()
    with socket.create_connection(("127.0.0.1", tiny.port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        data = b""
        while data.count(b"data: ") < 2:
            data += s.recv(4096)
        assert data.startswith(b"HTTP/1.1 200")
    _wait_for(lambda: _m(_metrics(tiny), "inference:request_success_total", finished_reason="abort")
              == _m(before, "inference:request_success_total", finished_reason="abort") + 1, what="one abort")
    after = _wait_idle(tiny)
    assert _m(after, "inference:generation_tokens_total") - _m(before, "inference:generation_tokens_total") < 450


def test_disconnect_during_non_streaming_request_aborts_it(tiny):
    """A client that gives up on a non-streaming request must not leave it generating to the end."""
    before = _wait_idle(tiny)
    prompt = _unique()
    body = json.dumps({"model": TINY, "prompt": prompt, "max_tokens": 600, **NO_EOS}).encode()
    with socket.create_connection(("127.0.0.1", tiny.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        _wait_for(lambda: _m(_metrics(tiny), "inference:num_requests_running") == 1, what="the request to run")
    _wait_for(lambda: _m(_metrics(tiny), "inference:num_requests_running") == 0, what="the request to end")
    after = _wait_idle(tiny)
    aborts = _m(after, "inference:request_success_total", finished_reason="abort") - \
        _m(before, "inference:request_success_total", finished_reason="abort")
    generated = _m(after, "inference:generation_tokens_total") - _m(before, "inference:generation_tokens_total")
    assert aborts == 1, f"request ran to the end ({generated:.0f} tokens) after its client left"
    assert generated < 600


# ---- metrics -------------------------------------------------------------------------------------
_COUNTED = [("inference:generation_tokens_total", {}), ("inference:prompt_tokens_total", {}),
            ("inference:request_success_total", {"finished_reason": "length"}),
            ("inference:request_success_total", {"finished_reason": "stop"}),
            ("inference:request_success_total", {"finished_reason": "abort"}),
            ("inference:time_to_first_token_seconds_count", {}), ("inference:e2e_request_latency_seconds_count", {}),
            ("inference:request_queue_time_seconds_count", {}), ("inference:inter_token_latency_seconds_count", {}),
            ("inference:request_prompt_tokens_count", {}), ("inference:request_prompt_tokens_sum", {}),
            ("inference:request_generation_tokens_count", {}), ("inference:request_generation_tokens_sum", {})]


def _deltas(before: dict, after: dict) -> dict[str, float]:
    return {name + "".join(f"{{{k}={v}}}" for k, v in labels.items()):
            _m(after, name, **labels) - _m(before, name, **labels) for name, labels in _COUNTED}


def test_metrics_move_by_the_right_amounts(tiny):
    before = _wait_idle(tiny)
    c = tiny.client()
    prompts = [_unique("first"), _unique("second one"), _unique("third, a bit longer")]
    lens = [5, 7, 9]
    for p, n in zip(prompts, lens):
        assert c.completions.create(model=TINY, prompt=p, max_tokens=n, extra_body=NO_EOS).usage.completion_tokens == n
    msgs = [{"role": "user", "content": _unique("chat")}]
    _, _, usage, _ = _read_stream(c.chat.completions.create(model=TINY, messages=msgs, max_tokens=4, stream=True,
                                                            stream_options={"include_usage": True},
                                                            extra_body=NO_EOS), chat=True)
    assert usage.completion_tokens == 4
    num_prompt = sum(map(_tiny_prompt_len, prompts)) + _tiny_chat_len(msgs)
    num_gen = sum(lens) + 4
    expected = {
        "inference:generation_tokens_total": num_gen, "inference:prompt_tokens_total": num_prompt,
        "inference:request_success_total{finished_reason=length}": 4,
        "inference:request_success_total{finished_reason=stop}": 0,
        "inference:request_success_total{finished_reason=abort}": 0,
        "inference:time_to_first_token_seconds_count": 4, "inference:e2e_request_latency_seconds_count": 4,
        "inference:request_queue_time_seconds_count": 4, "inference:inter_token_latency_seconds_count": num_gen - 4,
        "inference:request_prompt_tokens_count": 4, "inference:request_prompt_tokens_sum": num_prompt,
        "inference:request_generation_tokens_count": 4, "inference:request_generation_tokens_sum": num_gen,
    }
    with contextlib.suppress(AssertionError):        # stats land just after the last response is sent
        _wait_for(lambda: _deltas(before, _metrics(tiny)) == expected, timeout=5, what="metrics")
    after = _metrics(tiny)
    assert _deltas(before, after) == expected
    assert _m(after, "inference:num_requests_running") == 0 and _m(after, "inference:kv_cache_usage_perc") == 0
    assert _m(after, "inference:process_resident_memory_bytes") > 0
    from inference.kernels.cpu_ops import selected_isa
    assert _m(after, "inference:cpu_kernels_info", isa=selected_isa() or "none") == 1


def test_prefix_cache_metrics_move(tiny):
    c, prompt = tiny.client(), _unique("x" * 40)        # 54 tokens: three full 16-token blocks
    c.completions.create(model=TINY, prompt=prompt, max_tokens=1)
    before = _wait_idle(tiny)
    c.completions.create(model=TINY, prompt=prompt, max_tokens=1)
    _wait_for(lambda: _m(_metrics(tiny), "inference:request_success_total", finished_reason="length") +
              _m(_metrics(tiny), "inference:request_success_total", finished_reason="stop") >
              _m(before, "inference:request_success_total", finished_reason="length") +
              _m(before, "inference:request_success_total", finished_reason="stop"), what="the request to finish")
    after = _metrics(tiny)
    hits = _m(after, "inference:prefix_cache_hits_total") - _m(before, "inference:prefix_cache_hits_total")
    queries = _m(after, "inference:prefix_cache_queries_total") - _m(before, "inference:prefix_cache_queries_total")
    assert queries >= _tiny_prompt_len(prompt) - 16 and 32 <= hits <= 48 and hits % 16 == 0, (queries, hits)


# ---- admission control ---------------------------------------------------------------------------
def test_full_queue_answers_429_with_retry_after(admission):
    """1 running + 2 waiting fit; a flood arriving at once gets 429s, the admitted requests finish."""
    num, max_tokens = 10, 200
    barrier = threading.Barrier(num)
    client = admission.client()

    def one(i):
        barrier.wait()
        try:
            return client.completions.create(model=TINY, prompt=f"flood {i}", max_tokens=max_tokens, extra_body=NO_EOS)
        except openai.RateLimitError as exc:            # the SDK's own type for a 429
            return exc

    with ThreadPoolExecutor(num) as pool:
        results = list(pool.map(one, range(num)))
    rejected = [r for r in results if isinstance(r, openai.RateLimitError)]
    done = [r for r in results if not isinstance(r, openai.RateLimitError)]
    assert rejected and done, results
    for exc in rejected:
        err = _assert_error(exc.response, 429)
        assert err["type"] == "rate_limit_error" and err["code"] == "queue_full"
        assert int(exc.response.headers["retry-after"]) >= 1
    for out in done:
        assert out.usage.completion_tokens == max_tokens and out.choices[0].finish_reason == "length"
    # all arrive within milliseconds of each other and each runs for a while: 3 admitted, one more
    # at most if a request finished before the last of the flood arrived
    assert len(done) <= 4, f"{len(done)} of {num} admitted with room for 3"
    _wait_idle(admission, timeout=30)              # once the queue drains, requests are accepted again
    out = client.completions.create(model=TINY, prompt="after", max_tokens=2, extra_body=NO_EOS)
    assert out.usage.completion_tokens == 2


# ---- SmolLM2: real outputs -------------------------------------------------------------------------
PROMPTS = [
    "The capital of France is", "Write a haiku about autumn.", "1, 2, 3, 4,", "def fibonacci(n):",
    "The quick brown fox", "Once upon a time, in a small village,", "Water boils at", "List three colors:",
    "Translate to French: Good morning", "The meaning of life is", "import numpy as np\n", "Dear Sir or Madam,",
    "In 1969, astronauts", "The best way to learn programming is", "Photosynthesis is the process",
    "A recipe for pancakes:", "Q: What is 2 + 2?\nA:", "The sun rises in the", "My favourite book is",
    "Explain gravity to a child.", "SELECT * FROM", "The three laws of robotics are", "Roses are red,",
    "The weather today is", "How do airplanes fly?", "<html>\n<head>", "The largest ocean on Earth is",
    "Machine learning is", "To be or not to be,", "The first president of the United States was",
    "Ingredients: flour, sugar,", "Hello, my name is",
]


@pytest.mark.slow
def test_smol_ready_and_loading_states(smol):
    assert httpx.get(f"{smol.url}/health").status_code == 200
    assert httpx.get(f"{smol.url}/ready").json() == {"status": "ready"}
    if smol.loading:
        _assert_loading(smol)


@pytest.mark.slow
def test_smol_32_concurrent_streams_equal_offline_greedy(smol, llm_fp32):
    num_tokens = 24
    params = SamplingParams(temperature=0, max_tokens=num_tokens)
    expected = llm_fp32.generate(PROMPTS, params, use_tqdm=False)
    client = smol.client()
    barrier = threading.Barrier(len(PROMPTS))

    def one(prompt):
        barrier.wait()
        stream = client.completions.create(model="smollm2", prompt=prompt, max_tokens=num_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
        return _read_stream(stream, chat=False)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(one, PROMPTS))
    tok = llm_fp32.get_tokenizer()
    for prompt, exp, (texts, finish, usage, _) in zip(PROMPTS, expected, results):
        out = exp.outputs[0]
        assert texts == {0: out.text}, prompt
        assert finish == {0: out.finish_reason}, prompt
        assert usage.prompt_tokens == len(tok.encode(prompt)) == len(exp.prompt_token_ids)
        assert usage.completion_tokens == len(out.token_ids)
    _wait_idle(smol)


@pytest.mark.slow
def test_smol_chat_equals_offline_with_exact_usage(smol, llm_fp32):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name two planets."}]
    params = SamplingParams(temperature=0, max_tokens=30)
    exp = llm_fp32.chat(msgs, params, use_tqdm=False)[0]
    c = smol.client()
    out = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=30, temperature=0)
    assert out.choices[0].message.content == exp.outputs[0].text
    assert out.choices[0].finish_reason == exp.outputs[0].finish_reason
    tok = llm_fp32.get_tokenizer()
    assert out.usage.prompt_tokens == len(tok.apply_chat_template(msgs, add_generation_prompt=True))
    assert out.usage.completion_tokens == len(exp.outputs[0].token_ids)
    texts, finish, usage, _ = _read_stream(c.chat.completions.create(
        model="smollm2", messages=msgs, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}), chat=True)
    assert texts == {0: exp.outputs[0].text} and finish == {0: exp.outputs[0].finish_reason}
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens)


@pytest.mark.slow
def test_smol_stop_strings(smol, llm_fp32):
    prompt = "1, 2, 3, 4,"
    full = llm_fp32.generate(prompt, SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0].outputs[0].text
    stop = "7, 8"
    assert stop in full, full
    c = smol.client()
    for stream in (False, True):
        kw = dict(model="smollm2", prompt=prompt, max_tokens=30, temperature=0)
        if stream:
            texts, finish, _, _ = _read_stream(c.completions.create(stream=True, stop=stop, **kw), chat=False)
            text, reason = texts.get(0, ""), finish[0]
        else:
            out = c.completions.create(stop=stop, **kw)
            text, reason = out.choices[0].text, out.choices[0].finish_reason
        assert (text, reason) == (full[:full.index(stop)], "stop"), stream
    out = c.completions.create(model="smollm2", prompt=prompt, max_tokens=30, temperature=0,
                               stop=["no such thing", "6,"])
    assert out.choices[0].text == full[:full.index("6,")] and out.choices[0].finish_reason == "stop"
    out = c.completions.create(model="smollm2", prompt=prompt, max_tokens=30, temperature=0, stop=stop,
                               extra_body={"include_stop_str_in_output": True})
    assert out.choices[0].text == full[:full.index(stop) + len(stop)]
    out = c.completions.create(model="smollm2", prompt=prompt, max_tokens=30, temperature=0, stop="never there")
    assert out.choices[0].text == full and out.choices[0].finish_reason == "length"
    chat = c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Count from 1 to 10."}],
                                     max_tokens=40, temperature=0)
    text = chat.choices[0].message.content
    cut = text[len(text) // 2:][:3]
    assert cut.strip(), text
    stopped = c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Count from 1 to 10."}],
                                        max_tokens=40, temperature=0, stop=[cut])
    assert stopped.choices[0].message.content == text[:text.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.slow
def test_smol_seeds(smol):
    c = smol.client()
    msgs = [{"role": "user", "content": "Tell me a short story about a dragon."}]

    def run(seed):
        return c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=20, temperature=1.0,
                                         seed=seed).choices[0].message.content

    a = run(11)
    assert run(11) == a
    assert run(12) != a


@pytest.mark.slow
def test_smol_logprobs_equal_offline(smol, llm_fp32):
    prompt = "The capital of France is"
    exp = llm_fp32.generate(prompt, SamplingParams(temperature=0, max_tokens=8, logprobs=3), use_tqdm=False)[0]
    out = smol.client().completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    want = [step[t].logprob for t, step in zip(exp.outputs[0].token_ids, exp.outputs[0].logprobs)]
    assert lp.token_logprobs == pytest.approx(want, abs=1e-3)
    tok = llm_fp32.get_tokenizer()
    assert lp.tokens == [tok.decode([t], skip_special_tokens=False) for t in exp.outputs[0].token_ids]
    for top, step in zip(lp.top_logprobs, exp.outputs[0].logprobs):
        assert sorted(top.values()) == pytest.approx(sorted(v.logprob for v in step.values()), abs=1e-3)
