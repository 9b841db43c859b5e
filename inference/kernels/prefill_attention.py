"""Varlen causal prefill attention over the paged KV cache, in Triton (flash-attention style).

Several prefill chunks share one launch. Chunk i has query_len new tokens whose K/V are already
written to the cache, after context_len - query_len tokens cached earlier (a prefix-cache hit or
the chunks before it in chunked prefill). Query j of the chunk sits at absolute position
context_len - query_len + j and sees keys 0..that position (bottom-right causal):

    q              [T, H, D]   the chunks' tokens back to back (may be a strided view)
    query_start    [P + 1] int32  chunk i's queries are q[query_start[i]:query_start[i+1]]
    context_lens   [P] int32      cached + new tokens of chunk i
    block_tables   [P, max_blocks] int32
    k/v cache      [num_blocks, block_size, Hkv, D]

Grid (H, cdiv(max_query_len, BLOCK_M), P), the query tiles in reverse: every head's last (longest)
tile starts before any head's shorter ones, so the causal tail is short; tiles past a chunk's end
return at once. Keys before the tile's first query position are visible to every row, so those
loops run without masks; only the diagonal (and a partial last prefix tile) is masked. With
k_new / v_new the chunk's own keys are read from the step's K/V rows instead of through the block
table: contiguous rows whose tile pointers just advance, and no block-table load in the address
chain. A fresh prompt (no cached prefix) then never touches the block table.

    keys:  [0 ........ prefix) [prefix ...... diag) [diag .... prefix+i0+BLOCK_M)
            paged cache          k_new rows, no mask  k_new rows, causal mask
    (i0 = the tile's first query row, diag = prefix + i0 rounded down to BLOCK_N)
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from inference.kernels.triton_utils import LOG2E, check_paged_attention_inputs, dot, dot_fp32, f16_dot


@triton.jit
def _softmax_step(acc, l_i, m_i, s, v, scale_log2e, DOT_FP32: tl.constexpr):
    """One key tile of the online softmax (base 2): s [BLOCK_M, BLOCK_N] raw scores (masked ones
    -inf), v [BLOCK_N, D]."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2e)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha
    acc = acc * alpha[:, None]
    p = tl.exp2(s * scale_log2e - m_new[:, None])
    l_i = l_i + tl.sum(p, 1)
    acc = acc + dot(p.to(v.dtype), v, DOT_FP32)
    return acc, l_i, m_new


