"""Batch- and chunk-invariant attention on the CPU in bf16 (inference/models/invariant_attention.py
and the padded, masked decode in inference/worker/model_runner.py): the facts it rests on, and the
property itself on inputs drawn at random."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.models.invariant_attention import invariant_prefill_attention, padded_keys

BF16 = torch.bfloat16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_bf16_matmul_rows_do_not_depend_on_the_other_rows_columns_or_zero_padding():
    g = _gen(0)
    q = torch.randn(3, 96, 64, generator=g).to(BF16)
    k = torch.randn(3, 1024, 64, generator=g).to(BF16)
    p = torch.rand(3, 96, 1024, generator=g).to(BF16)
    for keys in (16, 48, 272, 1008):
        row = q[:, :1] @ k[:, :keys].transpose(1, 2)
        assert torch.equal((q @ k[:, :1024].transpose(1, 2))[:, :1, :keys], row)
        padded = p[:, :, :1024].clone()
        padded[:, :, keys:] = 0
        assert torch.equal((padded @ k)[:, :1], p[:, :1, :keys] @ k[:, :keys])


def test_softmax_rows_padded_with_minus_inf_to_multiples_of_16_keep_their_bits():
    g = _gen(1)
    for width in (16, 64, 272, 1008):
        s = torch.randn(9, 20, width, generator=g) * 5
        s[..., width - 5:] = float("-inf")
        for extra in (16, 48, 512):
            wide = torch.cat((s, torch.full((9, 20, extra), float("-inf"))), dim=-1)
            assert torch.equal(torch.softmax(wide, -1)[..., :width], torch.softmax(s, -1))


def test_decode_attention_alone_equals_the_same_row_in_a_padded_masked_batch():
    g = _gen(2)
    ctx = torch.randint(1, 700, (12,), generator=g)
    width = padded_keys(int(ctx.max()))
    q = torch.randn(12, 3, 3, 64, generator=g).to(BF16)
    k = torch.randn(12, 3, width, 64, generator=g).to(BF16)
    v = torch.randn(12, 3, width, 64, generator=g).to(BF16)
    mask = (torch.arange(width)[None] < ctx[:, None])[:, None, None]
    batch = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
    for i in range(12):
        w = padded_keys(int(ctx[i]))
        alone = F.scaled_dot_product_attention(q[i:i + 1], k[i:i + 1, :, :w], v[i:i + 1, :, :w],
                                               attn_mask=mask[i:i + 1, ..., :w], scale=0.125)
        assert torch.equal(alone, batch[i:i + 1])


def _prompt(n: int, seed: int):
    g = _gen(seed)
    q = torch.randn(n, 9, 64, generator=g).to(BF16)
    k = torch.randn(3, n, 64, generator=g).to(BF16)
    v = torch.randn(3, n, 64, generator=g).to(BF16)
    return q, k, v


def test_prefill_attention_matches_causal_attention():
    q, k, v = _prompt(300, seed=3)
    got = invariant_prefill_attention(q, k, v, 300, 0.125).float()
    kr, vr = (t.float().repeat_interleave(3, dim=0) for t in (k, v))
    want = F.scaled_dot_product_attention(q.float().transpose(0, 1), kr, vr, is_causal=True, scale=0.125)
    assert (got - want.transpose(0, 1)).abs().max() < 2e-2


def test_a_token_gets_the_same_bits_in_a_full_prefill_a_chunk_and_a_prefix_hit_tail():
    n = 333
    q, k, v = _prompt(n, seed=4)
    full = invariant_prefill_attention(q, k, v, n, 0.125)
    for cut in (1, 17, 256, 300, 332):        # chunks [0, cut) then [cut, n): a prefix hit's tail
        head = invariant_prefill_attention(q[:cut], k[:, :cut], v[:, :cut], cut, 0.125)
        tail = invariant_prefill_attention(q[cut:], k, v, n, 0.125)
        assert torch.equal(torch.cat((head, tail)), full), cut
