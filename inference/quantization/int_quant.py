"""Integer weight quantization: group parameters, round-to-nearest codes, dequantization.

A weight W [out, in] is cut along its input dim into groups of `group_len` columns (the last one
may be shorter); each (row, group) has a scale s and a zero point z, and each weight a code
q in [0, 2^bits - 1]:

    W[o, i] ~= s[o, g] * (q[o, i] - z[o, g]),   g = i // group_len

Asymmetric: s = (max - min) / qmax, z = round(-min / s) (0.0 is exact; z >= 1 for the GPTQ
format, which stores zero - 1 unsigned). Symmetric:
s = 2 max|w| / qmax, z = (qmax + 1) / 2 (GPTQ's convention, which the checkpoint format stores).
Codes are kept unsigned; 4-bit codes are packed two per byte (low nibble = even column).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inference.quantization.config import QuantConfig


def grouped(w: torch.Tensor, group_len: int) -> torch.Tensor:
    """[out, in] -> [out, G, group_len] (fp32); a short last group is padded by repeating its
    last column, which changes neither its min nor its max."""
    out, n = w.shape
    pad = -n % group_len
    w = w.float()
    if pad:
        w = F.pad(w[None], (0, pad), mode="replicate")[0]
    return w.view(out, -1, group_len)


def group_params(w: torch.Tensor, cfg: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [out, G] (fp32) for W [out, in] by min/max (RTN's choice)."""
    g = grouped(w, cfg.group_len(w.shape[1]))
    qmax = cfg.qmax
    if cfg.symmetric:
        scale = (2 * g.abs().amax(-1) / qmax).clamp(min=1e-10)
        zero = torch.full_like(scale, (qmax + 1) / 2)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scale = ((hi - lo) / qmax).clamp(min=1e-10)
        # GPTQ's (v1) format stores zero - 1 unsigned, so its zero points start at 1; AWQ's at 0
        zero = (-lo / scale).round().clamp(0 if cfg.method == "awq" else 1, qmax)
    # fp16-representable scales (both checkpoint formats store fp16), chosen before any code is
    # rounded, so what is written is what was optimised
    return scale.clamp(min=1e-6).half().float(), zero


def expand(params: torch.Tensor, group_len: int, in_features: int) -> torch.Tensor:
    """[out, G] per-group values -> [out, in] per-column values."""
    return params.repeat_interleave(group_len, dim=1)[:, :in_features]


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
    """Round-to-nearest codes uint8 [out, in] for W under the given group parameters."""
    gl = cfg.group_len(w.shape[1])
    s, z = expand(scale, gl, w.shape[1]), expand(zero, gl, w.shape[1])
    return (w.float() / s + z).round().clamp(0, cfg.qmax).to(torch.uint8)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_len: int,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 codes [out, in] -> W [out, in] in dtype."""
    n = codes.shape[1]
    return ((codes.float() - expand(zero, group_len, n)) * expand(scale, group_len, n)).to(dtype)


def quantize_rtn(w: torch.Tensor, cfg: QuantConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [out, in], scales [out, G], zeros [out, G]) by round-to-nearest."""
    scale, zero = group_params(w, cfg)
    return quantize_codes(w, scale, zero, cfg), scale, zero


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes in [0, 15], [out, in] -> [out, ceil(in / 2)], two per byte."""
    if codes.shape[1] % 2:
        codes = F.pad(codes, (0, 1))
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor, in_features: int) -> torch.Tensor:
    out = torch.stack((packed & 0xF, packed >> 4), dim=-1).view(packed.shape[0], -1)
    return out[:, :in_features]
