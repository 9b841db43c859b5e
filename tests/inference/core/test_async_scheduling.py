"""Async scheduling (on CUDA: step N+1 is scheduled and launched before step N's tokens are
collected, a decode taking its input from N's device output) gives exactly the outputs of the
sequential loop, keeps block accounting exact, and wastes no step on a request whose tokens in
flight already end it.

The CPU runners are synchronous, so here async mode is forced on; the bookkeeping is the same.
"""
from __future__ import annotations

import random
from unittest.mock import patch

import pytest

from inference.llm import LLM
from inference.sampling_params import SamplingParams
from tests.conftest import assert_all_blocks_free
from tests.inference.worker.test_kernel_runner import kernel_llm, prompts, reference_llm

KW = dict(dtype="float32", max_model_len=256, block_size=4, kv_cache_memory_bytes=2 << 20, max_num_batched_tokens=40)


def engines(**kw) -> tuple[LLM, LLM]:
    seq, asyn = LLM("random:tiny", **{**KW, **kw}), LLM("random:tiny", **{**KW, **kw})
    asyn.engine.async_scheduling = True
    assert not seq.engine.async_scheduling
    return seq, asyn


def summary(outputs):
    return [[(c.text, c.token_ids, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else [sorted(d) for d in c.logprobs]) for c in o.outputs] for o in outputs]


def mixed_params(seq: LLM, prompts_: list[dict], rng: random.Random) -> list[SamplingParams]:
    """Stop strings, stop ids under min_tokens, seeded n=2 sampling with logprobs, penalties."""
    probe = seq.generate(prompts_, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), use_tqdm=False)
    params = []
    for i, o in enumerate(probe):
        text = o.outputs[0].text
        kw = dict(max_tokens=rng.randint(1, 20), ignore_eos=True)
        if i % 3 == 0 and len(text) > 6:
            kw["stop"] = [text[3:5]]                            # a stop string this output will hit
        if i % 5 == 1:
            kw.update(temperature=0.9, seed=i, n=2, logprobs=2)
        elif i % 5 == 2:
            toks = o.outputs[0].token_ids            # a stop id that min_tokens holds back once, or not at all
            kw.update(temperature=0, max_tokens=20, min_tokens=2, stop_token_ids=[toks[2] if toks[2] not in toks[:2]
                                                                                 else toks[0]])
        elif i % 5 == 3:
            kw.update(temperature=0.7, seed=i, repetition_penalty=1.3, frequency_penalty=0.5)
        else:
            kw.update(temperature=0)
        params.append(SamplingParams(**kw))
    return params


def test_async_outputs_match_sequential():
    seq, asyn = engines()
    rng = random.Random(4)
    ps = [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(rng.randint(1, 30))]} for _ in range(15)]
    params = mixed_params(seq, ps, rng)
    want = summary(seq.generate(ps, params, use_tqdm=False))
    got = summary(asyn.generate(ps, params, use_tqdm=False))
    assert got == want
    assert any(c[2] == "stop" and isinstance(c[3], str) for o in want for c in o), "no stop string was hit"
    assert any(c[2] == "stop" and isinstance(c[3], int) for o in want for c in o), "no stop id was hit"
    assert_all_blocks_free(asyn)
    assert asyn.engine.last_stats.scheduler.num_running == 0
    assert not asyn.engine.has_unfinished()


def test_async_preemption_keeps_outputs_and_blocks():
    # 24 blocks of 4 tokens for 6 requests that want up to ~50 tokens each: preemption by recompute
    # while tokens are in flight (a preempted request's in-flight token is dropped and recomputed)
    kw = dict(kv_cache_memory_bytes=24 * 4 * 2 * 2 * 16 * 2 * 4, max_model_len=80)
    seq, asyn = engines(**kw)
    ps = prompts(6, seed=5)
    params = [SamplingParams(max_tokens=14, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=14, temperature=0.8, seed=3)] * 3
    want = summary(seq.generate(ps, params, use_tqdm=False))
    got = summary(asyn.generate(ps, params, use_tqdm=False))
    assert got == want
    assert asyn.engine.scheduler.num_preemptions > 0, "the cache was meant to be too small"
    assert_all_blocks_free(asyn)


