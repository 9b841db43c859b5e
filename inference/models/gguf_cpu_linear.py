"""A linear layer over a GGUF file's own quantized blocks (inference/loader/gguf_codes.py), run by
the AVX-512 VNNI kernel of inference/kernels/gguf_matmul.cpp: codes as the file has them, scales
and minimums exact (fp16 as in the file; fp32 products for the K types), activations quantized to
int8 per 32-value group inside the kernel (as llama.cpp does).

    w = scale * q + zero          per group of 32 input columns (16 for Q6_K)

A layer is one or more row segments, each of its own type: a fused q|k|v whose v is Q8_0 and q, k
Q5_0 keeps each part's codes. Codes are packed in blocks of 16 output rows (gguf_matmul.cpp says
how); a segment's row count is a multiple of 16, except the last one's, which gets zero rows to
fill its block, cut from the result.
"""
from __future__ import annotations

import torch
from torch import nn

from inference.kernels.cpu_ops import cpu_ops
from inference.loader.gguf_codes import BlockCodes

GROUP = 32
BLOCK = 16          # output rows per packed block

# file type -> (kernel kind, bit planes above the low nibble, scale dtype)
KINDS = {
    "Q4_0": (0, 0, torch.float16), "Q4_1": (0, 0, torch.float16),
    "Q5_0": (1, 1, torch.float16), "Q5_1": (1, 1, torch.float16),
    "Q4_K": (2, 0, torch.float32), "Q5_K": (3, 1, torch.float32),
    "Q6_K": (4, 2, torch.float32), "Q8_0": (5, 0, torch.float16),
}
_NO_MIN = ("Q6_K", "Q8_0")


def _blocked(t: torch.Tensor) -> torch.Tensor:
    """[out, ...] -> [ceil(out / 16) * 16, ...], zero rows at the end."""
    pad = -t.shape[0] % BLOCK
    return t if not pad else torch.cat([t, t.new_zeros((pad, *t.shape[1:]))])


