"""Verifying k drafted tokens from one target forward over [last token, d1 .. dk].

Row j of the target's logits is its distribution for the token after d_j (row 0: after the last
real token). Greedy requests keep the longest prefix of drafts equal to the target's argmax and
then take the target's own token, so the output is exactly non-speculative greedy. Sampled
requests use rejection sampling (Leviathan et al. 2023; Chen et al. 2023): d_j is accepted with
probability min(1, p(d_j) / q(d_j)); at the first rejection a token is drawn from the residual
norm(max(p - q, 0)); when all k are accepted a bonus token is drawn from p after d_k. Every emitted
token is then distributed exactly as the target would sample it. A proposer without
probabilities (n-gram) has a one-hot q: accept with probability p(d_j), else draw from p with d_j
removed.

A request held to a grammar (structured outputs) verifies position by position instead
(verify_constrained): row j is masked by the grammar as it stands after d_1 .. d_j-1, so the
target's choice at every position is one the grammar allows, and a draft the grammar forbids has
probability 0 and is rejected. The grammar advances by the emitted tokens only.
"""
from __future__ import annotations

import torch

from inference.worker.sampler import SamplingRow, accept_masked, draw, processed_probs


def verify_greedy(target_ids: list[int], draft: list[int]) -> list[int]:
    """target_ids: the target's argmax at each of the len(draft) + 1 rows. Returns the emitted
    tokens: the accepted drafts, then the target's token where they diverge (or the bonus)."""
    out = []
    for j, d in enumerate(draft):
        out.append(target_ids[j])
        if target_ids[j] != d:
            return out
    out.append(target_ids[len(draft)])
    return out


def verify_sampled(logits: torch.Tensor, draft: list[int], row: SamplingRow,
                   draft_probs: torch.Tensor | None, default_generator: torch.Generator) -> list[int]:
    """logits: [k + 1, vocab] the target's rows for one request; draft_probs: [k, vocab] the
    distributions the drafts were drawn from (None: one-hot, as for n-gram). Returns the emitted
    tokens (accepted drafts, then one drawn token)."""
    k = len(draft)
    p = processed_probs(logits.float(), [row] * (k + 1))                        # [k + 1, vocab]
    gen = row.generator or default_generator
    ids = torch.tensor(draft, dtype=torch.long, device=p.device)
    p_d = p[torch.arange(k, device=p.device), ids]
    q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs[torch.arange(k), ids].to(p.device)
    u = torch.rand(k, generator=gen, device=gen.device).to(p.device)
    rejected = (u * q_d >= p_d).tolist()       # accept iff u < p / q (q > 0: d_j was drawn from q)
    a = rejected.index(True) if True in rejected else k
    if a == k:
        final = p[k]
    else:
        final = p[a].clone()
        if draft_probs is None:
            final[draft[a]] = 0.0
        else:
            final = (final - draft_probs[a].to(p.device)).clamp_(min=0.0)
        if float(final.sum()) <= 0.0:           # only when p == q, where rejection has probability 0
            final = p[a]
    token = int(draw(final[None], [row.generator], default_generator)[0])
    return draft[:a] + [token]


def verify_constrained(logits: torch.Tensor, draft: list[int], row: SamplingRow,
                       draft_probs: torch.Tensor | None, default_generator: torch.Generator) -> list[int]:
    """verify_greedy / verify_sampled for a row with a grammar (row.grammar, advanced here by
    every emitted token). logits [k + 1, vocab]; the output is distributed as constrained
    non-speculative decoding: greedy gives its tokens exactly."""
    from inference.structured import apply_masks
    grammar, k, out = row.grammar, len(draft), []
    gen = row.generator or default_generator
    for j in range(k + 1):
        masked = logits[j:j + 1].float().clone()
        apply_masks(masked, [grammar])
        if row.params.is_greedy:
            token = int(masked.argmax(dim=-1))
        else:
            p = processed_probs(masked, [row])[0]
            final = p
            if j < k:
                d = draft[j]
                q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
                u = float(torch.rand(1, generator=gen, device=gen.device))
                if u * q_d < float(p[d]):                 # accepted (p[d] = 0 where the grammar forbids d)
                    accept_masked(grammar, d)
                    out.append(d)
                    if grammar.is_terminated():           # the end: nothing after it is verified
                        return out
                    continue
                final = p.clone()
                if draft_probs is None:
                    final[d] = 0.0
                else:
                    final = (final - draft_probs[j].to(p.device)).clamp_(min=0.0)
                if float(final.sum()) <= 0.0:
                    final = p
            token = int(draw(final[None], [row.generator], default_generator)[0])
        accept_masked(grammar, token)
        out.append(token)
        if not row.params.is_greedy or j == k or token != draft[j] or grammar.is_terminated():
            return out
    return out
