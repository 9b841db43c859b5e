"""A linear layer over GGUF 4-bit blocks on the CPU (Q4_0 / Q4_1 and our int4 checkpoints), run by
the AVX-512 VNNI kernel of inference/kernels/gguf_matmul.cpp: the file's codes in the file's own
nibble order, its fp16 scales and minimums kept exactly, activations quantized to int8 per
32-value group inside the kernel (as llama.cpp does).

    w = d * q + m          q in 0..15 per weight, d and m per 32 input columns
"""
from __future__ import annotations

import torch
from torch import nn

from inference.kernels.cpu_ops import cpu_ops

GROUP = 32


def gguf_matmul_available() -> bool:
    ops = cpu_ops()
    return ops is not None and ops.gguf_matmul_available()


class GGUFCpuLinear(nn.Module):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 bias: torch.Tensor | None = None):
        """codes [out, in] in 0..15; scale, zero [out, in / 32] (zero: the value of code 0)."""
        super().__init__()
        out, n = codes.shape
        groups = n // GROUP
        if n % GROUP or scale.shape != (out, groups) or zero.shape != scale.shape:
            raise ValueError(f"GGUFCpuLinear: codes {tuple(codes.shape)} need [out, in / 32] scales, got "
                             f"{tuple(scale.shape)} / {tuple(zero.shape)}")
        if int(codes.max()) > 15 or int(codes.min()) < 0:
            raise ValueError("GGUFCpuLinear: codes must lie in 0..15")
        self.out_features, self.in_features = out, n
        q = codes.to(torch.uint8).view(out, groups, GROUP)
        self.codes = (q[..., :16] | (q[..., 16:] << 4)).reshape(out, groups * 16).contiguous()
        self.d, self.m = scale.to(torch.float16).contiguous(), zero.to(torch.float16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.ops = cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self.bias is None:
            return self.ops.q4_matmul(x, self.codes, self.d, self.m)
        y = self.ops.q4_matmul(x.reshape(-1, self.in_features), self.codes, self.d, self.m)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.d, self.m))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={GROUP}, scales=fp16"


class GGUFQ8CpuLinear(nn.Module):
    """A linear over GGUF Q8_0 blocks (w = d * q, q in -128..127 per weight, d per 32 input
    columns) on the same VNNI kernel family: the file's codes and fp16 scales as they are."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        out, n = codes.shape
        if n % GROUP or scale.shape != (out, n // GROUP):
            raise ValueError(f"GGUFQ8CpuLinear: codes {tuple(codes.shape)} need [out, in / 32] scales, "
                             f"got {tuple(scale.shape)}")
        self.out_features, self.in_features = out, n
        self.codes = codes.to(torch.int8).contiguous()
        self.d = scale.to(torch.float16).contiguous()
        self.ops = cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return self.ops.q8_matmul(x, self.codes, self.d)
        return self.ops.q8_matmul(x.reshape(-1, self.in_features), self.codes, self.d).view(
            *x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return self.codes.numel() + 2 * self.d.numel()
