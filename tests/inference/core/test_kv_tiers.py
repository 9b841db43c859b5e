"""Tiered KV cache (inference/core/kv_tiers.py, kv_tier_store.py): prefix-cached blocks evicted from the
device pool move to host memory (then disk) and come back on a hit.

Scheduler-level tests play the runner with a fake KV cache of token ids that also executes the
transfers, so a loaded block holding the wrong tokens fails the step that reads it; engine-level
tests use random:tiny with a device pool too small to keep earlier chat turns.
"""
from __future__ import annotations

import argparse
import random

import pytest

from inference import LLM, SamplingParams
from inference.config import CacheConfig, SchedulerConfig
from inference.core.block_manager import BlockManager
from inference.core.kv_tiers import KVTierIndex, KVTransfer, TransferOp
from inference.core.scheduler import Scheduler
from tests.conftest import assert_all_blocks_free
from tests.helpers import factories
from tests.helpers.factories import (
    FakeKVCache,
    check_block_manager,
    fake_step,
    make_request,
    run_to_completion,
)

BLOCK_BYTES_TINY = 8192          # random:tiny in fp32, block_size 16: 2 layers x (K, V) x 16 x 2 x 16 x 4
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


# ---- a fake runner that executes the transfers ---------------------------------------------------
class TieredFakeKV(FakeKVCache):
    """Token ids for KV values, in the device pool, the host slots and the disk slots."""

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self.host: dict[int, list] = {}
        self.disk: dict[int, list] = {}

    def run(self, out) -> None:
        for t in out.kv_transfers:
            src = {TransferOp.DEVICE_TO_HOST: self.slots, TransferOp.HOST_TO_DEVICE: self.host,
                   TransferOp.HOST_TO_DISK: self.host, TransferOp.DISK_TO_HOST: self.disk}[t.op]
            dst = {TransferOp.DEVICE_TO_HOST: self.host, TransferOp.HOST_TO_DEVICE: self.slots,
                   TransferOp.HOST_TO_DISK: self.disk, TransferOp.DISK_TO_HOST: self.host}[t.op]
            dst[t.dst] = list(src[t.src])
        super().run(out)


def tiered_scheduler(num_blocks: int, host: int, disk: int = 0, block_size: int = 4,
                     budget: int = 32, write_behind: int | None = None) -> Scheduler:
    """A scheduler over tiers of 100-byte blocks; `write_behind`: bytes per step (None: default)."""
    kw = {} if write_behind is None else {"write_behind_bytes": write_behind}
    tiers = KVTierIndex(host, disk, block_size, bytes_per_block=100, **kw) if host else None
    bm = BlockManager(num_blocks, block_size, True, tiers)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8), bm, num_blocks * block_size)
    factories._kv_caches[sched] = TieredFakeKV(num_blocks, block_size)
    return sched


def chat_turns(sched: Scheduler, num_sessions: int, num_turns: int, seed: int = 0) -> int:
    """Multi-turn sessions (each turn: the whole conversation so far + a new message); returns the
    prompt tokens computed (looked up minus hit)."""
    rng = random.Random(seed)
    convs = [[20_000 + 1000 * s + rng.randrange(900) for _ in range(10)] for s in range(num_sessions)]
    for turn in range(num_turns):
        reqs = [make_request(f"s{s}t{turn}", list(c), max_tokens=3) for s, c in enumerate(convs)]
        for r in reqs:
            sched.add_request(r)
        log = run_to_completion(sched)
        for c, r in zip(convs, reqs):
            c += log.finished[r.request_id].output_token_ids + [30_000 + rng.randrange(900) for _ in range(5)]
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.req_to_blocks      # no leak
    return bm.prefix_stats.queries - bm.prefix_stats.hits


def test_evicted_blocks_move_down_and_hits_come_back_up():
    computed_off = chat_turns(tiered_scheduler(24, host=0), 6, 4)
    sched = tiered_scheduler(24, host=200)
    computed_on = chat_turns(sched, 6, 4)      # the fake KV checks every block a step reads
    host = sched.block_manager.tier_stats().tier("host")
    assert host.bytes_in > 0 and host.bytes_out > 0 and host.hit_blocks > 0
    assert computed_on < 0.5 * computed_off, (computed_on, computed_off)
    assert host.num_used <= host.num_slots


