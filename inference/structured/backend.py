"""The grammar backend's interface, the mask applied to a batch of logits, and the backend chosen."""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from inference.sampling_params import StructuredOutputsParams


class GrammarState(Protocol):
    """One request's position in its grammar."""
    backend: GrammarBackend

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of the int32 bitmask [rows, ceil(vocab / 32)]: bit t set = token t allowed next."""

    def try_accept(self, token: int) -> bool:
        """Advance past `token` if the grammar allows it next; False (and no change) if not."""

    def is_terminated(self) -> bool:
        """The grammar took its end (a stop token): no token follows."""


class GrammarBackend(Protocol):
    name: str

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of `spec` (cached), whose new_state() starts a sequence at its
        beginning; ValueError naming the field when the constraint is invalid."""

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        ...

    def fill_masks(self, states: list[GrammarState], bitmask: torch.Tensor) -> None:
        """Row j of `bitmask` from states[j], for every state at once."""


def apply_masks(logits: torch.Tensor, states: list[GrammarState | None]) -> None:
    """Set to -inf, in place, the logits of tokens each constrained row's grammar does not allow
    next; rows without a state are left alone. logits [rows, vocab] in any float dtype."""
    rows = [i for i, s in enumerate(states) if s is not None]
    if not rows:
        return
    backend = states[rows[0]].backend
    bitmask = backend.allocate_bitmask(len(rows))
    backend.fill_masks([states[i] for i in rows], bitmask)
    if logits.device.type == "cuda":
        apply_bitmask_on_device(logits, bitmask, rows)
        return
    vocab = logits.shape[-1]
    # bit t of a row = token t allowed: unpacked little-endian (2x faster than shifting in torch)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")[:, :vocab]
    blocked = torch.from_numpy(bits).to(logits.device) == 0                                   # [R, vocab]
    if len(rows) == logits.shape[0]:
        logits.masked_fill_(blocked, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(blocked, float("-inf")))


def apply_bitmask_on_device(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """apply_masks on the logits' device: the packed bitmask (4 bytes per 32 tokens, ~19 KB a
    row at a 152k vocabulary) is what crosses from the host, and xgrammar's kernel sets the
    blocked logits to -inf in place, row `rows[j]` of the logits from row j of the bitmask."""
    import xgrammar as xgr
    words = bitmask.to(logits.device, non_blocking=True)
    if len(rows) == logits.shape[0]:
        xgr.apply_token_bitmask_inplace(logits, words, vocab_size=logits.shape[-1])
        return
    full = torch.full((logits.shape[0], words.shape[1]), -1, dtype=words.dtype, device=logits.device)
    full[torch.tensor(rows, device=logits.device)] = words        # -1: every bit set, the row unmasked
    xgr.apply_token_bitmask_inplace(logits, full, vocab_size=logits.shape[-1])


def grammar_backend(tokenizer, vocab_size: int, end_ids: list[int]) -> GrammarBackend:
    """The engine's backend for its tokenizer: xgrammar."""
    from inference.structured.xgrammar_backend import XGrammarBackend
    return XGrammarBackend(tokenizer, vocab_size, end_ids)
