"""Scheduler without a model: budget, chunked prefill, max_num_seqs, preemption, abort, policies,
prefix-cache stats and stop conditions. `fake_step` plays the runner (tests/helpers/factories.py)."""
from __future__ import annotations

import random

import pytest

from inference.core.request import RequestStatus
from inference.interfaces import ModelRunnerOutput
from tests.helpers.factories import (
    check_block_manager,
    fake_step,
    kv_of,
    make_request,
    make_scheduler,
    prompt_tokens,
    run_to_completion,
)


def items(out):
    """(req_id, num_computed_tokens, num_scheduled_tokens, needs_sample) per scheduled request."""
    return [(i.request.request_id, i.num_computed_tokens, i.num_scheduled_tokens, i.needs_sample)
            for i in out.scheduled]


def outputs(n: int) -> list[int]:
    return [100 + j for j in range(n)]


# ---- basics --------------------------------------------------------------------------------
def test_nothing_to_schedule():
    s = make_scheduler()
    out = s.schedule()
    assert out.is_empty and out.total_num_scheduled_tokens == 0 and out.preempted_req_ids == []
    assert s.update_from_output(out, ModelRunnerOutput()) == []
    assert not s.has_unfinished() and s.num_unfinished == 0


def test_duplicate_request_id_is_rejected():
    s = make_scheduler()
    s.add_request(make_request("a"))
    with pytest.raises(ValueError, match="request_id"):
        s.add_request(make_request("a"))
    assert s.num_unfinished == 1 and len(s.waiting) == 1


def test_single_request_prefill_then_decode_to_max_tokens():
    s = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    a = make_request("a", 10, max_tokens=3)
    s.add_request(a)
    assert a.status == RequestStatus.WAITING and s.num_unfinished == 1

    out, updated = fake_step(s)
    assert items(out) == [("a", 0, 10, True)]
    assert out.total_num_scheduled_tokens == 10
    assert len(out.scheduled[0].block_ids) == 3
    assert updated == [a] and a.output_token_ids == [100]
    assert a.status == RequestStatus.RUNNING and a.num_computed_tokens == 10
    assert a.first_scheduled_time is not None and a.num_cached_tokens == 0
    assert s.block_manager.num_free_blocks == 13

    out, _ = fake_step(s)
    assert items(out) == [("a", 10, 1, True)]
    out, updated = fake_step(s)
    assert items(out) == [("a", 11, 1, True)]
    assert updated == [a]
    assert a.output_token_ids == [100, 101, 102]
    assert a.status == RequestStatus.FINISHED_LENGTH and a.finish_reason() == "length"
    assert not s.has_unfinished() and s.running == []
    assert s.block_manager.num_free_blocks == 16
    assert s.schedule().is_empty


# ---- token budget and chunked prefill ------------------------------------------------------
def test_chunked_prefill_splits_a_long_prompt():
    s = make_scheduler(max_num_batched_tokens=8)
    a = make_request("a", 20, max_tokens=2)
    s.add_request(a)
    steps = [items(fake_step(s)[0]) for _ in range(4)]
    assert steps == [[("a", 0, 8, False)], [("a", 8, 8, False)], [("a", 16, 4, True)],
                     [("a", 20, 1, True)]]
    assert a.output_token_ids == [100, 101] and not s.has_unfinished()
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_decodes_are_mixed_into_chunked_prefill_steps():
    s = make_scheduler(max_num_batched_tokens=8)
    a = make_request("a", 4, max_tokens=5)
    b = make_request("b", 20, max_tokens=1)
    s.add_request(a)
    log = run_to_completion(s, before_step=lambda step: step == 1 and s.add_request(b))
    assert [items(o) for o in log.steps] == [
        [("a", 0, 4, True)],
        [("a", 4, 1, True), ("b", 0, 7, False)],
        [("a", 5, 1, True), ("b", 7, 7, False)],
        [("a", 6, 1, True), ("b", 14, 6, True)],
        [("a", 7, 1, True)],
    ]
    assert [o.total_num_scheduled_tokens for o in log.steps] == [4, 8, 8, 7, 1]
    assert a.output_token_ids == outputs(5) and b.output_token_ids == outputs(1)