@pytest.mark.parametrize("host,disk", [(3, 0), (2, 6), (4, 200)])
def test_small_tiers_stay_within_size_and_correct(host, disk):
    sched = tiered_scheduler(16, host=host, disk=disk)
    chat_turns(sched, 5, 4, seed=host)
    stats = sched.block_manager.tier_stats()
    for t in stats.tiers:
        assert 0 <= t.num_used <= t.num_slots
    if disk:
        d = stats.tier("disk")
        assert d.bytes_in > 0 and d.num_used <= disk
    if disk == 200:
        assert d.hit_blocks > 0


def test_failed_step_forgets_its_transfers():
    sched = tiered_scheduler(12, host=50)
    chat_turns(sched, 4, 2)
    tiers = sched.block_manager.tiers
    used = len(tiers.host.entries)
    assert used > 0
    req = make_request("big", 40, max_tokens=2)
    sched.add_request(req)
    out = sched.schedule()
    assert out.kv_transfers                    # its blocks evict cached ones to the host tier
    sched.rollback(out)                        # the step failed: nothing was copied
    filled = {t.dst for t in out.kv_transfers if t.op is TransferOp.DEVICE_TO_HOST}
    assert not filled & set(tiers.host.entries.values())
    sched.finish_request("big", factories.RequestStatus.FINISHED_ABORTED)


# ---- write-behind -----------------------------------------------------------------------------------
D2H = TransferOp.DEVICE_TO_HOST


def offloads_on_eviction(out) -> list[KVTransfer]:
    return [t for t in out.kv_transfers if t.op is D2H and not t.behind]


def hashed_blocks(sched: Scheduler, request) -> dict[int, bytes]:
    """The request's cached device blocks: block id -> hash."""
    bm = sched.block_manager
    return {b: bm.blocks[b].block_hash for b in bm.block_table(request.request_id) if bm.blocks[b].block_hash}


def assert_tiers_hold_their_tokens(sched: Scheduler, requests) -> None:
    """Every host / disk entry holds the tokens of the block its hash names (no stale copy)."""
    bs, kv, tiers = sched.block_manager.block_size, factories._kv_caches[sched], sched.block_manager.tiers
    want = {}
    for r in requests:
        r.update_block_hashes(bs)
        for i, h in enumerate(r.block_hashes):
            want[h] = r.all_token_ids[i * bs:(i + 1) * bs]
    for tier, slots in ((tiers.host, kv.host), (tiers.disk, kv.disk)):
        for h, slot in (tier.entries.items() if tier is not None else ()):
            assert slots[slot] == want[h], (tier.name, slot, slots[slot], want[h])


def test_freed_blocks_are_written_behind_and_their_eviction_copies_nothing():
    sched = tiered_scheduler(16, host=50)
    tiers = sched.block_manager.tiers
    a = make_request("a", 13, max_tokens=1)         # one step: prefill, sample, freed
    sched.add_request(a)
    factories._kv_caches[sched].run(sched.schedule())
    a_blocks = hashed_blocks(sched, a)
    assert len(a_blocks) == 3
    sched.finish_request("a", factories.RequestStatus.FINISHED_STOPPED)
    assert not tiers.host.entries and list(tiers.unwritten) == list(reversed(a_blocks))
    b = make_request("b", 3, max_tokens=1)          # no full block of its own
    sched.add_request(b)
    out, _ = fake_step(sched)
    # the next launched step copies a's blocks down, before anything needs their device blocks
    assert {(t.src, t.behind) for t in out.kv_transfers} == {(blk, True) for blk in a_blocks}
    assert set(tiers.host.entries) == set(a_blocks.values())
    assert tiers.host.stats.bytes_written_behind == tiers.host.stats.bytes_in == 300
    run_to_completion(sched)
    c = make_request("c", 63, max_tokens=1)         # every device block: a's are evicted
    sched.add_request(c)
    log = run_to_completion(sched)
    assert not any(sched.block_manager.cached_blocks.get(h) in a_blocks for h in a_blocks.values())
    assert [offloads_on_eviction(o) for o in log.steps] == [[] for _ in log.steps]
    assert tiers.host.stats.num_evictions == 0 and set(a_blocks.values()) <= set(tiers.host.entries)
    assert_tiers_hold_their_tokens(sched, [a, b, c])


