"""BlockManager without a model: allocation, ref counts, prefix hits, LRU eviction, free, reset."""
from __future__ import annotations

import copy

import pytest

from inference.core.block_manager import BlockManager
from tests.helpers.factories import check_block_manager, make_block_manager, make_request, prompt_tokens


def snapshot(bm: BlockManager):
    return (list(bm.free_queue), copy.deepcopy(bm.req_to_blocks), dict(bm.req_num_cached),
            dict(bm.cached_blocks), [(b.ref_cnt, b.block_hash) for b in bm.blocks],
            (bm.prefix_stats.queries, bm.prefix_stats.hits))


def admit(bm: BlockManager, request, num_new: int | None = None) -> int:
    """What the scheduler does for a waiting request: prefix hit, allocate, mark computed."""
    hit, num_hit = bm.get_computed_blocks(request)
    num_new = request.num_tokens - num_hit if num_new is None else num_new
    assert bm.allocate_slots(request, num_new, hit)
    request.num_computed_tokens = num_hit + num_new
    return num_hit


# ---- construction and plain allocation -----------------------------------------------------
def test_rejects_zero_blocks():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)


def test_fresh_manager_is_all_free():
    bm = make_block_manager(num_blocks=8, block_size=4)
    assert bm.num_free_blocks == 8
    assert bm.usage == 0.0
    assert list(bm.free_queue) == list(range(8))
    assert bm.block_table("nope") == []
    assert [bm.num_blocks_for(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_block_counts_and_growth():
    bm = make_block_manager(num_blocks=10, block_size=4)
    r = make_request("a", 10)
    assert bm.can_allocate(r, 10)
    assert bm.allocate_slots(r, 10)
    assert bm.block_table("a") == [0, 1, 2]          # taken from the front of the free queue
    assert bm.num_free_blocks == 7
    assert bm.usage == pytest.approx(0.3)
    assert [bm.blocks[b].ref_cnt for b in (0, 1, 2)] == [1, 1, 1]
    r.num_computed_tokens = 10
    # tokens 11 and 12 still fit in block 2
    assert bm.allocate_slots(r, 2)
    assert bm.block_table("a") == [0, 1, 2] and bm.num_free_blocks == 7
    r.num_computed_tokens = 12
    assert bm.allocate_slots(r, 1)                   # token 13 needs a fourth block
    assert bm.block_table("a") == [0, 1, 2, 3] and bm.num_free_blocks == 6
    check_block_manager(bm)


def test_allocate_exactly_all_blocks_then_fail_without_side_effects():
    bm = make_block_manager(num_blocks=4, block_size=4)
    a = make_request("a", 12)
    assert bm.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    b = make_request("b", 5)                          # needs 2 blocks, 1 is free
    assert not bm.can_allocate(b, 5)
    before = snapshot(bm)
    assert bm.allocate_slots(b, 5) is False
    assert snapshot(bm) == before
    assert "b" not in bm.req_to_blocks
    assert bm.can_allocate(b, 4) and bm.allocate_slots(b, 4)     # one block fits exactly
    assert bm.num_free_blocks == 0
    # a growing request fails the same way
    before = snapshot(bm)
    assert not bm.can_allocate(a, 1)
    assert bm.allocate_slots(a, 1) is False
    assert snapshot(bm) == before
    check_block_manager(bm)


def test_can_allocate_counts_reclaimed_free_hit_blocks():
    """Hit blocks that sit in the free queue stop being free once taken: they don't count twice."""
    bm = make_block_manager(num_blocks=4, block_size=4)
    shared = prompt_tokens("shared", 8)
    a = make_request("a", shared)
    admit(bm, a)
    bm.free(a)                                      # 2 cached blocks, all 4 free
    assert bm.num_free_blocks == 4 and len(bm.cached_blocks) == 2

    b = make_request("b", shared + prompt_tokens("b", 9))        # 17 tokens -> 5 blocks, 2 hit
    hit, num_hit = bm.get_computed_blocks(b)
    assert (len(hit), num_hit) == (2, 8)
    assert not bm.can_allocate(b, 9, hit)           # 3 new + 2 reclaimed > 4 free
    before = snapshot(bm)
    assert bm.allocate_slots(b, 9, hit) is False
    assert snapshot(bm) == before                   # hit blocks were not touched

    c = make_request("c", shared + prompt_tokens("c", 8))        # 16 tokens -> 4 blocks, 2 hit
    hit, num_hit = bm.get_computed_blocks(c)
    assert num_hit == 8
    assert bm.can_allocate(c, 8, hit)
    assert bm.allocate_slots(c, 8, hit)
    assert bm.block_table("c")[:2] == hit and bm.num_free_blocks == 0
    check_block_manager(bm)


# ---- prefix hits -----------------------------------------------------------------------------
def test_shared_prefix_shares_blocks_with_ref_counts():
    bm = make_block_manager(num_blocks=10, block_size=4)
    prefix = prompt_tokens("p", 8)
    a = make_request("a", prefix + [1, 2])          # 10 tokens: 2 full blocks + 2 tokens
    assert admit(bm, a) == 0
    assert len(bm.cached_blocks) == 2               # only full blocks get a hash
    assert bm.blocks[bm.block_table("a")[2]].block_hash is None

    b = make_request("b", prefix + [3, 4, 5])       # 11 tokens
    assert admit(bm, b) == 8
    ta, tb = bm.block_table("a"), bm.block_table("b")
    assert tb[:2] == ta[:2]
    assert tb[2] not in ta
    assert len(tb) == 3
    assert [bm.blocks[x].ref_cnt for x in ta] == [2, 2, 1]
    assert bm.num_free_blocks == 10 - 3 - 1
    assert b.num_computed_tokens == 11

    bm.free(a)                                      # shared blocks survive while b holds them
    assert [bm.blocks[x].ref_cnt for x in tb] == [1, 1, 1]
    assert bm.num_free_blocks == 10 - 3
    assert ta[2] in bm.free_queue and ta[0] not in bm.free_queue
    bm.free(b)
    assert bm.num_free_blocks == 10
    check_block_manager(bm)


def test_hit_only_on_full_blocks():
    bm = make_block_manager(num_blocks=10, block_size=4)
    tokens = prompt_tokens("t", 10)
    admit(bm, make_request("a", tokens))
    # same 10 tokens: the partial third block is never shared
    hit, num_hit = bm.get_computed_blocks(make_request("b", tokens))
    assert num_hit == 8 and hit == bm.block_table("a")[:2]
    # 6 tokens: one full block in common
    hit, num_hit = bm.get_computed_blocks(make_request("c", tokens[:6]))
    assert (hit, num_hit) == (bm.block_table("a")[:1], 4)
    # a difference inside the first block: nothing in common
    hit, num_hit = bm.get_computed_blocks(make_request("d", [tokens[0], 7] + tokens[2:]))
    assert (hit, num_hit) == ([], 0)
    # a difference in the second block: only the first block
    assert bm.get_computed_blocks(make_request("e", tokens[:5] + [7] + tokens[6:]))[1] == 4


def test_at_least_one_token_is_left_to_compute():
    bm = make_block_manager(num_blocks=10, block_size=4)
    tokens = prompt_tokens("t", 8)
    admit(bm, make_request("a", tokens))
    assert len(bm.cached_blocks) == 2
    # identical 8-token prompt: the last block is not hit, or the last token would have no logits
    assert bm.get_computed_blocks(make_request("b", tokens))[1] == 4
    assert bm.get_computed_blocks(make_request("c", tokens + [1]))[1] == 8
    assert bm.get_computed_blocks(make_request("d", tokens[:4]))[1] == 0
    assert bm.get_computed_blocks(make_request("e", tokens[:5]))[1] == 4


def test_hash_is_chained_over_the_whole_prefix():
    bm = make_block_manager(num_blocks=10, block_size=4)
    x, y, z = prompt_tokens("x", 4), prompt_tokens("y", 4), prompt_tokens("z", 4)
    admit(bm, make_request("a", x + y + [1]))
    # block `y` at the same position but after another first block: no hit
    assert bm.get_computed_blocks(make_request("b", z + y + [1]))[1] == 0
    # same blocks, other order: no hit beyond the first
    assert bm.get_computed_blocks(make_request("c", y + x + [1]))[1] == 0
    assert bm.get_computed_blocks(make_request("d", x + z + [1]))[1] == 4


def test_no_prefix_caching_never_hits_or_hashes():
    bm = make_block_manager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    tokens = prompt_tokens("t", 9)
    a = make_request("a", tokens)
    admit(bm, a)
    assert bm.cached_blocks == {} and all(b.block_hash is None for b in bm.blocks)
    assert bm.get_computed_blocks(make_request("b", tokens)) == ([], 0)
    bm.free(a)
    assert bm.free_queue and bm.num_free_blocks == 10


def test_chunked_allocation_caches_only_scheduled_full_blocks():
    bm = make_block_manager(num_blocks=10, block_size=4)
    tokens = prompt_tokens("t", 12)
    a = make_request("a", tokens)
    assert bm.allocate_slots(a, 6)                  # tokens 0..5: block 0 full, block 1 half
    assert len(bm.block_table("a")) == 2
    assert len(bm.cached_blocks) == 1 and bm.req_num_cached["a"] == 1
    a.num_computed_tokens = 6
    assert bm.allocate_slots(a, 6)                  # tokens 6..11
    assert len(bm.block_table("a")) == 3
    assert len(bm.cached_blocks) == 3 and bm.req_num_cached["a"] == 3
    assert [bm.blocks[b].block_hash for b in bm.block_table("a")] == a.block_hashes


def test_duplicate_full_block_is_not_registered_twice():
    """Two identical 8-token prompts: the second computes its own last block; the cache keeps
    pointing to the first copy and the duplicate stays unhashed (reused first when freed)."""
    bm = make_block_manager(num_blocks=10, block_size=4)
    tokens = prompt_tokens("t", 8)
    a, b = make_request("a", tokens), make_request("b", tokens)
    admit(bm, a)
    assert admit(bm, b) == 4
    ta, tb = bm.block_table("a"), bm.block_table("b")
    assert tb[0] == ta[0] and tb[1] != ta[1]
    assert bm.blocks[tb[1]].block_hash is None
    assert bm.cached_blocks[a.block_hashes[1]] == ta[1]
    bm.free(b)
    assert next(iter(bm.free_queue)) == tb[1]
    check_block_manager(bm)


# ---- free queue and LRU eviction ---------------------------------------------------------------
def test_freed_cached_blocks_stay_hittable_until_reused():
    bm = make_block_manager(num_blocks=4, block_size=4)
    tokens = prompt_tokens("t", 6)                  # block 0 full (hashed), block 1 partial
    a = make_request("a", tokens)
    admit(bm, a)
    assert bm.block_table("a") == [0, 1]
    bm.free(a)
    # the unhashed block goes to the front (reused first), the hashed one to the back
    assert list(bm.free_queue) == [1, 2, 3, 0]
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    assert bm.get_computed_blocks(make_request("b", tokens))[1] == 4

    other = make_request("o", 12)                   # takes 1, 2, 3: block 0 survives
    admit(bm, other)
    assert bm.block_table("o") == [1, 2, 3]
    assert bm.get_computed_blocks(make_request("c", tokens)) == ([0], 4)

    last = make_request("l", 4)                     # takes block 0: its hash is evicted
    admit(bm, last)
    assert bm.block_table("l") == [0]
    assert a.block_hashes[0] not in bm.cached_blocks
    assert bm.get_computed_blocks(make_request("d", tokens)) == ([], 0)
    check_block_manager(bm)


def test_hit_on_free_cached_block_reclaims_it():
    bm = make_block_manager(num_blocks=4, block_size=4)
    tokens = prompt_tokens("t", 9)
    a = make_request("a", tokens)
    admit(bm, a)
    table_a = list(bm.block_table("a"))
    bm.free(a)
    assert bm.num_free_blocks == 4
    b = make_request("b", tokens)
    assert admit(bm, b) == 8
    assert bm.block_table("b")[:2] == table_a[:2]
    assert bm.num_free_blocks == 1                  # 2 reclaimed + 1 new
    assert all(bm.blocks[x].ref_cnt == 1 for x in bm.block_table("b"))
    check_block_manager(bm)


def test_lru_order_of_cached_free_blocks():
    """Least recently freed cached blocks are evicted first; a hit moves a block back to the end."""
    bm = make_block_manager(num_blocks=6, block_size=4)
    x, y, z = (make_request(i, prompt_tokens(i, 4) + [1]) for i in "xyz")   # one full block each
    for r in (x, y, z):
        admit(bm, r)
    bx, by, bz = (bm.block_table(r.request_id)[0] for r in (x, y, z))
    for r in (x, y, z):
        bm.free(r)
    # the partial blocks are in front; then x, y, z in the order they were freed
    queue = list(bm.free_queue)
    assert queue[-3:] == [bx, by, bz]
    # a hit on x takes it out of the queue; freeing again puts it at the end (most recent)
    x2 = make_request("x2", x.prompt_token_ids)
    assert admit(bm, x2) == 4
    bm.free(x2)
    assert list(bm.free_queue)[-3:] == [by, bz, bx]
    # the three unhashed blocks go first, then cached ones in LRU order
    filler = make_request("f", 12)                  # 3 blocks: the 3 unhashed ones
    admit(bm, filler)
    assert set(bm.block_table("f")).isdisjoint({bx, by, bz})
    g = make_request("g", 4)
    admit(bm, g)
    assert bm.block_table("g") == [by]              # y was least recently used
    assert bm.get_computed_blocks(make_request("y3", y.prompt_token_ids))[1] == 0
    assert bm.get_computed_blocks(make_request("z3", z.prompt_token_ids))[1] == 4
    assert bm.get_computed_blocks(make_request("x3", x.prompt_token_ids))[1] == 4
    check_block_manager(bm)


def test_free_releases_tail_first():
    """Freeing a chain puts its tail in front of its head: the tail is evicted first."""
    bm = make_block_manager(num_blocks=3, block_size=4)
    tokens = prompt_tokens("t", 12)
    a = make_request("a", tokens)
    admit(bm, a)
    bm.free(a)
    assert list(bm.free_queue) == [2, 1, 0]
    admit(bm, make_request("b", 4))                 # evicts block 2 (the tail)
    assert bm.get_computed_blocks(make_request("c", tokens + [1]))[1] == 8


# ---- free and reset ------------------------------------------------------------------------
def test_free_is_idempotent_and_accounts_exactly():
    bm = make_block_manager(num_blocks=8, block_size=4)
    a, b = make_request("a", 9), make_request("b", 5)
    admit(bm, a)
    admit(bm, b)
    assert bm.num_free_blocks == 8 - 3 - 2
    bm.free(a)
    assert bm.num_free_blocks == 8 - 2
    bm.free(a)                                      # second free: no error, no change
    assert bm.num_free_blocks == 8 - 2
    assert bm.block_table("a") == [] and "a" not in bm.req_num_cached
    bm.free(make_request("never", 3))               # never allocated: no-op
    bm.free(b)
    assert bm.num_free_blocks == 8 and bm.usage == 0.0
    assert all(blk.ref_cnt == 0 for blk in bm.blocks)
    assert bm.req_to_blocks == {} and bm.req_num_cached == {}
    check_block_manager(bm)


def test_reset_prefix_cache():
    bm = make_block_manager(num_blocks=8, block_size=4)
    dead, live = prompt_tokens("dead", 9), prompt_tokens("live", 9)
    a = make_request("a", dead)
    admit(bm, a)
    bm.free(a)
    b = make_request("b", live)
    admit(bm, b)
    assert len(bm.cached_blocks) == 4
    bm.reset_prefix_cache()
    assert bm.cached_blocks == {}
    assert all(blk.block_hash is None for blk in bm.blocks)
    assert bm.num_free_blocks == 8 - 3               # live blocks stay allocated
    assert bm.block_table("b") and bm.req_num_cached["b"] == 0
    assert bm.get_computed_blocks(make_request("c", dead)) == ([], 0)
    assert bm.get_computed_blocks(make_request("d", live)) == ([], 0)
    # the live request's full blocks are registered again on its next allocation
    assert bm.allocate_slots(b, 1)
    assert bm.req_num_cached["b"] == 2
    assert bm.get_computed_blocks(make_request("e", live))[0] == bm.block_table("b")[:2]
    check_block_manager(bm)
