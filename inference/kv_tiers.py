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

Nothing here touches tensors. `KVTierIndex` maps hashes to slots and records, in order, the
`KVTransfer`s the model runner must execute before the step's forward (inference/kv_tier_store.py):
order matters, e.g. a device block is read by its offload before a load overwrites it.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field


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

    def forget_slots(self, slots: set[int]) -> None:
        """Their content cannot be trusted (a step failed before its copies ran): free them."""
        for h in [h for h, s in self.entries.items() if s in slots]:
            self.free_slots.append(self.entries.pop(h))

    def clear(self) -> None:
        self.entries.clear()
        self.free_slots = list(range(self.num_slots - 1, -1, -1))

    def snapshot(self) -> TierStats:
        self.stats.num_used = len(self.entries)
        return TierStats(**vars(self.stats))


class KVTierIndex:
    """Which hashes the lower tiers hold, and the copies the runner owes them.

    The block manager calls `on_device_evict` when it reuses a hashed device block, and, for a
    prefix hit below the device, `pin` the request's hashes, `stage_for_load` (disk -> host when
    needed), then `record_load` once it has a device block for it. `take_transfers` hands the
    copies recorded so far to the step that runs them.
    """

    def __init__(self, num_host_slots: int, num_disk_slots: int, block_size: int, bytes_per_block: int):
        if num_host_slots < 1:
            raise ValueError(f"num_host_slots: must be >= 1, got {num_host_slots}")
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.host = SlotTier("host", num_host_slots)
        self.disk = SlotTier("disk", num_disk_slots) if num_disk_slots > 0 else None
        self.pending: list[KVTransfer] = []
        self.pinned: set[bytes] = set()        # hashes a lookup is loading: never victims meanwhile

    # ---- queries ---------------------------------------------------------------------------
    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self.host or (self.disk is not None and block_hash in self.disk)

    def stats(self) -> KVTierStats:
        tiers = [self.host] + ([self.disk] if self.disk is not None else [])
        return KVTierStats([t.snapshot() for t in tiers])

    # ---- device eviction -------------------------------------------------------------------
    def on_device_evict(self, block_hash: bytes, block_id: int) -> None:
        """A device block holding `block_hash` is about to be reused: keep its KV in the host tier."""
        if block_hash in self.host:
            self.host.touch(block_hash)          # inclusive: the host copy is still good
            return
        slot = self._host_slot()
        if slot is None:
            return                               # every host slot is pinned: forget the block
        self._record(TransferOp.DEVICE_TO_HOST, block_id, slot, self.host, "in")
        self.host.insert(block_hash, slot)

    # ---- prefix hits below the device --------------------------------------------------------
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
        self.pinned.discard(block_hash)

    # ---- the runner's side -----------------------------------------------------------------
    def take_transfers(self) -> list[KVTransfer]:
        """The copies recorded since the last call, in the order they must run."""
        out, self.pending = self.pending, []
        return out

    def forget_transfers(self, transfers: list[KVTransfer]) -> None:
        """A step failed, so its copies may not have run: forget whatever they were to fill."""
        self.host.forget_slots({t.dst for t in transfers if t.op in (TransferOp.DEVICE_TO_HOST,
                                                                      TransferOp.DISK_TO_HOST)})
        if self.disk is not None:
            self.disk.forget_slots({t.dst for t in transfers if t.op is TransferOp.HOST_TO_DISK})

    def clear(self) -> None:
        """Forget every hash (the weights changed). Pending copies still run, harmlessly."""
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

    def _record(self, op: TransferOp, src: int, dst: int, tier: SlotTier, direction: str) -> None:
        self.pending.append(KVTransfer(op, src, dst))
        if direction == "in":
            tier.stats.bytes_in += self.bytes_per_block
        else:
            tier.stats.bytes_out += self.bytes_per_block