def test_running_requests_blocks_are_written_behind_after_the_step_that_fills_them():
    sched = tiered_scheduler(16, host=50)
    tiers = sched.block_manager.tiers
    a = make_request("a", 13, max_tokens=6)
    sched.add_request(a)
    out, _ = fake_step(sched)                       # prefill: fills 3 blocks
    assert not out.kv_transfers
    a_blocks = hashed_blocks(sched, a)
    out, _ = fake_step(sched)                       # decode: writes them behind
    assert {(t.src, t.behind) for t in out.kv_transfers} == {(blk, True) for blk in a_blocks}
    while len(hashed_blocks(sched, a)) == 3:        # decodes of positions 14, 15: the second
        out, _ = fake_step(sched)                   # fills block 3, and must not copy it yet
        assert not out.kv_transfers
    out, _ = fake_step(sched)
    assert [(t.src, t.behind) for t in out.kv_transfers] == [(sched.block_manager.block_table("a")[3], True)]
    run_to_completion(sched)
    assert tiers.host.stats.bytes_written_behind == 400
    c = make_request("c", 63, max_tokens=1)         # every device block: a's are evicted
    sched.add_request(c)
    log = run_to_completion(sched)
    assert [offloads_on_eviction(o) for o in log.steps] == [[] for _ in log.steps]
    d = make_request("d", a.all_token_ids[:16] + [55_555, 55_556], max_tokens=2)
    sched.add_request(d)
    run_to_completion(sched)                        # the fake KV checks the loaded blocks' tokens
    assert d.num_cached_tokens == 16 and tiers.host.stats.hit_blocks == 4


def test_write_behind_is_bounded_per_step_and_never_copies_a_reused_block():
    """One block per step: a's other blocks are evicted (and handed to c) before their turn; they
    must be offloaded on eviction, once, and their queued write-behind dropped, not run later on
    c's data."""
    sched = tiered_scheduler(16, host=50, write_behind=100)
    bm, tiers = sched.block_manager, sched.block_manager.tiers
    a = make_request("a", 17, max_tokens=1)
    sched.add_request(a)
    run_to_completion(sched)
    a_hashes = set(a.block_hashes[:4])
    assert set(tiers.unwritten.values()) == a_hashes
    b = make_request("b", 3, max_tokens=1)
    sched.add_request(b)
    out, _ = fake_step(sched)
    assert [t.behind for t in out.kv_transfers] == [True]
    c = make_request("c", 63, max_tokens=1)
    sched.add_request(c)
    copied: list[bytes] = []
    while sched.has_unfinished():
        out = sched.schedule()
        for t in out.kv_transfers:
            if t.op is D2H:
                h = next(h for h, slot in tiers.host.entries.items() if slot == t.dst)
                copied.append(h)
                if t.behind:        # the source still caches that hash when the copy is recorded
                    assert bm.blocks[t.src].block_hash == h and bm.cached_blocks[h] == t.src
        factories._kv_caches[sched].run(out)
        from inference.interfaces import ModelRunnerOutput
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={
            it.request.request_id: factories.fake_token(it.request) for it in out.scheduled if it.needs_sample}))
        assert not set(tiers.unwritten) & set(bm.block_table("c"))
    a_copies = [h for h in copied if h in a_hashes]
    assert len(a_copies) == len(set(a_copies)) == 3           # the 3 not written behind yet, once each
    assert_tiers_hold_their_tokens(sched, [a, b, c])
    d = make_request("d", a.all_token_ids[:16] + [55_555], max_tokens=2)
    sched.add_request(d)
    run_to_completion(sched)
    assert d.num_cached_tokens == 16


def test_reused_block_queued_for_write_behind_is_not_copied():
    """The index alone: a queued block whose hash changed (reused, forgotten) is skipped; an
    evicted one leaves the queue; the budget rounds up to whole blocks."""
    tiers = KVTierIndex(8, 0, 4, bytes_per_block=100, write_behind_bytes=150)
    for blk, h in ((1, b"h1"), (2, b"h2"), (3, b"h3"), (4, b"h4")):
        tiers.on_device_free(h, blk)
    tiers.on_device_evict(b"h2", 2)                      # offloaded now, on the critical path
    assert [t.behind for t in tiers.take_transfers()] == [False]
    holds = {1: b"other", 3: b"h3", 4: b"h4"}            # block 1 was reused for other data
    tiers.write_behind(lambda blk, h: holds.get(blk) == h)
    assert [(t.src, t.behind) for t in tiers.take_transfers()] == [(3, True), (4, True)]   # 2 blocks
    assert set(tiers.host.entries) == {b"h2", b"h3", b"h4"} and not tiers.unwritten
    tiers.on_device_free(b"h3", 3)                       # already below: nothing to do
    assert not tiers.unwritten
    off = KVTierIndex(8, 0, 4, bytes_per_block=100, write_behind_bytes=0)
    off.on_device_free(b"h1", 1)
    off.write_behind(lambda blk, h: True)
    assert not off.take_transfers()


