"""Batch-1 decode GEMVs that carry their neighbours: RMSNorm, the residual add, SiLU-and-mul,
RoPE and the KV-cache write ride in the GEMVs' epilogues, so a dense decoder layer is six
kernels at one row instead of ten (the loop is inference/kernels/quant_gemv.py's `_row_sums`, any format).

    qkv  = rstd(h) * (h @ (W_qkv * g_in)^T)     q, k rotated; k, v -> their cache slot   ROPE
    attention over the cache (decode split + merge, inference/kernels/decode_attention.py)
    h   += attn @ W_o^T,      stats[j+1] = sum(h^2)                                       RESIDUAL
    act  = silu(rstd(h) * gate) * (rstd(h) * up), gate / up rows of W_gu * g_post          SILU
    h   += act @ W_down^T,    stats[j+2] = sum(h^2)                                       RESIDUAL

rstd(h) = rsqrt(stats[j] / K + eps). RMSNorm(h) * g is a scalar per row times h times g; g is
folded into the columns of the linear that reads the norm (inference/models/norm_folding.py), so
the consumer only needs the row's sum of squares, which the kernel that wrote h adds up in its
epilogue: one fp64 atomic per program, into one of STATS_LANES addresses a row (program id modulo
the lanes: thousands of programs adding into one address queue up at the end of the kernel), which
the consumer sums. The partial sums are fp32 and their fp64 total is exact to ~2^-40, so the order
of the atomics does not reach the fp32 rstd (in all but ~2^-18 of cases, where the rstd moves by
one fp32 ulp). `norm_stats`, the step's first kernel, writes the embedding row's sum and zeroes
the other slots.

Paired rows: SILU gives each program gate row r and up row I + r, ROPE row i of a head and row
i + D/2, side by side in its [BLOCK_N] rows, so its epilogue holds both halves of each output.

Why in the epilogue: a prologue's work is per input element, in every program (x * g and x^2 for
RMSNorm), and costs the GEMVs more than the kernels it removes
(bench/journal/2026-12-01-batch1-decode-profile.md, run 24); here a program's extra work is a few
loads and stores for its own BLOCK_N rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from inference.kernels.kv_cache import write_kv_cache_reference
from inference.kernels.quant_gemv import GemvWeight, _row_sums, gemv_config
from inference.kernels.rotary_kv_cache import store_cache_halves, supports_cache
from inference.kernels.triton_utils import (
    grid_dependency_launch,
    grid_dependency_sync,
    grid_dependency_wait,
    pdl_options,
    use_pdl,
)

RESIDUAL, SILU, ROPE = 1, 2, 3                      # the epilogues (module docstring)
# fp64 partial sums a row and norm (module docstring); one lane measured within noise of 32
# (bench/journal/2026-12-02-gemv-tiles-and-fused-layer.md, run 36)
STATS_LANES = 32
_RESIDUAL, _SILU, _ROPE = tl.constexpr(RESIDUAL), tl.constexpr(SILU), tl.constexpr(ROPE)


@dataclass(frozen=True)
class RopeKV:
    """What the qkv GEMV's epilogue needs for RoPE and the cache write (inference/kernels/rotary_kv_cache.py)."""
    positions: torch.Tensor         # [M] int64
    cos_sin: torch.Tensor           # [max_pos, D] fp32: cos half | sin half
    k_cache: torch.Tensor           # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor      # [M] int64, < 0: nothing cached
    num_heads: int
    num_kv_heads: int
    cos_sin_rows: torch.Tensor | None = None    # cos_sin[positions] [M, D]: once a step (else per call)


@triton.jit
def _norm_stats_kernel(X, STATS, stride_xm, M, N, NUM_SLOTS,
                       BLOCK: tl.constexpr, SLOTS: tl.constexpr, LANES: tl.constexpr, PDL: tl.constexpr):
    grid_dependency_sync(PDL)
    m = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + m * stride_xm + cols, mask=cols < N, other=0.0).to(tl.float32)
    total = tl.sum(x * x, 0).to(tl.float64)
    slots = tl.arange(0, SLOTS)[:, None]
    lanes = tl.arange(0, LANES)[None, :]
    tl.store(STATS + (slots * M + m) * LANES + lanes, tl.where((slots == 0) & (lanes == 0), total, 0.0),
             mask=(slots < NUM_SLOTS) & (lanes < LANES))


