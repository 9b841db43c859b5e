"""Weight-only quantized matrix-vector product for decode (a few rows): W8A16 / W4A16 on CUDA cores.

Same formats as kernels/quant_matmul.py (codes uint8 [N, K] or nibble-packed [N, K / 2], fp32
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
`gemv`, the batch-1 path of unquantized linears, 2 rows x 1024 columns per step, which beats
cuBLAS on every 7B shape at M=1 (bench/NOTES.md run 22: 104.6 vs 119 us per layer).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import (
    grid_dependency_launch,
    grid_dependency_wait,
    pdl_options,
    use_pdl,
)

# Up to this many rows the GEMV beats the tensor-core kernel (H200, bench/quant_gpu.py --sections
# gemv: int8 qkv at 2 rows 29 vs 47 us, at 4 rows 53 vs 48 us). Each row re-reads the codes, so
# only one row runs at the codes' full rate: 1.3-1.5x bf16 cuBLAS at int8.
GEMV_MAX_ROWS = 2


@triton.jit
def _quant_gemv_kernel(
    X, QW, S, Z, OUT, N, K, group_len, num_groups,
    stride_xm, stride_qn, stride_sn, stride_om,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (kernels/triton_utils.py)
):
    grid_dependency_wait(PDL)
    GROUPS_PER_TILE: tl.constexpr = BLOCK_K // GROUP_TILE
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    x_row = X + m * stride_xm
    q_rows = QW + rn.to(tl.int64)[:, None] * stride_qn                       # [BLOCK_N, 1]
    # Tried on the H200 (bench/NOTES.md runs 17-18): an element-wise accumulator summed once after
    # the loop (holds BLOCK_N x BLOCK_K fp32 and spills: 2x slower) and int-to-float replaced by
    # the 2^23 mantissa trick (3-7% slower). Each slab's products are summed as it arrives.
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if BITS == 16:
            rk = k0 + tl.arange(0, BLOCK_K)
            k_mask = rk < K
            x = tl.load(x_row + rk, mask=k_mask, other=0.0).to(tl.float32)                 # [BLOCK_K]
            w = tl.load(q_rows + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
        else:
            g = (k0 + tl.arange(0, GROUPS_PER_TILE) * GROUP_TILE) // group_len  # [GPT] the slab's groups
            gn_mask = n_mask[:, None] & (g < num_groups)[None, :]
            s = tl.load(S + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)   # [BLOCK_N, GPT]
            z = tl.load(Z + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)
            if BITS == 8:
                rk = k0 + tl.arange(0, BLOCK_K)
                k_mask = rk < K
                x = tl.load(x_row + rk, mask=k_mask, other=0.0).to(tl.float32)             # [BLOCK_K]
                q = tl.load(q_rows + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
                prod = q.to(tl.float32) * x[None, :]                                  # [BLOCK_N, BLOCK_K]
                part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE]), 2)
                x_sum = tl.sum(tl.reshape(x, [GROUPS_PER_TILE, GROUP_TILE]), 1)            # [GPT]
            else:
                j = tl.arange(0, BLOCK_K // 2)
                ke = k0 + 2 * j                                            # the slab's even columns
                k_mask = ke < K
                x_even = tl.load(x_row + ke, mask=k_mask, other=0.0).to(tl.float32)        # [BLOCK_K / 2]
                x_odd = tl.load(x_row + ke + 1, mask=k_mask, other=0.0).to(tl.float32)
                qb = tl.load(q_rows + (k0 // 2 + j)[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
                prod = (qb & 0xF).to(tl.float32) * x_even[None, :] + (qb >> 4).to(tl.float32) * x_odd[None, :]
                part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE // 2]), 2)
                x_sum = tl.sum(tl.reshape(x_even + x_odd, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
            acc += tl.sum(s * (part - z * x_sum[None, :]), 1)
    grid_dependency_launch(PDL)        # late: the next kernel's programs only overlap this one's tail
    tl.store(OUT + m * stride_om + rn, acc.to(OUT.dtype.element_ty), mask=n_mask)


def choose_gemv_tiles(n: int, k: int, bits: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps), the leaders of the H200 sweeps at M=1 (bench/NOTES.md runs
    16 and 19): int8 the longest K slab, 8 rows x 4 warps on the 4096-row shapes, 16 x 2 on the
    wide ones; int4 16 rows, 512-column slabs on the wide shapes and 1024 with 8 warps on the rest."""
    block_k = min(1024, triton.next_power_of_2(k))
    if bits == 16:
        return (2, block_k, 4)
    if bits == 8:
        return (8, block_k, 4) if n <= 4096 else (16, block_k, 2)
    return (16, block_k, 8) if n <= 4096 else (16, min(512, block_k), 2 if n < 16384 else 4)


def quant_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
               group_len: int, tiles: tuple[int, int] | None = None, num_warps: int | None = None,
               pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] (few rows, last dim contiguous) -> y [M, N] in x's dtype. Inputs are checked by
    quant_matmul, which dispatches here; group_len is K for per-channel scales.

    pdl: a programmatic dependent launch (default: where the GPU has it, kernels/triton_utils.py),
    letting the next kernel launch only after this one's loop (bench/NOTES.md runs 22-26)."""
    m, k = x.shape
    n = qweight.shape[0]
    block_n, block_k, default_warps = choose_gemv_tiles(n, k, bits)
    if tiles is not None:
        block_n, block_k = tiles
    per_channel = group_len >= k                 # one group: every slab lies in it
    group_tile = block_k if per_channel else min(group_len, block_k)
    if not per_channel and (block_k % group_tile or group_len % group_tile):
        raise ValueError(f"quant_gemv: BLOCK_K {block_k} and the group length {group_len} must nest")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (m, triton.cdiv(n, block_n))
    pdl = use_pdl(x, pdl)
    _quant_gemv_kernel[grid](
        x, qweight, scales, zeros, out, n, k, group_len, scales.shape[1],
        x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_TILE=group_tile, PDL=pdl,
        num_warps=num_warps or default_warps, **pdl_options(pdl))
    return out


def gemv(x: torch.Tensor, weight: torch.Tensor, tiles: tuple[int, int] | None = None,
         num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] times a plain weight [N, K] of x's dtype (contiguous) -> y [M, N]: F.linear
    without bias as one Triton GEMV; each row streams the weight again, so M = 1 is its case."""
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"gemv: want x [M, K] with a contiguous last dim and a contiguous weight [N, K], "
                         f"got {tuple(x.shape)} / {tuple(weight.shape)}")
    k = x.shape[1]
    if weight.shape[1] != k or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} {weight.dtype} does not take x {tuple(x.shape)} {x.dtype}")
    return quant_gemv(x, weight, weight, weight, 16, k, tiles=tiles, num_warps=num_warps, pdl=pdl)
