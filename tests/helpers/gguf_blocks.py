"""Raw bytes of GGUF quantized tensors with random contents, for the loader's and kernels' tests."""
from __future__ import annotations

import numpy as np

from inference.loader.gguf_codes import BLOCK

ALL_KINDS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]


def random_blocks(kind: str, out: int, n: int, seed: int) -> np.ndarray:
    """Raw bytes of a quantized tensor with random codes, scales and bit planes, and finite fp16
    d / m / dmin (every byte pattern of the other fields is a valid block)."""
    rng = np.random.default_rng(seed)
    g = n // (256 if kind.endswith("_K") else BLOCK)

    def f16(lo, hi):
        return rng.uniform(lo, hi, (out, g, 1)).astype(np.float16).view(np.uint8)

    def raw(size):
        return rng.integers(0, 256, (out, g, size), dtype=np.uint8)

    d, m = f16(-0.05, 0.05), f16(-0.3, 0.3)
    parts = {"Q4_0": (d, raw(16)), "Q4_1": (d, m, raw(16)), "Q8_0": (d, raw(32)),
             "Q5_0": (d, raw(4), raw(16)), "Q5_1": (d, m, raw(4), raw(16)),
             "Q4_K": (f16(0, 0.01), f16(0, 0.01), raw(12), raw(128)),
             "Q5_K": (f16(0, 0.01), f16(0, 0.01), raw(12), raw(32), raw(128)),
             "Q6_K": (raw(128), raw(64), raw(16), f16(-0.01, 0.01))}[kind]
    return np.concatenate(parts, axis=-1).reshape(out, -1)