def _pack_scales(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[out, S] -> [out / 16, S, 16]: a group's 16 rows side by side; the values must be exact in dtype."""
    packed = _blocked(s.to(dtype))
    if not torch.equal(packed[:s.shape[0]].float(), s.float()):
        raise ValueError(f"GGUFCpuLinear: scales or minimums are not exact in {dtype}")
    return packed.view(-1, BLOCK, s.shape[1]).transpose(1, 2).contiguous()


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """codes [out16, in] -> uint8 [out / 16, G, 256]: per group, 4 vectors whose byte 4 * row + t holds
    codes 4i + t (low nibble) and 16 + 4i + t (high nibble) of vector i."""
    q = q & 0x0F
    blocks, groups = q.shape[0] // BLOCK, q.shape[1] // GROUP
    q = q.view(blocks, BLOCK, groups, 2, 4, 4)                    # [b, row, g, half, i, t]
    packed = q[:, :, :, 0] | (q[:, :, :, 1] << 4)                  # [b, row, g, i, t]
    return packed.permute(0, 2, 3, 1, 4).reshape(blocks, groups, 256)


def _planes(q: torch.Tensor, planes: int) -> torch.Tensor:
    """codes [out16, in] -> uint8 [out / 16, G, 64 * planes]: per plane p, 64 bytes whose byte 4 * row + t
    holds, in bit j, bit 4 + p of code 4j + t (the byte of vector j it tops)."""
    blocks, groups = q.shape[0] // BLOCK, q.shape[1] // GROUP
    weights = (1 << torch.arange(8, dtype=torch.uint8)).view(1, 1, 1, 1, 8)
    out = []
    for p in range(planes):
        bits = ((q >> (4 + p)) & 1).view(blocks, BLOCK, groups, 8, 4).permute(0, 2, 1, 4, 3)   # [b, g, row, t, j]
        out.append((bits * weights).sum(-1, dtype=torch.uint8).reshape(blocks, groups, 64))
    return torch.cat(out, dim=-1)


def pack_codes(c: BlockCodes) -> torch.Tensor:
    """BlockCodes -> the kernel's bytes [out / 16, G * bytes per group]."""
    if c.kind == "Q8_0":
        q = _blocked(c.codes.to(torch.int8))
        blocks, groups = q.shape[0] // BLOCK, q.shape[1] // GROUP
        return q.view(blocks, BLOCK, groups, 8, 4).permute(0, 2, 3, 1, 4).reshape(blocks, groups * 512).contiguous()
    q = _blocked(c.codes.to(torch.uint8))
    planes = KINDS[c.kind][1]
    parts = [_nibbles(q)] + ([_planes(q, planes)] if planes else [])
    packed = torch.cat(parts, dim=-1)
    return packed.reshape(packed.shape[0], -1).contiguous()


def gguf_matmul_available() -> bool:
    ops = cpu_ops()
    return ops is not None and ops.gguf_matmul_available()


class GGUFCpuLinear(nn.Module):
    """x @ W^T (+ bias) with W the row segments' codes; bf16 in and out."""

    def __init__(self, parts: list[BlockCodes], bias: torch.Tensor | None = None, f32_out: bool = False):
        super().__init__()
        self.f32_out = f32_out      # fp32 outputs (the LM head's logits) instead of bf16
        if not parts:
            raise ValueError("GGUFCpuLinear: at least one segment")
        n = parts[0].codes.shape[1]
        self.codes, self.scales, self.mins, self.kinds = [], [], [], []
        for i, c in enumerate(parts):
            out, cols = c.codes.shape
            if c.kind not in KINDS:
                raise ValueError(f"GGUFCpuLinear: segment {i} has type {c.kind}; the kernel runs {sorted(KINDS)}")
            if cols != n or n % GROUP:
                raise ValueError(f"GGUFCpuLinear: segment {i} has {cols} columns; every segment needs the same "
                                 f"multiple of {GROUP} ({n})")
            group = 16 if c.kind == "Q6_K" else GROUP
            if c.scale.shape != (out, n // group) or c.zero.shape != c.scale.shape:
                raise ValueError(f"GGUFCpuLinear: codes {tuple(c.codes.shape)} need [out, in / {group}] scales, "
                                 f"got {tuple(c.scale.shape)} / {tuple(c.zero.shape)}")
            if out % BLOCK and i != len(parts) - 1:
                raise ValueError(f"GGUFCpuLinear: segment {i} has {out} rows; all but the last need a "
                                 f"multiple of {BLOCK}")
            top = 127 if c.kind == "Q8_0" else (16 << KINDS[c.kind][1]) - 1
            if int(c.codes.max()) > top or int(c.codes.min()) < (-128 if c.kind == "Q8_0" else 0):
                raise ValueError(f"GGUFCpuLinear: {c.kind} codes must lie in 0..{top}")
            kind, _, sdtype = KINDS[c.kind]
            self.kinds.append(kind)
            self.codes.append(pack_codes(c))
            self.scales.append(_pack_scales(c.scale, sdtype))
            self.mins.append(torch.empty(0) if c.kind in _NO_MIN else _pack_scales(c.zero, sdtype))
        self.out_features, self.in_features = sum(c.codes.shape[0] for c in parts), n
        self.types = [c.kind for c in parts]
        self.bias = None
        if bias is not None:
            self.bias = _blocked(bias.detach().float().reshape(-1)).contiguous()
        self.ops = cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"GGUFCpuLinear: x has {x.shape[-1]} features, the weight {self.in_features}")
        y = self.ops.gguf_linear(x.reshape(-1, self.in_features), self.codes, self.scales, self.mins, self.kinds,
                                 self.bias, self.f32_out)
        if y.shape[-1] != self.out_features:
            y = y[:, :self.out_features].contiguous()
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    def stack_entry(self) -> tuple[list[torch.Tensor], list[int]]:
        """This layer's tensors and description for cpu_ops.decode_layers."""
        tensors = [] if self.bias is None else [self.bias]
        for c, s, m in zip(self.codes, self.scales, self.mins):
            tensors += [c, s, m]
        return tensors, [len(self.kinds), int(self.bias is not None), *self.kinds]

    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.codes, *self.scales, *self.mins))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, types={self.types}"
