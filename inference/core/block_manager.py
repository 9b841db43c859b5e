"""Paged KV-cache block manager: blocks, reference counts, the free queue and the prefix cache.

The KV cache is a pool of fixed-size blocks; a request's KV lives in the blocks of its block
table, in token order:

    request tokens:  t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9
    block table:     [   7       ,    2        ,  11 ]      (block_size = 4)
    slot of t9:      11 * 4 + 1 = 45   (slot = block_id * block_size + offset)

Prefix caching: a *full* block is identified by a hash chained over every token up to its end
(`request.block_hashes`). Blocks whose hash is registered can be shared by any request whose
tokens start the same way (reference counted). A block whose count drops to zero goes to the
free queue but keeps its hash, so a later request can still hit it; it is only forgotten when
the block is taken from the front of the queue for new data (LRU eviction).

Lower tiers (optional, `tiers`): a hashed block taken for new data first has its KV copied to
host memory (and from there, when that fills, to disk), and a prefix lookup continues below the
device: such a hit gets a device block and a copy back up (inference/core/kv_tiers.py). The copies are
recorded here and run by the model runner before the step's forward. Hashed blocks are also
copied down ahead of time, a few per launched step, freed ones first (write-behind), so that their
eviction later costs no copy on the step that needs the block.

Shifted reuse (optional, `enable_kv_reuse`): requests that ask for it leave donors when they
release their blocks, and a later one may copy KV from them (inference/core/kv_reuse.py). Each
block's generation counts the times it was handed out for new data, which tells a donor's blocks
still hold its KV.

This class never sees tensors; the model runner owns the memory the block ids index.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from inference.core.kv_reuse import MAX_DONORS, Donor, ReusePlan, plan_reuse, with_slots
from inference.core.kv_tiers import KVTierIndex, KVTierStats, KVTransfer, TransferOp
from inference.core.request import Request


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    generation: int = 0        # times handed out for new data (a donor checks its blocks by it)


@dataclass
class PrefixCacheStats:
    queries: int = 0      # prompt tokens looked up
    hits: int = 0         # of those, found in the cache

    def record(self, num_queries: int, num_hits: int) -> None:
        self.queries += num_queries
        self.hits += num_hits


class BlockManager:
    """Owns every KV block. The scheduler asks; the model runner only reads block ids."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 tiers: KVTierIndex | None = None):
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> None for blocks with ref_cnt == 0; the front is evicted first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached_blocks: dict[bytes, int] = {}          # block hash -> block_id
        self.req_to_blocks: dict[str, list[int]] = {}      # req_id -> block table
        self.req_num_cached: dict[str, int] = {}           # req_id -> blocks registered in the cache
        self.prefix_stats = PrefixCacheStats()
        self.tiers = tiers if enable_prefix_caching else None     # host / disk tiers below this pool
        self.enable_kv_reuse = False        # the engine turns it on where the runner can shift KV
        self.donors: OrderedDict[int, Donor] = OrderedDict()      # most recent last
        self._num_donors = 0
        self.reused_tokens = 0              # prompt tokens served by shifted reuse (a counter)

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def block_table(self, req_id: str) -> list[int]:
        return self.req_to_blocks.get(req_id, [])

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of a waiting request: (block ids, number of tokens they hold).

        At least one token is always left to compute, because the model must produce the
        logits of the last token.
        """
        if not self.enable_prefix_caching:
            return [], 0
        request.update_block_hashes(self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hit: list[int | None] = []          # None: only a lower tier holds it (loaded below)
        hashes = request.block_hashes[:max_blocks]
        for block_hash in hashes:
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None and (self.tiers is None or not self.tiers.contains(block_hash)):
                break
            hit.append(block_id)
        if None in hit:
            hit = self._load_from_tiers(request, hashes[:len(hit)], hit)
        return hit, len(hit) * self.block_size

    def _load_from_tiers(self, request: Request, hashes: list[bytes], hit: list[int | None]) -> list[int]:
        """Give every lower-tier entry of a prefix hit a device block and record its copy up. The
        loaded blocks join the device prefix cache (free, MRU end of the queue) like any other
        hit. Only when the whole request then fits: a load for a request that cannot be admitted
        would be evicted again by the running ones before it is (copies for nothing, every step);
        without room the hit stops at its first lower-tier block."""
        tiers = self.tiers
        for block_id in hit:                 # device hits must not be evicted by the loads
            if block_id is not None:
                self._touch(block_id)
        num_device = sum(1 for b in hit if b is not None)
        fits = self.num_free_blocks >= self.num_blocks_for(request.num_tokens) - num_device
        tiers.pin(hashes)
        num_hit = len(hit) if fits else hit.index(None)
        for i, block_hash in enumerate(hashes[:num_hit]):
            if hit[i] is not None:
                continue
            slot = tiers.stage_for_load(block_hash) if self.free_queue else None
            if slot is None:
                num_hit = i
                break
            block_id = self._take_free_block()           # may offload another block first
            tiers.record_load(block_hash, slot, block_id)
            self.blocks[block_id].block_hash = block_hash
            self.cached_blocks[block_hash] = block_id
            hit[i] = block_id
        tiers.unpin()
        for block_id in reversed(hit):       # as free() does: the tail is evicted first
            if block_id is not None:
                self._untouch(block_id)
        return hit[:num_hit]

    def can_load_now(self, request: Request) -> bool:
        """Whether a waiting request may be admitted to the step being scheduled as far as lower
        tiers go: False when part of its prefix must be copied up and the step already carries
        its budget of such copies (KVTierIndex.load_budget_bytes); it then waits a step, and its
        copies overlap this step's compute."""
        tiers = self.tiers
        if tiers is None or tiers.load_budget_bytes is None or not tiers.num_pending_loads:
            return True
        request.update_block_hashes(self.block_size)
        num_loads = 0
        for block_hash in request.block_hashes[:(request.num_tokens - 1) // self.block_size]:
            if block_hash in self.cached_blocks:
                continue
            if not tiers.contains(block_hash):
                break
            num_loads += 1
        return tiers.loads_fit(num_loads)

    # ---- allocation ----------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int,
                     new_computed_blocks: list[int] = ()) -> bool:
        """Whether `allocate_slots` with the same arguments would succeed."""
        return self._num_blocks_short(request, num_new_tokens, new_computed_blocks) <= 0

    def _num_blocks_short(self, request: Request, num_new_tokens: int,
                          new_computed_blocks: list[int]) -> int:
        held = self.req_to_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = self.num_blocks_for(num_computed + num_new_tokens) - len(held) - len(new_computed_blocks)
        # Hit blocks that sit in the free queue stop being free once this request holds them.
        num_reclaimed = sum(1 for b in new_computed_blocks if self.blocks[b].ref_cnt == 0)
        return num_needed - (self.num_free_blocks - num_reclaimed)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[int] = ()) -> bool:
        """Give `request` room for `num_new_tokens` more tokens (after any prefix hit).

        Returns False and changes nothing when there are not enough free blocks.
        """
        if not new_computed_blocks:
            # Fast path for a running request (a decode step, mostly): room is usually there.
            table = self.req_to_blocks.get(request.request_id)
            num_total = request.num_computed_tokens + num_new_tokens
            if table is not None and len(table) * self.block_size >= num_total:
                if self.enable_prefix_caching and \
                        min(num_total, request.num_tokens) // self.block_size > self.req_num_cached.get(
                            request.request_id, 0):
                    self._cache_full_blocks(request, num_total)
                return True
        if self._num_blocks_short(request, num_new_tokens, new_computed_blocks) > 0:
            return False
        table = self.req_to_blocks.setdefault(request.request_id, [])
        for block_id in new_computed_blocks:
            self._touch(block_id)
            table.append(block_id)
        if new_computed_blocks:
            self.req_num_cached[request.request_id] = len(table)
        num_total = request.num_computed_tokens + len(new_computed_blocks) * self.block_size + num_new_tokens
        while len(table) < self.num_blocks_for(num_total):
            table.append(self._take_free_block())
        if self.enable_prefix_caching:
            # Blocks filled by this step become shareable now: the runner writes every
            # token's KV of a layer before any attention of that layer reads it.
            self._cache_full_blocks(request, num_total)
        return True

    def free(self, request: Request, num_valid_tokens: int | None = None) -> None:
        """Release every block of `request` (finish, abort or preemption). Idempotent.

        A request that runs on after this must count a preemption (`num_preemptions += 1`): the
        CUDA runner re-stages a block-table row only when the request, its table length or that
        count changes (tables otherwise only grow).

        `num_valid_tokens`: only that many tokens' KV was written (a step was cancelled); hashes
        registered for blocks past them are forgotten so no later request can hit them.
        """
        table = self.req_to_blocks.pop(request.request_id, [])
        self.req_num_cached.pop(request.request_id, None)
        donor = self.enable_kv_reuse and request.sampling_params.cache_reuse > 0 and table
        if donor:
            valid = min(request.num_tokens, request.num_computed_tokens if num_valid_tokens is None
                        else num_valid_tokens)
            self._keep_donor(request.all_token_ids[:valid], table)
        if num_valid_tokens is not None:
            for block_id in table[num_valid_tokens // self.block_size:]:
                block = self.blocks[block_id]
                if block.block_hash is not None and self.cached_blocks.get(block.block_hash) == block_id:
                    del self.cached_blocks[block.block_hash]
                block.block_hash = None
        # Reverse order: the tail of a sequence is the least likely to be shared, evict it first.
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block_id} freed twice"
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    if not donor:                   # worthless: reuse first
                        self.free_queue.move_to_end(block_id, last=False)
                elif self.tiers is not None:
                    self.tiers.on_device_free(block.block_hash, block_id)

    # ---- shifted reuse (inference/core/kv_reuse.py) -----------------------------------------------
    def _keep_donor(self, tokens: list[int], table: list[int]) -> None:
        if len(tokens) < 2:
            return
        blocks = table[:self.num_blocks_for(len(tokens))]
        self.donors[self._num_donors] = Donor(tokens, blocks, [self.blocks[b].generation for b in blocks])
        self._num_donors += 1
        while len(self.donors) > MAX_DONORS:
            self.donors.popitem(last=False)

    def plan_reuse(self, request: Request, num_hit: int) -> tuple[ReusePlan, Donor] | None:
        """A reuse plan for a request being admitted after a prefix hit of `num_hit` tokens."""
        if not (self.enable_kv_reuse and self.donors and request.sampling_params.cache_reuse > 0):
            return None
        return plan_reuse(request.prompt_token_ids, num_hit, request.sampling_params.cache_reuse,
                          list(reversed(self.donors.values())), self.block_size,
                          lambda block_id: self.blocks[block_id].generation)

    def allocate_with_reuse(self, request: Request, plan: ReusePlan, donor: Donor, num_new_tokens: int,
                            new_computed_blocks: list[int]) -> bool:
        """`allocate_slots` for an admission that copies `plan`'s KV: the donor blocks it reads
        are held while the request's blocks are taken, so none of them is handed out under it
        (the copies run before the step's forward, so later takers cannot overwrite them first).
        Fills in the plan's slots. False, changing nothing, when the blocks are not there."""
        bs = self.block_size
        run_src = range(plan.run_src, plan.run_src + plan.run_end - plan.run_start)
        src = sorted({donor.blocks[p // bs] for p in (*range(plan.base, plan.lead_end), *run_src)})
        for block_id in src:
            self._touch(block_id)
        try:
            request.num_exact_tokens = plan.base
            ok = self.allocate_slots(request, num_new_tokens, new_computed_blocks)
        finally:
            for block_id in src:
                self._untouch(block_id)
        if not ok:
            request.num_exact_tokens = None
            return False
        with_slots(plan, donor, request.request_id, self.req_to_blocks[request.request_id], bs)
        self.reused_tokens += plan.num_reused
        return True

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (e.g. after weights change). Live blocks stay allocated."""
        for block in self.blocks:
            block.block_hash = None
        self.cached_blocks.clear()
        for req_id in self.req_num_cached:
            self.req_num_cached[req_id] = 0
        if self.tiers is not None:
            self.tiers.clear()

    # ---- lower tiers -------------------------------------------------------------------------
    def take_kv_transfers(self) -> list[KVTransfer]:
        """Copies between tiers recorded since the last call, in order, then this step's
        write-behind copies; the step that carries them runs them before its forward (the
        write-behind ones alongside it). Only for a step that is launched."""
        if self.tiers is None:
            return []
        self.tiers.write_behind(self._caches)
        return self.tiers.take_transfers()

    def forget_kv_transfers(self, transfers: list[KVTransfer]) -> None:
        """A step failed, so its copies may not have run: forget the hashes of what they filled."""
        if self.tiers is None or not transfers:
            return
        self.tiers.forget_transfers(transfers)
        for t in transfers:
            if t.op is TransferOp.HOST_TO_DEVICE:
                block = self.blocks[t.dst]
                if block.block_hash is not None and self.cached_blocks.get(block.block_hash) == t.dst:
                    del self.cached_blocks[block.block_hash]
                block.block_hash = None

    def tier_stats(self) -> KVTierStats | None:
        return self.tiers.stats() if self.tiers is not None else None

    # ---- internals -----------------------------------------------------------------------
    def _caches(self, block_id: int, block_hash: bytes) -> bool:
        """Whether `block_id` still holds the KV of `block_hash` (not reused, not forgotten)."""
        return self.blocks[block_id].block_hash == block_hash and self.cached_blocks.get(block_hash) == block_id

    def _touch(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            del self.free_queue[block_id]
        block.ref_cnt += 1

    def _untouch(self, block_id: int) -> None:
        """Undo a `_touch`: at count zero the block goes back to the free queue (MRU end)."""
        block = self.blocks[block_id]
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_queue[block_id] = None

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:                      # evict from the prefix cache
            if self.cached_blocks.get(block.block_hash) == block_id:
                del self.cached_blocks[block.block_hash]
                if self.tiers is not None:                    # ... down to the host tier
                    self.tiers.on_device_evict(block.block_hash, block_id)
            block.block_hash = None
        block.ref_cnt = 1
        block.generation += 1
        return block_id

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        exact = request.num_tokens if request.num_exact_tokens is None else request.num_exact_tokens
        num_full = min(num_tokens, request.num_tokens, exact) // self.block_size
        start = self.req_num_cached.get(request.request_id, 0)
        if num_full <= start:
            return
        request.update_block_hashes(self.block_size)
        table = self.req_to_blocks[request.request_id]
        for i in range(start, num_full):
            block_hash = request.block_hashes[i]
            block = self.blocks[table[i]]
            if block.block_hash is None and block_hash not in self.cached_blocks:
                block.block_hash = block_hash
                self.cached_blocks[block_hash] = block.block_id
                if self.tiers is not None:
                    self.tiers.on_device_cached(block_hash, block.block_id)
        self.req_num_cached[request.request_id] = num_full
