"""The background-loop engine: streaming, abort, concurrency, bad input."""
from __future__ import annotations

import threading
import time

import pytest

from inference import OnlineEngine, SamplingParams


def _collect(stream):
    deltas = list(stream)
    return deltas, "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids]


def _wait_idle(engine, timeout=10.0):
    bm = engine.engine.block_manager
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bm.num_free_blocks == bm.num_blocks and not engine.engine.states:
            return
        time.sleep(0.01)
    raise AssertionError(f"{bm.num_blocks - bm.num_free_blocks} blocks still held")


@pytest.fixture(scope="module")
def smol():
    engine = OnlineEngine("smollm2", dtype="float32", max_model_len=1024, kv_cache_memory_bytes=128 << 20)
    yield engine
    engine.shutdown()


@pytest.mark.slow
def test_stream_deltas_concatenate_to_final_text(smol, llm_fp32):
    params = SamplingParams(temperature=0, max_tokens=40)
    expected = llm_fp32.generate("Write two sentences about the ocean.", params, use_tqdm=False)[0].outputs[0]
    deltas, text, tokens = _collect(smol.add_request("Write two sentences about the ocean.", params))
    assert text == expected.text and tokens == expected.token_ids
    assert deltas[-1].finish_reason == expected.finish_reason
    assert sum(1 for d in deltas if d.finished) == 1
    _wait_idle(smol)


@pytest.mark.slow
def test_chinese_streams_without_broken_characters(smol, llm_fp32):
    messages = [{"role": "user", "content": "请用中文写一句关于春天的话。"}]
    params = SamplingParams(temperature=0, max_tokens=40)
    deltas, text, _ = _collect(smol.chat(messages, params))
    assert all("\ufffd" not in d.text for d in deltas)
    assert text == llm_fp32.chat(messages, params, use_tqdm=False)[0].outputs[0].text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)
    _wait_idle(smol)


@pytest.mark.slow
def test_stream_never_shows_partial_stop_string(smol, llm_fp32):
    base = llm_fp32.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0]
    full = base.outputs[0].text
    stop = "7, 8"                                # spans several tokens
    assert stop in full
    deltas, text, _ = _collect(smol.add_request("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=30, stop=stop)))
    assert text == full[:full.index(stop)]
    running = ""
    for d in deltas:
        running += d.text
        assert not running.endswith(("7", "7,", "7, ")) or d.finished
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop
    _wait_idle(smol)


@pytest.fixture(scope="module")
def tiny():
    engine = OnlineEngine("random:tiny", dtype="float32", max_num_seqs=256, max_model_len=256,
                          kv_cache_memory_bytes=16 << 20, block_size=8)
    yield engine
    engine.shutdown()


def test_abort_mid_stream_frees_blocks(tiny):
    stream = tiny.add_request({"prompt_token_ids": list(range(3, 60))},
                              SamplingParams(max_tokens=150, ignore_eos=True))
    first = stream.get(timeout=10)
    assert first.token_ids and not first.finished
    stream.abort()
    rest = list(stream)
    assert rest[-1].finish_reason == "abort"
    assert sum(len(d.token_ids) for d in [first] + rest) < 150
    _wait_idle(tiny, timeout=2)


def test_several_hundred_concurrent_requests(tiny):
    num = 300
    results: dict[int, tuple[str, int]] = {}
    errors = []

    def client(i):
        try:
            n = 4 + i % 13
            stream = tiny.add_request({"prompt_token_ids": [3 + (i * 7 + j) % 250 for j in range(5 + i % 40)]},
                                      SamplingParams(temperature=0.8, seed=i, max_tokens=n, ignore_eos=True))
            deltas = list(stream)
            results[i] = (deltas[-1].finish_reason, sum(len(d.token_ids) for d in deltas), n)
        except Exception as exc:                     # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == num
    assert all(reason == "length" and got == want for reason, got, want in results.values())
    _wait_idle(tiny)
    stats = tiny.stats()
    assert stats.scheduler.num_running == 0 and stats.scheduler.num_waiting == 0


def test_bad_input_raises_in_caller_and_engine_keeps_serving(tiny):
    with pytest.raises(ValueError, match="^prompt"):
        tiny.add_request({"prompt_token_ids": [5] * 300}, SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="^prompt"):
        tiny.add_request("", SamplingParams(max_tokens=4))
    stream = tiny.add_request("still here", SamplingParams(max_tokens=3, ignore_eos=True))
    deltas = list(stream)
    assert deltas[-1].num_output_tokens == 3
    assert tiny.is_alive()


def test_failing_step_fails_its_requests_not_the_loop(tiny, monkeypatch):
    runner = tiny.engine.runner
    real = runner.execute
    calls = {"n": 0}

    def flaky(sched, prev=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device fault")
        return real(sched, prev)

    monkeypatch.setattr(runner, "execute", flaky)
    deltas = list(tiny.add_request("doomed", SamplingParams(n=2, max_tokens=5, ignore_eos=True)))
    assert [d.finish_reason for d in deltas] == ["abort", "abort"]
    assert "simulated device fault" in deltas[0].error
    _wait_idle(tiny, timeout=2)
    ok = list(tiny.add_request("fine", SamplingParams(max_tokens=4, ignore_eos=True)))
    assert ok[-1].finish_reason == "length" and ok[-1].num_output_tokens == 4
    assert tiny.is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the loop re-raises
def test_fatal_device_error_stops_the_loop_and_reports_not_alive(monkeypatch):
    # A sticky CUDA error (illegal address) would fail every later step: the loop stops, the
    # requests in flight end with the error, is_alive() turns false and new requests are refused.
    engine = OnlineEngine("random:tiny", dtype="float32", max_model_len=128, kv_cache_memory_bytes=4 << 20)
    try:
        def broken(sched, prev=None):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(engine.engine.runner, "execute", broken)
        deltas = list(engine.add_request("x", SamplingParams(max_tokens=3)))
        assert deltas[-1].finish_reason == "abort" and "illegal memory access" in deltas[-1].error
        engine._thread.join(5)
        assert not engine.is_alive() and "illegal memory access" in repr(engine.error)
        with pytest.raises(RuntimeError, match="not running"):
            engine.add_request("y", SamplingParams(max_tokens=3))
    finally:
        engine.shutdown()
