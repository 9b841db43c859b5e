"""Bad input and faults never cost other requests anything (regressions from a review)."""
from __future__ import annotations

import queue

import pytest

from inference import LLM, OnlineEngine, SamplingParams

KW = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=8 << 20, block_size=4)
PROMPT = {"prompt_token_ids": list(range(10, 40))}
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _drain(stream, timeout=10):
    tokens, reason = [], None
    while not stream.finished:
        d = stream.get(timeout=timeout)
        tokens += d.token_ids
        reason = d.finish_reason or reason
    return tokens, reason


@pytest.fixture()
def online():
    engine = OnlineEngine("random:tiny", **KW)
    yield engine
    engine.shutdown()


def test_failed_step_leaves_no_unwritten_blocks_in_prefix_cache(online):
    expected, _ = _drain(online.add_request(PROMPT, GREEDY))
    online.engine.block_manager.reset_prefix_cache()
    runner, calls = online.engine.runner, {"n": 0}
    real = runner.execute

    def flaky(sched, prev=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated out of memory")
        return real(sched, prev)

    runner.execute = flaky
    assert _drain(online.add_request(PROMPT, GREEDY))[1] == "abort"
    assert _drain(online.add_request(PROMPT, GREEDY)) == (expected, "length")


def test_stop_strings_wait_for_min_tokens():
    llm = LLM("random:tiny", **KW)
    free = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0]
    stop = free.text[0]
    early = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, stop=stop), use_tqdm=False)[0].outputs[0]
    assert early.finish_reason == "stop" and early.text == ""
    late = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8, stop=stop, min_tokens=3),
                        use_tqdm=False)[0].outputs[0]
    assert len(late.token_ids) > 3 or late.finish_reason == "length"


@pytest.mark.parametrize("kwargs, param", [
    (dict(request_id="x#0"), "request_id"), (dict(request_id=""), "request_id"),
    (dict(priority=None), "priority"),
])
def test_bad_request_fields_rejected_in_caller(online, kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}"):
        online.add_request(PROMPT, GREEDY, **kwargs)
    assert online.is_alive()
    assert _drain(online.add_request(PROMPT, GREEDY))[1] == "length"


@pytest.mark.parametrize("kwargs, param", [
    (dict(stop_token_ids=[100000]), "stop_token_ids"), (dict(stop_token_ids=5), "stop_token_ids"),
    (dict(seed=2 ** 70), "seed"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="0.5"), "temperature"), (dict(repetition_penalty=float("nan")), "repetition_penalty"),
])
def test_bad_sampling_values_rejected_before_scheduling(online, kwargs, param):
    with pytest.raises(ValueError, match=f"^{param}"):
        online.add_request(PROMPT, SamplingParams(max_tokens=4, **kwargs))
    assert _drain(online.add_request(PROMPT, GREEDY))[1] == "length"


def test_tiny_temperature_is_greedy():
    llm = LLM("random:tiny", **KW)
    greedy = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    tiny_t = llm.generate(PROMPT, SamplingParams(temperature=1e-50, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)[0].outputs[0].token_ids
    assert tiny_t == greedy


def test_integer_request_ids_and_abort(online):
    stream = online.add_request(PROMPT, SamplingParams(max_tokens=200, ignore_eos=True), request_id=5)
    stream.get(timeout=10)
    stream.abort()
    tokens, reason = _drain(stream)
    assert reason == "abort" and len(tokens) < 200
    assert _drain(online.add_request(PROMPT, GREEDY, request_id=5))[1] == "length"    # id free again


def test_chat_messages_validated(online):
    for bad in ([], [{"role": "bogus", "content": "x"}], [{"role": "user"}], "hello"):
        with pytest.raises(ValueError, match="^messages"):
            online.chat(bad, GREEDY)


def test_shutdown_ends_every_open_stream():
    engine = OnlineEngine("random:tiny", **KW)
    stream = engine.add_request(PROMPT, SamplingParams(max_tokens=250 - 30, ignore_eos=True))
    stream.get(timeout=10)
    engine.shutdown()
    try:
        _, reason = _drain(stream, timeout=5)
    except queue.Empty:
        pytest.fail("stream still open after shutdown")
    assert reason in ("abort", "length")