def test_without_chunked_prefill_a_prompt_waits_for_room_in_the_budget():
    s = make_scheduler(max_num_batched_tokens=8, chunked=False, max_model_len=8)
    a, b = make_request("a", 6, max_tokens=2), make_request("b", 6, max_tokens=2)
    s.add_request(a)
    s.add_request(b)
    out, _ = fake_step(s)
    assert items(out) == [("a", 0, 6, True)]          # b (6) does not fit the 2 tokens left
    out, _ = fake_step(s)
    assert items(out) == [("a", 6, 1, True), ("b", 0, 6, True)]
    out, _ = fake_step(s)
    assert items(out) == [("b", 6, 1, True)]
    assert not s.has_unfinished()
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("num_blocks,budget", [(6, 8), (12, 16), (40, 64)])
def test_random_workload_respects_budget_and_completes(policy, chunked, prefix, num_blocks, budget):
    """Staggered arrivals, shared prefixes, tight KV: every step within budget and max_num_seqs,
    block accounting exact, stale KV never read; every request ends with exactly max_tokens."""
    rng = random.Random(num_blocks * 1000 + budget)
    bs = 4
    max_model_len = num_blocks * bs
    if not chunked:
        budget = max(budget, max_model_len)     # see test_non_chunked_budget_below_max_model_len
    s = make_scheduler(num_blocks=num_blocks, block_size=bs, max_num_batched_tokens=budget,
                       max_num_seqs=5, enable_prefix_caching=prefix, chunked=chunked, policy=policy,
                       max_model_len=max_model_len)
    base = prompt_tokens("base", 16)
    arrivals: dict[int, list] = {}
    reqs = []
    for i in range(16):
        n = rng.randint(1, 14)
        k = rng.randint(0, n) if rng.random() < 0.6 else 0
        prompt = base[:k] + prompt_tokens(f"r{i}", n - k)
        r = make_request(f"r{i}", prompt, max_tokens=rng.randint(1, min(10, max_model_len - n)),
                         priority=rng.randint(0, 2))
        reqs.append(r)
        arrivals.setdefault(rng.randint(0, 12), []).append(r)

    def arrive(step):
        for r in arrivals.pop(step, []):
            s.add_request(r)
        if not s.has_unfinished() and arrivals:     # idle: let the next arrivals in now
            for r in arrivals.pop(min(arrivals)):
                s.add_request(r)

    log = run_to_completion(s, max_steps=2_000, before_step=arrive)
    assert not arrivals
    assert set(log.finished) == {r.request_id for r in reqs}
    for r in reqs:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == outputs(r.max_tokens)
    num_computed = sum(o.total_num_scheduled_tokens for o in log.steps)
    if s.num_preemptions == 0:      # every token but the last computed once, less prefix hits
        assert num_computed == sum(r.num_tokens - 1 for r in reqs) - s.stats().prefix_cache_hits
    elif not prefix:                # recompute only adds work
        assert num_computed > sum(r.num_tokens - 1 for r in reqs)
    if num_blocks == 6:
        assert s.num_preemptions > 0                # the tight cache really exercised preemption
    if num_blocks == 40:
        assert s.num_preemptions == 0
    assert s.stats().num_preemptions == s.num_preemptions
    assert s.block_manager.usage == 0.0


def test_max_num_seqs_bounds_the_batch():
    s = make_scheduler(num_blocks=32, max_num_batched_tokens=64, max_num_seqs=2)
    reqs = [make_request(f"r{i}", 4, max_tokens=3) for i in range(5)]
    for r in reqs:
        s.add_request(r)
    log = run_to_completion(s)
    assert [log.scheduled_ids(k) for k in range(log.num_steps)] == [
        ["r0", "r1"]] * 3 + [["r2", "r3"]] * 3 + [["r4"]] * 3
    assert log.first_token_step == {"r0": 0, "r1": 0, "r2": 3, "r3": 3, "r4": 6}
    assert all(r.output_token_ids == outputs(3) for r in reqs)


