"""A GGUF file's quantized tensors as they are: 4-bit or 8-bit codes with their per-block scales
and minimums, in the row order our Llama modules use, without re-rounding a single code.

Block layouts (ggml's, 32 weights per block, fp16 d and m):

    Q4_0  [d | 16 bytes]        w = d * (q - 8)    q in 0..15
    Q4_1  [d | m | 16 bytes]    w = d * q + m      q in 0..15
    Q8_0  [d | 32 int8]         w = d * q          q in -128..127

    a 4-bit block's 16 bytes:  byte j = q[j] | q[j + 16] << 4   (low nibbles: the first half)

llama.cpp's converter permutes the rows of attn_q / attn_k for its interleaved RoPE; transformers
(and our models, rotate_half) want them un-permuted. A row permutation moves whole rows of codes
with their scales, so it stays exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

BLOCK = 32
SUPPORTED = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")
_QUANTIZED_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}


@dataclass(frozen=True)
class BlockCodes:
    """One [out, in] weight as codes and per-block parameters (block = 32 input columns).

    codes  uint8 [out, in] (4-bit types, 0..15) or int8 [out, in] (Q8_0)
    scale  fp32 [out, in / 32]  (the file's fp16 d, exactly)
    zero   fp32 [out, in / 32]  the value of code 0: w = scale * q + zero
           (Q4_1: m; Q4_0: -8 d; Q8_0: 0, its codes are signed)
    """
    kind: str
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [out, in] = scale * q + zero, computed in fp32."""
        out, n = self.codes.shape
        q = self.codes.float().view(out, n // BLOCK, BLOCK)
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
    size = _QUANTIZED_BYTES[kind]
    if n % BLOCK:
        raise ValueError(f"GGUF tensor {name!r} ({kind}): {n} columns is not a multiple of {BLOCK}")
    flat = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if flat.size != out * (n // BLOCK) * size:
        raise ValueError(f"GGUF tensor {name!r} ({kind}): {flat.size} bytes for a {out} x {n} weight, "
                         f"expected {out * (n // BLOCK) * size}: the file is truncated or corrupt")
    return flat.reshape(out, n // BLOCK, size)


def _fp16(blocks: np.ndarray, start: int) -> torch.Tensor:
    half = np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0]
    return torch.from_numpy(half.astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[out, G, 16] bytes -> codes uint8 [out, G * 32] (low nibbles are a block's first 16)."""
    q = np.concatenate((qs & 0x0F, qs >> 4), axis=-1)                         # [out, G, 32]
    return torch.from_numpy(np.ascontiguousarray(q).reshape(q.shape[0], -1))


def decode_blocks(raw: np.ndarray, name: str, kind: str, out: int, n: int) -> BlockCodes:
    """The bytes of one quantized GGUF tensor -> BlockCodes [out, n]."""
    b = _blocks(raw, name, kind, out, n)
    d = _fp16(b, 0)
    if kind == "Q4_0":
        return BlockCodes(kind, _nibbles(b[..., 2:]), d, -8 * d)
    if kind == "Q4_1":
        return BlockCodes(kind, _nibbles(b[..., 4:]), d, _fp16(b, 2))
    codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(out, n))
    return BlockCodes(kind, codes, d, torch.zeros_like(d))


def unpermute_rope_rows(num_rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (per head: [pairs, 2] -> [2, pairs])."""
    half = num_rows // num_heads // 2
    return torch.arange(num_rows).view(num_heads, half, 2).transpose(1, 2).reshape(-1)


class GGUFFile:
    """The tensors of a GGUF file by name; a file that cannot be parsed is a ValueError."""

    def __init__(self, path: Path):
        from gguf import GGUFReader
        self.path = Path(path)
        try:
            reader = GGUFReader(self.path)
        except (ValueError, IndexError, OSError, KeyError) as exc:   # numpy raises these on a cut file
            raise ValueError(f"{self.path.name}: not a readable GGUF file ({type(exc).__name__}: {exc}); "
                             "it may be truncated") from exc
        self.tensors = {t.name: t for t in reader.tensors}
        self.fields = reader.fields

    def field(self, key: str):
        f = self.fields.get(key)
        return None if f is None else f.parts[f.data[0]].tolist()[0]

    def kind(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def codes(self, name: str) -> BlockCodes:
        """A quantized 2-D tensor [out, in] as BlockCodes (a ValueError for other types)."""
        t = self.tensors[name]
        kind = t.tensor_type.name
        if kind not in _QUANTIZED_BYTES:
            raise ValueError(f"GGUF tensor {name!r} has type {kind}; quantized execution supports "
                             f"{sorted(_QUANTIZED_BYTES)} (and loads {SUPPORTED} in all)")
        n, out = (int(x) for x in t.shape)                            # ggml lists dims innermost first
        return decode_blocks(t.data, name, kind, out, n)

    def check_supported(self) -> None:
        """Every tensor's type is one we read, else a ValueError naming the first that is not."""
        for name, t in self.tensors.items():
            if t.tensor_type.name not in SUPPORTED:
                raise ValueError(f"GGUF tensor {name!r} has type {t.tensor_type.name}, which this engine does not "
                                 f"run; supported types: {', '.join(SUPPORTED)}")
