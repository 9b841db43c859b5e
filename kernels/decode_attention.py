"""Paged decode attention with GQA and split-K (flash-decoding), in Triton.

One query token per sequence attends to its whole context in the paged cache:

    q            [B, H, D]                  (may be a strided view of the fused qkv output)
    k/v cache    [num_blocks, block_size, Hkv, D]
    block_tables [B, max_blocks] int32      context_lens [B] int32 (tokens incl. the new one)

Grid (B, Hkv, NUM_SPLITS): a program takes the GROUP query heads that share one KV head as the
rows of one tile (so each K/V byte is read once per group, not once per query head) and a slice of
the context. With NUM_SPLITS > 1 each program writes a normalized partial output and its
log-sum-exp; a second kernel merges the splits. Splitting keeps the GPU full when B * Hkv is small
and contexts are long (batch 1, 8 KV heads, 32k tokens would otherwise be 8 programs).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.triton_utils import (
    LOG2E,
    check_paged_attention_inputs,
    dot,
    dot_fp32,
    f16_dot,
    grid_dependency_sync,
    pdl_options,
    use_pdl,
)


@triton.jit
def _decode_split_kernel(
    Q, K_CACHE, V_CACHE, BLOCK_TABLES, CONTEXT_LENS, OUT, PART_OUT, PART_LSE,
    scale_log2e,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,          # cache: block, slot-in-block, kv head (dim is 1)
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_FP32: tl.constexpr, PDL: tl.constexpr,
    F16_DOT: tl.constexpr,
):
    grid_dependency_sync(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CONTEXT_LENS + b)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g                                                # [G_PAD]
    g_mask = g < GROUP
    q = tl.load(Q + b * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None], other=0.0)                           # [G_PAD, D]
    if F16_DOT:
        q = q.to(tl.float16)             # the tiles below upcast to q's dtype (see `f16_dot`)
    if NUM_SPLITS == 1:
        start = 0
        end = ctx
    else:
        split_len = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, ctx)

    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HEAD_DIM], dtype=tl.float32)
    table = BLOCK_TABLES + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)                                     # token positions
        n_mask = n < end
        blk = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = blk * stride_cb + (n % BLOCK_SIZE) * stride_cs + kvh * stride_ch   # [BLOCK_N]
        k = tl.load(K_CACHE + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0).to(q.dtype)
        s = dot(q, tl.trans(k), DOT_FP32) * scale_log2e                           # [G_PAD, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_CACHE + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + dot(p.to(q.dtype), v, DOT_FP32)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if NUM_SPLITS == 1:
        tl.store(OUT + b * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(OUT.dtype.element_ty), mask=g_mask[:, None])
    else:
        # partials: PART_OUT [B, H, NUM_SPLITS, D] fp32, PART_LSE [B, H, NUM_SPLITS] fp32 (log2 units)
        row = (b * (GROUP * tl.num_programs(1)) + heads) * NUM_SPLITS + split    # [G_PAD]
        tl.store(PART_OUT + row[:, None] * HEAD_DIM + d[None, :], out, mask=g_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(PART_LSE + row, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(
    PART_OUT, PART_LSE, OUT, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    grid_dependency_sync(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, HEAD_DIM)
    row = (b * NUM_HEADS + h) * NUM_SPLITS + s                             # [S_PAD]
    s_mask = s < NUM_SPLITS
    lse = tl.load(PART_LSE + row, mask=s_mask, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))                                      # empty splits -> 0
    w = w / tl.sum(w, 0)
    part = tl.load(PART_OUT + row[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0)                                     # [D]
    tl.store(OUT + b * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty))


MAX_SPLITS = 64


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                      block_n: int = 64) -> int:
    """Enough splits that B * Hkv * splits fills the SMs about twice, each split >= 2 tiles.
    A power of two, so at most 7 kernel variants are ever compiled (see `SPLIT_CHOICES`)."""
    programs = batch * num_kv_heads
    want = -(-2 * num_sms // programs)
    most = max(1, -(-max_context_len // (2 * block_n)))
    splits = max(1, min(want, most, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)                 # round down to a power of two


SPLIT_CHOICES = tuple(1 << i for i in range(MAX_SPLITS.bit_length()))   # 1, 2, 4, ..., 64


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     num_splits: int = 1, out: torch.Tensor | None = None,
                     block_n: int = 64, num_warps: int | None = None, num_stages: int | None = None,
                     pdl: bool | None = None) -> torch.Tensor:
    """q [B, H, D], caches [NB, BS, Hkv, D], block_tables [B, max_blocks] int32, context_lens [B]
    int32 (each >= 1) -> out [B, H, D] in q's dtype. The new token's K/V must already be cached.
    Default warps / stages: 4 / 2, or 2 / 3 for a float8 cache (the leaders of the H200 sweep at
    batch 512, context 192: bf16 94% of copy; fp8 389 vs 433 us with 4 / 2; bench/NOTES.md run 30)."""
    num_heads, head_dim, block_size, num_kv_heads = check_paged_attention_inputs(
        "decode_attention", q, k_cache, v_cache)
    batch = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError(f"decode_attention: block_tables {tuple(block_tables.shape)} / context_lens "
                         f"{tuple(context_lens.shape)} do not match batch {batch}")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("decode_attention: block_tables and context_lens must be int32")
    if block_tables.stride(1) != 1:
        raise ValueError("decode_attention: block_tables needs a contiguous last dim")
    if num_splits < 1:
        raise ValueError(f"decode_attention: num_splits must be >= 1, got {num_splits}")
    if out is None:
        out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=q.device)
    group = num_heads // num_kv_heads
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    num_warps = num_warps or (2 if fp8 else 4)
    num_stages = num_stages or (3 if fp8 else 2)
    pdl = use_pdl(q, pdl)
    if num_splits > 1:
        part_out = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out                                          # unused
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, NUM_SPLITS=num_splits, DOT_FP32=dot_fp32(q), PDL=pdl,
        F16_DOT=f16_dot(q, k_cache),
        num_warps=num_warps, num_stages=num_stages, **pdl_options(pdl))
    if num_splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            S_PAD=triton.next_power_of_2(num_splits), PDL=pdl, num_warps=4, **pdl_options(pdl))
    return out


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """fp32 softmax attention, one sequence at a time; returns q's dtype."""
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for b in range(batch):
        ctx = int(context_lens[b])
        blocks = block_tables[b, :math.ceil(ctx / block_size)].long()
        k = k_cache.float()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]   # [ctx, Hkv, D]
        v = v_cache.float()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # [ctx, H, D]
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