# ---- preemption by recompute ---------------------------------------------------------------
def test_preemption_takes_the_newest_and_puts_it_first_in_line():
    s = make_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=64,
                       enable_prefix_caching=False)
    a, b, c = (make_request(n, 4, max_tokens=4) for n in "abc")
    for r in (a, b, c):
        s.add_request(r)
    out, _ = fake_step(s)
    assert items(out) == [("a", 0, 4, True), ("b", 0, 4, True), ("c", 0, 4, True)]
    assert s.block_manager.num_free_blocks == 2
    d = make_request("d", 4, max_tokens=4)
    s.add_request(d)

    out, _ = fake_step(s)                           # each needs a second block; only two are free
    assert items(out) == [("a", 4, 1, True), ("b", 4, 1, True)]
    assert out.preempted_req_ids == ["c"]
    assert [r.request_id for r in s.waiting] == ["c", "d"]
    assert [r.request_id for r in s.running] == ["a", "b"]
    assert c.status == RequestStatus.PREEMPTED and c.num_computed_tokens == 0
    assert c.num_preemptions == 1 and s.num_preemptions == 1
    assert c.output_token_ids == [100]              # generated tokens are kept for recompute
    assert s.block_manager.block_table("c") == [] and s.block_manager.num_free_blocks == 1
    assert s.stats().num_preemptions == 1 and s.stats().num_waiting == 2

    log = run_to_completion(s, max_steps=100)
    assert set(log.finished) == {"a", "b", "c", "d"}
    for r in (a, b, c, d):
        assert r.output_token_ids == outputs(4) and r.status == RequestStatus.FINISHED_LENGTH
    # once a and b finish, c recomputes prompt + its first token in one go, ahead of d
    first = next(k for k in range(log.num_steps) if "c" in log.scheduled_ids(k))
    assert log.finish_step["a"] == log.finish_step["b"] == first - 1
    assert items(log.steps[first]) == [("c", 0, 5, True), ("d", 0, 4, True)]


def test_preempting_several_keeps_their_fcfs_order():
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64,
                       enable_prefix_caching=False)
    a, b, c = make_request("a", 8, max_tokens=4), make_request("b", 4, max_tokens=4), make_request("c", 4, max_tokens=4)
    for r in (a, b, c):
        s.add_request(r)
    fake_step(s)
    assert s.block_manager.num_free_blocks == 0
    out, _ = fake_step(s)
    # a needs a third block: c (newest) goes; then b needs a second block: b itself goes
    assert items(out) == [("a", 8, 1, True)]
    assert out.preempted_req_ids == ["c", "b"]
    assert [r.request_id for r in s.waiting] == ["b", "c"]
    assert s.num_preemptions == 2
    log = run_to_completion(s, max_steps=100)
    for r in (a, b, c):
        assert r.output_token_ids == outputs(4)
    assert log.first_token_step.get("b", 99) <= log.first_token_step.get("c", 99)


def test_preempted_request_recomputes_using_its_cached_prefix():
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = make_request("a", 4, max_tokens=8), make_request("b", 5, max_tokens=6)
    s.add_request(a)
    s.add_request(b)
    log = run_to_completion(s, max_steps=100)
    steps = [items(o) for o in log.steps]
    assert steps[3] == [("a", 6, 1, True), ("b", 7, 1, True)]
    assert steps[4] == [("a", 7, 1, True)] and log.steps[4].preempted_req_ids == ["b"]
    # b's second block was evicted for a's third; its first block is still cached and is hit
    assert steps[5:8] == [[("a", 8, 1, True)], [("a", 9, 1, True)], [("a", 10, 1, True)]]
    assert steps[8] == [("b", 4, 5, True)]
    assert steps[9] == [("b", 9, 1, True)]
    assert len(steps) == 10
    assert a.output_token_ids == outputs(8) and b.output_token_ids == outputs(6)
    assert b.num_preemptions == 1
    # prefix stats count each request once, at its first scheduling
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (9, 0)
    assert b.num_cached_tokens == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("prefix", [True, False])
