"""Inputs several benchmarks share, built the same way wherever they are used so that figures
from different scripts describe the same work:

  real text     token ids of the running Python's stdlib docstrings, and prompts cut from them
                that share no prefix (so a prefix cache never hits across repeats)
  support reply a synthetic support answer in English and Chinese with PII and banned terms
  token prompts seeded random token ids (random-weight models on the GPU)
  7B linears    Llama-2-7B's four linear shapes, round-to-nearest int8 / int4 copies of them
  paged KV      a random bf16 paged K/V cache with shuffled block tables

torch is imported inside the tensor builders: the CPU text workloads do not need it.
"""
from __future__ import annotations

import importlib
import random
import warnings

TEXT_MODULES = ["argparse", "collections", "json", "subprocess", "threading", "logging", "typing",
                "dataclasses", "functools", "itertools", "pathlib", "asyncio", "email", "unittest"]


def real_text_ids(tokenizer) -> list[int]:
    """Token ids of real English text (stdlib documentation), deterministic for a Python version."""
    parts = []
    for name in TEXT_MODULES:
        mod = importlib.import_module(name)
        parts.append(mod.__doc__ or "")
        for attr in sorted(dir(mod)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = getattr(getattr(mod, attr, None), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 200 and not attr.startswith("_"):
                parts.append(doc)
    ids = tokenizer("\n\n".join(parts), add_special_tokens=False)["input_ids"]
    if len(ids) < 8000:
        raise RuntimeError(f"only {len(ids)} tokens of text")
    return ids


class Prompts:
    """Hands out prompts of a given length that share no 16-token prefix with any earlier one."""

    def __init__(self, ids: list[int]):
        self.ids = ids
        self.offset = 0

    def take(self, length: int) -> list[int]:
        if self.offset + length > len(self.ids):
            self.offset = (self.offset % 7) + 1   # wrap with a new phase: new block hashes
        out = self.ids[self.offset:self.offset + length]
        self.offset += 37                         # windows overlap, but never start at the same token
        return out


SUPPORT_SENTENCES = [
    "Thanks for reaching out about order #{n}. ", "Your refund of ${n}.00 was issued today. ",
    "You can reach us at help{n}@example.com any time. ", "The card ending 1111 (4111 1111 1111 1111) was charged. ",
    "Please call +1 (415) 555-{n:04d} if the parcel is late. ", "我们已经为您安排了退款，请耐心等待。 ",
    "Beware of counterfeit sellers on other sites. ", "这不是假货，我们只销售正品。 ",
    "Shipping usually takes 3-5 business days. ", "We saw a login from 203.0.113.{m}. ",
]


def support_reply(num_bytes: int, seed: int = 0) -> str:
    """At least num_bytes (UTF-8) of support-reply text, the same for a given seed."""
    rng = random.Random(seed)
    parts, size = [], 0
    while size < num_bytes:
        s = rng.choice(SUPPORT_SENTENCES).format(n=rng.randrange(10000), m=rng.randrange(1, 255))
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


def random_prompts(n: int, lens: list[int], vocab: int, seed: int) -> list[dict]:
    """n token-id prompts of lengths lens[:n], ids uniform in [3, vocab)."""
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(n_in)]} for n_in in lens[:n]]


# Llama-2-7B's linear shapes (N, K): the decode step's four GEMVs / GEMMs a layer
SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}


def quantized_copies(n: int, k: int, bits: int, copies: int, gen) -> list[tuple]:
    """`copies` random [n, k] bf16 weights, each as (codes, scales, zeros, group length, bf16
    weight): int8 per output channel or int4 group 128, round-to-nearest, int4 packed in pairs."""
    import torch

    from inference.quantization.config import QuantConfig
    from inference.quantization.int_quant import pack_int4, quantize_rtn
    cfg = QuantConfig("rtn", 8, -1, True) if bits == 8 else QuantConfig("rtn", 4, 128)
    out = []
    for _ in range(copies):
        w = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        codes, s, z = quantize_rtn(w, cfg)
        out.append((pack_int4(codes) if bits == 4 else codes, s, z, cfg.group_len(k), w))
    return out


def paged_cache(num_seqs: int, ctx: int, hkv: int, d: int, block_size: int, gen):
    """Random bf16 K and V caches [blocks + 1, block_size, hkv, d] and a block table per sequence
    ([num_seqs, ctx / block_size], a random permutation: no two sequences share a block)."""
    import torch
    nb = num_seqs * (-(-ctx // block_size))
    k = torch.randn(nb + 1, block_size, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(nb + 1, block_size, hkv, d, device="cuda", generator=gen, dtype=torch.bfloat16)
    tables = torch.randperm(nb, device="cuda", generator=gen).to(torch.int32).view(num_seqs, -1)
    return k, v, tables