def test_write_behind_never_pushes_host_entries_to_disk():
    """A full host tier with a disk tier below: write-behind waits (it would cost a disk write on
    a decode step); without a disk tier it drops the LRU entry like an eviction would."""
    for disk, want in ((10, []), (0, [(5, True)])):
        tiers = KVTierIndex(1, disk, 4, bytes_per_block=100)
        tiers.on_device_evict(b"old", 9)
        tiers.take_transfers()
        tiers.on_device_free(b"new", 5)
        tiers.write_behind(lambda blk, h: True)
        assert [(t.src, t.behind) for t in tiers.take_transfers()] == want
        assert list(tiers.unwritten) == ([5] if disk else [])


def test_failed_step_requeues_its_write_behind():
    sched = tiered_scheduler(16, host=50)
    tiers = sched.block_manager.tiers
    a = make_request("a", 13, max_tokens=1)
    sched.add_request(a)
    run_to_completion(sched)
    b = make_request("b", 3, max_tokens=1)
    sched.add_request(b)
    out = sched.schedule()
    assert len(out.kv_transfers) == 3 and all(t.behind for t in out.kv_transfers)
    sched.rollback(out)                              # the copies may not have run
    sched.finish_request("b", factories.RequestStatus.FINISHED_ABORTED)
    assert not tiers.host.entries and len(tiers.unwritten_live) == 3
    sched.add_request(make_request("b2", 3, max_tokens=1))
    out, _ = fake_step(sched)
    assert len(out.kv_transfers) == 3 and len(tiers.host.entries) == 3
    assert_tiers_hold_their_tokens(sched, [a])


@pytest.mark.parametrize("seed", range(6))
def test_write_behind_under_aborts_preemptions_and_failed_steps(seed):
    """Random traffic over shared prefixes in a pool that preempts, with aborts and failed steps:
    every step reads the right tokens, no block leaks, and every tier entry holds its hash's
    tokens."""
    from inference.interfaces import ModelRunnerOutput
    rng = random.Random(seed)
    sched = tiered_scheduler(14, host=12 + 10 * (seed % 2), disk=20 * (seed % 3 == 0), budget=16,
                             write_behind=100 * (1 + seed % 3))
    bm, kv = sched.block_manager, factories._kv_caches[sched]
    prefixes = [[40_000 + 100 * p + i for i in range(rng.randrange(5, 21))] for p in range(4)]
    requests = []
    for step in range(400):
        if rng.random() < 0.35 and len(sched.requests) < 5:
            tail = [rng.randrange(50_000, 60_000) for _ in range(rng.randrange(1, 9))]
            r = make_request(f"r{step}", rng.choice(prefixes) + tail, max_tokens=rng.randrange(1, 7))
            sched.add_request(r)
            requests.append(r)
        if sched.requests and rng.random() < 0.06:
            sched.finish_request(rng.choice(list(sched.requests)), factories.RequestStatus.FINISHED_ABORTED)
        if not sched.has_unfinished():
            continue
        out = sched.schedule()
        if out.kv_transfers and rng.random() < 0.08:         # the step fails: nothing ran
            sched.rollback(out)
            for item in out.scheduled:
                sched.finish_request(item.request.request_id, factories.RequestStatus.FINISHED_ABORTED)
            continue
        kv.run(out)
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={
            it.request.request_id: factories.fake_token(it.request) for it in out.scheduled if it.needs_sample}))
        check_block_manager(bm)
    run_to_completion(sched)
    assert bm.num_free_blocks == bm.num_blocks and not bm.req_to_blocks
    stats = bm.tier_stats()
    assert stats.tier("host").bytes_written_behind > 0
    for t in stats.tiers:
        assert 0 <= t.num_used <= t.num_slots
    assert_tiers_hold_their_tokens(sched, requests)