def test_heavy_preemption_loses_nothing(policy, prefix):
    """Ten requests that together need 4x the KV cache all finish with every token."""
    s = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=32, max_num_seqs=10,
                       enable_prefix_caching=prefix, policy=policy)
    reqs = [make_request(f"r{i}", 6, max_tokens=6, priority=i % 3) for i in range(10)]
    for r in reqs:
        s.add_request(r)
    log = run_to_completion(s, max_steps=500)
    assert s.num_preemptions > 0
    assert sum(r.num_preemptions for r in reqs) == s.num_preemptions
    assert sum(len(o.preempted_req_ids) for o in log.steps) == s.num_preemptions
    assert all(r.output_token_ids == outputs(6) for r in reqs)
    assert s.block_manager.num_free_blocks == 8


# ---- abort ---------------------------------------------------------------------------------
def test_abort_running_request_frees_its_blocks_now():
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b = make_request("a", 12, max_tokens=4), make_request("b", 8, max_tokens=2)
    s.add_request(a)
    s.add_request(b)
    out, _ = fake_step(s)
    assert items(out) == [("a", 0, 12, True)]       # b needs 2 blocks, 1 is free
    assert s.block_manager.num_free_blocks == 1

    assert s.finish_request("a", RequestStatus.FINISHED_ABORTED) is a
    assert a.status == RequestStatus.FINISHED_ABORTED and a.finish_reason() == "abort"
    assert s.block_manager.num_free_blocks == 4 and s.block_manager.block_table("a") == []
    assert s.running == [] and s.num_unfinished == 1
    assert s.finish_request("a", RequestStatus.FINISHED_ABORTED) is None     # idempotent
    out, _ = fake_step(s)
    assert items(out) == [("b", 0, 8, True)]
    run_to_completion(s)


def test_abort_waiting_and_preempted_requests():
    s = make_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=64)
    a, b, c = (make_request(n, 4, max_tokens=4) for n in "abc")
    for r in (a, b, c):
        s.add_request(r)
    fake_step(s)
    d = make_request("d", 4)
    s.add_request(d)
    out, _ = fake_step(s)
    assert out.preempted_req_ids == ["c"]
    free = s.block_manager.num_free_blocks

    assert s.finish_request("d", RequestStatus.FINISHED_ABORTED) is d       # never scheduled
    assert s.finish_request("c", RequestStatus.FINISHED_ABORTED) is c       # preempted
    assert list(s.waiting) == []
    assert d.status == c.status == RequestStatus.FINISHED_ABORTED
    assert s.block_manager.num_free_blocks == free
    assert s.num_unfinished == 2
    assert s.finish_request("zzz", RequestStatus.FINISHED_ABORTED) is None
    log = run_to_completion(s)
    assert set(log.finished) == {"a", "b"}
    assert c.output_token_ids == [100] and d.output_token_ids == []


def test_abort_while_the_step_runs_drops_its_result():
    s = make_scheduler(num_blocks=8, block_size=4, max_num_batched_tokens=64)
    a, b = make_request("a", 5, max_tokens=4), make_request("b", 5, max_tokens=4)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    kv_of(s).run(out)
    assert s.block_manager.num_free_blocks == 4
    s.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert s.block_manager.num_free_blocks == 6
    updated = s.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": 100, "b": 100}))
    assert updated == [(b, [100])]
    assert a.output_token_ids == [] and a.num_placeholders == 1      # its token was dropped
    assert a.status == RequestStatus.FINISHED_ABORTED
    assert b.output_token_ids == [100] and b.num_computed_tokens == 5
    run_to_completion(s)


# ---- policies ------------------------------------------------------------------------------
def test_fcfs_first_tokens_in_arrival_order():
    s = make_scheduler(num_blocks=12, block_size=4, max_num_batched_tokens=12, max_num_seqs=3)
    reqs = [make_request(f"r{i}", 8, max_tokens=4) for i in range(6)]
    for r in reqs:
        s.add_request(r)
    log = run_to_completion(s)
    assert log.first_token_step == {"r0": 0, "r1": 1, "r2": 2, "r3": 4, "r4": 5, "r5": 6}
    times = [r.first_scheduled_time for r in reqs]
    assert times == sorted(times)


