"""Weight-only quantized matrix-vector product for decode (a few rows): W8A16 / W4A16 on CUDA cores.

Same formats as inference/kernels/quant_matmul.py (codes uint8 [N, K] or nibble-packed [N, K / 2], fp32
scales / zeros [N, G]). At batch 1 a tensor-core tile of 16 rows wastes 15/16 of its work and
the kernel is bound by how fast the codes stream in, so this one takes one activation row per
program and a [BLOCK_N, BLOCK_K] slab of codes per step, with no split-K (no atomics, no fp32
output to zero and cast):

    grid (M, cdiv(N, BLOCK_N))       each row streams the codes again, so only batch 1 runs at
                                     their rate (GEMV_MAX_ROWS)

    slab [BLOCK_N, BLOCK_K] = GROUPS_PER_TILE groups of GROUP_TILE columns:
      part[n, g] = sum_k x[k] * q[n, k]             (per group, in fp32)
      acc[n]    += sum_g s[n, g] * (part[n, g] - z[n, g] * sum_k x[k])

BITS=16 streams a plain float weight [N, K] (the model's dtype) through the same loop, no groups:
`gemv`, the batch-1 path of unquantized linears, 2 rows x 4096 columns per step (2 warps), which
beats cuBLAS on every 7B shape at M=1 (bench/journal/2026-12-01-batch1-decode-profile.md, run 22;
bench/journal/2026-12-02-gemv-tiles-and-fused-layer.md, run 35).

How codes become numbers (CONVERT, `quant_gemv(..., convert=)`; at one conversion per code (0) the
GEMV is bound by instructions, not bytes, so 1-3 convert two or more codes an instruction: runs 16-19
of bench/journal/2026-12-01-quantized-weights.md, run 30 of
bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md):

    0  u8 -> fp32 per code (I2F, 16 a clock per SM on Hopper), fp32 FMA with x
    1  fp16 magic: PRMT (int8) / LOP3 (int4) puts codes into the mantissa of fp16 1024 (0x6400),
       two a register, SUB.F16X2 / FMA.F16X2 makes them exact codes, fp16 -> fp32 (HADD2.F32,
       full rate), fp32 FMA: same numbers as 0
    2  as 1 without the subtract: 1024 + q (int4 odd columns: 1024 + 16 q, x / 16) in fp32, the
       offset taken off per group with the zero point (~7 bits of fp32 cancel: ~1e-5 relative)
    3  HFMA2: 8 codes a call (an int4 32-bit word / an int8 64-bit word), exact fp16 codes times
       fp16 x pairs in HFMA2, two lanes of 4 products each summed in fp32; x is scaled by a power
       of two per program so that a lane cannot overflow fp16 (|x| < 2^9 int4, 2^5 int8); fp16
       products: ~1e-3 relative error per 8-code chunk (the bf16 output rounds at 4e-3)

Defaults (`choose_convert`, the H200 sweep of run 30): int8 2, int4 3 (1 where its
words do not fit), 1 for fp32 activations. 1-3 are PTX (inference/kernels/gemv_codes.py) on the GPU; under
the interpreter (CPU) the same bit operations run as Triton integer / fp16 ops (EMULATE), so the
CPU tests check the layout logic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from inference.kernels.gemv_codes import (
    _chunks_hfma2,
    _codes4,
    _codes8,
    _x_pow2_scale,
)
from inference.kernels.triton_utils import (
    grid_dependency_launch,
    grid_dependency_wait,
    pdl_options,
    use_pdl,
)

# Up to this many rows the GEMV beats the tensor-core kernel; at 4 it is behind (H200, bench/gpu/quant_gpu.py
# --sections gemv: bench/journal/2026-12-01-quantized-weights.md, run 16). Each row re-reads the codes,
# so only one row runs at the codes' full rate.
GEMV_MAX_ROWS = 2

CONVERTS = (0, 1, 2, 3)
# Rows a program under the interpreter (the CPU tests), which pays per program (gemv_config): the GPU's
# 2-16 rows would make a tiny model's LM head 16k programs a step there.
INTERPRETER_ROWS = 64

@triton.jit
def _load_codes(q_rows, w_rows, k0, K, n_mask, BITS: tl.constexpr, BLOCK_K: tl.constexpr, CONVERT: tl.constexpr):
    """The slab's codes from column k0: [BLOCK_N, BLOCK_K] weights (BITS 16) / bytes (8),
    [BLOCK_N, BLOCK_K / 2] bytes (4), or [BLOCK_N, BLOCK_K / 8] words of 8 codes (CONVERT 3)."""
    if CONVERT == 3:
        c = tl.arange(0, BLOCK_K // 8)
        codes = tl.load(w_rows + (k0 // 8 + c)[None, :], mask=n_mask[:, None] & (k0 + 8 * c < K)[None, :], other=0)
    elif BITS == 4:
        j = tl.arange(0, BLOCK_K // 2)
        codes = tl.load(q_rows + (k0 // 2 + j)[None, :], mask=n_mask[:, None] & (k0 + 2 * j < K)[None, :], other=0)
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
        codes = tl.load(q_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0)
    return codes


@triton.jit
def _slab(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
          BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
          CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """One slab's contribution to the rows' sums [BLOCK_N], from its codes (_load_codes)."""
    if BITS == 16:
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)                     # [BLOCK_K]
        w = codes
        if w.dtype == tl.float8e4nv:             # e4m3 -> fp16: one packed cvt per two values
            w = w.to(tl.float16)
        res = tl.sum(w.to(tl.float32) * x[None, :], 1)
    else:
        res = _group_sums(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                          BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE)
    return res


@triton.jit
def _group_sums(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
                CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """sum_g s[n, g] * (part[n, g] - z[n, g] * sum_k x[k]) over the slab's groups (BITS 8, 4)."""
    GROUPS_PER_TILE: tl.constexpr = BLOCK_K // GROUP_TILE
    g = (k0 + tl.arange(0, GROUPS_PER_TILE) * GROUP_TILE) // group_len      # [GPT] the slab's groups
    gn_mask = n_mask[:, None] & (g < num_groups)[None, :]
    s = tl.load(S + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)       # [BLOCK_N, GPT]
    z = tl.load(Z + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)
    if CONVERT == 3:
        kc = k0 + 8 * tl.arange(0, BLOCK_K // 8)                           # each chunk's first column
        chunk, x_chunk = _chunks_hfma2(codes, x_row, kc, K, x_scale, BITS, EMULATE)   # [BLOCK_N, BLOCK_K / 8]
        part = tl.sum(tl.reshape(chunk, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE // 8]), 2)
        x_sum = tl.sum(tl.reshape(x_chunk, [GROUPS_PER_TILE, GROUP_TILE // 8]), 1)      # of the scaled x
    elif BITS == 8:
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)                 # [BLOCK_K]
        prod = _codes8(codes, CONVERT, EMULATE) * x[None, :]                       # [BLOCK_N, BLOCK_K]
        part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE]), 2)
        x_sum = tl.sum(tl.reshape(x, [GROUPS_PER_TILE, GROUP_TILE]), 1)                # [GPT]
        if CONVERT == 2:                                                   # the codes came as 1024 + q
            part = part - 1024.0 * x_sum[None, :]
    else:
        ke = k0 + 2 * tl.arange(0, BLOCK_K // 2)                           # the slab's even columns
        x_even = tl.load(x_row + ke, mask=ke < K, other=0.0).to(tl.float32)            # [BLOCK_K / 2]
        x_odd = tl.load(x_row + ke + 1, mask=ke < K, other=0.0).to(tl.float32)
        q_even, q_odd = _codes4(codes, CONVERT, EMULATE)
        if CONVERT == 2:                                # odd codes come as 1024 + 16 q: x / 16 (exact)
            prod = q_even * x_even[None, :] + q_odd * (x_odd * 0.0625)[None, :]
        else:
            prod = q_even * x_even[None, :] + q_odd * x_odd[None, :]
        part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE // 2]), 2)
        if CONVERT == 2:                                # 1024 + q_even and (1024 + 16 q_odd) / 16
            xe_sum = tl.sum(tl.reshape(x_even, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
            xo_sum = tl.sum(tl.reshape(x_odd, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
            x_sum = xe_sum + xo_sum
            part = part - (1024.0 * xe_sum + 64.0 * xo_sum)[None, :]
        else:
            x_sum = tl.sum(tl.reshape(x_even + x_odd, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
    return tl.sum(s * (part - z * x_sum[None, :]), 1)


@triton.jit
def _row_sums(x_row, QW, S, Z, rn, n_mask, K, group_len, num_groups, stride_qn, stride_sn,
              BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
              CONVERT: tl.constexpr, EMULATE: tl.constexpr, FP8: tl.constexpr):
    """sum_k x[k] * W[n, k] in fp32 for the rows rn [BLOCK_N] of one weight: codes QW [N, K'],
    group parameters S / Z [N, G] (per row for FP8); the loop of `_quant_gemv_kernel`, shared with
    the quantized experts' GEMVs (inference/kernels/fused_moe.py)."""
    q_rows = QW + rn.to(tl.int64)[:, None] * stride_qn                       # [BLOCK_N, 1]
    w_rows = q_rows
    if CONVERT == 3:                                                         # words of 8 codes
        if BITS == 8:
            w_rows = QW.to(tl.pointer_type(tl.int64)) + rn.to(tl.int64)[:, None] * (stride_qn // 8)
        else:
            w_rows = QW.to(tl.pointer_type(tl.int32)) + rn.to(tl.int64)[:, None] * (stride_qn // 4)
    x_scale = 1.0
    x_unscale = 1.0
    if CONVERT == 3:                       # gemv_codes.HFMA2_X_MAX_LOG2: a lane of 4 products fits fp16
        x_scale, x_unscale = _x_pow2_scale(x_row, K, BLOCK_K, 9 if BITS == 4 else 5)
    # Each slab's products are summed as it arrives. Slower on the H200: an element-wise
    # accumulator summed once after the loop (BLOCK_N x BLOCK_K fp32 spills), the 2^23 mantissa
    # trick instead of int-to-float (bench/journal/2026-12-01-quantized-weights.md, runs 17-18), the
    # next slab's codes loaded before this slab's products (2026-12-02-gemv-tiles-and-fused-layer.md,
    # run 35). Loading the first slab's codes before the PDL wait gains nothing
    # (2026-12-01-fp8-regression-and-gemv-conversions.md, run 27).
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        codes = _load_codes(q_rows, w_rows, k0, K, n_mask, BITS, BLOCK_K, CONVERT)
        if FP8:
            codes = codes.to(tl.float8e4nv, bitcast=True)
        acc += _slab(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                     BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE)
    if CONVERT == 3:
        acc = acc * x_unscale
    if FP8:
        acc = acc * tl.load(S + rn, mask=n_mask, other=0.0)
    return acc


@triton.jit
def _quant_gemv_kernel(
    X, QW, S, Z, OUT, M, N, K, group_len, num_groups,
    stride_xm, stride_qn, stride_sn, stride_om,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
    CONVERT: tl.constexpr,      # how codes become numbers (module docstring); 0 for BITS=16
    EMULATE: tl.constexpr,      # interpreter: CONVERT 1-3's PTX as Triton ops
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (inference/kernels/triton_utils.py)
    FP8: tl.constexpr,          # BITS 16 with e4m3 codes (passed as bytes), the sums times S[n]
):
    # one grid axis (a y / z axis stops at 65535 blocks: a 152k-row LM head at 2 rows a program
    # needs 76k), rows of x fastest so that the M programs of a weight block run side by side and
    # the second one reads it from L2
    pid = tl.program_id(0)
    m = (pid % M).to(tl.int64)
    rn = (pid // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    grid_dependency_wait(PDL)
    acc = _row_sums(X + m * stride_xm, QW, S, Z, rn, n_mask, K, group_len, num_groups, stride_qn, stride_sn,
                    BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE, FP8)
    grid_dependency_launch(PDL)        # late: the next kernel's programs only overlap this one's tail
    tl.store(OUT + m * stride_om + rn, acc.to(OUT.dtype.element_ty), mask=n_mask)


def choose_gemv_tiles(n: int, k: int, bits: int, fp8: bool = False) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps), the leaders of the H200 sweeps at M=1 for each format's
    default conversion (bench/journal/2026-12-02-gemv-tiles-and-fused-layer.md, run 35; earlier
    sweeps: runs 16, 19, 22 and 30):
      bf16           2 rows x 4096 columns x 2 warps
      int8, fp8      4 x 2048 x 2 on every 7B shape: more programs than 8-row tiles and more bytes
                     in flight a thread
      int4           8 x 4096 x 4 up to 4096 rows, 16 x 1024 x 4 on the wide shapes, 16 x 512 x 2
                     from 16k rows."""
    if bits == 8 or fp8:
        return (4, min(2048, triton.next_power_of_2(k)), 2)
    if bits == 16:
        return (2, min(4096, triton.next_power_of_2(k)), 2)
    if n <= 4096:
        return (8, min(4096, triton.next_power_of_2(k)), 4)
    block_k = min(1024, triton.next_power_of_2(k))
    return (16, block_k, 4) if n < 16384 else (16, min(512, block_k), 2)


def choose_convert(bits: int, k: int, block_k: int, group_tile: int, qweight: torch.Tensor,
                   x_dtype: torch.dtype) -> int:
    """The default conversion, by the H200 sweep (bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md,
    run 30, M=1 on the 7B shapes): int8 CONVERT 2, int4 CONVERT 3 where its 8-code words fit the
    rows, else 1 (exact, like 0, and faster).
    fp32 activations (the exactness mode) take 1: the same numbers as 0."""
    if bits == 16:
        return 0
    if x_dtype == torch.float32:
        return 1
    if bits == 8:
        return 2
    return 3 if _words_fit(bits, k, block_k, group_tile, qweight) else 1


def _words_fit(bits: int, k: int, block_k: int, group_tile: int, qweight: torch.Tensor) -> bool:
    """Whether CONVERT 3's 8-code words (int8: 8 bytes, int4: 4) tile the rows, slabs and groups."""
    word = 8 if bits == 8 else 4
    strides = qweight.stride()[:-1]              # rows (and experts, for stacked [E, N, K'] codes)
    return not (k % 8 or block_k % 8 or group_tile % 8 or any(st % word for st in strides) or qweight.data_ptr() % word)


def check_convert(convert: int, bits: int, k: int, block_k: int, group_tile: int, qweight: torch.Tensor) -> None:
    """CONVERT 1-3 are for the quantized formats; 3 reads the codes as 8-code words (int8: 8
    bytes, int4: 4), so rows, slabs and groups must hold whole words."""
    if convert not in CONVERTS:
        raise ValueError(f"quant_gemv: convert must be one of {CONVERTS}, got {convert!r}")
    if convert and bits == 16:
        raise ValueError("quant_gemv: convert applies to int8 / int4 codes, not to a plain weight")
    if convert == 3 and not _words_fit(bits, k, block_k, group_tile, qweight):
        word = 8 if bits == 8 else 4
        raise ValueError(f"quant_gemv: convert=3 reads {word}-byte words of 8 codes: wants K, BLOCK_K and the "
                         f"group tile divisible by 8 and aligned rows; got K {k}, BLOCK_K {block_k}, "
                         f"group tile {group_tile}, row stride {qweight.stride(0)}")


def quant_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
               group_len: int, tiles: tuple[int, int] | None = None, num_warps: int | None = None,
               pdl: bool | None = None, convert: int | None = None, fp8: bool = False) -> torch.Tensor:
    """x [M, K] (few rows, last dim contiguous) -> y [M, N] in x's dtype. Inputs are checked by
    quant_matmul, which dispatches here; group_len is K for per-channel scales.

    pdl: a programmatic dependent launch (default: where the GPU has it, inference/kernels/triton_utils.py),
    letting the next kernel launch only after this one's loop: launched at the GEMV's start it
    slows the GEMV (bench/journal/2026-12-01-batch1-decode-profile.md, runs 22-26).
    fp8: BITS 16 with e4m3 codes (qweight as uint8 bytes) and one fp32 scale a row in `scales` (`gemv_fp8`).
    convert: how codes become numbers (CONVERTS, the module docstring; default `choose_convert`);
    3 wants K % 8 == 0."""
    m, k = x.shape
    n = qweight.shape[0]
    cfg = gemv_config(n, k, bits, group_len, qweight, x.dtype, tiles, num_warps, convert, fp8)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (m * triton.cdiv(n, cfg["BLOCK_N"]),)
    pdl = use_pdl(x, pdl)
    _quant_gemv_kernel[grid](
        x, qweight, scales, zeros, out, m, n, k, group_len, scales.shape[1],
        x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        EMULATE=x.device.type != "cuda", PDL=pdl, FP8=fp8, **cfg, **pdl_options(pdl))
    return out


def gemv_config(n: int, k: int, bits: int, group_len: int, qweight: torch.Tensor, x_dtype: torch.dtype,
                tiles: tuple[int, int] | None = None, num_warps: int | None = None, convert: int | None = None,
                fp8: bool = False) -> dict:
    """The GEMV's launch constants for N rows of K columns (BITS, BLOCK_N, BLOCK_K, GROUP_TILE,
    CONVERT, num_warps): the defaults of choose_gemv_tiles / choose_convert, or the given ones,
    checked. group_len >= k means one group a row (per channel). Under the interpreter (codes
    off the GPU) the default tiles take INTERPRETER_ROWS rows: each program there costs
    milliseconds of Python, whatever its size."""
    block_n, block_k, default_warps = choose_gemv_tiles(n, k, bits, fp8)
    if tiles is not None:
        block_n, block_k = tiles
    elif qweight.device.type != "cuda":
        block_n = max(block_n, min(INTERPRETER_ROWS, triton.next_power_of_2(n)))
    per_channel = group_len >= k                 # one group: every slab lies in it
    group_tile = block_k if per_channel else min(group_len, block_k)
    if not per_channel and (block_k % group_tile or group_len % group_tile):
        raise ValueError(f"quant_gemv: BLOCK_K {block_k} and the group length {group_len} must nest")
    if convert is None:
        convert = choose_convert(bits, k, block_k, group_tile, qweight, x_dtype)
    else:
        check_convert(convert, bits, k, block_k, group_tile, qweight)
    return {"BITS": bits, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_TILE": group_tile, "CONVERT": convert,
            "num_warps": num_warps or default_warps}


@dataclass(frozen=True)
class GemvWeight:
    """A linear's weight as the decode GEMV streams it (inference/kernels/quant_gemv.py's formats): a plain
    weight [N, K] (bits 16), int8 / int4 codes with fp32 group scales / zeros, or e4m3 codes
    (as uint8) with one fp32 scale a row (fp8)."""
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group_len: int
    fp8: bool = False

    @staticmethod
    def plain(weight: torch.Tensor) -> GemvWeight:
        return GemvWeight(weight, weight, weight, 16, weight.shape[1])

    @staticmethod
    def e4m3(weight: torch.Tensor, scale: torch.Tensor) -> GemvWeight:
        """weight e4m3 [N, K], scale N fp32 values (one a row)."""
        n, k = weight.shape
        return GemvWeight(weight.view(torch.uint8), scale.view(n, 1), scale, 16, k, fp8=True)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]


def gemv(x: torch.Tensor, weight: torch.Tensor, tiles: tuple[int, int] | None = None,
         num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] times a plain weight [N, K] of x's dtype (contiguous) -> y [M, N]: F.linear
    without bias as one Triton GEMV; each row streams the weight again, so M = 1 is its case."""
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"gemv: want x [M, K] with a contiguous last dim and a contiguous weight [N, K], "
                         f"got {tuple(x.shape)} / {tuple(weight.shape)}")
    k = x.shape[1]
    if weight.shape[1] != k or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} {weight.dtype} "
                         f"does not take x {tuple(x.shape)} {x.dtype}")
    return _stream(x, GemvWeight.plain(weight), tiles, num_warps, pdl)


def gemv_fp8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, tiles: tuple[int, int] | None = None,
             num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) times an e4m3 weight [N, K] with one fp32 scale per output row
    (`scale`: N contiguous values, e.g. [1, N] or [N, 1]) -> y [M, N] in x's dtype. Weight-only
    FP8 for decode: at one row cuBLASLt's FP8 GEMM runs a 128-row tile and the activation must be
    quantized first, two kernels a linear; this streams the e4m3 codes once, with x unquantized
    (bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md, runs 28 and 31)."""
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"gemv_fp8: want x [M, K] with a contiguous last dim and a contiguous weight [N, K], "
                         f"got {tuple(x.shape)} / {tuple(weight.shape)}")
    n, k = weight.shape
    if (weight.dtype != torch.float8_e4m3fn or x.dtype not in (torch.bfloat16, torch.float16)
            or x.shape[1] != k or scale.numel() != n or scale.dtype != torch.float32 or not scale.is_contiguous()):
        raise ValueError(f"gemv_fp8: want x [M, {k}] bf16/fp16, an e4m3 weight [N, K] and {n} contiguous fp32 scales; "
                         f"got x {tuple(x.shape)} {x.dtype}, weight {weight.dtype}, "
                         f"scale {tuple(scale.shape)} {scale.dtype}")
    return _stream(x, GemvWeight.e4m3(weight, scale), tiles, num_warps, pdl)


def _stream(x: torch.Tensor, w: GemvWeight, tiles, num_warps, pdl) -> torch.Tensor:
    return quant_gemv(x, w.qweight, w.scales, w.zeros, w.bits, w.group_len, tiles=tiles, num_warps=num_warps,
                      pdl=pdl, fp8=w.fp8)
