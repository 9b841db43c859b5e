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

from inference.kernels.triton_utils import (
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
def _split_range(ctx, split, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The context slice [start, end) of split `split`: whole BLOCK_N tiles, the last one short."""
    if NUM_SPLITS == 1:
        start = 0
        end = ctx
    else:
        split_len = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, ctx)
    return start, end


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
    qk_scale = scale_log2e
    if F16_DOT:
        # the tiles below upcast to q's dtype (see `f16_dot`); the scale goes into q first, so
        # fp16 holds any q below 65504 / scale (8x bf16's reach for d 128), not just below 65504
        q = (q.to(tl.float32) * scale_log2e).to(tl.float16)
        qk_scale = 1.0
    start, end = _split_range(ctx, split, NUM_SPLITS, BLOCK_N)

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
        s = dot(q, tl.trans(k), DOT_FP32) * qk_scale                              # [G_PAD, BLOCK_N]
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


# Two words of four e4m3 codes each ($4, $5) -> four fp16 pairs: $j = (byte j of $4, byte j of $5).
# A float8 tile loaded as words [BLOCK_N, D / 4] splits into four fp16 tiles by byte; the two
# words of a call are adjacent in the register order, so each pair lands where the MMA packs it.
_ASM_E4M3_WORDS = tl.constexpr(
    "{\n.reg .b32 p01, p23;\n.reg .b16 l0, h0, l1, h1;\n"
    "prmt.b32 p01, $4, $5, 0x5140;\nprmt.b32 p23, $4, $5, 0x7362;\n"
    "mov.b32 {l0, h0}, p01;\nmov.b32 {l1, h1}, p23;\n"
    "cvt.rn.f16x2.e4m3x2 $0, l0;\ncvt.rn.f16x2.e4m3x2 $1, h0;\n"
    "cvt.rn.f16x2.e4m3x2 $2, l1;\ncvt.rn.f16x2.e4m3x2 $3, h1;\n}")


@triton.jit
def _e4m3_byte(w, j: tl.constexpr):
    return ((w >> (8 * j)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _e4m3_words(w, EMULATE: tl.constexpr):
    """int32 words of four e4m3 codes -> the four codes as fp16 tiles (byte 0, 1, 2, 3). EMULATE
    (the CPU interpreter, which runs no PTX): the same split as Triton ops."""
    if EMULATE:
        return _e4m3_byte(w, 0), _e4m3_byte(w, 1), _e4m3_byte(w, 2), _e4m3_byte(w, 3)
    return tl.inline_asm_elementwise(_ASM_E4M3_WORDS, "=r,=r,=r,=r,r,r", [w], dtype=(tl.float16,) * 4,
                                     is_pure=True, pack=2)


@triton.jit
def _decode_split_words_kernel(
    Q, K_WORDS, V_WORDS, BLOCK_TABLES, CONTEXT_LENS, OUT, PART_OUT, PART_LSE,
    scale_log2e,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,          # the caches as int32 words [NB, BS, Hkv, D / 4]
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr, EMULATE: tl.constexpr,
):
    """_decode_split_kernel for float8 e4m3 caches, read as words of four codes: the tiles are
    converted to fp16 in registers, before shared memory, so V reaches the MMA through 16-bit
    transposing loads instead of byte loads (bench/journal/2026-12-01-fp8-attention-and-fused-quant.md,
    run 32). Column d = 4 w + j of the head lives in byte j of word w, so q, the scores' dots and
    the output are taken per byte j."""
    grid_dependency_sync(PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(CONTEXT_LENS + b)
    g = tl.arange(0, G_PAD)
    w = tl.arange(0, HEAD_DIM // 4)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    q_rows = Q + b * stride_qt + heads[:, None] * stride_qh + 4 * w[None, :]
    # fp16 q with the softmax scale folded in first (as _decode_split_kernel's F16_DOT)
    q0 = (tl.load(q_rows + 0, mask=g_mask[:, None], other=0.0).to(tl.float32) * scale_log2e).to(tl.float16)
    q1 = (tl.load(q_rows + 1, mask=g_mask[:, None], other=0.0).to(tl.float32) * scale_log2e).to(tl.float16)
    q2 = (tl.load(q_rows + 2, mask=g_mask[:, None], other=0.0).to(tl.float32) * scale_log2e).to(tl.float16)
    q3 = (tl.load(q_rows + 3, mask=g_mask[:, None], other=0.0).to(tl.float32) * scale_log2e).to(tl.float16)
    start, end = _split_range(ctx, split, NUM_SPLITS, BLOCK_N)

    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc0 = tl.zeros([G_PAD, HEAD_DIM // 4], dtype=tl.float32)
    acc1 = tl.zeros([G_PAD, HEAD_DIM // 4], dtype=tl.float32)
    acc2 = tl.zeros([G_PAD, HEAD_DIM // 4], dtype=tl.float32)
    acc3 = tl.zeros([G_PAD, HEAD_DIM // 4], dtype=tl.float32)
    table = BLOCK_TABLES + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        blk = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = blk * stride_cb + (n % BLOCK_SIZE) * stride_cs + kvh * stride_ch
        k0, k1, k2, k3 = _e4m3_words(tl.load(K_WORDS + off[:, None] + w[None, :], mask=n_mask[:, None], other=0),
                                     EMULATE)
        # (the interpreter's 16-bit tl.dot is wrong: EMULATE upcasts the operands, as DOT_FP32 does)
        s = (dot(q0, tl.trans(k0), EMULATE) + dot(q1, tl.trans(k1), EMULATE)
             + dot(q2, tl.trans(k2), EMULATE) + dot(q3, tl.trans(k3), EMULATE))
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v0, v1, v2, v3 = _e4m3_words(tl.load(V_WORDS + off[:, None] + w[None, :], mask=n_mask[:, None], other=0),
                                     EMULATE)
        p16 = p.to(tl.float16)
        acc0 = acc0 * alpha[:, None] + dot(p16, v0, EMULATE)
        acc1 = acc1 * alpha[:, None] + dot(p16, v1, EMULATE)
        acc2 = acc2 * alpha[:, None] + dot(p16, v2, EMULATE)
        acc3 = acc3 * alpha[:, None] + dot(p16, v3, EMULATE)
        m_i = m_new

    inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)
    if NUM_SPLITS == 1:
        dst = OUT + b * stride_ot + heads[:, None] * stride_oh + 4 * w[None, :]
        ty = OUT.dtype.element_ty
    else:
        row = (b * (GROUP * tl.num_programs(1)) + heads) * NUM_SPLITS + split
        dst = PART_OUT + row[:, None] * HEAD_DIM + 4 * w[None, :]
        ty = tl.float32
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(PART_LSE + row, lse, mask=g_mask)
    tl.store(dst + 0, (acc0 * inv[:, None]).to(ty), mask=g_mask[:, None])
    tl.store(dst + 1, (acc1 * inv[:, None]).to(ty), mask=g_mask[:, None])
    tl.store(dst + 2, (acc2 * inv[:, None]).to(ty), mask=g_mask[:, None])
    tl.store(dst + 3, (acc3 * inv[:, None]).to(ty), mask=g_mask[:, None])


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


# warps, stages of a float8 cache's decode attention (H200 sweeps at batch 512 x context 192)
FP8_WARPS_STAGES = (2, 3)

SPLIT_CHOICES = tuple(1 << i for i in range(MAX_SPLITS.bit_length()))   # 1, 2, 4, ..., 64


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     num_splits: int = 1, out: torch.Tensor | None = None,
                     block_n: int = 64, num_warps: int | None = None, num_stages: int | None = None,
                     pdl: bool | None = None, words: bool | None = None) -> torch.Tensor:
    """q [B, H, D], caches [NB, BS, Hkv, D], block_tables [B, max_blocks] int32, context_lens [B]
    int32 (each >= 1) -> out [B, H, D] in q's dtype. The new token's K/V must already be cached.
    A float8 cache is read as words of four codes (`words`, the default for a 16-bit q; False:
    as float8 tiles, which is slower: bench/journal/2026-12-01-fp8-attention-and-fused-quant.md,
    run 32). Default warps / stages: 4 / 2, or FP8_WARPS_STAGES (2 / 3) for a float8 cache (the
    leaders of the H200 sweeps at batch 512 x context 192: that run, and run 30 in
    bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md)."""
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
    num_warps = num_warps or (FP8_WARPS_STAGES[0] if fp8 else 4)
    num_stages = num_stages or (FP8_WARPS_STAGES[1] if fp8 else 2)
    pdl = use_pdl(q, pdl)
    if num_splits > 1:
        part_out = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out                                          # unused
    # words by default where the dots already run in 16 bits (a 16-bit q); an fp32 q keeps
    # the float8 tiles and its fp32 dots
    words = fp8 and (q.dtype != torch.float32 if words is None else words)
    grid = (batch, num_kv_heads, num_splits)
    common = dict(GROUP=group, G_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
                  BLOCK_SIZE=block_size, BLOCK_N=block_n, NUM_SPLITS=num_splits, PDL=pdl,
                  num_warps=num_warps, num_stages=num_stages, **pdl_options(pdl))
    if words:
        kw, vw = k_cache.view(torch.int32), v_cache.view(torch.int32)
        _decode_split_words_kernel[grid](
            q, kw, vw, block_tables, context_lens, out, part_out, part_lse, scale * LOG2E,
            q.stride(0), q.stride(1), kw.stride(0), kw.stride(1), kw.stride(2), block_tables.stride(0),
            out.stride(0), out.stride(1), EMULATE=q.device.type == "cpu", **common)
    else:
        _decode_split_kernel[grid](
            q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
            scale * LOG2E,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1),
            DOT_FP32=dot_fp32(q), F16_DOT=f16_dot(q, k_cache), **common)
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
