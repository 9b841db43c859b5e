"""Small helpers shared by the Triton kernels."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634      # softmax runs in base 2: exp(x) = exp2(x * LOG2E)


@triton.jit
def dot(a, b, DOT_FP32: tl.constexpr):
    """tl.dot with fp32 accumulation; with DOT_FP32 the operands are upcast first (see `dot_fp32`)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if a.dtype == tl.float32:            # fp32 models are the exactness mode: no TF32
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


def dot_fp32(t: torch.Tensor) -> bool:
    """Triton 3.9's CPU interpreter computes bf16/fp16 tl.dot wrongly (off by ~1e10); on CPU
    tensors (interpreter only) the kernels upcast dot operands to fp32. GPUs use the 16-bit dot."""
    return t.device.type == "cpu" and t.dtype != torch.float32
