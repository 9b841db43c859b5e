"""A linear layer over 4-bit codes on the CPU: torch's int4 matmul (tinygemm's layout, AVX-512),
which reads the packed codes directly instead of a dequantized copy of the weight.

    codes   [out, in] in 0..15, packed by torch into its blocked layout (half a byte each)
    groups  32+ input columns share a scale s and an offset z:   w = s * (q - 8) + z

Both our int4 checkpoints (w = s * (q - zero_point)) and GGUF's Q4_0 / Q4_1 blocks
(w = d * q + m) map onto it exactly: s = d, z = m + 8 d. The kernel's scales are in the
activations' dtype; `scale_dtype` float32 keeps the file's fp16 scales exactly (activations are
cast to fp32 for the call), bfloat16 rounds them to 8 bits of mantissa (DRIFT in the tests).
"""
from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def int4_cpu_available() -> bool:
    """torch's CPU int4 ops exist and run on this CPU."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return False
    try:
        packed = torch._convert_weight_to_int4pack_for_cpu(torch.zeros(16, 64, dtype=torch.int32), 2)
        sz = torch.zeros(2, 16, 2, dtype=torch.float32)
        torch._weight_int4pack_mm_for_cpu(torch.zeros(1, 64), packed, 32, sz)
    except RuntimeError:
        return False
    return True


class Int4CpuLinear(nn.Module):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, out_dtype: torch.dtype,
                 scale_dtype: torch.dtype = torch.float32, bias: torch.Tensor | None = None):
        """codes [out, in] (0..15); scale, zero [out, G]: w = scale * q + zero (zero: the value of
        code 0, in fp32); out_dtype: the model's activations."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        groups = scale.shape[1]
        if self.in_features % groups or scale.shape != zero.shape or scale.shape[0] != self.out_features:
            raise ValueError(f"Int4CpuLinear: scale {tuple(scale.shape)} / zero {tuple(zero.shape)} do not fit "
                             f"codes {tuple(codes.shape)}")
        self.group_len = self.in_features // groups
        if self.group_len not in (32, 64, 128, 256):
            raise ValueError(f"Int4CpuLinear: group of {self.group_len} columns; the kernel takes 32, 64, 128 or 256")
        if int(codes.max()) > 15 or int(codes.min()) < 0:
            raise ValueError("Int4CpuLinear: codes must lie in 0..15")
        self.out_dtype, self.scale_dtype = out_dtype, scale_dtype
        self.packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 2)
        offset = zero.float() + 8 * scale.float()                             # the value of code 8
        self.scales_and_zeros = torch.stack((scale.float(), offset), dim=-1).transpose(0, 1) \
            .contiguous().to(scale_dtype)                                    # [G, out, 2]
        self.bias = None if bias is None else bias.detach().to(out_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != self.scale_dtype:
            rows = rows.to(self.scale_dtype)
        rows = rows.contiguous()                                              # the kernel's demand
        y = torch._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_len, self.scales_and_zeros)
        if y.dtype != self.out_dtype:
            y = y.to(self.out_dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_and_zeros))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={self.group_len}, scales={self.scale_dtype}"


class Int8AsTwoInt4CpuLinear(nn.Module):
    """A linear over signed 8-bit codes with group scales (GGUF's Q8_0: w = d * q, q in -128..127)
    as two int4 matmuls over the same input, exactly:

        q + 128 = 16 * hi + lo      (hi, lo in 0..15)
        w = (16 d) * hi - 128 d  +  d * lo

    torch's CPU int8 matmul takes one scale per output row only, so Q8_0's 32-column groups
    would have to be re-quantized for it; the int4 kernel takes group scales, and two passes over
    half-byte codes read as many bytes as one over the int8 codes."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype,
                 scale_dtype: torch.dtype = torch.bfloat16):
        """codes int8 [out, in]; scale [out, G]."""
        super().__init__()
        unsigned = codes.to(torch.int32) + 128
        scale = scale.float()
        self.high = Int4CpuLinear(unsigned >> 4, 16 * scale, -128 * scale, out_dtype, scale_dtype)
        self.low = Int4CpuLinear(unsigned & 15, scale, torch.zeros_like(scale), out_dtype, scale_dtype)
        self.out_features, self.in_features = codes.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.high.forward(x) + self.low.forward(x)

    def weight_bytes(self) -> int:
        return self.high.weight_bytes() + self.low.weight_bytes()
