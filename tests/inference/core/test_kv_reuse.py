"""Shifted KV reuse (inference/core/kv_reuse.py): the run search and plan on token lists, then the
real engine on SmolLM2: a prompt whose changed middle moved its suffix takes the suffix's KV from
the previous request, keys rotated to their new positions; the first layer's keys (which depend on
the token and its position alone) then equal a fresh computation's, the exact prefix cache is not
polluted by the approximate blocks, and every block comes back."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from inference import LLM, SamplingParams
from inference.core.kv_reuse import Donor, longest_common_run, plan_reuse
from tests.conftest import assert_all_blocks_free

BS = 16


def test_longest_run_skips_starts_inside_a_run_and_respects_the_minimum():
    rng = random.Random(0)
    run = [rng.randrange(1000) for _ in range(50)]
    donor = [1] * 7 + run + [2] * 5
    prompt = [3] * 12 + run[:30] + [4] + run[30:]
    assert longest_common_run(prompt, 0, len(prompt), donor, 0, len(donor), 16) == (12, 7, 30)
    assert longest_common_run(prompt, 0, len(prompt), donor, 0, len(donor), 31) is None
    assert longest_common_run(prompt, 42, len(prompt), donor, 0, len(donor), 16) == (43, 37, 20)


def test_plan_takes_the_donor_with_the_longest_start_and_checks_generations():
    rng = random.Random(1)
    head, suffix = [rng.randrange(1000) for _ in range(40)], [rng.randrange(1000) for _ in range(64)]
    old = head + [7, 7, 7] + suffix + [9]
    new = head + [5, 5, 5, 5, 5] + suffix + [9]
    donor = Donor(old, list(range(10, 10 + 7)), [0] * 7)
    other = Donor(head[:20] + suffix, list(range(30, 35)), [0] * 5)
    gens = [0] * 64
    plan, chosen = plan_reuse(new, 32, 16, [other, donor], BS, gens.__getitem__)
    assert chosen is donor
    assert (plan.base, plan.lead_end, plan.run_start, plan.run_end, plan.run_src) == (32, 40, 45, 109, 43)
    assert plan.num_reused == 8 + 64
    gens[donor.blocks[5]] = 1                  # a block of the run was handed out again
    assert plan_reuse(new, 32, 16, [donor], BS, gens.__getitem__) is None
    assert plan_reuse(new, 32, 100, [donor], BS, lambda _: 0) is None      # nothing that long
    assert plan_reuse(new, 48, 16, [donor], BS, lambda _: 0) is None       # the hit is past the lead


def _prompts(tok) -> tuple[str, str]:
    head = "def total(values):\n    '''Add the values up, skipping None.'''\n    result = 0\n"
    tail = ("\n    return result\n\n\ndef mean(values):\n    values = [v for v in values if v is not None]\n"
            "    if not values:\n        raise ValueError('mean of nothing')\n    return total(values) / len(values)\n"
            "\n\ndef spread(values):\n    lo, hi = min(values), max(values)\n    return hi - lo\n")
    return head + "    for v in values:\n" + tail, head + "    for index, value in enumerate(values):\n" + tail


@pytest.fixture(scope="module")
def engines():
    kw = dict(dtype="float32", max_model_len=1024, kv_cache_memory_bytes=64 << 20)
    return LLM("smollm2", **kw), LLM("smollm2", **kw)


def _first_layer(llm, tokens: int, positions: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0's K and V at `positions` of the most recent donor (its blocks, its tokens)."""
    donor = list(llm.engine.block_manager.donors.values())[-1]
    assert len(donor.tokens) >= tokens
    k, v = llm.engine.runner.kv_caches[0]
    rows = [donor.blocks[p // BS] * BS + p % BS for p in positions]
    return k.view(-1, *k.shape[2:])[rows].clone(), v.view(-1, *v.shape[2:])[rows].clone()


def test_a_moved_suffix_is_reused_rotated_and_the_prefix_cache_stays_exact(engines):
    reusing, fresh = engines
    tok = reusing.engine.tokenizer
    first, second = _prompts(tok)
    ids = tok.encode(second)
    greedy = dict(temperature=0.0, max_tokens=8, ignore_eos=True)
    reusing.generate(first, SamplingParams(cache_reuse=16, **greedy), use_tqdm=False)
    out = reusing.generate(second, SamplingParams(cache_reuse=16, **greedy), use_tqdm=False)[0]
    common = next(i for i, (a, b) in enumerate(zip(tok.encode(first), ids)) if a != b)
    assert out.num_cached_tokens >= len(ids) - 1 - 20, (out.num_cached_tokens, len(ids))
    bm = reusing.engine.block_manager
    assert bm.reused_tokens >= 40
    run = range(len(ids) - 40, len(ids) - 1)       # inside the moved suffix
    k_reused, v_reused = _first_layer(reusing, len(ids), run)

    plain = fresh.generate(second, SamplingParams(cache_reuse=1, **greedy), use_tqdm=False)[0]
    assert plain.num_cached_tokens == 0
    k_fresh, v_fresh = _first_layer(fresh, len(ids), run)
    torch.testing.assert_close(k_reused, k_fresh, rtol=1e-4, atol=1e-4)
    assert torch.equal(v_reused, v_fresh)

    # the approximate blocks never joined the exact prefix cache: the same prompt without reuse
    # hits only blocks before the change, and gives the fresh engine's tokens bit for bit
    again = reusing.generate(second, SamplingParams(**greedy), use_tqdm=False)[0]
    assert again.num_cached_tokens <= common // BS * BS
    assert again.outputs[0].token_ids == plain.outputs[0].token_ids
    assert_all_blocks_free(reusing)
    assert_all_blocks_free(fresh)


def test_reuse_under_chunked_prefill_and_sampling_keeps_the_pool_whole(engines):
    reusing, _ = engines
    first, second = ("# chunked\n" + p for p in _prompts(reusing.engine.tokenizer))   # nothing cached
    params = SamplingParams(cache_reuse=8, temperature=0.8, seed=3, max_tokens=6, n=2)
    bm, sched = reusing.engine.block_manager, reusing.engine.scheduler
    reusing.generate(first + "\n", params, use_tqdm=False)
    before, cfg = bm.reused_tokens, sched.config
    sched.config = replace(cfg, max_num_batched_tokens=24)        # chunks around the jump
    try:
        outs = reusing.generate([second + "\n", second + "\n# end\n"], params, use_tqdm=False)
    finally:
        sched.config = cfg
    assert all(len(c.token_ids) == 6 for o in outs for c in o.outputs)
    assert bm.reused_tokens - before >= 2 * 40
    assert_all_blocks_free(reusing)


def test_cache_reuse_must_be_a_non_negative_integer():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="cache_reuse"):
            SamplingParams(cache_reuse=bad)
