"""Shifted KV reuse: llama.cpp's `--cache-reuse`, in a paged cache.

While a developer types, consecutive fill-in-the-middle prompts share their start, which the
exact prefix cache serves, and after the few tokens that changed they share a long run that only
moved: the code after the cursor. Prefilling that run again is most of a keystroke's latency on a
CPU. A request that asks for it (`SamplingParams.cache_reuse = N > 0`) takes that run's KV from a
recent request instead, with each key rotated by the distance it moved (RoPE rotations compose).
The values are copied as they are.

It is an approximation, as in llama.cpp: the run's KV was computed after the old tokens, not the
new ones. So it is opt-in per request, and a request that reused KV registers in the exact prefix
cache only the blocks before its first reused token (`Request.num_exact_tokens`).

Donors. A request that asked for reuse leaves a donor when it finishes, is aborted or is
preempted: its tokens whose KV was written, its block table, and each block's generation. The
block manager bumps a block's generation whenever it hands the block out for new data, so a later
plan knows whether the KV is still there. Donors hold no reference: their blocks wait in the free
queue like cached blocks, and are evicted in LRU order.

A plan, made when the request is first admitted (`plan_reuse`), after its prefix-cache hit at
`base` (a block boundary), against the donor sharing the longest start with it:

    prompt:   [ prefix-cache hit | lead | changed | run .......... | rest ]
    donor:    [ prefix-cache hit | lead | old ... | run .......... | ... ]
                                  copied            copied, K rotated by (new - old position)

The admitting step copies the lead (same positions: exact) and the run, then computes `changed`;
the next step computes `rest` (from the run's end). Without `changed` one step does it all.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MAX_DONORS = 8           # recent requests kept as donors (a typist's last few keystrokes)
_KGRAM = 8               # run search: candidate starts come from an index of 8-token windows
_MAX_CANDIDATES = 16     # donor positions tried per prompt position (repeated code)


@dataclass
class KVShift:
    """Copy the KV of `src_slots` to `dst_slots` (one per token), keys rotated by `delta`
    positions (0: a plain copy), before the step's forward."""
    req_id: str
    src_slots: list[int]
    dst_slots: list[int]
    delta: int


@dataclass
class Donor:
    tokens: list[int]                 # the tokens whose KV is in `blocks`
    blocks: list[int]
    generations: list[int]            # each block's generation when the donor was recorded


@dataclass
class ReusePlan:
    base: int                         # the prefix-cache hit: first token not served by it
    lead_end: int                     # [base, lead_end) copied in place
    run_start: int                    # [run_start, run_end) copied from [run_src, run_src + its length)
    run_end: int
    run_src: int
    shifts: list[KVShift] = field(default_factory=list)

    @property
    def num_reused(self) -> int:
        return self.lead_end - self.base + self.run_end - self.run_start


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def longest_common_run(prompt: list[int], p0: int, p1: int, donor: list[int], d0: int, d1: int,
                       min_len: int) -> tuple[int, int, int] | None:
    """The longest run prompt[i:i+n] == donor[j:j+n] within prompt[p0:p1] and donor[d0:d1], with
    n >= min_len: (i, j, n), or None. Linear in practice: a start whose predecessors also match
    lies inside a run already measured, and is skipped."""
    k = max(1, min(_KGRAM, min_len))
    starts: dict[tuple[int, ...], list[int]] = {}
    for j in range(d0, d1 - k + 1):
        found = starts.setdefault(tuple(donor[j:j + k]), [])
        if len(found) < _MAX_CANDIDATES:
            found.append(j)
    best = None
    for i in range(p0, p1 - k + 1):
        for j in starts.get(tuple(prompt[i:i + k]), ()):
            if i > p0 and j > d0 and prompt[i - 1] == donor[j - 1]:
                continue
            n = k
            while i + n < p1 and j + n < d1 and prompt[i + n] == donor[j + n]:
                n += 1
            if n >= min_len and (best is None or n > best[2]):
                best = (i, j, n)
    return best


def slots(blocks: list[int], block_size: int, start: int, end: int) -> list[int]:
    """The cache slots of token positions [start, end) under a block table."""
    return [blocks[p // block_size] * block_size + p % block_size for p in range(start, end)]


def plan_reuse(prompt: list[int], base: int, min_run: int, donors: list[Donor],
               block_size: int, generation: Callable[[int], int]) -> tuple[ReusePlan, Donor] | None:
    """The plan for a prompt whose first `base` tokens the prefix cache serves (see the module
    docstring), from the valid donor sharing the longest start with it, or None when nothing of at least
    `min_run` tokens (the lead counts too) can be reused. The prompt's last token is always left
    to compute: its logits are needed. Donors come most recent first; a donor whose blocks were
    handed out again is passed over. Slots are filled in by the caller (`with_slots`)."""
    last = len(prompt) - 1
    ranked = sorted(((min(common_prefix(prompt, d.tokens), last), k, d) for k, d in enumerate(donors)),
                    key=lambda t: (-t[0], t[1]))
    for lead_end, _, donor in ranked:
        if lead_end < base:
            break
        run = longest_common_run(prompt, lead_end, last, donor.tokens, lead_end, len(donor.tokens), min_run)
        if run is None and lead_end - base < min_run:
            continue
        run_start, src, n = run if run is not None else (lead_end, lead_end, 0)
        used = {p // block_size for p in (*range(base, lead_end), *range(src, src + n))}
        if all(generation(donor.blocks[b]) == donor.generations[b] for b in used):
            return ReusePlan(base, lead_end, run_start, run_start + n, src), donor
        # else a block was handed out again since: its KV is gone; try the next donor
    return None


def with_slots(plan: ReusePlan, donor: Donor, req_id: str, blocks: list[int], block_size: int) -> ReusePlan:
    """Fill in the plan's copies once the request's own blocks are allocated."""
    if plan.lead_end > plan.base:
        plan.shifts.append(KVShift(req_id, slots(donor.blocks, block_size, plan.base, plan.lead_end),
                                   slots(blocks, block_size, plan.base, plan.lead_end), 0))
    if plan.run_end > plan.run_start:
        n = plan.run_end - plan.run_start
        plan.shifts.append(KVShift(req_id, slots(donor.blocks, block_size, plan.run_src, plan.run_src + n),
                                   slots(blocks, block_size, plan.run_start, plan.run_end),
                                   plan.run_start - plan.run_src))
    return plan
