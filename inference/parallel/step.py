"""One engine step as plain, picklable data for the tensor-parallel workers, and the workers'
mirror of the running requests that turns it back into a SchedulerOutput for their runner.

Only what the model's forward reads crosses the process boundary: per scheduled request its
id, computed / scheduled counts, this step's input tokens, its block table (ids are the same on
every rank: one block manager, rank 0's), its drafts and its preemption count (the CUDA runner's
staged block-table rows are keyed on it). Workers never sample for real: their mirrors are
greedy and their tokens are dropped; rank 0's sampler is the only one that counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from inference.core.request import Request
from inference.interfaces import ScheduledRequest, SchedulerOutput
from inference.sampling_params import SamplingParams

_GREEDY = SamplingParams(temperature=0.0)


@dataclass
class StepItem:
    req_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int
    token_ids: list[int]           # the request's tokens in [computed, computed + scheduled), drafts excluded
    block_ids: list[int]           # the whole block table
    needs_sample: bool
    spec_token_ids: list[int]
    num_preemptions: int


@dataclass
class StepMessage:
    items: list[StepItem] = field(default_factory=list)
    removed_req_ids: list[str] = field(default_factory=list)    # finished since the last step


def step_message(sched: SchedulerOutput, removed: list[str]) -> StepMessage:
    """Rank 0: the step's inputs as plain data (every input token is on the host: TP steps run
    in turn, without async scheduling)."""
    items = []
    for it in sched.scheduled:
        req, start, n = it.request, it.num_computed_tokens, it.num_scheduled_tokens
        items.append(StepItem(req.request_id, start, n, req.all_token_ids[start:start + n], list(it.block_ids),
                              it.needs_sample, list(it.spec_token_ids), req.num_preemptions))
    return StepMessage(items, removed)


class RequestMirror:
    """Worker side: req_id -> a Request holding the tokens the runner reads."""

    def __init__(self):
        self.requests: dict[str, Request] = {}        # req_id -> mirror

    def remove(self, req_ids: list[str]) -> None:
        for rid in req_ids:
            self.requests.pop(rid, None)

    def scheduler_output(self, msg: StepMessage) -> SchedulerOutput:
        scheduled = []
        for item in msg.items:
            req = self.requests.get(item.req_id)
            if req is None:
                req = self.requests[item.req_id] = Request(item.req_id, [], _GREEDY, None, 1)
            ids, start = req.all_token_ids, item.num_computed_tokens
            del ids[start:]
            ids.extend([0] * (start - len(ids)))      # a prefix-cache hit: those tokens are in the KV cache
            ids.extend(item.token_ids)
            req.num_preemptions = item.num_preemptions
            scheduled.append(ScheduledRequest(req, item.num_computed_tokens, item.num_scheduled_tokens,
                                              item.block_ids, item.needs_sample, item.spec_token_ids))
        total = sum(it.num_scheduled_tokens for it in scheduled)
        return SchedulerOutput(scheduled=scheduled, total_num_scheduled_tokens=total)
