"""SiLU-and-multiply (SwiGLU's gate): Triton kernel, PyTorch reference, wrapper.

    x = [gate | up]  [T, 2I]   ->   silu(gate) * up   [T, I]

All math is fp32; the result is written in x's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.triton_utils import grid_dependency_sync, pdl_options, use_pdl

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,                      # [T, 2I], row stride x_row_stride, last dim contiguous
    out_ptr,                    # [T, I] contiguous
    x_row_stride,
    I,  # noqa: E741  (the intermediate size, as in the papers)
    BLOCK: tl.constexpr,        # columns of the output per program
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (inference/kernels/triton_utils.py)
):
    grid_dependency_sync(PDL)
    row = tl.program_id(0).to(tl.int64)         # int64: row * stride may pass 2^31
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)   # [BLOCK]
    mask = cols < I
    x_row = x_ptr + row * x_row_stride
    gate = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_row + I + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * I + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:]  [T, I], fp32 math, x.dtype result."""
    i = x.shape[-1] // 2
    xf = x.float()
    return (torch.nn.functional.silu(xf[:, :i]) * xf[:, i:]).to(x.dtype)


def silu_and_mul(x: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """x [T, 2I] (row stride may exceed 2I; last dim contiguous) -> new contiguous [T, I]."""
    if x.dim() != 2:
        raise ValueError(f"silu_and_mul: x must be 2-D [num_tokens, 2 * intermediate], got {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"silu_and_mul: x dtype must be one of {_DTYPES}, got {x.dtype}")
    num_tokens, two_i = x.shape
    if two_i == 0 or two_i % 2:
        raise ValueError(f"silu_and_mul: last dim must be even and > 0, got {two_i}")
    if x.stride(1) != 1:
        raise ValueError(f"silu_and_mul: x last dim must be contiguous, got strides {x.stride()}")
    i = two_i // 2
    out = torch.empty((num_tokens, i), dtype=x.dtype, device=x.device)    # [T, I]
    if num_tokens == 0:
        return out
    block = min(MAX_BLOCK, triton.next_power_of_2(i))
    grid = (num_tokens, triton.cdiv(i, block))
    pdl = use_pdl(x, pdl)
    _silu_and_mul_kernel[grid](x, out, x.stride(0), i, BLOCK=block, PDL=pdl, num_warps=4, **pdl_options(pdl))
    return out
