"""Token embeddings looked up in a GGUF file's own quantized rows (Qwen2.5-Coder's `token_embd` is
Q5_0: 151,936 x 896), read from the file's memory map: a step decodes only the rows of its tokens,
and only pages of tokens ever seen become resident (a dense bf16 copy is 272 MB).

The rows are decoded by the same code as the linears' codes (inference/loader/gguf_codes.py), so
a row's values equal the dequantized embedding's, rounded to the model's dtype.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from inference.loader.gguf_codes import QUANTIZED, decode_blocks


class GGUFEmbedding(nn.Module):
    def __init__(self, raw: np.ndarray, kind: str, num_embeddings: int, embedding_dim: int, dtype: torch.dtype):
        """raw: the tensor's bytes (a map of the file), [num_embeddings * row bytes]."""
        super().__init__()
        if kind not in QUANTIZED:
            raise ValueError(f"GGUFEmbedding: type {kind} is not a quantized type ({', '.join(QUANTIZED)})")
        if raw.size % num_embeddings:
            raise ValueError(f"GGUFEmbedding: {raw.size} bytes do not split into {num_embeddings} rows")
        self.rows = raw.reshape(num_embeddings, -1)
        self.kind, self.num_embeddings, self.embedding_dim, self.dtype = kind, num_embeddings, embedding_dim, dtype
        # the dtype and device the model's code reads off `embed_tokens.weight`
        self.weight = torch.empty(0, dtype=dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1).numpy()
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_embeddings):
            raise IndexError(f"token id out of range [0, {self.num_embeddings})")
        codes = decode_blocks(self.rows[ids], "token_embd.weight", self.kind, ids.size, self.embedding_dim)
        return codes.dequantized(self.dtype).view(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.kind}, from the file's map"
