"""ModelRunner on CUDA (tests also run it on the CPU under the Triton interpreter): Triton kernels,
KV cache sized from free memory, persistent input buffers and CUDA graphs for decode batches.

A step's inputs are written into pinned host buffers, copied to persistent device buffers, and
the model runs either eagerly (prefill chunks, mixed batches) or, for a pure decode batch, as the
replay of a graph captured for the next bucketed batch size. Padding rows of a bucket write no
KV (slot -1), attend to one token, and their logits are dropped.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from inference.config import CacheConfig, SchedulerConfig
from inference.interfaces import ModelRunnerOutput, ScheduledRequest, SchedulerOutput, StepHandle
from inference.kernels.decode_attention import SPLIT_CHOICES, choose_num_splits
from inference.loader.model_loader import LoadedModel
from inference.models.triton_layers import KernelAttentionMetadata
from inference.worker.cuda_graphs import (
    GRAPH_BATCH_SIZES,
    MAX_MIXED_CHUNKS,
    GraphSet,
    mixed_shape_for,
    mixed_shapes,
)
from inference.worker.kv_sizing import run_largest_step
from inference.worker.model_runner import ModelRunner
from inference.worker.sampler import list_to_device, sample_on_device
from inference.worker.staging import StagingBuffers

log = logging.getLogger(__name__)


class CudaModelRunner(ModelRunner):
    def __init__(self, loaded: LoadedModel, cache: CacheConfig, sched: SchedulerConfig, num_blocks: int,
                 seed: int = 0, enforce_eager: bool = False, mixed_layout: bool | None = None):
        """mixed_layout: run prefill-carrying steps in the padded layout of the mixed graphs
        (default: when graphs are captured; tests turn it on for the eager CPU path)."""
        super().__init__(loaded, cache, num_blocks, seed)
        self.loaded = loaded
        dev = self.device
        self.max_model_len = loaded.max_model_len
        self.max_blocks = -(-loaded.max_model_len // self.block_size)      # block-table width
        on_cuda = dev.type == "cuda"    # the CPU only runs this under the Triton interpreter (tests)
        self.overlaps = on_cuda
        self.num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if on_cuda else 4
        max_seqs = sched.max_num_seqs
        if mixed_layout is None:
            mixed_layout = on_cuda and not enforce_eager
        self.mixed_shapes = mixed_shapes(max_seqs, sched.max_num_batched_tokens) if mixed_layout else []
        max_tokens = max([sched.max_num_batched_tokens, max_seqs] + [d + p for d, p in self.mixed_shapes])
        self.staging = StagingBuffers(max_tokens, max_seqs, MAX_MIXED_CHUNKS, self.max_blocks, dev, on_cuda)
        self.staged_rows: list[tuple | None] = [None] * max_seqs   # row -> (request, table len, preemptions)
        self.copied = torch.cuda.Event() if on_cuda else None   # staging may be rewritten once fired
        # decode batch B -> (graph, logits); mixed (Bd, Tp) -> (graph, hidden states)
        self.graphs = GraphSet()
        self.decode_sizes: list[int] = []
        self.sched_config = sched
        if on_cuda:
            self.warm_up_kernels()
            if not enforce_eager:
                self.capture_graphs(min(max_seqs, sched.max_num_batched_tokens))

    @torch.inference_mode()
    def warm_up_kernels(self) -> None:
        """Compile every kernel variant a step can need now, so no request waits on Triton's JIT
        (a compile takes ~1 s): one eager mixed step per split-K choice, writing no KV; then the
        largest step, so its memory is reserved before traffic arrives."""
        dev, i32 = self.device, dict(dtype=torch.int32, device=self.device)
        for splits in SPLIT_CHOICES:
            meta = KernelAttentionMetadata(
                torch.full((4,), -1, dtype=torch.long, device=dev), 1, self.staging.tables.device[:1],
                self.staging.ctx.device[:1], splits,
                prefill_block_tables=self.staging.tables.device[:1], prefill_query_start=torch.tensor([0, 3], **i32),
                prefill_context_lens=torch.tensor([3], **i32), max_query_len=3)
            hidden = self.model(self.staging.ids.device[:4], self.staging.pos.device[:4], self.kv_caches, meta)
            self.model.compute_logits(hidden)
        # one token: the fused batch-1 decode layers' kernels (inference/models/fused_decode.py)
        meta = KernelAttentionMetadata(torch.full((1,), -1, dtype=torch.long, device=dev), 1,
                                       self.staging.tables.device[:1], self.staging.ctx.device[:1], SPLIT_CHOICES[0])
        self.model.compute_logits(self.model(self.staging.ids.device[:1], self.staging.pos.device[:1], self.kv_caches,
                                             meta))
        # Without this, the first big steps after startup wait on cudaMalloc and pinned-memory
        # allocations, a cold start that lands in the first requests' TTFTs
        # (bench/journal/2026-11-29-gpu-engine-runs-01-09.md, run 5).
        run_largest_step(self.loaded, self.sched_config, self.kv_caches, write_kv=False)
        torch.cuda.synchronize(dev)

    # ---- CUDA graphs -------------------------------------------------------------------------
    def _decode_meta(self, batch: int, num_splits: int) -> KernelAttentionMetadata:
        return KernelAttentionMetadata(self.staging.slots.device[:batch], batch, self.staging.tables.device[:batch],
                                       self.staging.ctx.device[:batch], num_splits)

    def _graph_splits(self, batch: int) -> int:
        return choose_num_splits(batch, self.arch.num_key_value_heads, self.max_model_len, self.num_sms)

    def _decode_forward(self, batch: int, meta: KernelAttentionMetadata) -> torch.Tensor:
        hidden = self.model(self.staging.ids.device[:batch], self.staging.pos.device[:batch], self.kv_caches, meta)
        return self.model.compute_logits(hidden)                            # [batch, vocab]

    def _mixed_forward(self, shape: tuple[int, int]) -> torch.Tensor:
        """The model over the mixed layout (see inference/worker/cuda_graphs.py) in the device buffers."""
        bd, tp = shape
        rows = bd + tp
        meta = KernelAttentionMetadata(
            self.staging.slots.device[:rows], bd, self.staging.tables.device[:bd], self.staging.ctx.device[:bd],
            self._graph_splits(bd) if bd else 1,
            prefill_block_tables=self.staging.pf_tables.device, prefill_query_start=self.staging.pf_starts.device,
            prefill_context_lens=self.staging.pf_ctx.device, max_query_len=tp)
        # [rows, hidden]
        return self.model(self.staging.ids.device[:rows], self.staging.pos.device[:rows], self.kv_caches, meta)

    @torch.inference_mode()
    def capture_graphs(self, max_batch: int) -> None:
        """Mixed shapes, then decode batches, largest first (smaller ones reuse the pool's memory).
        Every slot is -1 and every chunk empty while capturing: nothing is written to the cache."""
        start = time.perf_counter()
        for shape in sorted(self.mixed_shapes, key=lambda s: -(s[0] + s[1])):
            self.graphs.capture(shape, lambda shape=shape: self._mixed_forward(shape))
        self.decode_sizes = [b for b in GRAPH_BATCH_SIZES if b <= max_batch]
        for batch in reversed(self.decode_sizes):
            meta = self._decode_meta(batch, self._graph_splits(batch))
            self.graphs.capture(batch, lambda batch=batch, meta=meta: self._decode_forward(batch, meta))
        torch.cuda.synchronize(self.device)
        log.info("captured %d decode graphs (batch %s) and %d mixed ones in %.1f s", len(self.decode_sizes),
                 self.decode_sizes, len(self.mixed_shapes), time.perf_counter() - start)

    # ---- one step ----------------------------------------------------------------------------
    def execute(self, sched: SchedulerOutput, prev: StepHandle | None = None) -> ModelRunnerOutput:
        return self.collect(self.launch(sched, prev))

    @torch.inference_mode()
    def _launch(self, sched: SchedulerOutput, prev: StepHandle | None) -> StepHandle:
        """Stage inputs, run the model and queue sampling; returns before the device finishes."""
        if self.copied is not None:
            torch.cuda.set_device(self.device)     # per thread: the engine loop may run elsewhere
        items = sorted(sched.scheduled, key=lambda it: it.num_scheduled_tokens != 1)   # decodes first
        num_decodes = sum(1 for it in items if it.num_scheduled_tokens == 1)
        num_tokens = sum(it.num_scheduled_tokens for it in items)
        graph_batch = mixed = None
        if num_decodes == num_tokens:
            graph_batch = min((b for b in self.decode_sizes if b >= num_tokens), default=None)
        else:
            mixed = mixed_shape_for(num_decodes, num_tokens - num_decodes, len(items) - num_decodes,
                                    self.mixed_shapes)
        # rows of the flat batch, and where its prefill tokens start (padded layouts: see cuda_graphs.py)
        rows, decode_rows = ((graph_batch, graph_batch) if graph_batch else (sum(mixed), mixed[0]) if mixed
                             else (num_tokens, num_decodes))
        if self.copied is not None:
            self.copied.synchronize()              # last step's copies have read the staging buffers
        sample_rows, waiting_rows = self._stage_inputs(items, num_decodes, rows, decode_rows)
        dev = self.device
        if mixed is not None:
            self._stage_chunks(items[num_decodes:])
            self.staging.upload_rows(rows, decode_rows)
            self.staging.upload_chunks()
            if self.copied is not None:
                self.copied.record()
            self._take_prev_tokens(self.staging.ids.device, waiting_rows, items, prev)
            hidden = self.graphs.replay(mixed) if mixed in self.graphs else self._mixed_forward(mixed)
            if not sample_rows:
                return StepHandle(output=ModelRunnerOutput())
            logits = self.model.compute_logits(hidden[list_to_device(sample_rows, torch.long, dev)])
        elif graph_batch is not None:
            self.staging.upload_rows(rows, decode_rows)
            self.copied.record()                   # graphs only exist on CUDA
            self._take_prev_tokens(self.staging.ids.device, waiting_rows, items, prev)
            logits = self.graphs.replay(graph_batch)[:num_tokens]
            if len(sample_rows) != num_tokens:
                logits = logits[list_to_device(sample_rows, torch.long, dev)]
        else:
            ids = self.staging.ids.host[:rows].to(dev, non_blocking=True)
            pos = self.staging.pos.host[:rows].to(dev, non_blocking=True)
            meta = KernelAttentionMetadata(self.staging.slots.host[:rows].to(dev, non_blocking=True))
            if num_decodes:
                meta.num_decodes = num_decodes
                max_ctx = int(self.staging.ctx.host[:num_decodes].max())
                meta.decode_context_lens = self.staging.ctx.host[:num_decodes].to(dev, non_blocking=True)
                # Whole rows: the kernels see one row stride (max_blocks) in every step, so Triton
                # never compiles another variant for a new width mid-serving.
                meta.decode_block_tables = self.staging.tables.host[:num_decodes].to(dev, non_blocking=True)
                meta.num_splits = choose_num_splits(num_decodes, self.arch.num_key_value_heads, max_ctx,
                                                    self.num_sms)
            if self.copied is not None:
                self.copied.record()
            self._take_prev_tokens(ids, waiting_rows, items, prev)
            if num_decodes < len(items):
                self._prefill_meta(items[num_decodes:], meta)
            hidden = self.model(ids, pos, self.kv_caches, meta)
            if not sample_rows:
                return StepHandle(output=ModelRunnerOutput())
            if len(sample_rows) != rows:
                hidden = hidden[list_to_device(sample_rows, torch.long, dev)]
            logits = self.model.compute_logits(hidden)
        sampled = [it for it in items if it.needs_sample]
        if any(it.spec_token_ids for it in sampled):     # verification needs the host: no overlap
            return StepHandle(output=self._sample(items, logits))
        pending = sample_on_device(logits, [self._sampling_row(it) for it in sampled], self.default_generator)
        handle = StepHandle(sampled=sampled, pending=pending)
        if self.copied is not None:             # CUDA: the ids come back by an async copy
            handle.host_tokens = torch.empty(len(sampled), dtype=torch.long, pin_memory=True)
            handle.host_tokens.copy_(pending.token_ids, non_blocking=True)
            handle.done = torch.cuda.Event()
            handle.done.record()
        return handle


    def _stage_inputs(self, items: list[ScheduledRequest], num_decodes: int, rows: int,
                      decode_rows: int) -> tuple[list[int], list[int]]:
        """Token ids, positions, slots (and decode block tables / context lengths) into the pinned
        staging buffers: decodes from row 0, prefill tokens from row decode_rows, padding rows
        (slot -1, context 1) up to rows. Returns the flat-batch rows that sample, and the decode
        rows whose input token is the previous step's sample, still on the device (async
        scheduling)."""
        ids, pos, slots = self.staging.ids.host.numpy(), self.staging.pos.host.numpy(), self.staging.slots.host.numpy()
        ctx, tables = self.staging.ctx.host.numpy(), self.staging.tables.host.numpy()
        bs, nd = self.block_size, num_decodes
        decodes = items[:nd]
        # decodes: one token each, staged column-wise (a few bulk numpy writes, not 5 per row)
        starts = [it.num_computed_tokens for it in decodes]
        known = [p < len(it.request.all_token_ids) for it, p in zip(decodes, starts)]
        if all(known):
            ids[:nd] = [it.request.all_token_ids[p] for it, p in zip(decodes, starts)]
            waiting_rows = []
        else:
            ids[:nd] = [it.request.all_token_ids[p] if k else 0 for it, p, k in zip(decodes, starts, known)]
            waiting_rows = [i for i, k in enumerate(known) if not k]
        pos[:nd] = starts
        slots[:nd] = [it.block_ids[p // bs] * bs + p % bs for it, p in zip(decodes, starts)]
        ctx[:nd] = pos[:nd] + 1
        staged = self.staged_rows
        for i, it in enumerate(decodes):
            # A running request's table only grows (preemption rebuilds it: num_preemptions
            # changes), so the same request with the same table length in the same row is
            # already staged. The row keeps the Request alive, so `is` cannot be fooled.
            req, table = it.request, it.block_ids
            key = staged[i]
            if key is None or key[0] is not req or key[1] != len(table) or key[2] != req.num_preemptions:
                tables[i, :len(table)] = table
                staged[i] = (req, len(table), req.num_preemptions)
        sample_rows = [i for i, it in enumerate(decodes) if it.needs_sample]
        if decode_rows > nd:                       # graph padding rows after the decodes
            ids[nd:decode_rows], pos[nd:decode_rows], slots[nd:decode_rows], ctx[nd:decode_rows] = 0, 0, -1, 1
        t = decode_rows
        for it in items[nd:]:
            start, n, table = it.num_computed_tokens, it.num_scheduled_tokens, it.block_ids
            p = np.arange(start, start + n)
            ids[t:t + n] = it.token_ids()                    # drafts (speculative decoding) last
            pos[t:t + n] = p
            slots[t:t + n] = np.asarray(table, dtype=np.int64)[p // bs] * bs + p % bs
            t += n
            if it.needs_sample:
                sample_rows.extend(range(t - 1 - len(it.spec_token_ids), t))
        if rows > t:                               # graph padding rows after the prefill tokens
            ids[t:rows], pos[t:rows], slots[t:rows] = 0, 0, -1
        return sample_rows, waiting_rows

    def _take_prev_tokens(self, d_ids: torch.Tensor, waiting_rows: list[int], items: list[ScheduledRequest],
                          prev: StepHandle | None) -> None:
        """Copy the previous step's sampled tokens into the rows that take them as input, on the
        device (queued after that step, so no host sync)."""
        if not waiting_rows:
            return
        src_of = {id(it.request): i for i, it in enumerate(prev.sampled)}
        src = [src_of[id(items[r].request)] for r in waiting_rows]
        n = len(src)
        if waiting_rows[-1] == n - 1 and src == waiting_rows:        # the common case: rows 0..n-1 in order
            d_ids[:n] = prev.pending.token_ids[:n]
            return
        dev = self.device
        d_ids[list_to_device(waiting_rows, torch.long, dev)] = prev.pending.token_ids[
            list_to_device(src, torch.long, dev)]

    def _chunk_layout(self, chunks: list[ScheduledRequest], tables: np.ndarray) -> tuple[list[int], list[int]]:
        """Prefill chunks' query offsets and context lengths; their block tables into `tables`."""
        bs = self.block_size
        starts, ctx_lens = [0], []
        for i, it in enumerate(chunks):
            starts.append(starts[-1] + it.num_scheduled_tokens)
            c = it.num_computed_tokens + it.num_scheduled_tokens
            ctx_lens.append(c)
            nb = -(-c // bs)
            tables[i, :nb] = it.block_ids[:nb]
        return starts, ctx_lens

    def _stage_chunks(self, chunks: list[ScheduledRequest]) -> None:
        """The mixed layout's chunk metadata into its pinned buffers; unused chunks are empty."""
        starts, ctx_lens = self._chunk_layout(chunks, self.staging.pf_tables.host.numpy())
        n = len(chunks)
        self.staging.pf_starts.host.numpy()[:n + 1] = starts
        self.staging.pf_starts.host.numpy()[n + 1:] = starts[-1]
        self.staging.pf_ctx.host.numpy()[:n] = ctx_lens
        self.staging.pf_ctx.host.numpy()[n:] = 1

    def _prefill_meta(self, chunks: list[ScheduledRequest], meta: KernelAttentionMetadata) -> None:
        dev = self.device
        tables = np.zeros((len(chunks), self.max_blocks), dtype=np.int32)   # fixed row stride (see decode)
        starts, ctx_lens = self._chunk_layout(chunks, tables)
        # Pinned, non-blocking: a pageable copy would wait for the device to finish the step in
        # flight (async scheduling), stalling every prefill step's launch
        # (bench/journal/2026-11-29-gpu-engine-runs-01-09.md, run 7).
        if dev.type == "cuda":
            meta.prefill_block_tables = torch.from_numpy(tables).pin_memory().to(dev, non_blocking=True)
        else:
            meta.prefill_block_tables = torch.from_numpy(tables)
        meta.prefill_query_start = list_to_device(starts, torch.int32, dev)
        meta.prefill_context_lens = list_to_device(ctx_lens, torch.int32, dev)
        meta.max_query_len = max(it.num_scheduled_tokens for it in chunks)
