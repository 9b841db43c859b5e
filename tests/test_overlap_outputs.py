"""Deferred output processing (the CUDA runner's overlap of step N's device work with step N-1's
detokenisation, stop strings and streaming) gives exactly the outputs of the sequential loop.

The CPU runner is synchronous, so here the deferral is forced on; the ordering logic is the same.
"""
from __future__ import annotations

import random

from inference.llm import LLM
from inference.sampling_params import SamplingParams
from tests.conftest import assert_all_blocks_free

KW = dict(dtype="float32", max_model_len=256, block_size=4, kv_cache_memory_bytes=2 << 20, max_num_batched_tokens=40)


def engines() -> tuple[LLM, LLM]:
    seq, deferred = LLM("random:tiny", **KW), LLM("random:tiny", **KW)
    deferred.engine.overlap_outputs = True
    assert not seq.engine.overlap_outputs
    return seq, deferred


def summary(outputs):
    return [[(c.text, c.token_ids, c.finish_reason, c.stop_reason,
              None if c.logprobs is None else [sorted(d) for d in c.logprobs]) for c in o.outputs] for o in outputs]


def test_deferred_outputs_match_sequential():
    seq, deferred = engines()
    rng = random.Random(4)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(rng.randint(1, 30))]} for _ in range(12)]
    probe = seq.generate(prompts, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), use_tqdm=False)
    params = []
    for i, o in enumerate(probe):
        text = o.outputs[0].text
        kw = dict(max_tokens=rng.randint(1, 20), ignore_eos=True)
        if i % 3 == 0 and len(text) > 6:
            kw["stop"] = [text[3:5]]                            # a stop string this output will hit
        if i % 4 == 1:
            kw.update(temperature=0.9, seed=i, n=2, logprobs=2)
        elif i % 4 == 2:
            kw.update(temperature=0, min_tokens=min(3, kw["max_tokens"]), stop_token_ids=[o.outputs[0].token_ids[0]])
        else:
            kw.update(temperature=0)
        params.append(SamplingParams(**kw))
    want = summary(seq.generate(prompts, params, use_tqdm=False))
    got = summary(deferred.generate(prompts, params, use_tqdm=False))
    assert got == want
    assert any(c[2] == "stop" and isinstance(c[3], str) for o in want for c in o), "no stop string was hit"
    assert_all_blocks_free(deferred)
    stats = deferred.engine.last_stats
    assert stats.scheduler.num_running == 0


def _run_until_done(engine) -> dict:
    done = {}
    while engine.has_unfinished():
        for state in engine.step():
            if state.finished:
                done[state.request_id] = state.to_output()
                engine.retire_aborted(state.request_id)
    return done


def test_abort_with_a_pending_token_then_reusing_the_id():
    # A token sampled for "a" is still pending (delivered one step late) when "a" is aborted; a
    # new request reusing the id "a" must not receive it and must run to its own end.
    seq, deferred = engines()
    greedy = dict(temperature=0, ignore_eos=True)
    eng = deferred.engine
    eng.add_request(eng.validate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=9, **greedy),
                                 request_id="a"))
    eng.step()
    eng.step()
    assert eng._pending, "the second step's token should still be pending"
    eng.abort_request("a")
    eng.retire_aborted("a")
    second = {"prompt_token_ids": [9, 8, 7, 6]}
    eng.add_request(eng.validate(second, SamplingParams(max_tokens=3, **greedy), request_id="a"))
    got = _run_until_done(eng)["a"].outputs[0]
    want = seq.generate(second, SamplingParams(max_tokens=3, **greedy), use_tqdm=False)[0].outputs[0]
    assert (got.token_ids, got.finish_reason) == (want.token_ids, "length")
    assert_all_blocks_free(deferred)


def test_abort_after_the_last_token_was_sampled_keeps_the_finish_reason():
    _, deferred = engines()
    eng = deferred.engine
    eng.add_request(eng.validate({"prompt_token_ids": [5, 6, 7]},
                                 SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), request_id="b"))
    while not eng._pending or eng.scheduler.has_unfinished():
        eng.step()                              # until the final token is sampled but not delivered
    eng.abort_request("b")
    out = eng.states["b"].to_output().outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (2, "length")
    eng.retire_aborted("b")
    assert_all_blocks_free(deferred)