def test_fcfs_first_tokens_in_arrival_order_under_preemption():
    s = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=16, max_num_seqs=8,
                       enable_prefix_caching=False)
    reqs = [make_request(f"r{i}", 4, max_tokens=8) for i in range(8)]
    for r in reqs:
        s.add_request(r)
    log = run_to_completion(s, max_steps=500)
    assert s.num_preemptions > 0
    first = [log.first_token_step[r.request_id] for r in reqs]
    assert first == sorted(first)
    done = [log.finish_step[r.request_id] for r in reqs]
    assert done == sorted(done)


@pytest.mark.parametrize("policy,expected", [
    ("priority", ["high", "high2", "mid", "low"]),
    ("fcfs", ["low", "high", "mid", "high2"]),
])
def test_waiting_order_by_policy(policy, expected):
    s = make_scheduler(max_num_seqs=1, policy=policy)
    for name, prio in (("low", 2), ("high", 0), ("mid", 1), ("high2", 0)):
        s.add_request(make_request(name, 4, max_tokens=2, priority=prio))
    assert [r.request_id for r in s.waiting] == expected
    log = run_to_completion(s)
    assert [log.scheduled_ids(k)[0] for k in range(0, 8, 2)] == expected
    assert log.first_token_step == {name: 2 * i for i, name in enumerate(expected)}


def test_priority_preempts_the_lowest_priority_even_if_older():
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, policy="priority")
    low = make_request("low", 4, max_tokens=8, priority=1)
    high = make_request("high", 8, max_tokens=8, priority=0)
    s.add_request(low)
    fake_step(s)
    s.add_request(high)
    out, _ = fake_step(s)
    assert items(out) == [("low", 4, 1, True), ("high", 0, 8, True)]
    assert s.block_manager.num_free_blocks == 0
    out, _ = fake_step(s)
    # low was scheduled first, then unscheduled when high needed a third block
    assert items(out) == [("high", 8, 1, True)]
    assert out.total_num_scheduled_tokens == 1
    assert out.preempted_req_ids == ["low"]
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0
    assert low.output_token_ids == [100, 101]       # the unscheduled step added nothing
    assert [r.request_id for r in s.waiting] == ["low"]
    log = run_to_completion(s, max_steps=100)
    assert high.output_token_ids == outputs(8) and low.output_token_ids == outputs(8)
    assert list(log.finished) == ["high", "low"]


# ---- prefix-cache stats --------------------------------------------------------------------
def test_prefix_cache_hits_and_stats():
    s = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    shared = prompt_tokens("shared", 8)
    a = make_request("a", shared + [1, 2], max_tokens=2)
    b = make_request("b", shared + [3, 4], max_tokens=2)
    s.add_request(a)
    out, _ = fake_step(s)
    s.add_request(b)
    out, _ = fake_step(s)
    assert items(out) == [("a", 10, 1, True), ("b", 8, 2, True)]
    assert out.scheduled[1].block_ids[:2] == out.scheduled[0].block_ids[:2]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    st = s.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (20, 8)
    assert (st.num_running, st.num_waiting) == (1, 0)      # a finished with its 2 tokens
    assert st.kv_cache_usage == pytest.approx(3 / 16)      # b's 11 tokens; a freed its own block
    run_to_completion(s)
    # identical prompt later: all but the last (partial) block is hit
    c = make_request("c", shared + [1, 2], max_tokens=1)
    s.add_request(c)
    out, _ = fake_step(s)
    assert items(out) == [("c", 8, 2, True)]
    assert (s.stats().prefix_cache_queries, s.stats().prefix_cache_hits) == (30, 16)
    run_to_completion(s)


