"""Weight-only quantized matmul (W8A16 / W4A16): Triton kernel, PyTorch reference, wrapper.

    y [M, N] = x [M, K] @ W^T,   W[n, k] = s[n, g] * (q[n, k] - z[n, g]),   g = k // group_len

    codes    uint8 [N, K] (8-bit) or [N, K / 2] (4-bit: low nibble = even k, high = odd k)
    scales   fp32 [N, G]        zeros  fp32 [N, G]

The codes are never dequantized element by element: a K tile lies inside one group, so
x_tile @ (q - z)^T * s = (x_tile @ q^T - sum_k(x_tile) * z) * s, one tensor-core dot on the raw
codes (0..255 are exact in bf16/fp16) and a rank-1 correction. 4-bit tiles multiply the even
and the odd columns of x by the two nibbles. Skinny (decode) shapes split K across programs
(SPLIT_K) and add their partial sums atomically into an fp32 output. From DEQUANT_MIN_ROWS rows
the weight is dequantized in one pass and multiplied by cuBLAS instead; up to GEMV_MAX_ROWS
rows (batch-1 decode) a CUDA-core GEMV streams the codes instead (inference/kernels/quant_gemv.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.quant_gemv import GEMV_MAX_ROWS, quant_gemv
from inference.kernels.triton_utils import dot, dot_fp32

# From this many rows (prefill) the fused kernel loses to dequantize + cuBLAS: it does not pipeline
# the code tiles (bench/journal/2026-12-01-quantized-weights.md, runs 14-15).
DEQUANT_MIN_ROWS = 256


@triton.jit
def _quant_matmul_kernel(
    X, QW, S, Z, OUT,
    M, N, K, group_len, k_per_split,
    stride_xm, stride_qn, stride_sn, stride_om,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rm < M, rn < N
    x_rows = X + rm.to(tl.int64)[:, None] * stride_xm                     # [BLOCK_M, 1]
    q_rows = QW + rn.to(tl.int64)[:, None] * stride_qn                    # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        g = k0 // group_len                                                # the tile's group
        s = tl.load(S + rn * stride_sn + g, mask=n_mask, other=0.0)        # [BLOCK_N]
        z = tl.load(Z + rn * stride_sn + g, mask=n_mask, other=0.0)
        if BITS == 8:
            rk = k0 + tl.arange(0, BLOCK_K)
            k_mask = rk < k_end
            x = tl.load(x_rows + rk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            q = tl.load(q_rows + rk[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
            part = dot(x, tl.trans(q.to(tl.float32).to(x.dtype)), DOT_FP32)    # [BLOCK_M, BLOCK_N]
            x_sum = tl.sum(x.to(tl.float32), 1)
        else:
            j = tl.arange(0, BLOCK_K // 2)
            ke = k0 + 2 * j                                                # even columns of the tile
            k_mask = ke < k_end
            xm = m_mask[:, None] & k_mask[None, :]
            x_even = tl.load(x_rows + ke[None, :], mask=xm, other=0.0)
            x_odd = tl.load(x_rows + ke[None, :] + 1, mask=xm, other=0.0)
            qb = tl.load(q_rows + (k0 // 2 + j)[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0)
            lo = (qb & 0xF).to(tl.float32).to(x_even.dtype)      # via fp32: the interpreter mis-converts u8 -> bf16
            hi = (qb >> 4).to(tl.float32).to(x_even.dtype)
            part = dot(x_even, tl.trans(lo), DOT_FP32) + dot(x_odd, tl.trans(hi), DOT_FP32)
            x_sum = tl.sum(x_even.to(tl.float32), 1) + tl.sum(x_odd.to(tl.float32), 1)
        acc += (part - x_sum[:, None] * z[None, :]) * s[None, :]
    out = OUT + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    o_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=o_mask)
    else:
        tl.atomic_add(out, acc, mask=o_mask)


@triton.jit
def _dequantize_kernel(QW, S, Z, W, K, group_len, stride_qn, stride_sn, stride_wn,
                       BITS: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row block of W [N, K] = s * (q - z) in W's dtype (for large M: then a cuBLAS matmul)."""
    n = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = k < K
    if BITS == 8:
        q = tl.load(QW + n * stride_qn + k, mask=mask, other=0).to(tl.float32)
    else:
        byte = tl.load(QW + n * stride_qn + k // 2, mask=mask, other=0)
        q = ((byte >> ((k % 2) * 4).to(tl.uint8)) & 0xF).to(tl.float32)
    g = k // group_len
    s = tl.load(S + n * stride_sn + g, mask=mask, other=0.0)
    z = tl.load(Z + n * stride_sn + g, mask=mask, other=0.0)
    tl.store(W + n * stride_wn + k, ((q - z) * s).to(W.dtype.element_ty), mask=mask)


def dequantize_weight(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, group_len: int,
                      in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype from codes + group parameters (one pass)."""
    n = qweight.shape[0]
    w = torch.empty((n, in_features), dtype=dtype, device=qweight.device)
    block = 1024
    _dequantize_kernel[(n, triton.cdiv(in_features, block))](
        qweight, scales, zeros, w, in_features, group_len, qweight.stride(0), scales.stride(0), w.stride(0),
        BITS=bits, BLOCK_K=block, num_warps=4)
    return w


def quant_matmul_reference(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                           group_len: int) -> torch.Tensor:
    """fp32 dequantize-then-matmul; codes are unpacked uint8 [N, K]. Returns x's dtype."""
    n, k = codes.shape
    s = scales.repeat_interleave(group_len, 1)[:, :k]
    z = zeros.repeat_interleave(group_len, 1)[:, :k]
    return (x.float() @ ((codes.float() - z) * s).t()).to(x.dtype)


def choose_tiles(m: int, n: int, k: int, group_len: int, num_sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K): a K tile never crosses a group; skinny shapes
    split K until there are about two programs per SM."""
    # the H200 sweep at M=1 (bench/journal/2026-12-01-quantized-weights.md, run 15): 128-wide N
    # tiles, the longest K tile a group allows (256 for per-channel int8), split-K within noise of none
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 128
    block_k = 256 if group_len >= k else min(256, group_len)
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while programs * split * 2 <= 2 * num_sms and k // (split * 2) >= 4 * block_k:
        split *= 2
    return block_m, block_n, block_k, split


def quant_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
                 group_len: int, out_features: int | None = None, tiles: tuple[int, int, int, int] | None = None,
                 num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """x [M, K] (fp32/bf16/fp16, last dim contiguous) -> y [M, N] in x's dtype."""
    if bits not in (4, 8):
        raise ValueError(f"quant_matmul: bits must be 4 or 8, got {bits}")
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"quant_matmul: x must be 2-D with a contiguous last dim, got {tuple(x.shape)}")
    m, k = x.shape
    n = qweight.shape[0]
    if qweight.dtype != torch.uint8 or qweight.shape[1] != (k // 2 if bits == 4 else k) or (bits == 4 and k % 2):
        raise ValueError(f"quant_matmul: {bits}-bit codes for K={k} must be uint8 [N, {k // 2 if bits == 4 else k}], "
                         f"got {qweight.dtype} {tuple(qweight.shape)}")
    num_groups = -(-k // group_len)
    if scales.shape != (n, num_groups) or zeros.shape != scales.shape or scales.dtype != torch.float32:
        raise ValueError(f"quant_matmul: scales/zeros must be fp32 [{n}, {num_groups}], got "
                         f"{tuple(scales.shape)} {scales.dtype} / {tuple(zeros.shape)}")
    if m <= GEMV_MAX_ROWS and tiles is None:
        return quant_gemv(x, qweight, scales, zeros, bits, group_len if group_len < k else k)
    if m >= DEQUANT_MIN_ROWS and tiles is None:
        # compute-bound: one pass to bf16 weights, then the vendor GEMM (vLLM's AWQ does the same)
        w = dequantize_weight(qweight, scales, zeros, bits, group_len, k, x.dtype)
        return torch.nn.functional.linear(x, w)
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    block_m, block_n, block_k, split = tiles or choose_tiles(m, n, k, group_len, num_sms)
    if tiles is None and x.dtype == torch.float32:
        # fp32 tiles take twice the shared memory of the 16-bit ones the sizes were chosen for:
        # 128 x 256 fp32 weights over 3 stages need 256 KB of the H200's 227 (the exactness mode)
        block_k, num_stages = min(block_k, 64), min(num_stages, 2)
    if group_len < k and group_len % block_k:
        raise ValueError(f"quant_matmul: BLOCK_K {block_k} must divide the group length {group_len}")
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k      # whole tiles, so whole groups
    out = (torch.zeros if split > 1 else torch.empty)((m, n), dtype=torch.float32 if split > 1 else x.dtype,
                                                      device=x.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    _quant_matmul_kernel[grid](
        x, qweight, scales, zeros, out, m, n, k, group_len if group_len < k else k, k_per_split,
        x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, DOT_FP32=dot_fp32(x),
        num_warps=num_warps, num_stages=num_stages)
    return out if split == 1 else out.to(x.dtype)
