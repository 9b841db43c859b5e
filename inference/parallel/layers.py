"""Module wrappers that put a tensor-parallel model's communication around its sharded layers.

They wrap whatever module holds the shard (nn.Linear, QuantLinear, PackedLinear, TritonLinear),
so quantization and the kernel transforms still find and replace the inner linear layers:

    o_proj / down_proj   RowParallel          partial sums of the rank's input slice -> all-reduce
    embed_tokens         VocabParallelEmbedding  the rank's vocab rows, zeros elsewhere -> all-reduce
    lm_head              ParallelLMHead       the rank's vocab columns of the logits -> all-gather
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from inference.parallel.comm import TPComm


class RowParallel(nn.Module):
    """y = all_reduce(inner(x_rank)): the rank holds the input columns of its heads / MLP slice
    (bias on rank 0 only)."""

    def __init__(self, inner: nn.Module, comm: TPComm):
        super().__init__()
        self.inner = inner
        self.comm = comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce(self.inner.forward(x).contiguous())


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + rows) of the table; other ids embed to zeros here and
    the all-reduce adds the rank that owns them."""

    def __init__(self, weight: torch.Tensor, vocab_start: int, comm: TPComm):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)        # [rows_per_rank, hidden]
        self.vocab_start = vocab_start
        self.comm = comm

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.weight.shape[0])              # [T]
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)                      # [T, hidden]
        return self.comm.all_reduce(out)


class ParallelLMHead(nn.Module):
    """Logits of the rank's vocab rows, gathered: [S, hidden] -> [S, vocab] on every rank."""

    def __init__(self, inner: nn.Module, vocab_size: int, comm: TPComm):
        super().__init__()
        self.inner = inner
        self.vocab_size = vocab_size
        self.comm = comm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.comm.all_gather(self.inner.forward(hidden))        # [S, N * rows_per_rank]
        return logits[..., :self.vocab_size]                              # drop the padding rows