def test_same_step_admissions_share_a_prefix():
    """Blocks are registered at allocation: a request admitted later in the same step hits them."""
    s = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    shared = prompt_tokens("shared", 8)
    a, b = make_request("a", shared + [1], max_tokens=1), make_request("b", shared + [2], max_tokens=1)
    s.add_request(a)
    s.add_request(b)
    log = run_to_completion(s)
    assert [items(o) for o in log.steps] == [[("a", 0, 9, True), ("b", 8, 1, True)]]


def test_no_prefix_caching_records_queries_but_no_hits():
    s = make_scheduler(enable_prefix_caching=False)
    shared = prompt_tokens("shared", 8)
    for n in "ab":
        s.add_request(make_request(n, shared + [1], max_tokens=1))
    run_to_completion(s)
    assert (s.stats().prefix_cache_queries, s.stats().prefix_cache_hits) == (18, 0)


# ---- stop conditions -----------------------------------------------------------------------
EOS = 7


def always(token):
    return lambda request: token


def test_stop_on_eos():
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=8, eos=102)
    s.add_request(a)
    run_to_completion(s)
    assert a.output_token_ids == [100, 101, 102]
    assert a.status == RequestStatus.FINISHED_STOPPED and a.finish_reason() == "stop"
    assert a.stop_reason is None


@pytest.mark.parametrize("min_tokens,expected", [(0, 1), (1, 1), (3, 3), (8, 8)])
def test_min_tokens_holds_off_eos(min_tokens, expected):
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=8, eos=EOS, min_tokens=min_tokens)
    s.add_request(a)
    run_to_completion(s, token_fn=always(EOS))
    assert a.output_token_ids == [EOS] * expected
    assert a.status == RequestStatus.FINISHED_STOPPED     # eos is checked before length


def test_ignore_eos_runs_to_max_tokens():
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=5, eos=EOS, ignore_eos=True)
    s.add_request(a)
    run_to_completion(s, token_fn=always(EOS))
    assert a.output_token_ids == [EOS] * 5 and a.status == RequestStatus.FINISHED_LENGTH


def test_stop_token_ids():
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=8, stop_token_ids=[101, 500])
    b = make_request("b", 4, max_tokens=8, stop_token_ids=[101], min_tokens=3)
    s.add_request(a)
    s.add_request(b)
    run_to_completion(s)
    assert a.output_token_ids == [100, 101]
    assert a.status == RequestStatus.FINISHED_STOPPED and a.stop_reason == 101
    # b passes 101 before min_tokens and never sees it again
    assert b.output_token_ids == outputs(8) and b.status == RequestStatus.FINISHED_LENGTH
    assert b.stop_reason is None


def test_stop_token_id_at_min_tokens_stops():
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=8, stop_token_ids=[102], min_tokens=3)
    s.add_request(a)
    run_to_completion(s)
    assert a.output_token_ids == [100, 101, 102] and a.stop_reason == 102


def test_eos_none_never_stops_early():
    s = make_scheduler()
    a = make_request("a", 4, max_tokens=4, eos=None)
    s.add_request(a)
    run_to_completion(s, token_fn=always(EOS))
    assert a.output_token_ids == [EOS] * 4 and a.status == RequestStatus.FINISHED_LENGTH


def test_max_model_len_stops_with_length():
    s = make_scheduler(num_blocks=16, block_size=4, max_model_len=10)
    a = make_request("a", 6, max_tokens=100)
    s.add_request(a)
    run_to_completion(s)
    assert a.output_token_ids == outputs(4) and a.num_tokens == 10
    assert a.status == RequestStatus.FINISHED_LENGTH


def test_finished_requests_leave_the_scheduler_in_the_same_step():
    s = make_scheduler()
    a, b = make_request("a", 4, max_tokens=1), make_request("b", 4, max_tokens=2)
    s.add_request(a)
    s.add_request(b)
    out, updated = fake_step(s)
    assert updated == [a, b]
    assert a.status == RequestStatus.FINISHED_LENGTH and b.status == RequestStatus.RUNNING
    assert s.running == [b] and s.num_unfinished == 1
    assert s.block_manager.block_table("a") == []
    check_block_manager(s.block_manager)


