"""Lower tiers of the prefix cache: host memory, then an optional disk file (bookkeeping only).

    device pool (BlockManager)        host tier (pinned memory)       disk tier (one file)
    +------------------------+ evict  +----------------------+ evict  +------------------+
    | hashed free blocks,    | -----> | slots, LRU by hash   | -----> | slots, LRU       |
    | LRU free queue         | <----- |                      | <----- |                  |
    +------------------------+  hit   +----------------------+  hit   +------------------+

When the block manager reuses a device block that still carries a prefix hash, the block's KV is
copied to a host slot instead of being forgotten; when the host tier is full its least recently
used slot moves to the disk tier (or is dropped without one). A prefix lookup that misses on the
device but finds the hash lower down gets a device block and a copy back up (disk -> host ->
device), which is far cheaper than recomputing the prefill.

The tiers are inclusive: a lower tier keeps its copy when a block goes back up, so a block that
is evicted again (the next turn of a chat) costs no second copy.

Write-behind: each launched step also copies up to `write_behind_bytes` of cached device blocks
that have no host copy yet down to host slots, ahead of any eviction (`write_behind`; marked
`behind`: the runner does not hold the step's forward for them). Cached blocks are immutable, so
the copy stays valid, and the block's later eviction finds it in the host tier and costs nothing.
Blocks freed by their last request go first (`on_device_free`: they are what evictions take),
then blocks of running requests (`on_device_cached`), from the step after the one that writes
their KV: when a round of chat turns ends together, the next round evicts the tails of the
replies just freed before any step could copy them. A queued block that is evicted first is
offloaded as before and leaves the queue; one whose hash changed meanwhile (reused, forgotten) is
skipped when its turn comes, so no copy reads a block after it was handed to new data.
Write-behind fills free host slots; for a freed block without a disk tier it may drop the host
tier's LRU entry (as its eviction would); it never pushes an entry down to disk (synchronous host
work, left to real evictions).

Load budget (`load_budget_bytes`, set where steps overlap: the CUDA runner with async scheduling):
a step takes the prefix hits of waiting requests until their copies up reach the budget; the
next request waits one step. Its loads then run on the side stream while this step computes,
instead of every later turn of a round waiting for all of the round's loads before any of them
computes (the first hit of a step is always admitted, however large).

Nothing here touches tensors. `KVTierIndex` maps hashes to slots and records, in order, the
`KVTransfer`s the model runner must execute before the step's forward (inference/worker/kv_tier_store.py):
order matters, e.g. a device block is read by its offload before a load overwrites it.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field

WRITE_BEHIND_BYTES_PER_STEP = 16 << 20    # H200 8B: 8 blocks, ~0.3 ms of link time beside a ~6 ms step
LOAD_BYTES_PER_STEP = 256 << 20           # overlapped steps: ~5 ms of loads at ~50 GB/s, one staging round


class TransferOp(enum.Enum):
    DEVICE_TO_HOST = "device_to_host"   # src: device block id, dst: host slot
    HOST_TO_DEVICE = "host_to_device"   # src: host slot, dst: device block id
    HOST_TO_DISK = "host_to_disk"       # src: host slot, dst: disk slot
    DISK_TO_HOST = "disk_to_host"       # src: disk slot, dst: host slot


@dataclass(frozen=True, slots=True)
class KVTransfer:
    """One block's copy between two places (see TransferOp for what src and dst index)."""
    op: TransferOp
    src: int
    dst: int
    behind: bool = False      # a write-behind copy: the step's forward need not wait for it


@dataclass
class TierStats:
    """One lower tier's counters (cumulative since the engine started, except num_used)."""
    tier: str                 # "host" | "disk"
    num_slots: int
    num_used: int = 0
    hit_blocks: int = 0       # blocks a prefix lookup found here (and copied back up)
    hit_tokens: int = 0
    bytes_in: int = 0         # copied into this tier from the one above it
    bytes_out: int = 0        # copied out of this tier to the one above it
    bytes_written_behind: int = 0   # of bytes_in: copied ahead of an eviction (write-behind)
    num_evictions: int = 0    # entries dropped, or moved down to the next tier

    @property
    def usage(self) -> float:
        return self.num_used / self.num_slots if self.num_slots else 0.0


