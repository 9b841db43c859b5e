"""Batched sampling: penalties, min_tokens, temperature, top-k / top-p / min-p, per-request seeds.

Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)), which draws exactly from p
and lets every seeded request draw its noise from its own generator, so a seeded request's
output does not depend on what else is in the batch.
"""
from __future__ import annotations

import os
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
    grammar: object | None = None         # structured outputs: the sequence's GrammarState


@dataclass
class SamplerOutput:
    token_ids: list[int]
    # per row: {token_id: (logprob, rank)} for the sampled token and the top-k, or None
    logprobs: list[dict[int, tuple[float, int]] | None]


@dataclass
class PendingSample:
    """Sampling launched on the device; `resolve` turns it into a SamplerOutput."""
    token_ids: torch.Tensor                   # [num_rows] on the logits' device
    raw_logprobs: torch.Tensor | None         # [num_rows, vocab] fp32 when any row wants logprobs
    rows: list[SamplingRow]


def sample(logits: torch.Tensor, rows: list[SamplingRow],
           default_generator: torch.Generator | None = None) -> SamplerOutput:
    """logits: [num_rows, vocab] in the model's dtype; processed in fp32."""
    return resolve(sample_on_device(logits, rows, default_generator))


def sample_on_device(logits: torch.Tensor, rows: list[SamplingRow],
                     default_generator: torch.Generator | None = None) -> PendingSample:
    """Choose every row's token on the logits' device. On CUDA the common paths (greedy, and
    temperature / top-k / top-p / min-p sampling) queue device work only, without a host sync."""
    if any(r.grammar is not None for r in rows):
        return _sample_constrained(logits, rows, default_generator)
    return _sample_unconstrained(logits, rows, default_generator)


def _sample_unconstrained(logits: torch.Tensor, rows: list[SamplingRow], default_generator) -> PendingSample:
    want_logprobs = any(r.params.logprobs is not None for r in rows)
    fast = all(r.params.is_greedy and not r.params.needs_penalties and not r.blocked_token_ids for r in rows)
    if fast and not want_logprobs:
        # argmax is exact in any dtype: skip the fp32 copy of [rows, vocab]. On the CPU, max's
        # indices (the first maximum, as argmax) take a quarter of argmax's time over bf16 rows.
        ids = logits.max(dim=-1).indices if logits.device.type == "cpu" else logits.argmax(dim=-1)
        return PendingSample(ids, None, rows)
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
    return PendingSample(token_ids, raw_logprobs, rows)


# How a structured-output row meets its grammar: "check_first" samples without the mask and fills
# the mask only when the grammar rejects the token (a trained model's choice mostly passes);
# "mask_first" fills every row's mask before sampling, on the host while the device runs the
# forward. INFERENCE_GRAMMAR_ORDER picks one for a benchmark; auto is check_first.
GRAMMAR_ORDERS = ("auto", "check_first", "mask_first")


def grammar_order() -> str:
    order = os.environ.get("INFERENCE_GRAMMAR_ORDER", "auto")
    if order not in GRAMMAR_ORDERS:
        raise ValueError(f"INFERENCE_GRAMMAR_ORDER={order!r}: one of {', '.join(GRAMMAR_ORDERS)}")
    return "check_first" if order == "auto" else order


def _checks_first(row: SamplingRow, order: str) -> bool:
    """The token chosen without the grammar's mask is the masked choice whenever the grammar
    allows it: greedy, or a sample from the whole (tempered) distribution."""
    p = row.params
    return order == "check_first" and (p.is_greedy or (p.top_k <= 0 and p.top_p >= 1.0 and p.min_p == 0.0))


