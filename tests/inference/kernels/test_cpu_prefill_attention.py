"""paged_prefill_attention (inference/kernels/cpu_prefill_attention.cpp): causal attention of a
prefill chunk over the paged bf16 cache, against an fp32 reference, and the property greedy
determinism rests on: a row's bits do not depend on how the prompt was cut into chunks."""
from __future__ import annotations

import pytest
import torch

from inference.kernels.cpu_ops import cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="the CPU kernels cannot build here")
BF16 = torch.bfloat16


def _case(seed, heads, kv_heads, d, ctx, n, num_blocks=80, bs=16):
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g).to(BF16)
    v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g).to(BF16)
    table = torch.randperm(num_blocks, generator=g)[:-(-ctx // bs)]
    q = torch.randn(n, heads, d, generator=g).to(BF16)
    return q, k_cache, v_cache, table


def _reference(q, k_cache, v_cache, table, ctx, scale):
    n, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    k = k_cache[table].reshape(-1, kv_heads, d)[:ctx].float().repeat_interleave(heads // kv_heads, 1)
    v = v_cache[table].reshape(-1, kv_heads, d)[:ctx].float().repeat_interleave(heads // kv_heads, 1)
    s = torch.einsum("nhd,thd->hnt", q.float(), k) * scale
    pos = torch.arange(ctx - n, ctx)[:, None]
    s = s.masked_fill(torch.arange(ctx)[None, :] > pos, float("-inf"))
    return torch.einsum("hnt,thd->nhd", s.softmax(-1), v)


@pytest.mark.parametrize("heads,kv_heads,d,ctx,n", [
    (14, 2, 64, 357, 69),      # Qwen2.5-Coder-0.5B after a prefix-cache hit
    (12, 2, 128, 100, 100),    # Qwen2.5-Coder-1.5B, a whole prompt
    (9, 3, 64, 33, 1),         # SmolLM2, one token past two blocks
    (4, 4, 32, 16, 16),        # no grouping, one full block
])
def test_matches_causal_attention(heads, kv_heads, d, ctx, n):
    q, kc, vc, table = _case(ctx + n, heads, kv_heads, d, ctx, n)
    got = cpu_ops().paged_prefill_attention(q, kc, vc, table, ctx, d ** -0.5)
    want = _reference(q, kc, vc, table, ctx, d ** -0.5)
    assert got.dtype == BF16 and got.shape == q.shape
    assert float((got.float() - want).abs().max()) < 1e-2


def test_a_rows_bits_do_not_depend_on_the_chunking():
    q, kc, vc, table = _case(7, 14, 2, 64, 300, 300)
    whole = cpu_ops().paged_prefill_attention(q, kc, vc, table, 300, 0.125)
    for start, stop in ((0, 1), (0, 17), (17, 100), (100, 299), (299, 300), (5, 300)):
        part = cpu_ops().paged_prefill_attention(q[start:stop].contiguous(), kc, vc, table, stop, 0.125)
        assert torch.equal(part, whole[start:stop]), (start, stop)


def test_bad_shapes_are_errors_not_reads_outside_the_cache():
    q, kc, vc, table = _case(1, 14, 2, 64, 40, 8)
    with pytest.raises(RuntimeError, match="blocks for"):
        cpu_ops().paged_prefill_attention(q, kc, vc, table[:2], 40, 0.125)
    with pytest.raises(RuntimeError, match="shorter than the chunk"):
        cpu_ops().paged_prefill_attention(q, kc, vc, table, 4, 0.125)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_ops().paged_prefill_attention(q, kc, vc, torch.tensor([0, 1, 500]), 40, 0.125)
