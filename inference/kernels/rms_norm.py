"""RMSNorm, optionally fused with the residual add: Triton kernel, PyTorch reference, wrapper.

    without residual:  out = x * rsqrt(mean(x^2) + eps) * weight
    with residual:     s = x + residual   (rounded to x.dtype, as an unfused model would hold it)
                       out = s * rsqrt(mean(s^2) + eps) * weight;  residual <- s  (in place)

All math is fp32; results are written in x's dtype. One program normalises one row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from inference.kernels.triton_utils import grid_dependency_sync, pdl_options, use_pdl

MAX_HIDDEN_SIZE = 65536         # one row must fit one block (registers); Llama-405B is 16384
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rms_norm_kernel(
    x_ptr,                      # [T, N], row stride x_row_stride, last dim contiguous
    residual_ptr,               # [T, N], row stride residual_row_stride (unused without residual)
    weight_ptr,                 # [N]
    out_ptr,                    # [T, N] contiguous
    x_row_stride,
    residual_row_stride,
    N,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,      # next_power_of_2(N)
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (inference/kernels/triton_utils.py)
):
    grid_dependency_sync(PDL)
    row = tl.program_id(0).to(tl.int64)         # int64: row * stride may pass 2^31
    cols = tl.arange(0, BLOCK_N)                # [BLOCK_N]
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        res_ptrs = residual_ptr + row * residual_row_stride + cols
        r = tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
        # Round the sum to the activation dtype before normalising: the stored residual and the
        # normalised value then come from the same number, as in the unfused model.
        s = (x + r).to(residual_ptr.dtype.element_ty)
        tl.store(res_ptrs, s, mask=mask)
        x = s.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / N     # masked lanes are 0 and add nothing
    rstd = tl.rsqrt(mean_square + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = x * rstd * w
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None):
    """x [T, N] -> rms_norm(x) * weight; with residual -> (rms_norm(s) * weight, s), s = x + residual.

    Does not modify its inputs.
    """
    if residual is not None:
        x = (x.float() + residual.float()).to(x.dtype)   # the residual stream, as the model keeps it
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    out = out.to(x.dtype)
    return out if residual is None else (out, x)


def _check_rows(name: str, t: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype,
                device: torch.device) -> None:
    if t.dim() != 2 or tuple(t.shape) != shape:
        raise ValueError(f"rms_norm: {name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"rms_norm: {name} dtype {t.dtype} must equal x.dtype {dtype}")
    if t.device != device:
        raise ValueError(f"rms_norm: {name} is on {t.device}, x on {device}")
    if shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"rms_norm: {name} last dim must be contiguous, got strides {t.stride()}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             pdl: bool | None = None):
    """x [T, N] -> out [T, N] (new, contiguous, x.dtype).

    With residual [T, N]: one kernel computes s = x + residual, writes s into `residual` in place
    and returns (rms_norm(s) * weight, residual). x and residual may have a row stride != N.
    """
    if x.dim() != 2:
        raise ValueError(f"rms_norm: x must be 2-D [num_tokens, hidden], got shape {list(x.shape)}")
    if x.dtype not in _DTYPES:
        raise ValueError(f"rms_norm: x dtype must be one of {_DTYPES}, got {x.dtype}")
    num_tokens, n = x.shape
    if x.stride(1) != 1 and n > 1:
        raise ValueError(f"rms_norm: x last dim must be contiguous, got strides {x.stride()}")
    if not 0 < n <= MAX_HIDDEN_SIZE:
        raise ValueError(f"rms_norm: hidden size must be in 1..{MAX_HIDDEN_SIZE}, got {n}")
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"rms_norm: weight must have shape [{n}], got {list(weight.shape)}")
    if weight.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"rms_norm: weight dtype must be x.dtype or float32, got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"rms_norm: weight is on {weight.device}, x on {x.device}")
    if n > 1 and weight.stride(0) != 1:
        raise ValueError("rms_norm: weight must be contiguous")
    if residual is not None:
        _check_rows("residual", residual, (num_tokens, n), x.dtype, x.device)
        if num_tokens > 1 and residual.stride(0) < n:
            raise ValueError(f"rms_norm: residual rows overlap (strides {residual.stride()}); it is written in place")

    out = torch.empty((num_tokens, n), dtype=x.dtype, device=x.device)   # [T, N]
    if num_tokens == 0:
        return out if residual is None else (out, residual)
    block_n = triton.next_power_of_2(n)
    num_warps = min(max(block_n // 512, 4), 16)
    _rms_norm_kernel[(num_tokens,)](
        x, residual if residual is not None else x, weight, out,
        x.stride(0), residual.stride(0) if residual is not None else 0,
        n, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, PDL=use_pdl(x, pdl), num_warps=num_warps,
        **pdl_options(use_pdl(x, pdl)),
    )
    return out if residual is None else (out, residual)