# ---- regressions: bugs these tests found once ----------------------------------------------
class SchedulerBug(AssertionError):
    """Raised by the final check of a regression test (distinguishes the bug from a broken set-up)."""


def check_bug(cond: bool, msg: str) -> None:
    if not cond:
        raise SchedulerBug(msg)


def test_unscheduled_victim_leaves_no_uncomputed_block_in_the_prefix_cache():
    s = make_scheduler(num_blocks=7, block_size=4, max_num_batched_tokens=64, policy="priority")
    kv = kv_of(s)
    t = prompt_tokens("t", 4)
    x = make_request("x", t + [1, 2], max_tokens=5, priority=0)
    low = make_request("low", t, max_tokens=12, priority=1)    # its block 0 duplicates x's: unhashed
    high = make_request("high", prompt_tokens("high", 6), max_tokens=12, priority=0)
    s.add_request(x)
    s.add_request(low)
    steps = []
    for step in range(5):
        if step == 1:
            s.add_request(high)
        steps.append(fake_step(s)[0])
    # step 4: low's decode filled (and registered) its second block; then high needed a block
    # and low, already scheduled, was unscheduled and freed. Its unhashed block 0 went to the
    # front of the free queue and was taken by high; the registered block survived.
    assert items(steps[4]) == [("x", 9, 1, True), ("high", 8, 1, True)]
    assert steps[4].preempted_req_ids == ["low"]
    assert low.all_token_ids == t + outputs(4)
    # a chat continuation of low: its prompt + its 4 generated tokens + one more token
    c = make_request("c", low.all_token_ids + [1], max_tokens=1)
    hit, num_hit = s.block_manager.get_computed_blocks(c)
    kv.check("c", c.all_token_ids, hit, num_hit)     # position 7 was never written


def test_request_after_an_unscheduled_victim_is_still_scheduled():
    s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, policy="priority")
    s.add_request(make_request("low", 4, max_tokens=10, priority=1))
    fake_step(s)
    s.add_request(make_request("high", 4, max_tokens=10))
    s.add_request(make_request("y", 4, max_tokens=10))
    out, _ = fake_step(s)
    assert [i[0] for i in items(out)] == ["low", "high", "y"]
    assert s.block_manager.num_free_blocks == 0
    out, _ = fake_step(s)
    assert out.preempted_req_ids == ["low"]
    # low's 2 freed blocks: high takes one, y (which needs one too) must get the other
    check_bug(items(out) == [("high", 4, 1, True), ("y", 4, 1, True)], f"scheduled {items(out)}")


def test_unscheduled_victim_returns_its_tokens_to_the_budget():
    s = make_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=3, policy="priority")
    s.add_request(make_request("low", 3, max_tokens=10, priority=1))
    fake_step(s)
    s.add_request(make_request("high", 1, max_tokens=10))
    s.add_request(make_request("y", 8, max_tokens=10))
    for _ in range(4):
        out, _ = fake_step(s)
        assert [i[0] for i in items(out)] == ["low", "high", "y"]
        assert out.total_num_scheduled_tokens == 3
    out, _ = fake_step(s)
    assert out.preempted_req_ids == ["low"]
    # y is mid-prefill (4 of 8 prompt tokens): with low's token given back it gets 2 tokens
    check_bug(items(out) == [("high", 4, 1, True), ("y", 4, 2, False)]
              and out.total_num_scheduled_tokens == 3, f"scheduled {items(out)}")


def test_non_chunked_budget_below_max_model_len_is_rejected_or_completes():
    try:
        s = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=8, chunked=False)
    except ValueError:
        return                                      # rejected up front: fine
    a, b = make_request("a", 4, max_tokens=12), make_request("b", 4, max_tokens=12)
    s.add_request(a)
    s.add_request(b)
    try:
        run_to_completion(s, max_steps=200)         # b is preempted at 9 tokens > budget 8
    except AssertionError as e:
        check_bug("not finished after" not in str(e), str(e))
        raise
    assert a.output_token_ids == outputs(12) and b.output_token_ids == outputs(12)
    assert s.num_preemptions >= 1