# ---- load budget -----------------------------------------------------------------------------------
def test_load_budget_spreads_a_rounds_loads_over_steps():
    """With a budget of 6 copies up per step, a step admits waiting hits until the next would pass
    it (a step's first hit always goes in, however large): the round's later turns then load
    over several steps. Same hits and prefill as without the budget; every read checked."""
    runs = {}
    for load_budget in (None, 600):
        sched = tiered_scheduler(24, host=200, budget=256)
        sched.block_manager.tiers.load_budget_bytes = load_budget
        steps, seen, plain = [], set(), sched.schedule

        def schedule(plain=plain, steps=steps, seen=seen):
            out = plain()
            new = [it.request.request_id for it in out.scheduled if it.request.request_id not in seen]
            seen.update(new)
            steps.append((sum(1 for t in out.kv_transfers if t.op is TransferOp.HOST_TO_DEVICE), len(new)))
            return out
        sched.schedule = schedule
        computed = chat_turns(sched, 6, 4)
        runs[load_budget] = (steps, computed, sched.block_manager.tier_stats().tier("host").hit_blocks)
    (plain_steps, plain_computed, plain_hits), (steps, computed, hits) = runs[None], runs[600]
    assert max(n for n, _ in plain_steps) > 6
    assert all(n <= 6 or admitted == 1 for n, admitted in steps), steps
    assert sum(1 for n, _ in steps if n) > sum(1 for n, _ in plain_steps if n)
    assert (computed, hits) == (plain_computed, plain_hits)


def test_load_budget_never_holds_back_a_step_with_nothing_else():
    """Loads recorded by a schedule that launched nothing still count against the budget (they run
    with the next launched step); a step with nothing else scheduled must admit the request anyway,
    or every later step would come out empty."""
    sched = tiered_scheduler(8, host=50, budget=64)
    a = make_request("a", 13, max_tokens=2)
    sched.add_request(a)
    run_to_completion(sched)
    b = make_request("b", [9_000 + i for i in range(28)], max_tokens=2)
    sched.add_request(b)
    run_to_completion(sched)                             # b's blocks evict a's: a is in the host tier only
    tiers = sched.block_manager.tiers
    assert all(tiers.contains(h) for h in a.block_hashes[:3])
    tiers.load_budget_bytes = 100                        # one block a step
    tiers.num_pending_loads = 5                          # carried over from a step that launched nothing
    a2 = make_request("a2", list(a.prompt_token_ids), max_tokens=2)
    sched.add_request(a2)
    out, _ = fake_step(sched)
    assert [it.request.request_id for it in out.scheduled] == ["a2"]
    assert any(t.op is TransferOp.HOST_TO_DEVICE for t in out.kv_transfers)
    run_to_completion(sched)
    assert_tiers_hold_their_tokens(sched, [a, b, a2])


def test_retried_prompt_is_not_written_behind_while_its_step_writes_it():
    """A step fails and its request is aborted: its blocks' hashes are forgotten without an
    eviction, while their write-behind entries are still queued. A retry of the same prompt gets
    the same blocks and caches the same hashes again; the step that writes them must not carry a
    write-behind copy of them (it would copy them down before / while its forward fills them)."""
    sched = tiered_scheduler(16, host=50)
    a = make_request("a", 13, max_tokens=2)
    sched.add_request(a)
    sched.rollback(sched.schedule())                     # the step fails ...
    sched.finish_request("a", factories.RequestStatus.FINISHED_ABORTED)   # ... and is aborted
    a2 = make_request("a2", list(a.prompt_token_ids), max_tokens=2)       # the client retries
    sched.add_request(a2)
    out, _ = fake_step(sched)
    written = set(sched.block_manager.block_table("a2"))
    assert not [t for t in out.kv_transfers if t.behind and t.src in written], out.kv_transfers
    run_to_completion(sched)
    assert_tiers_hold_their_tokens(sched, [a, a2])


def test_load_budget_engine_outputs_identical(without_tiers):
    llm = _tiny(swap_space=200 * BLOCK_BYTES_TINY / 2**30)
    llm.engine.block_manager.tiers.load_budget_bytes = 4 * BLOCK_BYTES_TINY
    replies, computed = _multi_turn(llm)
    assert replies == without_tiers[0]
    assert computed < 0.5 * without_tiers[1]
    assert_all_blocks_free(llm)


