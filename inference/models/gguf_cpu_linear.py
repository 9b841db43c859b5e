"""A linear layer over GGUF 4-bit blocks on the CPU (Q4_0 / Q4_1 and our int4 checkpoints), run by
the AVX-512 VNNI kernel of inference/kernels/gguf_matmul.cpp: the file's codes in the file's own
nibble order, its fp16 scales and minimums kept exactly, activations quantized to int8 per
32-value group inside the kernel (as llama.cpp does).

    w = d * q + m          q in 0..15 per weight, d and m per 32 input columns

The codes are packed in blocks of 16 output rows (gguf_matmul.cpp says how); a layer whose output
count is not a multiple of 16 gets zero rows to fill its last block, cut from the result.
"""
from __future__ import annotations

import torch
from torch import nn

from inference.kernels.cpu_ops import cpu_ops

GROUP = 32
BLOCK = 16          # output rows per packed block


def _blocked(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [ceil(out / 16) * 16, ...], zero rows at the end."""
    pad = -t.shape[0] % BLOCK
    return t if not pad else torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])


def _pack_scales(s: torch.Tensor) -> torch.Tensor:
    """[out, G] -> fp16 [out / 16, G, 16]: a group's 16 rows side by side."""
    s = _blocked(s.to(torch.float16))
    return s.view(-1, BLOCK, s.shape[1]).transpose(1, 2).contiguous()


def pack_q4(q: torch.Tensor) -> torch.Tensor:
    """codes [out, in] in 0..15 -> uint8 [out / 16, G * 256]: per block and group, 4 vectors whose
    byte 4 * row + t holds codes 4i + t (low nibble) and 16 + 4i + t (high nibble) of vector i."""
    q = _blocked(q.to(torch.uint8))
    blocks, groups = q.shape[0] // BLOCK, q.shape[1] // GROUP
    q = q.view(blocks, BLOCK, groups, 2, 4, 4)                    # [b, row, g, half, i, t]
    packed = q[:, :, :, 0] | (q[:, :, :, 1] << 4)                  # [b, row, g, i, t]
    return packed.permute(0, 2, 3, 1, 4).reshape(blocks, groups * 256).contiguous()


def pack_q8(q: torch.Tensor) -> torch.Tensor:
    """codes [out, in] int8 -> int8 [out / 16, G * 512]: per block and group, 8 vectors whose byte
    4 * row + t holds code 4i + t of vector i."""
    q = _blocked(q.to(torch.int8))
    blocks, groups = q.shape[0] // BLOCK, q.shape[1] // GROUP
    return q.view(blocks, BLOCK, groups, 8, 4).permute(0, 2, 3, 1, 4).reshape(blocks, groups * 512).contiguous()


def _cut(y: torch.Tensor, out: int) -> torch.Tensor:
    return y if y.shape[-1] == out else y[:, :out].contiguous()


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
        self.codes = pack_q4(codes)
        self.d, self.m = _pack_scales(scale), _pack_scales(zero)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16)
        self.ops = cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and self.bias is None:
            return _cut(self.ops.q4_matmul(x, self.codes, self.d, self.m), self.out_features)
        y = _cut(self.ops.q4_matmul(x.reshape(-1, self.in_features), self.codes, self.d, self.m), self.out_features)
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
        self.codes = pack_q8(codes)
        self.d = _pack_scales(scale)
        self.ops = cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _cut(self.ops.q8_matmul(x.reshape(-1, self.in_features), self.codes, self.d), self.out_features)
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        return self.codes.numel() + 2 * self.d.numel()
