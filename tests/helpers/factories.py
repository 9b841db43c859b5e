"""Small factories for CPU-only scheduler / block-manager tests: no model, no torch.

`fake_step` plays the model runner: every request that needs a sample this step gets the
deterministic token `100 + len(request.output_token_ids)`, so a request's outputs are always
[100, 101, ...] however often it was preempted and recomputed. Prompts built from a count use
token ids >= 10_000, so they never collide with fake outputs or with small eos / stop ids.
"""
from __future__ import annotations

import itertools
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.config import SchedulerConfig
from inference.core.block_manager import BlockManager
from inference.core.request import Request, RequestStatus
from inference.core.scheduler import Scheduler
from inference.interfaces import ModelRunnerOutput, SchedulerOutput
from inference.sampling_params import SamplingParams

_clock = itertools.count(1)     # arrival times: strictly increasing, never tied


def prompt_tokens(req_id: str, num_tokens: int) -> list[int]:
    """A prompt that shares no block with another request id's (distinct start per id)."""
    base = 10_000 + (zlib.crc32(req_id.encode()) % 10_000) * 1_000
    return [base + i for i in range(num_tokens)]


def make_request(req_id: str, prompt: int | list[int] = 4, *, max_tokens: int = 8,
                 eos: int | None = None, min_tokens: int = 0,
                 stop_token_ids: list[int] | None = None, ignore_eos: bool = False,
                 priority: int = 0, arrival_time: float | None = None,
                 params: SamplingParams | None = None) -> Request:
    """A request of `prompt` tokens (a count: tokens unique to `req_id`; or an explicit list)."""
    token_ids = prompt_tokens(req_id, prompt) if isinstance(prompt, int) else list(prompt)
    if params is None:
        params = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens,
                                stop_token_ids=stop_token_ids, ignore_eos=ignore_eos)
    return Request(request_id=req_id, prompt_token_ids=token_ids, sampling_params=params,
                   eos_token_id=eos, max_tokens=max_tokens, priority=priority,
                   arrival_time=float(next(_clock)) if arrival_time is None else arrival_time)


def make_block_manager(num_blocks: int = 16, block_size: int = 4,
                       enable_prefix_caching: bool = True) -> BlockManager:
    return BlockManager(num_blocks, block_size, enable_prefix_caching)


def make_scheduler(num_blocks: int = 16, block_size: int = 4, max_num_batched_tokens: int = 64,
                   max_num_seqs: int = 16, enable_prefix_caching: bool = True,
                   chunked: bool = True, policy: str = "fcfs",
                   max_model_len: int | None = None) -> Scheduler:
    """A scheduler over a fresh block manager; max_model_len defaults to the whole KV cache."""
    config = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             enable_chunked_prefill=chunked, policy=policy)
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching)
    return Scheduler(config, bm, max_model_len or num_blocks * block_size)


def fake_token(request: Request) -> int:
    return 100 + len(request.output_token_ids)


class StaleKVError(AssertionError):
    """A step attended to KV that does not hold its request's tokens."""