def test_no_step_is_wasted_on_a_request_its_tokens_in_flight_finish():
    # prefill samples token 1, then one decode per token: max_tokens steps, not one more; the
    # model's length ends a request the same way
    for max_tokens, max_model_len in ((7, 256), (50, 16)):
        _, asyn = engines(max_model_len=max_model_len)
        runner = asyn.engine.runner
        out = asyn.generate({"prompt_token_ids": [5, 6, 7]},
                            SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == min(max_tokens, max_model_len - 3)
        assert runner.timings.num_steps == len(out.token_ids)
        assert_all_blocks_free(asyn)


def _run_until_done(engine) -> dict:
    done = {}
    while engine.has_unfinished():
        for state in engine.step():
            if state.finished:
                done[state.request_id] = state.to_output()
                engine.retire_aborted(state.request_id)
    return done


def test_abort_with_a_token_in_flight_then_reusing_the_id():
    seq, asyn = engines()
    greedy = dict(temperature=0, ignore_eos=True)
    eng = asyn.engine
    eng.add_request(eng.validate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=9, **greedy),
                                 request_id="a"))
    eng.step()
    eng.step()
    assert eng._inflight is not None and eng.scheduler.requests["a"].num_placeholders == 1
    delivered = len(eng.states["a"].samples[0].token_ids)
    eng.abort_request("a")
    out = eng.retire_aborted("a").to_output().outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (delivered, "abort")
    second = {"prompt_token_ids": [9, 8, 7, 6]}
    eng.add_request(eng.validate(second, SamplingParams(max_tokens=3, **greedy), request_id="a"))
    got = _run_until_done(eng)["a"].outputs[0]
    want = seq.generate(second, SamplingParams(max_tokens=3, **greedy), use_tqdm=False)[0].outputs[0]
    assert (got.token_ids, got.finish_reason) == (want.token_ids, "length")
    assert_all_blocks_free(asyn)


def test_a_failed_step_leaves_no_blocks_or_bad_cache_entries():
    seq, asyn = engines()
    ps = [{"prompt_token_ids": list(range(3, 3 + 4 * k + 1))} for k in range(1, 6)]
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    runner = asyn.engine.runner
    real_collect, calls = runner.collect, []

    def failing_collect(handle):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("device fell over")
        return real_collect(handle)

    with patch.object(runner, "collect", failing_collect), pytest.raises(RuntimeError, match="fell over"):
        asyn.generate(ps, params, use_tqdm=False)
    assert_all_blocks_free(asyn)
    assert not asyn.engine.has_unfinished()
    # the same prompts again (prefix-cache hits on whatever the failed run registered)
    assert summary(asyn.generate(ps, params, use_tqdm=False)) == summary(seq.generate(ps, params, use_tqdm=False))


def test_kernel_runner_takes_in_flight_tokens_on_the_device():
    # chunked prefill (budget 24) finishes long prompts after short ones started decoding, so a
    # step's decodes are not in the previous step's sampling order: the gather path is exercised
    ours = kernel_llm(max_num_batched_tokens=24)
    ours.engine.async_scheduling = True
    ref = reference_llm(ours, max_num_batched_tokens=24)
    ps = prompts(7, seed=9)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    runner, reordered = ours.engine.runner, []
    take = runner._take_prev_tokens

    def spy(d_ids, rows, items, prev):
        if rows:
            src = [next(i for i, s in enumerate(prev.sampled) if s.request is items[r].request) for r in rows]
            reordered.append(src != list(range(len(rows))))
        return take(d_ids, rows, items, prev)

    with patch.object(runner, "_take_prev_tokens", spy):
        got = [o.outputs[0].token_ids for o in ours.generate(ps, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in ref.generate(ps, params, use_tqdm=False)]
    assert got == want
    assert any(reordered) and not all(reordered), "both the in-order and the gather path should run"
    assert_all_blocks_free(ours)
