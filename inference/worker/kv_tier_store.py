"""The memory behind the lower KV tiers (inference/core/kv_tiers.py), owned by the model runner.

    host tier:  uint8 [num_host_slots, num_layers, 2 (K, V), block_bytes]   pinned on CUDA
    disk tier:  one file of num_disk_slots * bytes_per_block, slot-major, same layout per slot
    device:     per layer (K, V), each [num_blocks, block_size, kv_heads, width] (viewed as bytes)

A slot holds one block of every layer, so a block moves host <-> disk with one read or write.
`apply` runs a step's transfers in their recorded order, before the step's forward:

- CPU: numpy fancy-indexed copies over 8-byte words, one per layer and K / V (torch's indexed
  copies are several times slower on the CPU: bench/journal/2026-12-01-tiered-kv-cache.md, T5).
- CUDA: device <-> host copies run on a side stream through a device staging buffer laid out
  like the host slots: one Triton kernel gathers (or scatters) a batch's blocks of every layer's
  K and V through a table of the 2 * num_layers cache base pointers, then one copy-engine copy
  per run of consecutive slots, so they overlap the step still in flight. (Without Triton, or
  for block sizes that are not whole 8-byte words: one index_select / index_copy_ per tensor.)
  The side stream waits only for in-flight steps that
  touch a block it reads or overwrites, and the compute stream waits for this step's copies (its
  forward reads the loaded blocks and overwrites the offloaded ones) through one event.
  Write-behind copies (`KVTransfer.behind`, inference/core/kv_tiers.py) are queued after them and only
  the next step waits for those: this step's forward neither writes the free cached blocks they
  read nor reads the fresh host slots they fill, while a later step may overwrite those blocks.
  Disk reads and writes are host work: they first wait for the side stream's copies.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from inference.config import CacheConfig
from inference.core.kv_tiers import LOAD_BYTES_PER_STEP, KVTierIndex, KVTransfer, TransferOp

STAGING_BYTES = 256 << 20     # device staging for one batch of device <-> host copies
WORDS_PER_PROGRAM = 1024      # 8-byte words one gather / scatter program moves (8 KiB)
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
    """The block manager's bookkeeping for the runner's tiers (None without tiers). A runner whose
    steps overlap (CUDA) gets a load budget per step: the next step's copies up run beside this
    step's compute. (Not known here: a speculative engine runs steps in turn all the same.)"""
    store: KVTierStore | None = getattr(runner, "kv_tier_store", None)
    if store is None:
        return None
    s = store.sizes
    return KVTierIndex(s.num_host_slots, s.num_disk_slots, store.block_size, s.bytes_per_block,
                       load_budget_bytes=LOAD_BYTES_PER_STEP if getattr(runner, "overlaps", False) else None)


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
        if not self.on_cuda:             # the CPU copies' views: int64 words where blocks allow
            word = np.int64 if self.block_bytes % 8 == 0 else np.uint8
            self.flat_np = [tuple(c.numpy().view(word) for c in kv) for kv in self.flat]
            self.host_words = self.host_np.view(word)     # [slots, layers, 2, words]
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
            # base address of every layer's K and V, in slot order (layer-major, K before V): the
            # gather / scatter kernels reach all 2 * num_layers tensors in one launch
            self.kernels = _block_copy_kernels() if self.block_bytes % 8 == 0 else None
            if self.kernels is not None:
                self.cache_ptrs = torch.tensor([c.data_ptr() for kv in self.flat for c in kv],
                                               dtype=torch.int64, device=self.device)
                self._warm_up_kernels()
            # launched steps not known to be done: (event at their end, their schedule)
            self.inflight: deque[tuple[torch.cuda.Event, object]] = deque()
            self.last_sched = None
            self.num_writer_waits = 0        # batches whose copies waited for a step in flight
            self.behind_done: torch.cuda.Event | None = None     # the last step's write-behind copies
            # bench/cpu/kv_tiers.py sets this: (start, end, bytes, write-behind?) of every staged batch
            self.copy_timings: list[tuple[torch.cuda.Event, torch.cuda.Event, int, bool]] | None = None

    def close(self) -> None:
        if self.disk_fd is not None:
            os.close(self.disk_fd)
            self.disk_fd = None

    # ---- one step ------------------------------------------------------------------------------
    def apply(self, sched) -> None:
        """Run `sched.kv_transfers` in order; on CUDA, make the compute stream wait for them
        (for the write-behind ones: the next step's compute)."""
        transfers: list[KVTransfer] = sched.kv_transfers
        if self.on_cuda:
            self._note_launch(sched)
            if self.behind_done is not None:     # this step may overwrite what they read
                torch.cuda.current_stream(self.device).wait_event(self.behind_done)
                self.behind_done = None
        if not transfers:
            return
        self._busy = None                    # blocks in-flight steps touch: computed on first need
        # recorded after every other copy of the step, so running them last keeps the order
        needed = [t for t in transfers if not t.behind]
        behind = [t for t in transfers if t.behind]
        self._run(needed, behind=False)
        if self.on_cuda and needed:
            done = torch.cuda.Event()
            done.record(self.stream)
            torch.cuda.current_stream(self.device).wait_event(done)
        if behind:
            self._run(behind, behind=True)
            if self.on_cuda:
                self.behind_done = torch.cuda.Event()
                self.behind_done.record(self.stream)

    def _run(self, transfers: list[KVTransfer], behind: bool) -> None:
        for op, batch in _batches(transfers):
            if op in GPU_OPS:
                self._device_copies(op, batch, behind)
            else:
                for t in batch:
                    self._disk_copy(t)

    def _device_copies(self, op: TransferOp, run: list[KVTransfer], behind: bool = False) -> None:
        """One run of same-direction copies. Later copies to the same destination win (the earlier
        data was dead: the destination was reused in between), and none of them reads what another
        writes, so they may go in any order: sorted by host slot, consecutive slots copy at once."""
        last = {t.dst: t for t in run}
        run = sorted(last.values(), key=lambda t: t.dst if op is TransferOp.DEVICE_TO_HOST else t.src)
        to_host = op is TransferOp.DEVICE_TO_HOST
        blocks = [t.src if to_host else t.dst for t in run]
        slots = [t.dst if to_host else t.src for t in run]
        if not self.on_cuda:
            b, s, host = np.array(blocks), np.array(slots), self.host_words
            for layer, kv in enumerate(self.flat_np):
                for j, cache in enumerate(kv):
                    if to_host:
                        host[s, layer, j] = cache[b]
                    else:
                        cache[b] = host[s, layer, j]
            return
        for start in range(0, len(run), self.staging_blocks):
            self._staged_copies(to_host, blocks[start:start + self.staging_blocks],
                                slots[start:start + self.staging_blocks], behind)

    def _staged_copies(self, to_host: bool, blocks: list[int], slots: list[int], behind: bool = False) -> None:
        stream, n = self.stream, len(blocks)
        self._wait_for_writers(set(blocks))
        with torch.cuda.stream(stream):
            if self.copy_timings is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
            idx = torch.tensor(blocks, dtype=torch.long, pin_memory=True).to(self.device, non_blocking=True)
            stage = self.staging[:n]                                   # [n, layers, 2, block_bytes]
            if to_host:
                self._gather(idx, stage)
            for pos, slot, length in _runs(slots):
                if to_host:
                    self.host[slot:slot + length].copy_(stage[pos:pos + length], non_blocking=True)
                else:
                    stage[pos:pos + length].copy_(self.host[slot:slot + length], non_blocking=True)
            if not to_host:
                self._scatter(idx, stage)
            if self.copy_timings is not None:
                end.record(stream)
                self.copy_timings.append((start, end, n * self.sizes.bytes_per_block, behind))

    def _gather(self, idx: torch.Tensor, stage: torch.Tensor) -> None:
        """stage[i] = block idx[i] of every layer's K and V (on the current stream)."""
        self._stage_blocks(idx, stage, gather=True)

    def _scatter(self, idx: torch.Tensor, stage: torch.Tensor) -> None:
        """Block idx[i] of every layer's K and V = stage[i] (on the current stream)."""
        self._stage_blocks(idx, stage, gather=False)

    def _stage_blocks(self, idx: torch.Tensor, stage: torch.Tensor, gather: bool) -> None:
        if self.kernels is None:
            for layer, kv in enumerate(self.flat):
                for j, cache in enumerate(kv):
                    if gather:
                        stage[:, layer, j] = cache.index_select(0, idx)
                    else:
                        cache.index_copy_(0, idx, stage[:, layer, j])
            return
        kernel = self.kernels[0 if gather else 1]
        words = self.block_bytes // 8
        kernel[(len(idx), 2 * self.num_layers, -(-words // WORDS_PER_PROGRAM))](
            self.cache_ptrs, idx, stage.view(torch.int64), NUM_TENSORS=2 * self.num_layers, WORDS=words,
            CHUNK=WORDS_PER_PROGRAM)

    def _warm_up_kernels(self) -> None:
        """Compile both kernels now (a JIT compile mid-serving stalls a step by ~1 s): block 0 out
        to staging and back, which leaves it as it was."""
        with torch.cuda.stream(self.stream):
            idx = torch.zeros(1, dtype=torch.long, device=self.device)
            self._gather(idx, self.staging[:1])
            self._scatter(idx, self.staging[:1])
        self.stream.synchronize()

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
            self.num_writer_waits += 1


def _touched_blocks(sched, block_size: int) -> set[int]:
    """Every block a step reads or writes: its requests' tables up to their context length."""
    out: set[int] = set()
    for it in sched.scheduled:
        out.update(it.block_ids[:-(-(it.num_computed_tokens + it.num_scheduled_tokens) // block_size)])
    return out


def _host_buffer(shape: tuple[int, ...], pinned: bool) -> torch.Tensor:
    """The host tier. On CUDA its pages are pinned in place (cudaHostRegister) so copies to and
    from it run at the link's speed and asynchronously; pin_memory=True would round the allocation
    up to a power of two. The registration ends when the memory is freed (a registered range that
    is unmapped stays registered, and a later buffer at the same address then fails to register:
    cudaErrorHostMemoryAlreadyRegistered)."""
    if not pinned:
        return torch.empty(shape, dtype=torch.uint8)
    arr = np.empty(math.prod(shape), dtype=np.uint8)
    cudart = torch.cuda.cudart()
    ptr = arr.ctypes.data
    err = int(cudart.cudaHostRegister(ptr, arr.nbytes, 1))                      # portable
    if err == 0:
        # numpy drops an array's weak references before it frees the data: unregister first
        weakref.finalize(arr, cudart.cudaHostUnregister, ptr).atexit = False
        buf = torch.from_numpy(arr).view(shape)
        if buf.is_pinned():                      # is_pinned asks the driver about the pointer
            return buf
    else:
        try:                                     # the failed call's error is still pending:
            torch.zeros(1, device="cuda")        # the next launch check reports (and clears) it
        except Exception:
            pass
    return torch.empty(shape, dtype=torch.uint8, pin_memory=True)


# what each op reads and writes: (kind of its src, kind of its dst)
_PLACES = {TransferOp.DEVICE_TO_HOST: ("device", "host"), TransferOp.HOST_TO_DEVICE: ("host", "device"),
           TransferOp.HOST_TO_DISK: ("host", "disk"), TransferOp.DISK_TO_HOST: ("disk", "host")}


def _batches(transfers: list[KVTransfer]) -> list[tuple[TransferOp, list[KVTransfer]]]:
    """The transfers as few same-op batches as their order allows. The block manager records an
    offload before each load that evicts a block (D2H, H2D, D2H, H2D, ...), and every batch costs
    a staging round (index upload, kernel, copies): in recorded order a round would move only a few
    blocks (bench/journal/2026-12-01-tiered-kv-cache.md, T3).
    Each transfer joins the first batch of its op after the last batch holding a transfer it
    depends on (one that writes what it reads or writes, or reads what it writes); transfers it
    moves ahead of touch nothing it touches, so the result is the same as in recorded order."""
    batches: list[tuple[TransferOp, list[KVTransfer]]] = []
    last_write: dict[tuple[str, int], int] = {}          # place -> last batch writing it
    last_read: dict[tuple[str, int], int] = {}           # place -> last batch reading it
    for t in transfers:
        src_kind, dst_kind = _PLACES[t.op]
        src, dst = (src_kind, t.src), (dst_kind, t.dst)
        after = max(last_write.get(src, -1), last_write.get(dst, -1), last_read.get(dst, -1))
        j = next((k for k in range(after + 1, len(batches)) if batches[k][0] is t.op), None)
        if j is None:
            j = len(batches)
            batches.append((t.op, []))
        batches[j][1].append(t)
        last_write[dst] = max(last_write.get(dst, -1), j)
        last_read[src] = max(last_read.get(src, -1), j)
    return batches


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


_KERNELS = None


def _block_copy_kernels():
    """(gather, scatter) Triton kernels over the table of cache base pointers; None without Triton.

        gather:  stage[i, t, :] = cache_t[idx[i], :]      t = 2 * layer + (0 for K, 1 for V)
        scatter: cache_t[idx[i], :] = stage[i, t, :]
    Grid (len(idx), num tensors, chunks of a block); everything is moved as int64 words."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def gather(ptrs, idx, stage, NUM_TENSORS: tl.constexpr, WORDS: tl.constexpr, CHUNK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1)
        offs = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK)          # [CHUNK] words of the block
        mask = offs < WORDS
        cache = tl.load(ptrs + t).to(tl.pointer_type(tl.int64))        # [num_blocks, WORDS]
        block = tl.load(idx + i)
        vals = tl.load(cache + block * WORDS + offs, mask=mask)
        tl.store(stage + (i * NUM_TENSORS + t) * WORDS + offs, vals, mask=mask)

    @triton.jit
    def scatter(ptrs, idx, stage, NUM_TENSORS: tl.constexpr, WORDS: tl.constexpr, CHUNK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64)
        t = tl.program_id(1)
        offs = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK)
        mask = offs < WORDS
        cache = tl.load(ptrs + t).to(tl.pointer_type(tl.int64))
        block = tl.load(idx + i)
        vals = tl.load(stage + (i * NUM_TENSORS + t) * WORDS + offs, mask=mask)
        tl.store(cache + block * WORDS + offs, vals, mask=mask)

    _KERNELS = (gather, scatter)
    return _KERNELS
