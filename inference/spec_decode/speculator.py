"""The engine's side of speculative decoding: between steps, propose drafts for the running
requests that decode; after a step, count what the target accepted and adapt each request's k.

Drafts ride the normal schedule (DESIGN §3): a request with drafts is scheduled for 1 + k tokens,
the runner verifies them in the same forward as the rest of the batch, and the scheduler takes
back the computed count of the rejected ones. Requests that need their full logits history on the
host (penalties, logprobs) or still block EOS (min_tokens) decode plainly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from inference.core.request import Request, RequestStatus
from inference.interfaces import ModelRunnerOutput, SchedulerOutput
from inference.spec_decode.config import SpeculativeConfig
from inference.spec_decode.ngram import NgramProposer
from inference.spec_decode.step_cost import StepCost

# Adaptive k: a request's acceptance rate a is estimated per draft position (accepted / tested,
# decayed); draft j is proposed while its chance of being reached and accepted, a**j, is at least
# MIN_GAIN. Verifying one more row costs far less than a step, so the bar is low.
MIN_GAIN = 0.3
DECAY = 0.8
PRIOR = (4.0, 5.0)           # (accepted, tested): a new request starts at a = 0.8
# Drafts go out only when the tokens a step is expected to yield with them, 1 + a + ... + a**k,
# beat what the step then costs (StepCost.ratio, measured); a request below that still drafts one
# token every PROBE_EVERY steps, so its rate keeps being measured.
PROBE_EVERY = 8


@dataclass
class SpecDecodeStats:
    """Cumulative counters (vLLM's spec_decode metric set)."""
    num_drafts: int = 0                  # steps in which a request carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)   # index j: drafts accepted at j

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer):
        self.config = config
        self.proposer = proposer
        self.stats = SpecDecodeStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self.acceptance: dict[str, tuple[float, float]] = {}     # req_id -> (accepted, tested), decayed
        self.idle: dict[str, int] = {}           # req_id -> decode steps without drafts since its last probe
        self.cost = StepCost()
        self._draft_s = self._prev_draft_s = 0.0     # time spent proposing for the next / this step

    def num_drafts_for(self, request: Request) -> int:
        """How many tokens to propose for a request now (0: decode it plainly)."""
        params = request.sampling_params
        if (params.needs_penalties or params.logprobs is not None
                or request.num_output_tokens < params.min_tokens):
            return 0
        k = self.config.num_speculative_tokens
        k = min(k, request.max_tokens - request.num_output_tokens - 1)
        if not self.config.adaptive or k <= 1:
            return max(0, k)
        accepted, tested = self.acceptance.get(request.request_id, PRIOR)
        rate = accepted / tested
        n = 1
        while n < k and rate ** (n + 1) >= MIN_GAIN:
            n += 1
        expected = sum(rate ** j for j in range(n + 1))          # tokens per step with n drafts
        if expected >= self.cost.ratio:
            self.idle.pop(request.request_id, None)
            return n
        idle = self.idle.get(request.request_id, 0) + 1       # not worth it: probe now and then
        self.idle[request.request_id] = 0 if idle >= PROBE_EVERY else idle
        return 1 if idle >= PROBE_EVERY else 0

    def propose(self, running: list[Request]) -> None:
        """Set `spec_token_ids` of every running request whose next step is a decode."""
        wanted = []
        for request in running:
            request.spec_token_ids = []
            if request.status == RequestStatus.RUNNING and request.num_placeholders == 0 \
                    and request.num_computed_tokens == request.num_tokens - 1:
                k = self.num_drafts_for(request)
                if k > 0:
                    wanted.append((request, k))
        if wanted:
            t0 = time.perf_counter()
            for (request, _), draft in zip(wanted, self.proposer.propose(wanted)):
                request.spec_token_ids = draft
            self._draft_s = time.perf_counter() - t0

    def record(self, sched: SchedulerOutput, result: ModelRunnerOutput) -> None:
        """Count a finished step's drafts and acceptances; update each request's rate."""
        stats = self.stats
        for item in sched.scheduled:
            if not item.spec_token_ids:
                continue
            rid = item.request.request_id
            num_accepted = len(result.accepted_draft_ids.get(rid, ()))
            stats.num_drafts += 1
            stats.num_draft_tokens += len(item.spec_token_ids)
            stats.num_accepted_tokens += num_accepted
            for j in range(num_accepted):
                stats.accepted_per_position[j] += 1
            accepted, tested = self.acceptance.get(rid, PRIOR)
            tested_now = min(num_accepted + 1, len(item.spec_token_ids))
            self.acceptance[rid] = (DECAY * accepted + num_accepted, DECAY * tested + tested_now)

    def observe_step(self, sched: SchedulerOutput, seconds: float) -> None:
        """A finished step's wall time (engine.step, steps run in turn, the proposal for the next
        step at its end): feeds the cost model, each step charged with drafting its own drafts."""
        self.cost.observe(sched, seconds - self._draft_s + self._prev_draft_s)
        self._prev_draft_s, self._draft_s = self._draft_s, 0.0

    def remove(self, req_ids) -> None:
        for rid in req_ids:
            self.acceptance.pop(rid, None)
            self.idle.pop(rid, None)
        self.proposer.remove(req_ids)


class NgramDrafts:
    """Proposer adapter: prompt lookup over each request's own tokens."""

    def __init__(self, config: SpeculativeConfig):
        self.lookup = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, wanted: list[tuple[Request, int]]) -> list[list[int]]:
        return [self.lookup.propose(request.all_token_ids, k) for request, k in wanted]

    def remove(self, req_ids) -> None:
        pass


def build_speculator(config: SpeculativeConfig, engine) -> Speculator:
    """The speculator for `engine` (an LLMEngine being built: its target model is loaded)."""
    if config.method == "ngram":
        return Speculator(config, NgramDrafts(config))
    from inference.spec_decode.draft_model import DraftModelProposer
    return Speculator(config, DraftModelProposer(config, engine))