@dataclass
class KVTierStats:
    """Every lower tier, top down (host first)."""
    tiers: list[TierStats] = field(default_factory=list)

    def tier(self, name: str) -> TierStats | None:
        return next((t for t in self.tiers if t.tier == name), None)


class SlotTier:
    """One lower tier's slots: block hash -> slot, least recently used first."""

    def __init__(self, name: str, num_slots: int):
        self.name = name
        self.num_slots = num_slots
        self.free_slots: list[int] = list(range(num_slots - 1, -1, -1))   # pop() hands out slot 0 first
        self.entries: OrderedDict[bytes, int] = OrderedDict()             # hash -> slot; front = LRU
        self.stats = TierStats(name, num_slots)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.entries

    def touch(self, block_hash: bytes) -> int:
        """The slot of a held hash, now the most recently used."""
        self.entries.move_to_end(block_hash)
        return self.entries[block_hash]

    def take_slot(self, pinned: set[bytes]) -> tuple[int, tuple[bytes, int] | None] | None:
        """A slot for new data: a free one, else the least recently used unpinned entry's, which
        is returned as the victim (hash, slot) so the caller can move it down. None: all pinned."""
        if self.free_slots:
            return self.free_slots.pop(), None
        victim = next((h for h in self.entries if h not in pinned), None)
        if victim is None:
            return None
        slot = self.entries.pop(victim)
        self.stats.num_evictions += 1
        return slot, (victim, slot)

    def insert(self, block_hash: bytes, slot: int) -> None:
        self.entries[block_hash] = slot

    def forget_slots(self, slots: set[int]) -> dict[int, bytes]:
        """Their content cannot be trusted (a step failed before its copies ran): free them.
        Returns slot -> the hash it was filled for."""
        forgotten = {}
        for h in [h for h, s in self.entries.items() if s in slots]:
            slot = self.entries.pop(h)
            self.free_slots.append(slot)
            forgotten[slot] = h
        return forgotten

    def clear(self) -> None:
        self.entries.clear()
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def snapshot(self) -> TierStats:
        self.stats.num_used = len(self.entries)
        return TierStats(**vars(self.stats))