def _sample_constrained(logits: torch.Tensor, rows: list[SamplingRow], default_generator) -> PendingSample:
    """A batch with structured-output rows (their tokens go to the host: the grammar advances
    here). Rows that can check first sample without the mask and keep the token if their grammar
    accepts it; the rest, and the rejected ones, are masked (inference/structured) and sampled."""
    from inference.structured import apply_masks
    order = grammar_order()
    first = [i for i, r in enumerate(rows) if r.grammar is not None and _checks_first(r, order)]
    # the rows as they are now, for a retry: sampling changes fp32 logits in place (a bf16 batch is
    # copied to fp32 first, and greedy reads it only), so only then is a copy needed up front
    saved = logits.clone() if first and logits.dtype == torch.float32 else logits
    masked = [i for i, r in enumerate(rows) if r.grammar is not None and i not in first]
    apply_masks(logits, [rows[i].grammar if i in masked else None for i in range(len(rows))])
    pending = _sample_unconstrained(logits, rows, default_generator)
    tokens = pending.token_ids.tolist()
    retry = [i for i in first if not rows[i].grammar.try_accept(tokens[i])]
    if retry:
        sub, sub_rows = saved[retry], [rows[i] for i in retry]
        apply_masks(sub, [r.grammar for r in sub_rows])
        for i, token in zip(retry, _sample_unconstrained(sub, sub_rows, default_generator).token_ids.tolist()):
            tokens[i] = token
    for i in masked + retry:                  # chosen under the mask: the grammar must take them
        accept_masked(rows[i].grammar, tokens[i])
    token_ids = torch.tensor(tokens, device=logits.device)
    return PendingSample(token_ids, pending.raw_logprobs, rows)


def accept_masked(grammar, token: int) -> None:
    """Advance the grammar past a token chosen under its own mask, which it must take."""
    if not grammar.try_accept(token):
        raise RuntimeError(f"the grammar rejected token {token}, which its own mask allowed")


def resolve(pending: PendingSample, token_ids: list[int] | None = None) -> SamplerOutput:
    """Token ids (already copied to the host, or copied now) and the requested logprobs."""
    tokens = pending.token_ids.tolist() if token_ids is None else token_ids
    logprobs = [None] * len(pending.rows)
    if pending.raw_logprobs is not None:
        for i, row in enumerate(pending.rows):
            if row.params.logprobs is not None:
                logprobs[i] = _logprobs_of(pending.raw_logprobs[i], tokens[i], row.params.logprobs)
    return SamplerOutput(tokens, logprobs)


def list_to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a device tensor without a sync: pageable copies to CUDA wait for the
    stream to drain, pinned non-blocking ones don't."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    for i, row in enumerate(rows):
        p = row.params
        if p.repetition_penalty != 1.0:
            seen = list_to_device(sorted(set(row.prompt_token_ids) | set(row.output_token_ids)), torch.long,
                              logits.device)
            seen = seen[seen < vocab]
            vals = logits[i, seen]
            logits[i, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty or p.frequency_penalty) and row.output_token_ids:
            counts = torch.bincount(list_to_device(row.output_token_ids, torch.long, logits.device),
                                    minlength=vocab)[:vocab]
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)