@triton.jit
def _attend(acc, l_i, m_i, q, K, V, table, kvh, q_pos, n_start, n_end, scale_log2e,
            stride_kb, stride_ks, stride_kh,
            HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
            MASKED: tl.constexpr, DOT_FP32: tl.constexpr, STAGES: tl.constexpr):
    """Online softmax over keys [n_start, n_end) of the paged cache (each key's row from the block
    table). MASKED: the range end and the causal diagonal are masked (only the last tile or two).
    STAGES: this loop's pipeline depth (the wrapper's paged_stages)."""
    d = tl.arange(0, HEAD_DIM)
    for n0 in tl.range(n_start, n_end, BLOCK_N, num_stages=STAGES):
        n = n0 + tl.arange(0, BLOCK_N)                                     # key positions
        n_mask = n < n_end
        if MASKED:
            blk = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        else:
            blk = tl.load(table + n // BLOCK_SIZE).to(tl.int64)
        off = blk * stride_kb + (n % BLOCK_SIZE) * stride_ks + kvh * stride_kh   # [BLOCK_N]
        if MASKED:
            k = tl.load(K + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
            v = tl.load(V + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
        else:
            k = tl.load(K + off[:, None] + d[None, :])                     # [BLOCK_N, D]
            v = tl.load(V + off[:, None] + d[None, :])
        s = dot(q, tl.trans(k.to(q.dtype)), DOT_FP32)                      # [BLOCK_M, BLOCK_N]; a float8 cache upcasts
        if MASKED:
            s = tl.where((n[None, :] <= q_pos[:, None]) & n_mask[None, :], s, float("-inf"))
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, s, v.to(q.dtype), scale_log2e, DOT_FP32)
    return acc, l_i, m_i


@triton.jit
def _attend_rows(acc, l_i, m_i, q, K, V, row_base, kvh, q_pos, n_start, n_end, scale_log2e,
                 stride_kt, stride_kh,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_FP32: tl.constexpr):
    """`_attend` over the step's own K/V rows: key n at row row_base + n, so the tile pointers
    just advance by BLOCK_N rows a step (no per-row 64-bit address arithmetic in the loop)."""
    j = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_DIM)
    off = (row_base + n_start + j) * stride_kt + kvh * stride_kh                   # [BLOCK_N] int64
    k_ptrs = K + off[:, None] + d[None, :]                                         # [BLOCK_N, D]
    v_ptrs = V + off[:, None] + d[None, :]
    step = BLOCK_N * stride_kt
    for n0 in range(n_start, n_end, BLOCK_N):
        if MASKED:
            n = n0 + j
            k = tl.load(k_ptrs, mask=(n < n_end)[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=(n < n_end)[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = dot(q, tl.trans(k), DOT_FP32)                                  # [BLOCK_M, BLOCK_N]
        if MASKED:
            # n <= q_pos implies n < n_end for the rows stored (padding rows past the chunk
            # see zeros from the masked loads and are never written)
            s = tl.where(n[None, :] <= q_pos[:, None], s, float("-inf"))
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, s, v, scale_log2e, DOT_FP32)
        k_ptrs += step
        v_ptrs += step
    return acc, l_i, m_i


@triton.jit
def _attend_desc(acc, l_i, m_i, q, k_desc, v_desc, col, q_pos, n_start, n_end, prefix, scale_log2e,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, DOT_FP32: tl.constexpr):
    """`_attend` over the chunk's own keys through TMA descriptors of its K/V rows (key n is row
    n - prefix; rows past the chunk read as zeros)."""
    for n0 in range(n_start, n_end, BLOCK_N):
        k = k_desc.load([n0 - prefix, col])                                # [BLOCK_N, D]
        v = v_desc.load([n0 - prefix, col])
        s = dot(q, tl.trans(k), DOT_FP32)
        if MASKED:
            n = n0 + tl.arange(0, BLOCK_N)
            s = tl.where((n[None, :] <= q_pos[:, None]) & (n < n_end)[None, :], s, float("-inf"))
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, s, v, scale_log2e, DOT_FP32)
    return acc, l_i, m_i


@triton.jit
def _prefill_kernel(
    Q, K_CACHE, V_CACHE, K_NEW, V_NEW, BLOCK_TABLES, QUERY_START, CONTEXT_LENS, OUT,
    scale_log2e,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_nt, stride_nh,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_NEW: tl.constexpr, TMA: tl.constexpr,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, DOT_FP32: tl.constexpr, F16_DOT: tl.constexpr,
    HEADS_FIRST: tl.constexpr, PAGED_STAGES: tl.constexpr,
):
    # Longest tiles (last queries: most keys) first, so the causal tail doesn't idle the GPU.
    # HEADS_FIRST: grid (H, tiles, P), every head's tile t launches before any head's tile t - 1;
    # else (P, tiles, H): one head's tiles back to back.
    if HEADS_FIRST:
        h = tl.program_id(0)
        seq = tl.program_id(2)
    else:
        seq = tl.program_id(0)
        h = tl.program_id(2)
    tile = tl.num_programs(1) - 1 - tl.program_id(1)
    q_start = tl.load(QUERY_START + seq)
    q_len = tl.load(QUERY_START + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    ctx = tl.load(CONTEXT_LENS + seq)
    prefix = ctx - q_len
    kvh = h // GROUP
    i0 = tile * BLOCK_M
    i = i0 + tl.arange(0, BLOCK_M)                                         # query rows of the chunk
    i_mask = i < q_len
    d = tl.arange(0, HEAD_DIM)
    rows = (q_start + i).to(tl.int64)            # a big step's T * stride can pass 2**31
    if TMA:
        # descriptors bounded by this chunk's rows: tiles past its end read zeros, stores clip
        q0 = q_start.to(tl.int64)
        q_desc = tl.make_tensor_descriptor(Q + q0 * stride_qt, shape=[q_len, NUM_HEADS * HEAD_DIM],
                                           strides=[stride_qt, 1], block_shape=[BLOCK_M, HEAD_DIM])
        q = q_desc.load([i0, h * HEAD_DIM])                                # [BLOCK_M, D]
    else:
        q = tl.load(Q + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
                    mask=i_mask[:, None], other=0.0)                       # [BLOCK_M, D]
    if F16_DOT:
        # a float8 cache: the dots in fp16 (`f16_dot`), the scale folded into q first so fp16
        # holds any q below 65504 / scale rather than 65504
        q = (q.to(tl.float32) * scale_log2e).to(tl.float16)
        scale_log2e = 1.0
    q_pos = prefix + i

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    table = BLOCK_TABLES + seq * stride_bt
    tile_end = tl.minimum(prefix + i0 + BLOCK_M, ctx)
    if HAS_NEW:
        # cached prefix through the block table (whole tiles, then the partial one) ...
        prefix_full = (prefix // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, K_CACHE, V_CACHE, table, kvh, q_pos, 0, prefix_full,
                                scale_log2e, stride_cb, stride_cs, stride_ch,
                                HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, DOT_FP32, PAGED_STAGES)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, K_CACHE, V_CACHE, table, kvh, q_pos, prefix_full, prefix,
                                scale_log2e, stride_cb, stride_cs, stride_ch,
                                HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, DOT_FP32, PAGED_STAGES)
        # ... then the chunk's own keys, read straight from the step's K/V rows (contiguous):
        # whole key tiles before the tile's first query unmasked, then the diagonal masked.
        diag = prefix + (i0 // BLOCK_N) * BLOCK_N
        if TMA:
            q0 = q_start.to(tl.int64)
            kv_shape = [q_len, NUM_KV_HEADS * HEAD_DIM]
            k_desc = tl.make_tensor_descriptor(K_NEW + q0 * stride_nt, shape=kv_shape, strides=[stride_nt, 1],
                                               block_shape=[BLOCK_N, HEAD_DIM])
            v_desc = tl.make_tensor_descriptor(V_NEW + q0 * stride_nt, shape=kv_shape, strides=[stride_nt, 1],
                                               block_shape=[BLOCK_N, HEAD_DIM])
            col = kvh * HEAD_DIM
            acc, l_i, m_i = _attend_desc(acc, l_i, m_i, q, k_desc, v_desc, col, q_pos, prefix, diag,
                                         prefix, scale_log2e, BLOCK_N, False, DOT_FP32)
            acc, l_i, m_i = _attend_desc(acc, l_i, m_i, q, k_desc, v_desc, col, q_pos, diag, tile_end,
                                         prefix, scale_log2e, BLOCK_N, True, DOT_FP32)
        else:
            row_base = (q_start - prefix).to(tl.int64)
            acc, l_i, m_i = _attend_rows(acc, l_i, m_i, q, K_NEW, V_NEW, row_base, kvh, q_pos, prefix, diag,
                                         scale_log2e, stride_nt, stride_nh, HEAD_DIM, BLOCK_N, False, DOT_FP32)
            acc, l_i, m_i = _attend_rows(acc, l_i, m_i, q, K_NEW, V_NEW, row_base, kvh, q_pos, diag, tile_end,
                                         scale_log2e, stride_nt, stride_nh, HEAD_DIM, BLOCK_N, True, DOT_FP32)
    else:
        # everything from the cache: keys [0, full_end) are visible to every query of the tile
        full_end = ((prefix + i0) // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, K_CACHE, V_CACHE, table, kvh, q_pos, 0, full_end,
                                scale_log2e, stride_cb, stride_cs, stride_ch,
                                HEAD_DIM, BLOCK_SIZE, BLOCK_N, False, DOT_FP32, PAGED_STAGES)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, K_CACHE, V_CACHE, table, kvh, q_pos, full_end, tile_end,
                                scale_log2e, stride_cb, stride_cs, stride_ch,
                                HEAD_DIM, BLOCK_SIZE, BLOCK_N, True, DOT_FP32, PAGED_STAGES)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(OUT + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
             out.to(OUT.dtype.element_ty), mask=i_mask[:, None])


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, query_start: torch.Tensor, context_lens: torch.Tensor,
                      max_query_len: int, scale: float, out: torch.Tensor | None = None,
                      k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
                      block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                      num_stages: int = 3, paged_stages: int = 2, heads_first: bool = True,
                      tma: bool = False) -> torch.Tensor:
    """See the module docstring. Returns out [T, H, D] in q's dtype; max_query_len bounds the grid.
    k_new / v_new [T, Hkv, D] (optional, may be strided views of the fused qkv output): the
    chunks' own K/V, row for row with q. Given, the kernel reads the new keys from them (contiguous
    rows) and only the cached prefix through the block table; else everything from the cache.
    block_m / block_n: query rows / keys a tile (powers of two >= 16); num_stages: the pipeline
    depth of the loops over the new rows, paged_stages that of the loops over the paged cache.
    heads_first: the head-major grid of the module docstring (else chunk-major, one head's tiles
    back to back). tma: load q and the new K/V through TMA descriptors (off by default: no faster
    than pointer loads on the H200, bench/journal/2026-12-01-prefill-and-mixed-step-graphs.md, run 11).
    The defaults lead bench/gpu/gpu_kernels.py's sweeps on the H200 at 4k, d 128
    (bench/journal/2026-12-02-prefill-attention.md, run 37): 64 x 64 tiles of one warpgroup leave
    two programs an SM; the head-major grid beats chunk-major; 2 paged stages beat 3 after a long
    cached prefix (fresh prompts, read through k_new, run no paged loop); 128-row tiles of two
    warpgroups (which meet at every tile's barrier) and a lazy rescale (a block-wide branch on the
    max's growth, FA4's trick) are slower."""
    num_heads, head_dim, block_size, num_kv_heads = check_paged_attention_inputs(
        "prefill_attention", q, k_cache, v_cache)
    num_tokens = q.shape[0]
    num_seqs = context_lens.shape[0]
    if (block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or query_start.shape != (num_seqs + 1,)
            or block_tables.stride(1) != 1):
        raise ValueError(f"prefill_attention: block_tables {tuple(block_tables.shape)}, query_start "
                         f"{tuple(query_start.shape)}, context_lens {tuple(context_lens.shape)} disagree")
    if any(t.dtype != torch.int32 for t in (block_tables, query_start, context_lens)):
        raise ValueError("prefill_attention: block_tables, query_start and context_lens must be int32")
    if max_query_len < 1:
        raise ValueError(f"prefill_attention: max_query_len must be >= 1, got {max_query_len}")
    has_new = k_new is not None
    if has_new != (v_new is not None):
        raise ValueError("prefill_attention: pass both k_new and v_new, or neither")
    if has_new:
        want = (num_tokens, num_kv_heads, head_dim)
        if (k_new.shape != want or v_new.shape != want or k_new.stride() != v_new.stride()
                or k_new.stride(2) != 1 or k_new.dtype != q.dtype or v_new.dtype != q.dtype):
            raise ValueError(f"prefill_attention: k_new/v_new must be {want} of {q.dtype} with equal strides and "
                             f"a contiguous last dim; got {tuple(k_new.shape)} {k_new.dtype} / "
                             f"{tuple(v_new.shape)} {v_new.dtype}")
    else:
        k_new = v_new = q                                                  # unused
    if out is None:
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    if head_dim > 128:                                   # keep the tile within shared memory
        block_m, block_n = min(block_m, 64), min(block_n, 32)
    if block_m & (block_m - 1) or block_n & (block_n - 1) or min(block_m, block_n) < 16:
        raise ValueError(f"prefill_attention: block_m {block_m} and block_n {block_n} must be powers of two >= 16")
    if tma and not (has_new and tma_layout_ok(q, k_new, v_new, head_dim)):
        raise ValueError("prefill_attention: tma needs k_new/v_new with heads packed in each row and "
                         "16-byte aligned rows")
    if tma:
        triton.set_allocator(_descriptor_scratch)
    num_tiles = triton.cdiv(max_query_len, block_m)
    grid = (num_heads, num_tiles, num_seqs) if heads_first else (num_seqs, num_tiles, num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, k_new, v_new, block_tables, query_start, context_lens, out,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_new.stride(0), k_new.stride(1),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, HAS_NEW=has_new, TMA=tma, NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads, DOT_FP32=dot_fp32(q), F16_DOT=f16_dot(q, k_cache) and not has_new,
        HEADS_FIRST=heads_first, PAGED_STAGES=paged_stages, num_warps=num_warps, num_stages=num_stages)
    return out


def tma_layout_ok(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, head_dim: int) -> bool:
    """TMA descriptors see q / k_new / v_new as 2-D [rows, heads * D]: heads packed in a row,
    16-byte aligned row strides and base addresses."""
    size = q.element_size()
    return all(t.stride(1) == head_dim and (t.stride(0) * size) % 16 == 0 and t.data_ptr() % 16 == 0
               for t in (q, k_new, v_new))


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory Triton asks for to build the kernel's TMA descriptors on the device."""
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device() if torch.cuda.is_available()
                       else "cpu")


def prefill_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, query_start: torch.Tensor,
                                context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 bottom-right causal attention, one chunk at a time; returns q's dtype."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    for i in range(context_lens.shape[0]):
        s, e, ctx = int(query_start[i]), int(query_start[i + 1]), int(context_lens[i])
        n = e - s
        blocks = block_tables[i, :math.ceil(ctx / block_size)].long()
        k = k_cache.float()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        v = v_cache.float()[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # [ctx, H, D]
        scores = torch.einsum("thd,nhd->htn", q[s:e].float(), k) * scale             # [H, n, ctx]
        q_pos = torch.arange(ctx - n, ctx, device=q.device)[:, None]
        visible = torch.arange(ctx, device=q.device)[None, :] <= q_pos
        scores = scores.masked_fill(~visible, float("-inf"))
        out[s:e] = torch.einsum("htn,nhd->thd", scores.softmax(-1), v).to(q.dtype)
    return out