# ---- config --------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,msg", [
    (dict(swap_space=-1), "swap_space: must be a number"),
    (dict(swap_space="4"), "swap_space: must be a number"),
    (dict(swap_space=float("nan")), "swap_space: must be a number"),
    (dict(swap_space=1, kv_disk_bytes=-5, kv_disk_path="/tmp"), "kv_disk_bytes: must be an integer"),
    (dict(swap_space=1, kv_disk_bytes=1 << 20), "kv_disk_bytes: the disk KV tier needs kv_disk_path"),
    (dict(swap_space=1, kv_disk_path="/tmp"), "kv_disk_path: set kv_disk_bytes"),
    (dict(kv_disk_path="/tmp", kv_disk_bytes=1 << 20), "set swap_space > 0 too"),
    (dict(swap_space=1, enable_prefix_caching=False), "needs enable_prefix_caching=True"),
])
def test_bad_tier_config_is_refused(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        CacheConfig(**kwargs)


def test_tier_sizes_checked_against_the_model(tmp_path):
    small = dict(dtype="float32", max_model_len=128, kv_cache_memory_bytes=16 * BLOCK_BYTES_TINY)
    with pytest.raises(ValueError, match="swap_space: .* holds no KV block"):
        LLM("random:tiny", swap_space=1e-9, **small)
    with pytest.raises(ValueError, match="swap_space: .* more than 80%"):
        LLM("random:tiny", swap_space=1e6, **small)
    with pytest.raises(ValueError, match="kv_disk_path: .* is not a writable directory"):
        LLM("random:tiny", swap_space=0.001, kv_disk_path=str(tmp_path / "nope"), kv_disk_bytes=1 << 20, **small)
    with pytest.raises(ValueError, match="kv_disk_bytes: 100 bytes hold no KV block"):
        LLM("random:tiny", swap_space=0.001, kv_disk_path=str(tmp_path), kv_disk_bytes=100, **small)


def test_cli_flags_reach_the_config(tmp_path):
    from inference.__main__ import add_engine_args, engine_config
    p = argparse.ArgumentParser()
    add_engine_args(p)
    cfg = engine_config(p.parse_args(["--swap-space", "2.5", "--kv-disk-path", str(tmp_path),
                                      "--kv-disk-bytes", str(1 << 30)]))
    assert (cfg.cache.swap_space, cfg.cache.kv_disk_path, cfg.cache.kv_disk_bytes) == (2.5, str(tmp_path), 1 << 30)


# ---- the engine ----------------------------------------------------------------------------------
def _multi_turn(llm: LLM, num_sessions: int = 6, num_turns: int = 4) -> tuple[list[list[int]], int]:
    """Greedy multi-turn sessions; (every reply, prefill tokens computed)."""
    computed = 0
    step = llm.engine.step

    def counting_step():
        nonlocal computed
        out = step()
        computed += llm.engine.last_stats.iteration.num_prompt_tokens
        return out

    llm.engine.step = counting_step
    rng = random.Random(1)
    convs = [[rng.randrange(3, 500) for _ in range(90)] for _ in range(num_sessions)]
    replies = []
    for _ in range(num_turns):
        outs = llm.generate([{"prompt_token_ids": c} for c in convs], GREEDY, use_tqdm=False)
        for c, o in zip(convs, outs):
            c += list(o.outputs[0].token_ids) + [rng.randrange(3, 500) for _ in range(25)]
            replies.append(list(o.outputs[0].token_ids))
    llm.engine.step = step
    return replies, computed


def _tiny(**kw) -> LLM:
    # 40 blocks of 16 = 640 tokens: six sessions of 100-300 tokens do not all fit
    return LLM("random:tiny", dtype="float32", max_model_len=512, block_size=16,
               kv_cache_memory_bytes=40 * BLOCK_BYTES_TINY, max_num_batched_tokens=256, **kw)


@pytest.fixture(scope="module")
def without_tiers():
    return _multi_turn(_tiny())


def test_host_tier_same_outputs_fewer_prefill_tokens(without_tiers):
    llm = _tiny(swap_space=200 * BLOCK_BYTES_TINY / 2**30)
    replies, computed = _multi_turn(llm)
    assert replies == without_tiers[0]
    assert computed < 0.5 * without_tiers[1], (computed, without_tiers[1])
    stats = llm.engine.scheduler.stats().kv_tiers
    host = stats.tier("host")
    assert host.hit_blocks > 0 and host.bytes_in > 0 and host.bytes_out == host.hit_blocks * BLOCK_BYTES_TINY
    assert host.num_used <= host.num_slots == 200
    assert_all_blocks_free(llm)


def test_write_behind_same_outputs_fewer_offloads_on_the_critical_path(without_tiers):
    """fp32 replies identical with write-behind on and off; with it on, most evictions find the
    block already in the host tier (the step that evicts it copies nothing)."""
    offloads, behind = {}, {}
    for write_behind in (True, False):
        llm = _tiny(swap_space=200 * BLOCK_BYTES_TINY / 2**30)
        if not write_behind:
            llm.engine.block_manager.tiers.write_behind_bytes = 0
        runner, plain = llm.engine.runner, llm.engine.runner.apply_kv_transfers
        offloads[write_behind] = behind[write_behind] = 0

        def apply(sched, plain=plain, key=write_behind):
            offloads[key] += sum(1 for t in sched.kv_transfers if t.op is D2H and not t.behind)
            behind[key] += sum(1 for t in sched.kv_transfers if t.behind)
            plain(sched)
        runner.apply_kv_transfers = apply
        replies, computed = _multi_turn(llm)
        assert replies == without_tiers[0]
        assert computed < 0.5 * without_tiers[1]
        host = llm.engine.scheduler.stats().kv_tiers.tier("host")
        assert host.bytes_written_behind == behind[write_behind] * BLOCK_BYTES_TINY <= host.bytes_in
        assert host.bytes_in == (offloads[write_behind] + behind[write_behind]) * BLOCK_BYTES_TINY
        assert_all_blocks_free(llm)
    assert behind[False] == 0 and behind[True] > 0
    assert offloads[True] < 0.5 * offloads[False], offloads


def test_disk_tier_round_trips(without_tiers, tmp_path):
    llm = _tiny(swap_space=8 * BLOCK_BYTES_TINY / 2**30, kv_disk_path=str(tmp_path),
                kv_disk_bytes=300 * BLOCK_BYTES_TINY)
    replies, computed = _multi_turn(llm)
    assert replies == without_tiers[0]
    stats = llm.engine.scheduler.stats().kv_tiers
    disk = stats.tier("disk")
    assert disk.bytes_in > 0 and disk.hit_blocks > 0 and disk.bytes_out == disk.hit_blocks * BLOCK_BYTES_TINY
    assert stats.tier("host").num_used <= 8
    assert computed < 0.5 * without_tiers[1]
    assert list(tmp_path.iterdir()) == []        # the tier's file is unlinked: nothing left behind
    assert_all_blocks_free(llm)


def test_tier_metrics_are_exported():
    from monitoring.engine_metrics import EngineMetrics
    llm = _tiny(swap_space=200 * BLOCK_BYTES_TINY / 2**30)
    _multi_turn(llm, num_sessions=6, num_turns=2)
    metrics = EngineMetrics("m")
    metrics.observe(llm.engine.idle_stats())
    text = metrics.render()[0].decode()
    host = llm.engine.scheduler.stats().kv_tiers.tier("host")
    assert f'inference:kv_tier_hits_total{{model_name="m",tier="host"}} {float(host.hit_tokens)}' in text
    assert f'inference:kv_tier_bytes_total{{direction="in",model_name="m",tier="host"}} {float(host.bytes_in)}' in text
    assert 'inference:kv_tier_usage{model_name="m",tier="host"}' in text
    assert host.bytes_written_behind > 0                 # finished turns are copied down before eviction
    assert (f'inference:kv_tier_write_behind_bytes_total{{model_name="m",tier="host"}} '
            f'{float(host.bytes_written_behind)}') in text


def test_transfer_batches_keep_the_recorded_order_s_result():
    """Random transfer lists over few blocks / slots (many conflicts): executing the same-op
    batches gives what executing them one by one in recorded order gives."""
    from inference.worker.kv_tier_store import _batches
    T = TransferOp
    places = {T.DEVICE_TO_HOST: ("device", "host"), T.HOST_TO_DEVICE: ("host", "device"),
              T.HOST_TO_DISK: ("host", "disk"), T.DISK_TO_HOST: ("disk", "host")}
    rng = random.Random(0)

    def run(transfers, state):
        for t in transfers:
            a, b = places[t.op]
            state[(b, t.dst)] = state[(a, t.src)]
        return state

    for _ in range(300):
        transfers = [KVTransfer(rng.choice(list(T)), rng.randrange(4), rng.randrange(4))
                     for _ in range(rng.randrange(1, 16))]
        start = {(kind, i): f"{kind}{i}" for kind in ("device", "host", "disk") for i in range(4)}
        batches = _batches(transfers)
        assert all(t.op is op for op, batch in batches for t in batch)
        assert sorted(map(id, (t for _, b in batches for t in b))) == sorted(map(id, transfers))
        # inside a batch, later copies to one destination win (the store keeps the last)
        flat = [t for _, batch in batches for t in batch]
        assert run(flat, dict(start)) == run(transfers, dict(start))
    # the block manager's pattern (evict a block, load into it) makes two batches, not 2n
    alternating = [x for b in range(8)
                   for x in (KVTransfer(T.DEVICE_TO_HOST, b, b), KVTransfer(T.HOST_TO_DEVICE, 8 + b, b))]
    assert [(op, len(batch)) for op, batch in _batches(alternating)] == [(T.DEVICE_TO_HOST, 8), (T.HOST_TO_DEVICE, 8)]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_cuda_store_copies_blocks_bit_exactly_while_compute_runs(kernels):
    """The CUDA path (side stream, staging, pinned host slots, disk) against plain indexing, with
    the Triton gather / scatter over every layer and with the per-tensor torch fallback."""
    import torch

    from inference.core.kv_tiers import KVTransfer
    from inference.interfaces import SchedulerOutput
    from inference.worker.kv_tier_store import KVTierStore, TierSizes
    dev = torch.device("cuda")
    caches = [tuple(torch.randn(64, 16, 2, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
              for _ in range(3)]
    bpb = 2 * 3 * 16 * 2 * 64 * 2
    store = KVTierStore(caches, TierSizes(40, 20, bpb), "/tmp")
    store.staging_blocks = 3                       # several staging rounds per run
    assert store.host.is_pinned() and store.kernels is not None
    if kernels == "torch":
        store.kernels = None
    want = {b: [c[b].clone() for kv in caches for c in kv] for b in range(10)}
    busy = torch.randn(4096, 4096, device=dev)
    for _ in range(3):
        busy = busy @ busy / 64                    # compute in flight on the default stream
    T = TransferOp
    out = SchedulerOutput(kv_transfers=[KVTransfer(T.DEVICE_TO_HOST, b, 30 - b) for b in range(10)] +
                          [KVTransfer(T.HOST_TO_DISK, 30 - b, b) for b in range(5)] +
                          [KVTransfer(T.DISK_TO_HOST, b, b) for b in range(5)] +
                          [KVTransfer(T.HOST_TO_DEVICE, b, 40 + b) for b in range(5)] +
                          [KVTransfer(T.HOST_TO_DEVICE, 30 - b, 50 + b) for b in range(5, 10)])
    store.apply(SchedulerOutput())
    store.apply(out)
    for kv in caches:                              # this step's forward overwrites the offloaded blocks:
        for c in kv:                               # the compute stream waits for the copies first
            c[:10] = 0
    torch.cuda.synchronize()
    for b in range(10):
        dst = 40 + b if b < 5 else 50 + b
        got = [c[dst] for kv in caches for c in kv]
        assert all(torch.equal(g, w) for g, w in zip(got, want[b])), b


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="CUDA only")
def test_cuda_write_behind_runs_beside_compute_and_before_the_next_step_overwrites():
    """Write-behind copies (behind=True) are not waited for by their own step's compute, but the
    next step's compute waits for them before it may overwrite the blocks they read."""
    import torch

    from inference.interfaces import SchedulerOutput
    from inference.worker.kv_tier_store import KVTierStore, TierSizes
    dev = torch.device("cuda")
    caches = [tuple(torch.randn(64, 16, 2, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
              for _ in range(3)]
    store = KVTierStore(caches, TierSizes(40, 0, 2 * 3 * 16 * 2 * 64 * 2))
    want = {b: [c[b].clone() for kv in caches for c in kv] for b in range(10)}
    with torch.cuda.stream(store.stream):
        torch.cuda._sleep(200_000_000)             # ~0.1 s: the copies below start after it
    T = TransferOp
    store.apply(SchedulerOutput(kv_transfers=[KVTransfer(T.DEVICE_TO_HOST, b, 30 - b, behind=True)
                                              for b in range(10)]))
    assert store.behind_done is not None
    own = torch.cuda.Event()
    own.record()                                   # this step's compute: not held for them
    own.synchronize()
    assert not store.behind_done.query()           # (the side stream is still asleep)
    store.apply(SchedulerOutput())                 # the next step: its compute waits for them,
    # so the overwrite below cannot run before the copies read the blocks (without the wait it
    # would: the copies are queued behind the sleep)
    for kv in caches:
        for c in kv:
            c[:10] = 0
    store.apply(SchedulerOutput(kv_transfers=[KVTransfer(T.HOST_TO_DEVICE, 30 - b, 40 + b) for b in range(10)]))
    torch.cuda.synchronize()
    for b in range(10):
        assert all(torch.equal(c[40 + b], w) for c, w in zip((c for kv in caches for c in kv), want[b])), b