def _sample_rows(logits: torch.Tensor, rows: list[SamplingRow], default_generator) -> torch.Tensor:
    result = logits.argmax(dim=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if not random_idx:
        return result
    all_random = len(random_idx) == len(rows)
    idx = None if all_random else list_to_device(random_idx, torch.long, logits.device)
    sub = logits if all_random else logits[idx]                          # [R, vocab]
    sub_rows = [rows[i] for i in random_idx]
    chosen = draw(processed_probs(sub, sub_rows), [r.generator for r in sub_rows], default_generator)
    if all_random:
        return chosen
    result[idx] = chosen
    return result


def processed_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, then min-p / top-k /
    top-p, as fp32 probabilities [R, vocab]. Changes `logits` (fp32) in place."""
    temps = list_to_device([r.params.temperature for r in rows], logits.dtype, logits.device)
    logits.div_(temps[:, None])
    _filter_top_k_top_p_min_p(logits, rows)
    return torch.softmax(logits, dim=-1)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None], default_generator) -> torch.Tensor:
    """One token per row of `probs` [R, vocab] by the exponential race; a row with a generator
    draws its noise from it alone, the rest share `default_generator`."""
    noise = torch.empty_like(probs)
    seeded = [j for j, g in enumerate(generators) if g is not None]
    if len(seeded) < len(generators):
        noise.exponential_(generator=default_generator)               # one launch for the unseeded rows
    for j in seeded:                                                  # seeded rows: their own stream
        noise[j].exponential_(generator=generators[j])
    return (probs / noise).argmax(dim=-1)


def _filter_top_k_top_p_min_p(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    vocab = logits.shape[-1]
    dev = logits.device
    top_k = list_to_device([r.params.top_k if r.params.top_k > 0 else vocab for r in rows], torch.long, dev)
    top_p = list_to_device([r.params.top_p for r in rows], logits.dtype, dev)
    min_p = list_to_device([r.params.min_p for r in rows], logits.dtype, dev)
    if any(r.params.min_p > 0 for r in rows):
        probs = torch.softmax(logits, dim=-1)
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        logits.masked_fill_(probs < threshold, float("-inf"))
    filtered = [0 < r.params.top_k < vocab or r.params.top_p < 1.0 for r in rows]
    if all(filtered) and _filter_within_top_candidates(logits, rows, top_k, top_p):
        return
    if any(filtered):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=dev)[None, :]
        remove = ranks >= top_k[:, None]
        sorted_probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
        cum = sorted_probs.cumsum(dim=-1)
        remove |= (cum - sorted_probs) > top_p[:, None]        # keep the token that crosses top_p
        remove[:, 0] = False
        logits.scatter_(-1, order, sorted_logits.masked_fill(remove, float("-inf")))


TOP_CANDIDATES = 256     # top-k / top-p look at this many best tokens before sorting the vocabulary


def _filter_within_top_candidates(logits: torch.Tensor, rows: list[SamplingRow], top_k: torch.Tensor,
                                  top_p: torch.Tensor) -> bool:
    """The same filter as the full sort below, from the best TOP_CANDIDATES tokens only, when
    every row's kept set lies inside them: its top_k fits, and those tokens hold more than top_p
    of the (top-k renormalized) mass. A sort of the whole vocabulary costs ~3.5 ms a row on
    the CPU, topk ~0.1 ms. False (nothing changed) when some row needs more."""
    vocab = logits.shape[-1]
    k = min(vocab, max([TOP_CANDIDATES] + [r.params.top_k for r in rows if 0 < r.params.top_k < vocab]))
    if k == vocab:
        return False
    vals, order = logits.topk(k, dim=-1)                                 # [R, k], best first
    ranks = torch.arange(k, device=logits.device)[None, :]
    remove = ranks >= top_k[:, None]
    limited = top_k < vocab                                               # rows renormalized over their top_k
    norm = torch.where(limited, torch.logsumexp(vals.masked_fill(remove, float("-inf")), dim=-1),
                       torch.logsumexp(logits, dim=-1))                   # [R]
    probs = torch.exp(vals - norm[:, None]).masked_fill(remove, 0.0)
    cum = probs.cumsum(dim=-1)
    if not bool(((cum[:, -1] > top_p) | limited).all()):                  # a row's top_p mass reaches past k
        return False
    remove |= (cum - probs) > top_p[:, None]                              # keep the token that crosses top_p
    remove[:, 0] = False
    kept = vals.masked_fill(remove, float("-inf"))
    logits.fill_(float("-inf")).scatter_(-1, order, kept)
    return True


def _logprobs_of(row_logprobs: torch.Tensor, token: int, k: int) -> dict[int, tuple[float, int]]:
    chosen = row_logprobs[token]
    rank = int((row_logprobs > chosen).sum()) + 1
    out = {token: (float(chosen), rank)}
    if k:
        vals, ids = row_logprobs.topk(k)
        for r, (v, t) in enumerate(zip(vals.tolist(), ids.tolist()), start=1):
            out.setdefault(t, (v, r))
    return out