class KVTierIndex:
    """Which hashes the lower tiers hold, and the copies the runner owes them.

    The block manager calls `on_device_free` when a hashed block's last holder frees it,
    `on_device_evict` when it reuses a hashed device block, and, for a prefix hit below the
    device, `pin` the request's hashes, `stage_for_load` (disk -> host when needed), then
    `record_load` once it has a device block for it. Before a launched step takes its copies
    (`take_transfers`) it calls `write_behind`.
    """

    def __init__(self, num_host_slots: int, num_disk_slots: int, block_size: int, bytes_per_block: int,
                 write_behind_bytes: int = WRITE_BEHIND_BYTES_PER_STEP, load_budget_bytes: int | None = None):
        if num_host_slots < 1:
            raise ValueError(f"num_host_slots: must be >= 1, got {num_host_slots}")
        if write_behind_bytes < 0:
            raise ValueError(f"write_behind_bytes: must be >= 0, got {write_behind_bytes}")
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.write_behind_bytes = write_behind_bytes     # per step; 0: off (any > 0: >= 1 block)
        self.load_budget_bytes = load_budget_bytes       # copies up per step; None: no bound
        self.num_pending_loads = 0                       # copies up recorded for the next step
        self.host = SlotTier("host", num_host_slots)
        self.disk = SlotTier("disk", num_disk_slots) if num_disk_slots > 0 else None
        self.pending: list[KVTransfer] = []
        self.pinned: set[bytes] = set()        # hashes a lookup is loading: never victims meanwhile
        # write-behind queues, device block id -> its hash, oldest first: freed cached blocks
        # with no host copy yet (about the device's eviction order), blocks of running requests
        # hashed in earlier steps, and those hashed by the step being scheduled (its forward
        # writes their KV: copied from the next step on)
        self.unwritten: OrderedDict[int, bytes] = OrderedDict()
        self.unwritten_live: OrderedDict[int, bytes] = OrderedDict()
        self.fresh: dict[int, bytes] = {}

    # ---- queries ---------------------------------------------------------------------------
    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self.host or (self.disk is not None and block_hash in self.disk)

    def stats(self) -> KVTierStats:
        tiers = [self.host] + ([self.disk] if self.disk is not None else [])
        return KVTierStats([t.snapshot() for t in tiers])

    # ---- device frees and evictions ----------------------------------------------------------
    def on_device_cached(self, block_hash: bytes, block_id: int) -> None:
        """A running request's block now caches `block_hash` (this step writes its KV). An
        older queue entry for the block is dropped: its hash was forgotten without an eviction
        (a rolled-back step, a preemption), and the same hash cached again in the same block (a
        retried prompt) must not be copied down while this step's forward writes it."""
        self.unwritten.pop(block_id, None)
        self.unwritten_live.pop(block_id, None)
        if self.write_behind_bytes and block_hash not in self.host:
            self.fresh[block_id] = block_hash

    def on_device_free(self, block_hash: bytes, block_id: int) -> None:
        """A cached device block has no holder left: copy it down ahead of its eviction."""
        if not self.write_behind_bytes or block_hash in self.host or block_id in self.fresh:
            return                               # (fresh: its KV is still being written)
        self.unwritten_live.pop(block_id, None)
        self.unwritten[block_id] = block_hash

    def write_behind(self, holds) -> None:
        """Record write-behind copies of the oldest queued blocks, freed ones first, up to the
        per-step budget. `holds(block_id, block_hash)`: whether the device block still caches
        that hash (one reused or forgotten since it was queued is skipped: its KV is no longer
        that hash's). Called once per launched step, after the step's other copies."""
        budget = -(-self.write_behind_bytes // self.bytes_per_block)
        for queue, may_drop in ((self.unwritten, self.disk is None), (self.unwritten_live, False)):
            while queue and budget > 0:
                block_id, block_hash = queue.popitem(last=False)
                if block_hash in self.host or block_id in self.fresh or not holds(block_id, block_hash):
                    continue                     # (fresh: written by this step, queued again below)
                slot = self.host.free_slots.pop() if self.host.free_slots else (
                    self._host_slot() if may_drop else None)
                if slot is None:                 # no slot to be had cheaply: later
                    queue[block_id] = block_hash
                    queue.move_to_end(block_id, last=False)
                    break
                self._record(TransferOp.DEVICE_TO_HOST, block_id, slot, self.host, "in", behind=True)
                self.host.stats.bytes_written_behind += self.bytes_per_block
                self.host.insert(block_hash, slot)
                budget -= 1
        self.unwritten_live.update(self.fresh)   # written by the step that takes these copies
        self.fresh.clear()

    def on_device_evict(self, block_hash: bytes, block_id: int) -> None:
        """A device block holding `block_hash` is about to be reused: keep its KV in the host tier."""
        for queue in (self.unwritten, self.unwritten_live, self.fresh):
            queue.pop(block_id, None)            # too late to write behind: offloaded now
        if block_hash in self.host:
            self.host.touch(block_hash)          # inclusive: the host copy is still good
            return
        slot = self._host_slot()
        if slot is None:
            return                               # every host slot is pinned: forget the block
        self._record(TransferOp.DEVICE_TO_HOST, block_id, slot, self.host, "in")
        self.host.insert(block_hash, slot)

    # ---- prefix hits below the device --------------------------------------------------------
    def loads_fit(self, num_loads: int) -> bool:
        """Whether a prefix hit that copies `num_loads` blocks up may join the step being
        scheduled (always when it is the step's first, so every request gets its turn)."""
        if self.load_budget_bytes is None or not num_loads or not self.num_pending_loads:
            return True
        return (self.num_pending_loads + num_loads) * self.bytes_per_block <= self.load_budget_bytes

    def pin(self, hashes) -> None:
        """Keep these hashes in their tiers while a lookup loads them (until each one's
        record_load): copies made room for meanwhile must pick other victims."""
        self.pinned.update(hashes)

    def unpin(self) -> None:
        self.pinned.clear()

    def stage_for_load(self, block_hash: bytes) -> int | None:
        """The host slot that holds `block_hash` now, copied up from disk if only the disk has it;
        None when no host slot can be had (all pinned). Counts the hit in its tier."""
        if block_hash in self.host:
            stats = self.host.stats
            slot = self.host.touch(block_hash)
        elif self.disk is not None and block_hash in self.disk:
            disk_slot = self.disk.touch(block_hash)
            slot = self._host_slot()
            if slot is None:
                return None
            self._record(TransferOp.DISK_TO_HOST, disk_slot, slot, self.disk, "out")
            self.host.insert(block_hash, slot)
            stats = self.disk.stats
        else:
            return None
        stats.hit_blocks += 1
        stats.hit_tokens += self.block_size
        return slot

    def record_load(self, block_hash: bytes, host_slot: int, block_id: int) -> None:
        """The copy up of a staged hash into `block_id`. Its host slot may be reused from now on:
        whatever overwrites it is recorded, and so runs, after this copy."""
        self._record(TransferOp.HOST_TO_DEVICE, host_slot, block_id, self.host, "out")
        self.num_pending_loads += 1
        self.pinned.discard(block_hash)

    # ---- the runner's side -----------------------------------------------------------------
    def take_transfers(self) -> list[KVTransfer]:
        """The copies recorded since the last call, in the order they must run."""
        out, self.pending = self.pending, []
        self.num_pending_loads = 0
        return out

    def forget_transfers(self, transfers: list[KVTransfer]) -> None:
        """A step failed, so its copies may not have run: forget whatever they were to fill.
        Write-behind sources go back in the queue (`write_behind` checks they still hold it)."""
        forgotten = self.host.forget_slots({t.dst for t in transfers if t.op in (TransferOp.DEVICE_TO_HOST,
                                                                                  TransferOp.DISK_TO_HOST)})
        for t in transfers:
            if t.behind and t.dst in forgotten and self.write_behind_bytes:
                self.unwritten_live[t.src] = forgotten[t.dst]        # free or not: the cautious queue
        if self.disk is not None:
            self.disk.forget_slots({t.dst for t in transfers if t.op is TransferOp.HOST_TO_DISK})

    def clear(self) -> None:
        """Forget every hash (the weights changed). Pending copies still run, harmlessly."""
        for queue in (self.unwritten, self.unwritten_live, self.fresh):
            queue.clear()
        self.host.clear()
        if self.disk is not None:
            self.disk.clear()

    # ---- internals ---------------------------------------------------------------------------
    def _host_slot(self) -> int | None:
        """A free host slot; a full tier moves its LRU entry down to the disk tier (or drops it)."""
        got = self.host.take_slot(self.pinned)
        if got is None:
            return None
        slot, victim = got
        if victim is not None and self.disk is not None:
            victim_hash, victim_slot = victim
            if victim_hash in self.disk:
                self.disk.touch(victim_hash)
            else:
                taken = self.disk.take_slot(self.pinned)
                if taken is not None:
                    self._record(TransferOp.HOST_TO_DISK, victim_slot, taken[0], self.disk, "in")
                    self.disk.insert(victim_hash, taken[0])
        return slot

    def _record(self, op: TransferOp, src: int, dst: int, tier: SlotTier, direction: str,
                behind: bool = False) -> None:
        self.pending.append(KVTransfer(op, src, dst, behind))
        if direction == "in":
            tier.stats.bytes_in += self.bytes_per_block
        else:
            tier.stats.bytes_out += self.bytes_per_block
