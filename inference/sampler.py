"""Batched sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, per-request seeds.

Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p
and lets every seeded request draw its noise from its own generator, so a seeded request's
output does not depend on what else is in the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None     # seeded requests only
    blocked_token_ids: list[int]          # EOS / stop ids while below min_tokens


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # per row: {token_id: (logprob, rank)} for the sampled token and the top-k, or None
    logprobs: list[dict[int, tuple[float, int]] | None]


def sample(logits: torch.Tensor, rows: list[SamplingRow], default_generator: torch.Generator | None = None) -> SamplerOutput:
    """logits: [num_rows, vocab] in the model's dtype; processed in fp32."""
    want_logprobs = any(r.params.logprobs is not None for r in rows)
    fast = all(r.params.is_greedy and not r.params.needs_penalties and not r.blocked_token_ids for r in rows)
    if fast and not want_logprobs:
        # argmax is exact in any dtype: skip the fp32 copy of [rows, vocab]
        return SamplerOutput(logits.argmax(dim=-1).tolist(), [None] * len(rows))
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
    if fast:
        token_ids = logits.argmax(dim=-1)
    else:
        _apply_penalties(logits, rows)
        for i, row in enumerate(rows):
            if row.blocked_token_ids:
                logits[i, row.blocked_token_ids] = float("-inf")
        token_ids = _sample_rows(logits, rows, default_generator)
    tokens = token_ids.tolist()
    logprobs = [None] * len(rows)
    if want_logprobs:
        for i, row in enumerate(rows):
            if row.params.logprobs is not None:
                logprobs[i] = _logprobs_of(raw_logprobs[i], tokens[i], row.params.logprobs)
    return SamplerOutput(tokens, logprobs)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(row.prompt_token_ids) | set(row.output_token_ids)), dtype=torch.long,
                                device=logits.device)
            seen = seen[seen < vocab]
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
            counts = torch.bincount(torch.tensor(row.output_token_ids, dtype=torch.long, device=logits.device),
                                    minlength=vocab)[:vocab]
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _sample_rows(logits: torch.Tensor, rows: list[SamplingRow], default_generator) -> torch.Tensor:
    result = logits.argmax(dim=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if not random_idx:
        return result
    sub = logits[random_idx]                                             # [R, vocab]
    sub_rows = [rows[i] for i in random_idx]
    temps = torch.tensor([r.params.temperature for r in sub_rows], dtype=sub.dtype, device=sub.device)
    sub.div_(temps[:, None])
    _filter_top_k_top_p_min_p(sub, sub_rows)
    probs = torch.softmax(sub, dim=-1)
    noise = torch.empty_like(probs)
    for j, row in enumerate(sub_rows):
        noise[j].exponential_(generator=row.generator or default_generator)
    result[random_idx] = (probs / noise).argmax(dim=-1)
    return result


def _filter_top_k_top_p_min_p(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    dev = logits.device
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in rows], device=dev)
    top_p = torch.tensor([r.params.top_p for r in rows], dtype=logits.dtype, device=dev)
    min_p = torch.tensor([r.params.min_p for r in rows], dtype=logits.dtype, device=dev)
    if any(r.params.min_p > 0 for r in rows):
        probs = torch.softmax(logits, dim=-1)
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits.masked_fill_(probs < threshold, float("-inf"))
    if any(0 < r.params.top_k < vocab or r.params.top_p < 1.0 for r in rows):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=dev)[None, :]
        remove = ranks >= top_k[:, None]
        sorted_probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
        cum = sorted_probs.cumsum(dim=-1)
        remove |= (cum - sorted_probs) > top_p[:, None]        # keep the token that crosses top_p
        remove[:, 0] = False
        logits.scatter_(-1, order, sorted_logits.masked_fill(remove, float("-inf")))


def _logprobs_of(row_logprobs: torch.Tensor, token: int, k: int) -> dict[int, tuple[float, int]]:
    chosen = row_logprobs[token]
    rank = int((row_logprobs > chosen).sum()) + 1
    out = {token: (float(chosen), rank)}
    if k:
        vals, ids = row_logprobs.topk(k)
        for r, (v, t) in enumerate(zip(vals.tolist(), ids.tolist()), start=1):
            out.setdefault(t, (v, r))
    return out