class FakeKVCache:
    """The paged KV cache with token ids for values: catches a step that attends to a slot its
    request never wrote (a stale prefix hit, a block overwritten while shared, a bad table)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.slots: list[list[int | None]] = [[None] * block_size for _ in range(num_blocks)]

    def run(self, out: SchedulerOutput) -> None:
        bs = self.block_size
        # every scheduled token's KV is written before any attention reads (as in the runner)
        for item in out.scheduled:
            start = item.num_computed_tokens
            for pos, token in zip(range(start, start + item.num_scheduled_tokens), item.token_ids()):
                self.slots[item.block_ids[pos // bs]][pos % bs] = token
        for item in out.scheduled:      # drafts (speculative decoding) follow the request's tokens
            self.check(item.request.request_id, item.request.all_token_ids + item.spec_token_ids, item.block_ids,
                       item.num_computed_tokens + item.num_scheduled_tokens)

    def check(self, req_id: str, tokens: list[int], block_ids: list[int], num_tokens: int) -> None:
        bs = self.block_size
        seen = [self.slots[block_ids[pos // bs]][pos % bs] for pos in range(num_tokens)]
        bad = [pos for pos in range(num_tokens) if seen[pos] != tokens[pos]]
        if bad:
            raise StaleKVError(f"{req_id}: KV of positions {bad} is not its tokens "
                               f"(blocks {block_ids}; slots hold {[seen[p] for p in bad]})")


_kv_caches: weakref.WeakKeyDictionary[Scheduler, FakeKVCache] = weakref.WeakKeyDictionary()


def kv_of(scheduler: Scheduler) -> FakeKVCache:
    """The fake KV cache that goes with `scheduler` (one per scheduler, made on first use)."""
    kv = _kv_caches.get(scheduler)
    if kv is None:
        bm = scheduler.block_manager
        kv = _kv_caches[scheduler] = FakeKVCache(bm.num_blocks, bm.block_size)
    return kv


def fake_step(scheduler: Scheduler, token_fn: Callable[[Request], int] = fake_token
              ) -> tuple[SchedulerOutput, list[Request]]:
    """schedule() -> play the step on the scheduler's fake KV cache (checks what it reads) ->
    a ModelRunnerOutput with one token per `needs_sample` -> update_from_output."""
    out = scheduler.schedule()
    kv_of(scheduler).run(out)
    result = ModelRunnerOutput(sampled_token_ids={
        item.request.request_id: token_fn(item.request) for item in out.scheduled if item.needs_sample})
    updated = [request for request, _ in scheduler.update_from_output(out, result)]
    return out, updated


# ---- invariants and a bounded run loop -------------------------------------------------------
def check_block_manager(bm: BlockManager) -> None:
    """Ref counts match the block tables; the free queue holds exactly the unreferenced blocks;
    the hash table and the blocks agree."""
    counts = [0] * bm.num_blocks
    for table in bm.req_to_blocks.values():
        assert len(set(table)) == len(table), f"block listed twice in one table: {table}"
        for block_id in table:
            counts[block_id] += 1
    for block in bm.blocks:
        assert block.ref_cnt == counts[block.block_id], (
            f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by {counts[block.block_id]} tables")
    assert set(bm.free_queue) == {b.block_id for b in bm.blocks if b.ref_cnt == 0}
    assert len(bm.free_queue) == bm.num_free_blocks
    for block_hash, block_id in bm.cached_blocks.items():
        assert bm.blocks[block_id].block_hash == block_hash


def check_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
    cfg = scheduler.config
    total = sum(item.num_scheduled_tokens for item in out.scheduled)
    assert out.total_num_scheduled_tokens == total
    assert 0 <= total <= cfg.max_num_batched_tokens
    assert len(out.scheduled) <= cfg.max_num_seqs
    assert len(scheduler.running) <= cfg.max_num_seqs
    ids = [item.request.request_id for item in out.scheduled]
    assert len(set(ids)) == len(ids), f"request scheduled twice in one step: {ids}"
    assert not set(ids) & set(out.preempted_req_ids)
    bs = scheduler.block_manager.block_size
    for item in out.scheduled:
        assert item.num_scheduled_tokens >= 1
        # the block table covers every token computed so far plus this step's tokens
        assert len(item.block_ids) * bs >= item.num_computed_tokens + item.num_scheduled_tokens
        if not cfg.enable_chunked_prefill:
            assert item.needs_sample, "without chunked prefill every scheduled request samples"
    for r in scheduler.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.num_computed_tokens == 0
        assert r.request_id not in scheduler.block_manager.req_to_blocks
    for r in scheduler.running:
        assert r.status == RequestStatus.RUNNING
    assert len(scheduler.running) + len(scheduler.waiting) == scheduler.num_unfinished
    check_block_manager(scheduler.block_manager)


@dataclass
class RunLog:
    steps: list[SchedulerOutput] = field(default_factory=list)
    finished: dict[str, Request] = field(default_factory=dict)      # req_id -> request
    first_token_step: dict[str, int] = field(default_factory=dict)  # req_id -> step index
    finish_step: dict[str, int] = field(default_factory=dict)       # req_id -> step index

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def scheduled_ids(self, step: int) -> list[str]:
        return [item.request.request_id for item in self.steps[step].scheduled]


def run_to_completion(scheduler: Scheduler, max_steps: int = 1_000,
                      token_fn: Callable[[Request], int] = fake_token,
                      before_step: Callable[[int], None] | None = None,
                      log: RunLog | None = None) -> RunLog:
    """Step until nothing is unfinished, checking invariants each step. A deadlock (or livelock)
    fails after `max_steps` instead of hanging."""
    log = log or RunLog()
    bm = scheduler.block_manager
    step = 0
    while True:
        if before_step is not None:
            before_step(step)
        if not scheduler.has_unfinished():
            break
        if step >= max_steps:
            raise AssertionError(
                f"not finished after {max_steps} steps: running={[r.request_id for r in scheduler.running]} "
                f"waiting={[r.request_id for r in scheduler.waiting]}")
        out, updated = fake_step(scheduler, token_fn)
        check_step(scheduler, out)
        log.steps.append(out)
        for r in updated:
            log.first_token_step.setdefault(r.request_id, step)
            if r.status.is_finished:
                log.finished[r.request_id] = r
                log.finish_step[r.request_id] = step
        step += 1
    assert bm.num_free_blocks == bm.num_blocks, f"{bm.num_blocks - bm.num_free_blocks} blocks leaked"
    assert not bm.req_to_blocks and not bm.req_num_cached
    assert not scheduler.running and not scheduler.waiting
    check_block_manager(bm)
    return log
