"""The memory behind the lower KV tiers (inference/kv_tiers.py), owned by the model runner.

    host tier:  uint8 [num_host_slots, num_layers, 2 (K, V), block_bytes]   pinned on CUDA
    disk tier:  one file of num_disk_slots * bytes_per_block, slot-major, same layout per slot
    device:     per layer (K, V), each [num_blocks, block_size, kv_heads, width] (viewed as bytes)

A slot holds one block of every layer, so a block moves host <-> disk with one read or write.
`apply` runs a step's transfers in their recorded order, before the step's forward:

- CPU: plain indexed copies.
- CUDA: device <-> host copies run on a side stream through a device staging buffer (gather the
  blocks of every layer with one kernel per layer, then one copy per run of consecutive slots),
  so they overlap the step still in flight. The side stream waits only for in-flight steps that
  touch a block it reads or overwrites, and the compute stream waits for this step's copies (its
  forward reads the loaded blocks and overwrites the offloaded ones) through one event.
  Disk reads and writes are host work: they first wait for the side stream's copies.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass

import torch

from inference.config import CacheConfig
from inference.kv_tiers import KVTierIndex, KVTransfer, TransferOp

STAGING_BYTES = 256 << 20     # device staging for one batch of device <-> host copies
GPU_OPS = (TransferOp.DEVICE_TO_HOST, TransferOp.HOST_TO_DEVICE)


@dataclass(frozen=True)
class TierSizes:
    num_host_slots: int
    num_disk_slots: int
    bytes_per_block: int


def tier_sizes(cache: CacheConfig, bytes_per_block: int) -> TierSizes | None:
    """Slots per tier for this model's blocks; None when no tier is configured. Checks the sizes
    against this machine's memory and the disk's free space."""
    if not cache.swap_space:
        return None
    num_host = cache.swap_space_bytes // bytes_per_block
    if num_host < 1:
        raise ValueError(f"swap_space: {cache.swap_space} GiB holds no KV block of this model "
                         f"({bytes_per_block} bytes); raise it or set it to 0")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if cache.swap_space_bytes > 0.8 * ram:
        raise ValueError(f"swap_space: {cache.swap_space} GiB is more than 80% of this machine's "
                         f"{ram / 2**30:.1f} GiB of memory")
    num_disk = 0
    if cache.kv_disk_bytes:
        path = cache.kv_disk_path
        if not os.path.isdir(path) or not os.access(path, os.W_OK):
            raise ValueError(f"kv_disk_path: {path!r} is not a writable directory")
        num_disk = cache.kv_disk_bytes // bytes_per_block
        if num_disk < 1:
            raise ValueError(f"kv_disk_bytes: {cache.kv_disk_bytes} bytes hold no KV block of this model "
                             f"({bytes_per_block} bytes)")
        free = shutil.disk_usage(path).free
        if cache.kv_disk_bytes > free:
            raise ValueError(f"kv_disk_bytes: {cache.kv_disk_bytes} bytes is more than the "
                             f"{free} bytes free in {path!r}")
    return TierSizes(num_host, num_disk, bytes_per_block)


def tier_index_for(runner) -> KVTierIndex | None:
    """The block manager's bookkeeping for the runner's tiers (None without tiers)."""
    store: KVTierStore | None = getattr(runner, "kv_tier_store", None)
    if store is None:
        return None
    s = store.sizes
    return KVTierIndex(s.num_host_slots, s.num_disk_slots, store.block_size, s.bytes_per_block)


class KVTierStore:
    """Host slots (and the disk file) for the runner's KV cache; executes KVTransfers."""

    def __init__(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sizes: TierSizes,
                 disk_path: str | None = None):
        k0 = kv_caches[0][0]
        self.device = k0.device
        self.on_cuda = self.device.type == "cuda"
        self.sizes = sizes
        self.block_size = k0.shape[1]
        self.num_layers = len(kv_caches)
        # per layer (K, V) as [num_blocks, block_bytes]: any cache dtype (fp8, int8 + scales) moves as bytes
        self.flat = [tuple(c.view(torch.uint8).view(c.shape[0], -1) for c in kv) for kv in kv_caches]
        self.block_bytes = self.flat[0][0].shape[1]
        assert 2 * self.num_layers * self.block_bytes == sizes.bytes_per_block, "tier slot size mismatch"
        self.host = _host_buffer((sizes.num_host_slots, self.num_layers, 2, self.block_bytes), self.on_cuda)
        self.host_np = self.host.numpy()
        self.disk_fd: int | None = None
        if sizes.num_disk_slots:
            fd, name = tempfile.mkstemp(prefix="kv-tier-", suffix=".bin", dir=disk_path)
            os.unlink(name)                  # the space goes back when the process ends, however it ends
            os.ftruncate(fd, sizes.num_disk_slots * sizes.bytes_per_block)
            self.disk_fd = fd
        if self.on_cuda:
            self.stream = torch.cuda.Stream(self.device)
            self.staging_blocks = max(1, min(256, STAGING_BYTES // sizes.bytes_per_block))
            self.staging = torch.empty((self.staging_blocks, self.num_layers, 2, self.block_bytes),
                                       dtype=torch.uint8, device=self.device)
            # launched steps not known to be done: (event at their end, their schedule)
            self.inflight: deque[tuple[torch.cuda.Event, object]] = deque()
            self.last_sched = None

    def close(self) -> None:
        if self.disk_fd is not None:
            os.close(self.disk_fd)
            self.disk_fd = None

    # ---- one step ------------------------------------------------------------------------------
    def apply(self, sched) -> None:
        """Run `sched.kv_transfers` in order; on CUDA, make the compute stream wait for them."""
        transfers: list[KVTransfer] = sched.kv_transfers
        if self.on_cuda:
            self._note_launch(sched)
        if not transfers:
            return
        self._busy = None                    # blocks in-flight steps touch: computed on first need
        i = 0
        while i < len(transfers):
            op = transfers[i].op
            j = i
            while j < len(transfers) and transfers[j].op is op:
                j += 1
            if op in GPU_OPS:
                self._device_copies(op, transfers[i:j])
            else:
                for t in transfers[i:j]:
                    self._disk_copy(t)
            i = j
        if self.on_cuda:
            done = torch.cuda.Event()
            done.record(self.stream)
            torch.cuda.current_stream(self.device).wait_event(done)

    def _device_copies(self, op: TransferOp, run: list[KVTransfer]) -> None:
        """One run of same-direction copies. Later copies to the same destination win (the earlier
        data was dead: the destination was reused in between), and none of them reads what another
        writes, so they may go in any order: sorted by host slot, consecutive slots copy at once."""
        last = {t.dst: t for t in run}
        run = sorted(last.values(), key=lambda t: t.dst if op is TransferOp.DEVICE_TO_HOST else t.src)
        to_host = op is TransferOp.DEVICE_TO_HOST
        blocks = [t.src if to_host else t.dst for t in run]
        slots = [t.dst if to_host else t.src for t in run]
        if not self.on_cuda:
            b, s = torch.tensor(blocks), torch.tensor(slots)
            for layer, kv in enumerate(self.flat):
                for j, cache in enumerate(kv):
                    if to_host:
                        self.host[s, layer, j] = cache[b]
                    else:
                        cache[b] = self.host[s, layer, j]
            return
        for start in range(0, len(run), self.staging_blocks):
            self._staged_copies(to_host, blocks[start:start + self.staging_blocks],
                                slots[start:start + self.staging_blocks])

    def _staged_copies(self, to_host: bool, blocks: list[int], slots: list[int]) -> None:
        stream, n = self.stream, len(blocks)
        self._wait_for_writers(set(blocks))
        with torch.cuda.stream(stream):
            idx = torch.tensor(blocks, dtype=torch.long, pin_memory=True).to(self.device, non_blocking=True)
            stage = self.staging[:n]
            if to_host:
                for layer, kv in enumerate(self.flat):
                    for j, cache in enumerate(kv):
                        stage[:, layer, j] = cache.index_select(0, idx)
            for pos, slot, length in _runs(slots):
                if to_host:
                    self.host[slot:slot + length].copy_(stage[pos:pos + length], non_blocking=True)
                else:
                    stage[pos:pos + length].copy_(self.host[slot:slot + length], non_blocking=True)
            if not to_host:
                for layer, kv in enumerate(self.flat):
                    for j, cache in enumerate(kv):
                        cache.index_copy_(0, idx, stage[:, layer, j])

    def _disk_copy(self, t: KVTransfer) -> None:
        """Host <-> disk, on this thread, after every device <-> host copy queued before it."""
        slot = t.src if t.op is TransferOp.HOST_TO_DISK else t.dst
        if self.on_cuda:
            self.stream.synchronize()        # the side stream's copies, of this step and earlier ones
        off = (t.dst if t.op is TransferOp.HOST_TO_DISK else t.src) * self.sizes.bytes_per_block
        buf = memoryview(self.host_np[slot]).cast("B")
        if t.op is TransferOp.HOST_TO_DISK:
            written = os.pwrite(self.disk_fd, buf, off)
            assert written == len(buf), "short write to the KV disk tier"
        else:
            got = os.preadv(self.disk_fd, [buf], off)
            assert got == len(buf), "short read from the KV disk tier"

    # ---- CUDA ordering -------------------------------------------------------------------------
    def _note_launch(self, sched) -> None:
        """The previous step is fully enqueued on the compute stream: remember where it ends."""
        if self.last_sched is not None:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self.inflight.append((ev, self.last_sched))
        self.last_sched = sched
        while self.inflight and self.inflight[0][0].query():
            self.inflight.popleft()

    def _wait_for_writers(self, blocks: set[int]) -> None:
        """The side stream waits for the newest in-flight step that touches one of `blocks`: a
        request aborted or preempted while its last step still runs frees blocks that step still
        writes (an offload must read them after) or reads (a load must not overwrite them yet)."""
        if self._busy is None:
            while self.inflight and self.inflight[0][0].query():
                self.inflight.popleft()
            self._busy = set().union(*(_touched_blocks(sched, self.block_size) for _, sched in self.inflight))
        if self.inflight and blocks & self._busy:
            self.stream.wait_event(self.inflight[-1][0])     # the newest: steps finish in order


def _touched_blocks(sched, block_size: int) -> set[int]:
    """Every block a step reads or writes: its requests' tables up to their context length."""
    out: set[int] = set()
    for it in sched.scheduled:
        out.update(it.block_ids[:-(-(it.num_computed_tokens + it.num_scheduled_tokens) // block_size)])
    return out


def _host_buffer(shape: tuple[int, ...], pinned: bool) -> torch.Tensor:
    """The host tier. On CUDA its pages are pinned in place (cudaHostRegister) so copies to and
    from it are asynchronous; pin_memory=True would round the allocation up to a power of two."""
    buf = torch.empty(shape, dtype=torch.uint8)
    if pinned:
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), buf.numel(), 1)   # portable
        if int(err) != 0:
            return torch.empty(shape, dtype=torch.uint8, pin_memory=True)
    return buf


def _runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(position, first slot, length) of each run of consecutive slots in a sorted list."""
    runs: list[tuple[int, int, int]] = []
    for pos, slot in enumerate(slots):
        if runs and runs[-1][1] + runs[-1][2] == slot:
            p, s, n = runs[-1]
            runs[-1] = (p, s, n + 1)
        else:
            runs.append((pos, slot, 1))
    return runs
