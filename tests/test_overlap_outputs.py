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