@triton.jit
def _fused_gemv_kernel(
    X, QW, S, Z, OUT, M, N, K, group_len, num_groups, stride_xm, stride_qn, stride_sn, stride_om,
    STATS_IN, STATS_OUT, eps,
    SLOT, COS_SIN_ROWS, K_CACHE, V_CACHE,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
    CONVERT: tl.constexpr, EMULATE: tl.constexpr, PDL: tl.constexpr, FP8: tl.constexpr,
    EPILOGUE: tl.constexpr,     # RESIDUAL, SILU or ROPE
    RSTD_IN: tl.constexpr,      # the sums times rsqrt(sum of STATS_IN[m, :] / K + eps)
    LANES: tl.constexpr,        # STATS_LANES
    HALF_D: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, FP8_CACHE: tl.constexpr,
):
    pid = tl.program_id(0)
    m = (pid % M).to(tl.int64)
    blk = pid // M
    PAIRS: tl.constexpr = BLOCK_N // 2
    j = tl.arange(0, BLOCK_N)
    if EPILOGUE == _SILU:                        # gate row p with up row I + p
        half = N // 2
        pair = blk * PAIRS + j // 2
        rn = pair + (j % 2) * half
        n_mask = pair < half
    elif EPILOGUE == _ROPE:                      # row i of a head with row i + D / 2
        pair = blk * PAIRS + j // 2
        rn = (pair // HALF_D) * (2 * HALF_D) + pair % HALF_D + (j % 2) * HALF_D
        n_mask = pair < N // 2
    else:
        rn = blk * BLOCK_N + j
        n_mask = rn < N
    grid_dependency_wait(PDL)
    # what the epilogue reads comes in before the loop: a program is short (a few us at one row),
    # and a load issued after its sums would add an L2 round trip to every program's tail
    # (no arithmetic on them before the loop: a use there would wait for the load)
    partials = tl.zeros([LANES], dtype=tl.float64)
    if RSTD_IN:
        partials = tl.load(STATS_IN + m * LANES + tl.arange(0, LANES))
    p = blk * PAIRS + tl.arange(0, PAIRS)
    res = tl.zeros([BLOCK_N], dtype=tl.float32)
    cos = tl.full([PAIRS], 1.0, tl.float32)
    sin = tl.zeros([PAIRS], dtype=tl.float32)
    slot = m * 0 - 1
    if EPILOGUE == _RESIDUAL:
        res = tl.load(OUT + m * stride_om + rn, mask=n_mask, other=0.0).to(tl.float32)
    if EPILOGUE == _ROPE:
        cos, sin, slot = _rope_tables(p, m, N, SLOT, COS_SIN_ROWS, HALF_D, H, HKV)
    acc = _row_sums(X + m * stride_xm, QW, S, Z, rn, n_mask, K, group_len, num_groups, stride_qn, stride_sn,
                    BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE, FP8)
    grid_dependency_launch(PDL)
    if RSTD_IN:
        acc = acc * tl.rsqrt(tl.sum(partials, 0).to(tl.float32) / K + eps)
    if EPILOGUE == _RESIDUAL:                    # h += sums in place, its squares summed
        h = (acc + res).to(OUT.dtype.element_ty)
        tl.store(OUT + m * stride_om + rn, h, mask=n_mask)
        hf = tl.where(n_mask, h.to(tl.float32), 0.0)
        # relaxed: the reader is the next kernel, after the grid completes (its PDL wait orders the
        # stores); acq_rel, the default, makes every program's tail wait for its stores, which slows
        # o / down (bench/journal/2026-12-02-gemv-tiles-and-fused-layer.md, run 36)
        tl.atomic_add(STATS_OUT + m * LANES + blk % LANES, tl.sum(hf * hf, 0).to(tl.float64), sem="relaxed")
    else:
        first, second = tl.split(tl.reshape(acc, [PAIRS, 2]))             # [PAIRS] each
        if EPILOGUE == _SILU:
            act = first / (1.0 + tl.exp(-first)) * second
            tl.store(OUT + m * stride_om + p, act.to(OUT.dtype.element_ty), mask=p < N // 2)
        else:
            _rope_kv_epilogue(first, second, cos, sin, slot, p, m, OUT, stride_om, N, K_CACHE, V_CACHE,
                              HALF_D, H, HKV, FP8_CACHE)


@triton.jit
def _rope_tables(p, m, N, SLOT, COS_SIN_ROWS, HALF_D: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr):
    """cos / sin [PAIRS] of row m's position (1 / 0 for v heads: no rotation) and its cache slot;
    the rows are gathered once a step, so no load here waits for another (the position)."""
    D: tl.constexpr = 2 * HALF_D
    rotate = (p < N // 2) & (p // HALF_D < H + HKV)
    i = p % HALF_D
    cos = tl.load(COS_SIN_ROWS + m * D + i, mask=rotate, other=1.0)
    sin = tl.load(COS_SIN_ROWS + m * D + HALF_D + i, mask=rotate, other=0.0)
    return cos, sin, tl.load(SLOT + m)


@triton.jit
def _rope_kv_epilogue(x1, x2, cos, sin, slot, p, m, OUT, stride_om, N, K_CACHE, V_CACHE,
                      HALF_D: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, FP8_CACHE: tl.constexpr):
    """Pairs p of the qkv row (head p // (D/2), column p % (D/2) and its partner D/2 later): q and
    k rotated (`_rope_tables`), all three stored in OUT, k and v in their cache slot
    (rotary_kv_cache's math)."""
    D: tl.constexpr = 2 * HALF_D
    p_mask = p < N // 2
    head = p // HALF_D
    i = p % HALF_D
    rotate = head < H + HKV
    r1 = (x1 * cos - x2 * sin).to(OUT.dtype.element_ty)
    r2 = (x2 * cos + x1 * sin).to(OUT.dtype.element_ty)
    out = OUT + m * stride_om + head * D + i
    tl.store(out, r1, mask=p_mask)
    tl.store(out + HALF_D, r2, mask=p_mask)
    is_k = rotate & (head >= H)
    is_v = head >= H + HKV
    cached = (p * 0 + slot) >= 0                 # slot as a tensor: see rotary_kv_cache
    kv_head = tl.where(is_k, head - H, head - H - HKV)
    store_cache_halves(K_CACHE, V_CACHE, slot * (HKV * D) + kv_head * D + i, HALF_D, r1, r2,
                       p_mask & is_k & cached, p_mask & is_v & cached, FP8_CACHE)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"gemv_fused: {message}")


def _check_stats(name: str, stats: torch.Tensor, m: int, device: torch.device) -> None:
    _check(stats.dtype == torch.float64 and tuple(stats.shape) == (m, STATS_LANES) and stats.is_contiguous()
           and stats.device == device, f"{name} must be a contiguous fp64 [{m}, {STATS_LANES}] on {device}, "
           f"got {stats.dtype} {list(stats.shape)} on {stats.device}")


def norm_stats(x: torch.Tensor, stats: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """stats [S, M, STATS_LANES] fp64 <- slot 0: sum(x^2) per row of x [M, K] (in lane 0); every
    other lane and slot 0 (the slots the step's RESIDUAL GEMVs add into). Returns stats."""
    _check(x.dim() == 2 and x.stride(1) == 1, f"x must be [M, K] with a contiguous last dim, got {list(x.shape)}")
    m, k = x.shape
    _check(stats.dim() == 3 and stats.shape[1:] == (m, STATS_LANES) and stats.dtype == torch.float64
           and stats.is_contiguous() and stats.device == x.device,
           f"stats must be contiguous fp64 [S, {m}, {STATS_LANES}] on {x.device}, "
           f"got {stats.dtype} {list(stats.shape)}")
    pdl = use_pdl(x, pdl)
    _norm_stats_kernel[(m,)](x, stats, x.stride(0), m, k, stats.shape[0], BLOCK=triton.next_power_of_2(k),
                             SLOTS=triton.next_power_of_2(stats.shape[0]), LANES=STATS_LANES, PDL=pdl, num_warps=4,
                             **pdl_options(pdl))
    return stats


def _launch(x: torch.Tensor, w: GemvWeight, out: torch.Tensor, epilogue: int, stats_in: torch.Tensor | None,
            eps: float, stats_out: torch.Tensor | None = None, rope: RopeKV | None = None,
            pdl: bool | None = None, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """tiles: (BLOCK_N, BLOCK_K, warps) instead of the decode GEMV's defaults (a benchmark's sweep)."""
    _check(x.dim() == 2 and x.stride(1) == 1, f"x must be [M, K] with a contiguous last dim, got {list(x.shape)}")
    m, k = x.shape
    n = w.out_features
    _check(w.qweight.device == x.device and w.qweight.dim() == 2 and w.qweight.stride(1) == 1,
           f"the weight must be a 2-D row-major tensor on {x.device}")
    _check(w.bits != 16 or w.fp8 or (w.qweight.dtype == x.dtype and w.qweight.shape[1] == k),
           f"a plain weight {list(w.qweight.shape)} {w.qweight.dtype} does not take x {list(x.shape)} {x.dtype}")
    _check(not w.fp8 or x.dtype in (torch.float16, torch.bfloat16), f"an fp8 weight wants 16-bit x, got {x.dtype}")
    if stats_in is not None:
        _check_stats("stats_in", stats_in, m, x.device)
    if stats_out is not None:
        _check_stats("stats_out", stats_out, m, x.device)
    cfg = gemv_config(n, k, w.bits, w.group_len, w.qweight, x.dtype, tiles=tiles and tiles[:2],
                      num_warps=tiles and tiles[2], fp8=w.fp8)
    _check(epilogue == RESIDUAL or (cfg["BLOCK_N"] % 2 == 0 and n % 2 == 0),
           f"paired rows want an even row count and tile, got {n} rows, tile {cfg['BLOCK_N']}")
    rope_args = (x, x, x, x)
    rope_consts = {"HALF_D": 1, "H": 1, "HKV": 1, "FP8_CACHE": False}
    if rope is not None:
        tables = rope.cos_sin.index_select(0, rope.positions) if rope.cos_sin_rows is None else rope.cos_sin_rows
        rope_args = (rope.slot_mapping, tables, rope.k_cache, rope.v_cache)
        d = n // (rope.num_heads + 2 * rope.num_kv_heads)
        rope_consts = {"HALF_D": d // 2, "H": rope.num_heads, "HKV": rope.num_kv_heads,
                       "FP8_CACHE": rope.k_cache.dtype == torch.float8_e4m3fn}
    pdl = use_pdl(x, pdl)
    grid = (m * triton.cdiv(n, cfg["BLOCK_N"]),)         # paired: BLOCK_N / 2 pairs of the N / 2
    _fused_gemv_kernel[grid](
        x, w.qweight, w.scales, w.zeros, out, m, n, k, w.group_len, w.scales.shape[1],
        x.stride(0), w.qweight.stride(0), w.scales.stride(0), out.stride(0),
        stats_in if stats_in is not None else x, stats_out if stats_out is not None else x, eps, *rope_args,
        EMULATE=x.device.type != "cuda", PDL=pdl, FP8=w.fp8, EPILOGUE=epilogue, RSTD_IN=stats_in is not None,
        LANES=STATS_LANES,
        **rope_consts, **cfg, **pdl_options(pdl))
    return out


def gemv_residual(x: torch.Tensor, w: GemvWeight, residual: torch.Tensor, stats_out: torch.Tensor,
                  pdl: bool | None = None, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """residual [M, N] += x [M, K] @ W^T in place (rounded to residual's dtype, as the unfused
    model holds it); stats_out [M, STATS_LANES] fp64: the new residual's squares added across the
    lanes (their sum is the row's). Returns residual."""
    _check(residual.dim() == 2 and residual.shape == (x.shape[0], w.out_features) and residual.stride(1) == 1
           and residual.dtype == x.dtype and residual.device == x.device,
           f"residual must be [{x.shape[0]}, {w.out_features}] {x.dtype} with a contiguous last dim, got "
           f"{list(residual.shape)} {residual.dtype}")
    return _launch(x, w, residual, RESIDUAL, None, 0.0, stats_out, pdl=pdl, tiles=tiles)


def gemv_silu(x: torch.Tensor, w: GemvWeight, stats_in: torch.Tensor, eps: float,
              pdl: bool | None = None, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """silu(g) * u of y = rstd(x) * (x @ W^T), W = [gate rows | up rows] [2I, K] -> [M, I]."""
    out = torch.empty((x.shape[0], w.out_features // 2), dtype=x.dtype, device=x.device)
    return _launch(x, w, out, SILU, stats_in, eps, pdl=pdl, tiles=tiles)


def gemv_rope_kv(x: torch.Tensor, w: GemvWeight, stats_in: torch.Tensor, eps: float, rope: RopeKV,
                 pdl: bool | None = None, tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """qkv = rstd(x) * (x @ W_qkv^T) [M, (H + 2 Hkv) D] with q and k rotated (RoPE at rope.positions)
    and the rotated k and v written to their slots of rope.k_cache / v_cache."""
    m = x.shape[0]
    heads = rope.num_heads + 2 * rope.num_kv_heads
    n = w.out_features
    _check(rope.num_heads > 0 and rope.num_kv_heads > 0 and n % heads == 0,
           f"{n} qkv rows are not {rope.num_heads} + 2 x {rope.num_kv_heads} heads")
    d = n // heads
    _check(d % 2 == 0 and tuple(rope.k_cache.shape[2:]) == (rope.num_kv_heads, d)
           and rope.v_cache.shape == rope.k_cache.shape
           and rope.k_cache.is_contiguous() and rope.v_cache.is_contiguous()
           and supports_cache(rope.k_cache) and rope.v_cache.dtype == rope.k_cache.dtype,
           f"caches [blocks, block_size, {rope.num_kv_heads}, {d}] contiguous, one supported dtype; got "
           f"{list(rope.k_cache.shape)} {rope.k_cache.dtype} / {list(rope.v_cache.shape)} {rope.v_cache.dtype}")
    for name, t in (("positions", rope.positions), ("slot_mapping", rope.slot_mapping)):
        _check(t.dim() == 1 and t.shape[0] == m and t.dtype == torch.int64 and t.is_contiguous(),
               f"{name} must be contiguous int64 [{m}], got {t.dtype} {list(t.shape)}")
    _check(rope.cos_sin.dim() == 2 and rope.cos_sin.shape[1] == d and rope.cos_sin.dtype == torch.float32
           and rope.cos_sin.is_contiguous(), f"cos_sin must be contiguous fp32 [max_pos, {d}]")
    rows = rope.cos_sin_rows
    _check(rows is None or (rows.shape == (m, d) and rows.dtype == torch.float32 and rows.is_contiguous()),
           f"cos_sin_rows must be contiguous fp32 [{m}, {d}] (cos_sin[positions])")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    return _launch(x, w, out, ROPE, stats_in, eps, rope=rope, pdl=pdl, tiles=tiles)


def gemv_fused_reference(x: torch.Tensor, weight: torch.Tensor, epilogue: int, stats_in: torch.Tensor | None = None,
                         eps: float = 0.0, residual: torch.Tensor | None = None, rope: RopeKV | None = None):
    """The same math in PyTorch over a dense weight [N, K] (dequantized for the integer formats):
    stats_in [M, lanes] is summed over its lanes.
    RESIDUAL -> (new residual, its row sums of squares in fp64), without touching `residual`;
    SILU -> act [M, I]; ROPE -> qkv [M, N], writing rope's caches in place (slots < 0 skipped)."""
    m, k = x.shape
    y = x.float() @ weight.float().t()                                    # [M, N] fp32
    if stats_in is not None:
        y = y * torch.rsqrt(stats_in.sum(-1).float()[:, None] / k + eps)
    if epilogue == RESIDUAL:
        h = (residual.float() + y).to(residual.dtype)
        return h, h.double().pow(2).sum(1)
    if epilogue == SILU:
        i = y.shape[1] // 2
        return (torch.nn.functional.silu(y[:, :i]) * y[:, i:]).to(x.dtype)
    h, hkv = rope.num_heads, rope.num_kv_heads
    heads = y.view(m, h + 2 * hkv, -1)
    half = heads.shape[-1] // 2
    cos_sin = rope.cos_sin[rope.positions]                                # [M, D]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    qk = heads[:, :h + hkv]
    rotated = torch.cat((qk[..., :half] * cos - qk[..., half:] * sin, qk[..., half:] * cos + qk[..., :half] * sin), -1)
    qkv = torch.cat((rotated, heads[:, h + hkv:]), 1).to(x.dtype)           # [M, H + 2 Hkv, D]
    write_kv_cache_reference(qkv[:, h:h + hkv], qkv[:, h + hkv:], rope.k_cache, rope.v_cache, rope.slot_mapping)
    return qkv.view(m, -1)
