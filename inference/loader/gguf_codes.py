"""A GGUF file's quantized tensors as they are: 4- to 8-bit codes with their per-group scales and
minimums, in the row order our Llama modules use, without re-rounding a single code.

Block layouts (ggml's; d, m, dmin fp16):

    Q4_0  [d | 16 bytes]                  w = d * (q - 8)     q in 0..15, 32 weights
    Q4_1  [d | m | 16 bytes]              w = d * q + m       q in 0..15
    Q5_0  [d | qh u32 | 16 bytes]         w = d * (q - 16)    q in 0..31: low nibble | bit j of qh << 4
    Q5_1  [d | m | qh u32 | 16 bytes]     w = d * q + m
    Q8_0  [d | 32 int8]                   w = d * q           q in -128..127
    Q4_K  [d | dmin | 12 B 6-bit sc, mn | 128 B]     256 weights, 8 groups of 32:
                                          w = (d * sc_g) * q - dmin * mn_g      q in 0..15
    Q5_K  [d | dmin | 12 B | qh 32 B | 128 B]        as Q4_K, q in 0..31
    Q6_K  [ql 128 B | qh 64 B | 16 int8 sc | d]      16 groups of 16: w = (d * sc_g) * (q - 32), q in 0..63

    a 4-bit 32-block's 16 bytes:  byte j = q[j] | q[j + 16] << 4   (low nibbles: the first half)
    K blocks: each 64 weights take 32 bytes, low nibbles the first 32, high nibbles the next 32

Scales of the K types are the products of the file's fp16 d and its small integer scales: exact in
fp32, so `dequantized` reproduces ggml's (and the `gguf` package's) values bit for bit.

llama.cpp's converter permutes the rows of attn_q / attn_k of Llama-arch files (not Qwen2's) for its
interleaved RoPE; transformers
(and our models, rotate_half) want them un-permuted. A row permutation moves whole rows of codes
with their scales, so it stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

BLOCK = 32
QUANTIZED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED = ("F32", "F16", "BF16", *QUANTIZED)
_QUANTIZED_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176,
                    "Q6_K": 210}
_WEIGHTS_PER_BLOCK = {k: (256 if k.endswith("_K") else BLOCK) for k in _QUANTIZED_BYTES}


@dataclass(frozen=True)
class BlockCodes:
    """One [out, in] weight as codes and per-group parameters (a group: 32 input columns, 16 for
    Q6_K).

    codes  uint8 [out, in] (0..15, 0..31 or 0..63) or int8 [out, in] (Q8_0)
    scale  fp32 [out, in / group]  (the file's fp16 d, or the exact product d * sc of K types)
    zero   fp32 [out, in / group]  the value of code 0: w = scale * q + zero
           (Q4_1 / Q5_1: m; Q4_0: -8 d; Q5_0: -16 d; K types: -dmin * mn; Q6_K: -32 scale; Q8_0: 0)
    """
    kind: str
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def group(self) -> int:
        return self.codes.shape[1] // self.scale.shape[1]

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [out, in] = scale * q + zero, computed in fp32."""
        out, n = self.codes.shape
        q = self.codes.float().view(out, n // self.group, self.group)
        return (q * self.scale[..., None] + self.zero[..., None]).view(out, n).to(dtype)

    def rows(self, index: torch.Tensor) -> BlockCodes:
        return BlockCodes(self.kind, self.codes[index], self.scale[index], self.zero[index])

    @staticmethod
    def cat(parts: list[BlockCodes]) -> BlockCodes:
        """Stack weights along their output rows (fused qkv, gate_up)."""
        kinds = {p.kind for p in parts}
        return BlockCodes(kinds.pop() if len(kinds) == 1 else "mixed", torch.cat([p.codes for p in parts]),
                          torch.cat([p.scale for p in parts]), torch.cat([p.zero for p in parts]))


def _blocks(raw: np.ndarray, name: str, kind: str, out: int, n: int) -> np.ndarray:
    size, per = _QUANTIZED_BYTES[kind], _WEIGHTS_PER_BLOCK[kind]
    if n % per:
        raise ValueError(f"GGUF tensor {name!r} ({kind}): {n} columns is not a multiple of {per}")
    flat = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if flat.size != out * (n // per) * size:
        raise ValueError(f"GGUF tensor {name!r} ({kind}): {flat.size} bytes for a {out} x {n} weight, "
                         f"expected {out * (n // per) * size}: the file is truncated or corrupt")
    return flat.reshape(out, n // per, size)


def _fp16(blocks: np.ndarray, start: int) -> torch.Tensor:
    half = np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0]
    return torch.from_numpy(half.astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[out, G, 16] bytes -> codes uint8 [out, G * 32] (low nibbles are a block's first 16)."""
    q = np.concatenate((qs & 0x0F, qs >> 4), axis=-1)                         # [out, G, 32]
    return torch.from_numpy(np.ascontiguousarray(q).reshape(q.shape[0], -1))


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[out, G, 4] bytes (a little-endian u32 per block) -> [out, G * 32] 0 or 16: bit j for value j."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little")                      # [out, G, 32]
    return (bits.astype(np.uint8) << 4).reshape(qh.shape[0], -1)


def _k_scales(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit minimums per super-block: bytes 0-3
    hold scales 0-3 (low 6 bits), 4-7 minimums 0-3; scales / minimums 4-7 take bytes 8-11's low /
    high nibbles plus the top 2 bits of bytes 0-3 / 4-7."""
    a, b, c = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate((a & 0x3F, (c & 0x0F) | ((a >> 6) << 4)), axis=-1)
    mn = np.concatenate((b & 0x3F, (c >> 4) | ((b >> 6) << 4)), axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """[out, S, 128] bytes -> [out, S, 256] codes: per 64 weights, 32 low nibbles then 32 high."""
    q = qs.reshape(*qs.shape[:2], 4, 1, 32)
    return np.concatenate((q & 0x0F, q >> 4), axis=3).reshape(*qs.shape[:2], 256)


def _decode_k(b: np.ndarray, kind: str, out: int, n: int) -> BlockCodes:
    d, dmin = _fp16(b, 0).numpy(), _fp16(b, 2).numpy()                        # [out, S]
    sc, mn = _k_scales(b[..., 4:16])                                          # [out, S, 8]
    scale = (d[..., None] * sc).reshape(out, -1)
    zero = -(dmin[..., None] * mn).reshape(out, -1)
    if kind == "Q4_K":
        q = _k_low_nibbles(b[..., 16:144])
    else:                                         # Q5_K: bit 2i / 2i+1 of qh[l] tops weight l of 64-chunk i
        q = _k_low_nibbles(b[..., 48:176])
        bits = np.unpackbits(b[..., 16:48, None], axis=-1, bitorder="little")      # [out, S, 32 l, 8 bit]
        q = q | (bits.transpose(0, 1, 3, 2).reshape(*q.shape) << 4)
    return BlockCodes(kind, torch.from_numpy(np.ascontiguousarray(q).reshape(out, n)),
                      torch.from_numpy(scale), torch.from_numpy(zero))


def _decode_q6_k(b: np.ndarray, out: int, n: int) -> BlockCodes:
    """Per 128 weights: 64 bytes of ql (low nibbles: weights 0-31 | 32-63, high: 64-95 | 96-127) and
    32 of qh (bit pairs 0-1, 2-3, 4-5, 6-7 top weights l, 32 + l, 64 + l, 96 + l)."""
    ql = b[..., 0:128].reshape(out, -1, 2, 2, 32)                             # [out, S, half, part, l]
    qh = b[..., 128:192].reshape(out, -1, 2, 1, 32)
    low = np.concatenate((ql & 0x0F, ql >> 4), axis=3)                         # [out, S, half, 4, 32]: part = l // 32
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)) & 3
    q = (low | (high << 4)).reshape(out, n)
    sc = b[..., 192:208].view(np.int8).astype(np.float32)                      # [out, S, 16]
    d = np.ascontiguousarray(b[..., 208:210]).view(np.float16)[..., 0].astype(np.float32)
    scale = (d[..., None] * sc).reshape(out, -1)
    return BlockCodes("Q6_K", torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(scale),
                      torch.from_numpy(-32 * scale))


def decode_blocks(raw: np.ndarray, name: str, kind: str, out: int, n: int) -> BlockCodes:
    """The bytes of one quantized GGUF tensor -> BlockCodes [out, n]."""
    b = _blocks(raw, name, kind, out, n)
    if kind in ("Q4_K", "Q5_K"):
        return _decode_k(b, kind, out, n)
    if kind == "Q6_K":
        return _decode_q6_k(b, out, n)
    d = _fp16(b, 0)
    if kind == "Q4_0":
        return BlockCodes(kind, _nibbles(b[..., 2:]), d, -8 * d)
    if kind == "Q4_1":
        return BlockCodes(kind, _nibbles(b[..., 4:]), d, _fp16(b, 2))
    if kind == "Q5_0":
        return BlockCodes(kind, _nibbles(b[..., 6:]) | torch.from_numpy(_high_bits(b[..., 2:6])), d, -16 * d)
    if kind == "Q5_1":
        return BlockCodes(kind, _nibbles(b[..., 8:]) | torch.from_numpy(_high_bits(b[..., 4:8])), d, _fp16(b, 2))
    codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(out, n))
    return BlockCodes(kind, codes, d, torch.zeros_like(d))


def unpermute_rope_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (per head: [pairs, 2] -> [2, pairs])."""
    half = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(-1)


class GGUFFile:
    """The tensors of a GGUF file by name; a file that cannot be parsed is a ValueError."""

    def __init__(self, path: Path):
        from inference.loader.gguf_reader import read_gguf
        self.path = Path(path)
        try:
            self.meta, self.tensors = read_gguf(self.path)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{self.path.name}: not a readable GGUF file ({exc}); it may be truncated") from exc

    def field(self, key: str):
        return self.meta.get(key)

    @property
    def architecture(self) -> str:
        return str(self.meta.get("general.architecture", ""))

    @property
    def permuted_rope_rows(self) -> bool:
        """llama.cpp's converter permutes q / k rows for Llama-arch files only (Qwen2 keeps HF's order)."""
        return self.architecture == "llama"

    def kind(self, name: str) -> str:
        return self.tensors[name].type_name

    def codes(self, name: str) -> BlockCodes:
        """A quantized 2-D tensor [out, in] as BlockCodes (a ValueError for other types)."""
        t = self.tensors[name]
        kind = t.type_name
        if kind not in _QUANTIZED_BYTES:
            raise ValueError(f"GGUF tensor {name!r} has type {kind}; quantized execution supports "
                             f"{sorted(_QUANTIZED_BYTES)} (and loads {SUPPORTED} in all)")
        n, out = (int(x) for x in t.shape)                            # ggml lists dims innermost first
        return decode_blocks(t.data, name, kind, out, n)

    def check_supported(self) -> None:
        """Every tensor's type is one we read, else a ValueError naming the first that is not."""
        for name, t in self.tensors.items():
            if t.type_name not in SUPPORTED:
                raise ValueError(f"GGUF tensor {name!r} has type {t.type_name}, which this engine does not "
                                 f"run; supported types: {', '.join(SUPPORTED)}")
