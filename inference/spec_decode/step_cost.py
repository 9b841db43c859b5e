"""What verifying drafts costs, measured while the engine runs: the wall time of decode steps
with drafts against decode steps without (exponential moving averages); drafts pay only when they
add more tokens per step than that ratio. PRIOR_RATIO is near what bench/cpu/spec.py --step-cost
measures for 1-8 drafts on the CPU and on the H200 (bench/journal/2026-12-01-speculative-decoding.md)."""
from __future__ import annotations

from dataclasses import dataclass

from inference.interfaces import SchedulerOutput

PRIOR_RATIO = 1.3            # until both kinds of step have been seen
SMOOTHING = 0.1              # weight of the newest step in each average


@dataclass
class StepCost:
    plain_s: float | None = None       # decode steps without drafts
    spec_s: float | None = None        # decode steps where some request carried drafts

    def observe(self, sched: SchedulerOutput, seconds: float) -> None:
        """Count a finished step; steps that carry prefill tokens say nothing about decode."""
        if sched.is_empty or any(it.num_scheduled_tokens - len(it.spec_token_ids) != 1 or not it.needs_sample
                                 for it in sched.scheduled):
            return
        name = "spec_s" if any(it.spec_token_ids for it in sched.scheduled) else "plain_s"
        old = getattr(self, name)
        setattr(self, name, seconds if old is None else (1 - SMOOTHING) * old + SMOOTHING * seconds)

    @property
    def ratio(self) -> float:
        """Step time with drafts / without (>= 1)."""
        if self.plain_s is None or self.spec_s is None or self.plain_s <= 0:
            return PRIOR_RATIO
        return max(1.0, self.spec_s / self.plain_s)
