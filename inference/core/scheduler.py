"""Token-level continuous-batching scheduler (vLLM v1's rule).

Each step has a token budget (`max_num_batched_tokens`) and a sequence bound (`max_num_seqs`).
Running requests are served first (decodes cost one token, unfinished prefills take a chunk),
then waiting requests are admitted in policy order with their prefix-cache hit applied and the
rest of their prompt chunked into what is left of the budget. When blocks run out, the
lowest-priority running request (the newest under FCFS) is preempted: its blocks are freed and it
goes back to the front of the waiting queue to be recomputed later. Nothing here touches tensors.

`num_computed_tokens` advances when a step is scheduled, and a step that samples leaves a
placeholder for its token until `update_from_output` fills it in. So the next step can be
scheduled while this one still runs on the device (async scheduling): a decode's input is then
the previous step's sampled token, which the runner takes from that step's device output.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from inference.config import SchedulerConfig
from inference.core.block_manager import BlockManager
from inference.core.kv_tiers import KVTierStats
from inference.core.request import Request, RequestStatus
from inference.interfaces import ModelRunnerOutput, ScheduledRequest, SchedulerOutput


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    kv_tiers: KVTierStats | None = None       # host / disk KV tiers, when configured


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int):
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
            # a prompt, or a recompute after preemption, of up to max_model_len tokens must fit one step
            raise ValueError(f"max_num_batched_tokens: must be >= max_model_len ({max_model_len}) "
                             f"without chunked prefill, got {config.max_num_batched_tokens}")
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}      # req_id -> live request
        self.num_preemptions = 0

    # ---- requests in and out ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a validated request (its prompt fits the model and the KV cache)."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already running")
        self.requests[request.request_id] = request
        self._enqueue_waiting(request, front=False)

    def finish_request(self, req_id: str, status: RequestStatus) -> Request | None:
        """Finish (stop, length) or abort a request; its blocks go back to the pool now."""
        request = self.requests.pop(req_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        # Only KV below num_computed_tokens was written: a step that failed (or a request
        # aborted around one) must not leave hashes of unwritten blocks in the prefix cache.
        self.block_manager.free(request, num_valid_tokens=request.num_computed_tokens)
        return request

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens: running requests first, then admit waiting ones."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        bm = self.block_manager

        # 1. Running requests, oldest first; preempt from the back when blocks run out.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens + request.num_placeholders - request.num_computed_tokens, budget)
            if request.reuse_jump is not None:     # compute up to the reused run; its KV is copied
                num_new = min(num_new, request.reuse_jump[0] - request.num_computed_tokens)
            if num_new <= 0 or self._ends_with_placeholders(request):
                i += 1                  # nothing to compute, or it finishes with a token in flight
                continue
            spec = self._fitting_drafts(request, num_new, budget)
            if spec and not bm.allocate_slots(request, num_new + len(spec)):
                spec = []               # no room for the drafts: decode plainly rather than preempt
            if spec or bm.allocate_slots(request, num_new):
                self._schedule(out, request, num_new + len(spec), spec)
                budget -= num_new + len(spec)
                i += 1
                continue
            victim = self._pick_victim()
            if self.running.index(victim) < i:
                i -= 1                  # an already-scheduled victim: later entries shift left
            budget += self._preempt(victim, out)
            # retry running[i]: the same request, or the next one if it was the victim

        # 2. Waiting requests, unless we just had to preempt (no room: don't thrash).
        while (self.waiting and budget > 0 and not out.preempted_req_ids
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting[0]
            if out.scheduled and not bm.can_load_now(request):
                break                   # this step's copies up from the KV tiers are spent
                # (a step with nothing else always takes it: loads recorded by a step that
                # launched nothing still count, and must not hold every later step back)
            hit_blocks, num_hit = bm.get_computed_blocks(request)
            first = request.num_cached_tokens < 0
            reuse = bm.plan_reuse(request, num_hit) if first else None
            start, jump = self._reuse_start(reuse[0]) if reuse is not None else (num_hit, None)
            num_new = (jump[0] if jump else request.num_tokens) - start
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            if reuse is not None and not bm.allocate_with_reuse(
                    request, *reuse, max(start + num_new, reuse[0].run_end) - num_hit, hit_blocks):
                reuse, start, jump = None, num_hit, None         # no room for it: try without
                num_new = min(request.num_tokens - num_hit, budget)
            if reuse is None and not bm.allocate_slots(request, num_new, hit_blocks):
                break
            self.waiting.popleft()
            if first:
                request.num_cached_tokens = num_hit + (reuse[0].num_reused if reuse else 0)
                bm.prefix_stats.record(request.num_tokens, num_hit)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
            request.num_computed_tokens = start
            request.reuse_jump, request.reuse_base = jump, num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._schedule(out, request, num_new)
            if reuse is not None:
                out.kv_shifts.extend(reuse[0].shifts)
            budget -= num_new
        if out.scheduled:                       # an empty step is not launched: copies wait for one
            out.kv_transfers = bm.take_kv_transfers()
        return out

    def update_from_output(self, out: SchedulerOutput,
                           result: ModelRunnerOutput) -> list[tuple[Request, list[int]]]:
        """Advance computed counts, append sampled tokens, finish on EOS/stop-id/length.

        Returns (request, its new tokens) for the requests that got tokens this step (finished
        ones included; those are already removed from the scheduler and their blocks freed).
        Speculative steps give a request its accepted drafts and then the sampled token; the KV
        of rejected drafts stops counting as computed (those slots are rewritten later).
        """
        updated = []
        for item in out.scheduled:
            request = item.request
            if not item.needs_sample:
                continue
            if request.status == RequestStatus.RUNNING:
                request.num_placeholders -= 1
            elif request.status != RequestStatus.PREEMPTED:
                continue                      # finished or aborted since it was scheduled
            # else preempted with this token in flight (async scheduling): keep it, as the
            # sequential loop would have before preempting; the recompute then includes it
            accepted = result.accepted_draft_ids.get(request.request_id, [])
            if item.spec_token_ids and request.status == RequestStatus.RUNNING:
                request.num_computed_tokens -= len(item.spec_token_ids) - len(accepted)
            tokens = []
            for token in (*accepted, result.sampled_token_ids[request.request_id]):
                request.append_output_token(token)
                tokens.append(token)
                status = self._check_stop(request, token)
                if status is not None:
                    self.finish_request(request.request_id, status)
                    break
            updated.append((request, tokens))
        return updated

    def rollback(self, out: SchedulerOutput) -> None:
        """Undo the scheduling of a step that failed (its KV was never written), so that freeing
        its requests forgets the prefix-cache hashes of their unwritten blocks."""
        shifted = {s.req_id for s in out.kv_shifts}
        for item in out.scheduled:
            request = item.request
            if request.status == RequestStatus.RUNNING:
                floor = item.num_computed_tokens
                if request.request_id in shifted:          # its copies may not have run either
                    floor, request.reuse_jump, request.num_exact_tokens = request.reuse_base, None, None
                request.num_computed_tokens = min(request.num_computed_tokens, floor)
                request.num_placeholders = 0
        self.block_manager.forget_kv_transfers(out.kv_transfers)

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(len(self.running), len(self.waiting), bm.usage,
                              bm.prefix_stats.queries, bm.prefix_stats.hits, self.num_preemptions,
                              bm.tier_stats())

    # ---- internals -----------------------------------------------------------------------
    def _fitting_drafts(self, request: Request, num_new: int, budget: int) -> list[int]:
        """The request's drafts that fit this step: after a plain decode only (its last token
        known), within the token budget, max_tokens and the model's length (every draft accepted
        plus the bonus token must still fit). Taken from the request either way."""
        spec, request.spec_token_ids = request.spec_token_ids, []
        if not spec or num_new != 1 or request.num_placeholders:
            return []
        room = min(budget - 1, request.max_tokens - request.num_output_tokens - 1,
                   self.max_model_len - request.num_tokens - 1)
        return spec[:max(0, room)]

    def _schedule(self, out: SchedulerOutput, request: Request, num_new: int, spec: list[int] = ()) -> None:
        computed = request.num_computed_tokens
        needs_sample = computed + num_new - len(spec) == request.num_tokens + request.num_placeholders
        out.scheduled.append(ScheduledRequest(
            request=request,
            num_computed_tokens=computed,
            num_scheduled_tokens=num_new,
            block_ids=list(self.block_manager.block_table(request.request_id)),
            needs_sample=needs_sample,
            spec_token_ids=list(spec),
        ))
        out.total_num_scheduled_tokens += num_new
        request.num_computed_tokens = computed + num_new
        request.num_placeholders += needs_sample
        jump = request.reuse_jump
        if jump is not None and request.num_computed_tokens == jump[0]:
            request.num_computed_tokens, request.reuse_jump = jump[1], None

    @staticmethod
    def _reuse_start(plan) -> tuple[int, tuple[int, int] | None]:
        """Where an admission with a reuse plan starts computing, and the run it jumps later: the
        lead is copied, so computing starts after it; a run right there is skipped too."""
        if plan.run_end == plan.run_start:
            return plan.lead_end, None
        if plan.run_start == plan.lead_end:
            return plan.run_end, None
        return plan.lead_end, (plan.run_start, plan.run_end)

    def _ends_with_placeholders(self, request: Request) -> bool:
        """Its tokens in flight take it to max_tokens or the model's length: nothing to schedule."""
        return request.num_placeholders > 0 and (
            request.num_output_tokens + request.num_placeholders >= request.max_tokens
            or request.num_tokens + request.num_placeholders >= self.max_model_len)

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, request: Request, out: SchedulerOutput) -> int:
        """Preempt `request`; returns the tokens it gives back to this step's budget."""
        self.running.remove(request)
        num_unscheduled = 0
        # An already-scheduled victim (possible under the priority policy) must be unscheduled.
        for k, item in enumerate(out.scheduled):
            if item.request is request:
                num_unscheduled = item.num_scheduled_tokens
                out.total_num_scheduled_tokens -= num_unscheduled
                request.num_computed_tokens = item.num_computed_tokens     # its step won't run
                del out.scheduled[k]
                break
        # Blocks its cancelled step registered in the prefix cache will never be written.
        self.block_manager.free(request, num_valid_tokens=request.num_computed_tokens)
        request.status = RequestStatus.PREEMPTED
        request.spec_token_ids = []
        request.reuse_jump, request.num_exact_tokens = None, None    # recomputed in full, exactly
        request.num_computed_tokens = 0
        request.num_placeholders = 0          # a token in flight is still appended when it arrives
        request.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_req_ids.append(request.request_id)
        self._enqueue_waiting(request, front=True)
        return num_unscheduled

    def _enqueue_waiting(self, request: Request, front: bool) -> None:
        if self.config.policy == "priority":
            key = (request.priority, request.arrival_time)
            idx = next((k for k, r in enumerate(self.waiting) if (r.priority, r.arrival_time) > key),
                       len(self.waiting))
            self.waiting.insert(idx, request)
        elif front:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if (token == request.eos_token_id or token in request.end_token_ids) and not params.ignore_eos:
                request.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if params.stop_token_ids and token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None
