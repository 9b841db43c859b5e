"""Per-token FP8 (e4m3) quantization of activations for `torch._scaled_mm`: Triton kernel,
PyTorch reference, wrapper.

    x [M, K] (bf16/fp16/fp32)  ->  x8 [M_pad, K] float8_e4m3fn,  scale [M_pad, 1] fp32
    scale[m] = max(max_k |x[m, k]|, tiny) / 448,   x8[m, k] = clamp(x[m, k] / scale[m], +-448)

One program per row does in one launch what takes ~6 PyTorch ops (abs, amax, divide, clamp, cast,
pad): rows M..M_pad-1 are written as zeros, so cuBLASLt gets the 16-aligned row count it wants
without a separate pad. Every FP8 linear on the tensor-core path runs this before its GEMM, and six
launches a linear would cost FP8 its matmul advantage (bench/journal/2026-12-01-quantized-weights.md,
run 18).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.triton_utils import grid_dependency_sync, pdl_options, use_pdl

E4M3_MAX = tl.constexpr(torch.finfo(torch.float8_e4m3fn).max)       # 448
MIN_SCALE = tl.constexpr(1e-12)


@triton.jit
def _per_token_fp8_kernel(X, Q, S, M, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
                          PDL: tl.constexpr):
    grid_dependency_sync(PDL)
    m = tl.program_id(0)
    row = X + m.to(tl.int64) * stride_xm
    out = Q + m.to(tl.int64) * stride_qm
    live = m < M                                       # padding rows: zeros, scale 1
    # a padding row reads nothing (a limit, not `mask & live`: the interpreter turns a scalar
    # bool broadcast into a tensor `&` into int, which tl.load rejects)
    k_read = tl.where(live, K, 0)
    if ONE_PASS:
        # the whole row in registers: one load, so a call on few rows is one memory round trip
        # instead of two chains of K / BLOCK_K dependent loads (the loop below reads each row twice;
        # bench/journal/2026-12-01-fp8-regression-and-gemv-conversions.md, run 28)
        k = tl.arange(0, BLOCK_K)
        x = tl.load(row + k, mask=k < k_read, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), 0) / E4M3_MAX, MIN_SCALE)
        q = tl.clamp(tl.math.div_rn(x, scale), -E4M3_MAX, E4M3_MAX)     # IEEE division, as PyTorch
        tl.store(out + k, q.to(Q.dtype.element_ty), mask=k < K)
    else:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(row + k, mask=k < k_read, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, 0) / E4M3_MAX, MIN_SCALE)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(row + k, mask=k < k_read, other=0.0).to(tl.float32)
            q = tl.clamp(tl.math.div_rn(x, scale), -E4M3_MAX, E4M3_MAX)
            tl.store(out + k, q.to(Q.dtype.element_ty), mask=k < K)
    tl.store(S + m, tl.where(live, scale, 1.0))


# Rows up to this long are quantized in one pass from registers (16 warps: 32 fp32 values a thread).
ONE_PASS_MAX_K = 16384


def per_token_fp8_reference(x: torch.Tensor, pad_rows_to: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in PyTorch; also how fp8 weights are quantized (one scale per output row)."""
    m = x.shape[0]
    pad = -m % pad_rows_to
    limit = torch.finfo(torch.float8_e4m3fn).max
    scale = (x.abs().amax(dim=1, keepdim=True).float() / limit).clamp(min=1e-12)
    q = (x.float() / scale).clamp(-limit, limit).to(torch.float8_e4m3fn)
    if pad:
        q = torch.cat([q, torch.zeros(pad, x.shape[1], dtype=q.dtype, device=x.device)])
        scale = torch.cat([scale, torch.ones(pad, 1, device=x.device)])
    return q, scale


def per_token_fp8(x: torch.Tensor, pad_rows_to: int = 16, block_k: int = 1024,
                  one_pass: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (last dim contiguous) -> (x8 [M_pad, K] e4m3, scale [M_pad, 1] fp32), M_pad the
    next multiple of pad_rows_to. one_pass (default: K <= ONE_PASS_MAX_K): each row loads once;
    else it is read twice in block_k slices (max, then quantize)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"per_token_fp8: x must be 2-D with a contiguous last dim, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"per_token_fp8: x must be fp32/fp16/bf16, got {x.dtype}")
    m, k = x.shape
    m_pad = -(-max(m, 1) // pad_rows_to) * pad_rows_to
    q = torch.empty((m_pad, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m_pad, 1), dtype=torch.float32, device=x.device)
    one_pass = k <= ONE_PASS_MAX_K if one_pass is None else one_pass
    pdl = use_pdl(x)
    block = triton.next_power_of_2(k) if one_pass else min(block_k, triton.next_power_of_2(k))
    _per_token_fp8_kernel[(m_pad,)](x, q, scale, m, k, x.stride(0), q.stride(0),
                                    BLOCK_K=block, ONE_PASS=one_pass, PDL=pdl,
                                    num_warps=max(4, min(16, block // 1024)), **pdl_options(pdl))
    return q, scale
