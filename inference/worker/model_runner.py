"""Model runner: the only owner of device memory (weights, KV cache, per-request generators).

Per step it flattens every scheduled token into one varlen batch (decodes first, then prefill
chunks), builds slot mappings and gather indices from the block tables, runs the model once,
computes logits only for rows that sample, and samples.
"""
from __future__ import annotations

import math
import mmap
import time
from dataclasses import dataclass

import torch

from inference.config import CacheConfig
from inference.core.request import Request
from inference.interfaces import ModelRunnerOutput, Runner, ScheduledRequest, SchedulerOutput, StepHandle
from inference.loader.model_loader import LoadedModel
from inference.models.attention import (
    AttentionMetadata,
    PrefillChunk,
    bottom_right_causal_mask,
)
from inference.models.invariant_attention import padded_keys
from inference.models.llama import rope_inv_freq
from inference.spec_decode.rejection import verify_constrained, verify_greedy, verify_sampled
from inference.worker.kv_shift import apply_kv_shifts, supports_kv_shift
from inference.worker.kv_sizing import kv_cache_dtype, kv_cache_shape
from inference.worker.sampler import SamplerOutput, SamplingRow, resolve, sample


@dataclass
class RunnerTimings:
    """Where a step's time goes (for benchmarks): launching it on the host, and waiting for the
    device in collect. Engine wall time minus both is the rest of the host work."""
    num_steps: int = 0
    launch_s: float = 0.0
    wait_s: float = 0.0


class ModelRunner(Runner):
    # True when launch() returns before the device finishes, so the engine schedules and
    # launches the next step, and processes this one's outputs, while the device computes.
    overlaps = False
    kv_tier_store = None          # KVTierStore: host / disk slots below the KV cache (attach_kv_tiers)

    def __init__(self, loaded: LoadedModel, cache: CacheConfig, num_blocks: int, seed: int = 0):
        self.num_blocks = num_blocks
        self.timings = RunnerTimings()
        self.model = loaded.model
        self.arch = loaded.arch
        self.dtype = loaded.dtype
        self.device = next(self.model.parameters()).device
        self.block_size = cache.block_size
        shape = kv_cache_shape(loaded, cache, num_blocks)
        # per layer: (K, V), each [num_blocks, block_size, num_kv_heads, head_dim (+ 4 for int8)]
        cache_dtype = kv_cache_dtype(loaded, cache)
        # Decodes on the CPU in bf16 attend over keys padded to a multiple of 16 under a mask, so a
        # request's tokens do not depend on the batch it lands in (the flash kernel gives the same
        # bits for a row then: tests/inference/models/test_invariant_attention.py). The CPU
        # kernels' decode attention (inference/models/cpu_layers.py) reads the context lengths
        # instead and needs no mask.
        self.invariant_decode = self.device.type == "cpu" and self.dtype == torch.bfloat16
        self.decode_mask_needed = not (getattr(self.model, "decodes_from_context_lens", False)
                                       and cache_dtype == torch.bfloat16)
        self._kv_maps: list[mmap.mmap] = []       # CPU: the anonymous maps the caches live in
        self.kv_caches = [(self._zeroed(shape, cache_dtype), self._zeroed(shape, cache_dtype))
                          for _ in range(self.arch.num_hidden_layers)]
        # shifted KV reuse (inference/core/kv_reuse.py): keys move by one more RoPE rotation
        self.supports_kv_shift = supports_kv_shift(self.kv_caches[0][0], self.arch.head_dim)
        self._inv_freq = rope_inv_freq(self.arch)
        self.generators: dict[str, torch.Generator] = {}     # req_id -> its seeded generator
        self.rows: dict[str, tuple[Request, SamplingRow]] = {}   # req_id -> (request, its sampling row)
        self.default_generator = torch.Generator(device=self.device).manual_seed(seed)
        # req_id -> [k, vocab] the distributions a draft model drew the request's next drafts from
        # (speculative decoding; absent for n-gram drafts, which are one-hot)
        self.draft_probs: dict[str, torch.Tensor] = {}


    def _zeroed(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zero cache tensor. On the CPU it lives in an anonymous memory map: the kernel's zero
        pages, resident only once a block is written (a 512 MiB cache serving a few requests then
        costs megabytes of RSS, not half a gigabyte of memset pages)."""
        if self.device.type != "cpu":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        mem = mmap.mmap(-1, max(nbytes, 1))
        self._kv_maps.append(mem)
        return torch.frombuffer(mem, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)
    def remove_requests(self, req_ids) -> None:
        for req_id in req_ids:
            self.generators.pop(req_id, None)
            self.rows.pop(req_id, None)
            self.draft_probs.pop(req_id, None)

    def launch(self, sched: SchedulerOutput, prev: StepHandle | None = None) -> StepHandle:
        """Start a step. `prev`: the step before it when that one is not collected yet (async
        scheduling); a decode whose input token it sampled takes the token from it."""
        if sched.kv_shifts:           # first: a tier load this step may refill a donor's block
            apply_kv_shifts(self.kv_caches, sched.kv_shifts, self._inv_freq)
        self.apply_kv_transfers(sched)
        t0 = time.perf_counter()
        handle = self._launch(sched, prev)
        self.timings.num_steps += 1
        self.timings.launch_s += time.perf_counter() - t0
        return handle

    def _launch(self, sched: SchedulerOutput, prev: StepHandle | None) -> StepHandle:
        return StepHandle(output=self.execute(sched, prev))

    # ---- KV tiers (inference/core/kv_tiers.py) ------------------------------------------------------
    def attach_kv_tiers(self, cache: CacheConfig) -> None:
        """Allocate the host (and disk) tiers `cache` asks for below this runner's KV cache."""
        from inference.worker.kv_tier_store import KVTierStore, tier_sizes
        k = self.kv_caches[0][0]
        bytes_per_block = 2 * len(self.kv_caches) * k[0].numel() * k.element_size()
        sizes = tier_sizes(cache, bytes_per_block)
        if sizes is not None:
            self.kv_tier_store = KVTierStore(self.kv_caches, sizes, cache.kv_disk_path)

    def apply_kv_transfers(self, sched: SchedulerOutput) -> None:
        """Run the step's copies between KV tiers before anything of its forward: offloads read
        blocks this step overwrites, loads fill blocks its attention reads. On CUDA they are
        queued on a side stream the compute stream waits for."""
        if self.kv_tier_store is not None:
            self.kv_tier_store.apply(sched)

    def collect(self, handle: StepHandle) -> ModelRunnerOutput:
        if handle.output is not None:
            return handle.output
        tokens = None
        if handle.done is not None:
            t0 = time.perf_counter()
            handle.done.synchronize()
            self.timings.wait_s += time.perf_counter() - t0
            tokens = handle.host_tokens.tolist()
        return self._output(handle.sampled, resolve(handle.pending, tokens))

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, prev: StepHandle | None = None) -> ModelRunnerOutput:
        items, logits = self.forward(sched.scheduled, prev)
        if logits is None:
            return ModelRunnerOutput()
        return self._sample(items, logits)

    @torch.inference_mode()
    def forward(self, scheduled: list[ScheduledRequest], prev: StepHandle | None = None
                ) -> tuple[list[ScheduledRequest], torch.Tensor | None]:
        """Run the model over every scheduled token; returns the items in batch order and the
        logits of the rows that sample (None if none does): an item's last row, or all 1 + k
        rows of an item with drafts."""
        items = sorted(scheduled, key=lambda it: it.num_scheduled_tokens != 1)   # decodes first
        input_ids, positions, slots, sample_rows = [], [], [], []
        for it in items:
            start, n = it.num_computed_tokens, it.num_scheduled_tokens
            input_ids.extend(it.token_ids())
            if len(input_ids) < len(positions) + n:    # its last token is prev's sample, not back yet
                input_ids.append(prev.output.sampled_token_ids[it.request.request_id])
            pos = range(start, start + n)
            positions.extend(pos)
            bs, table = self.block_size, it.block_ids
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            if it.needs_sample:
                sample_rows.extend(range(len(input_ids) - 1 - len(it.spec_token_ids), len(input_ids)))
        dev = self.device
        meta = self._attention_metadata(items, torch.tensor(slots, dtype=torch.long, device=dev))
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long, device=dev),
                            torch.tensor(positions, dtype=torch.long, device=dev), self.kv_caches, meta)
        if not sample_rows:
            return items, None
        if len(sample_rows) != hidden.shape[0]:          # only rows that sample need logits
            hidden = hidden[torch.tensor(sample_rows, device=dev)]
        return items, self.model.compute_logits(hidden)

    def _sample(self, items: list[ScheduledRequest], logits: torch.Tensor) -> ModelRunnerOutput:
        """logits: the rows of the items that sample, in order (1 + k for an item with drafts)."""
        sampled = [it for it in items if it.needs_sample]
        if any(it.spec_token_ids for it in sampled):
            return self._verify(sampled, logits)
        return self._output(sampled, sample(logits, [self._sampling_row(it) for it in sampled],
                                            self.default_generator))

    def _verify(self, sampled: list[ScheduledRequest], logits: torch.Tensor) -> ModelRunnerOutput:
        """A step with drafts: plain rows sample as usual, each item with drafts keeps the ones the
        target accepts (inference/spec_decode/rejection.py) and adds one token of its own."""
        out = ModelRunnerOutput()
        starts, row = [], 0
        for it in sampled:
            starts.append(row)
            row += 1 + len(it.spec_token_ids)
        greedy_ids = (logits.argmax(dim=-1).tolist()
                      if any(it.spec_token_ids and it.request.sampling_params.is_greedy for it in sampled) else None)
        plain = [i for i, it in enumerate(sampled) if not it.spec_token_ids]
        if plain:
            index = torch.tensor([starts[i] for i in plain], device=logits.device)
            result = sample(logits[index], [self._sampling_row(sampled[i]) for i in plain], self.default_generator)
            self._output([sampled[i] for i in plain], result, out)
        for i, it in enumerate(sampled):
            draft = it.spec_token_ids
            if not draft:
                continue
            rid, lo = it.request.request_id, starts[i]
            q = self.draft_probs.pop(rid, None)
            if it.request.grammar is not None:
                emitted = verify_constrained(logits[lo:lo + len(draft) + 1], draft, self._sampling_row(it),
                                             None if q is None else q[:len(draft)], self.default_generator)
            elif it.request.sampling_params.is_greedy:
                emitted = verify_greedy(greedy_ids[lo:lo + len(draft) + 1], draft)
            else:
                emitted = verify_sampled(logits[lo:lo + len(draft) + 1], draft, self._sampling_row(it),
                                         None if q is None else q[:len(draft)], self.default_generator)
            out.sampled_token_ids[rid] = emitted[-1]
            out.accepted_draft_ids[rid] = emitted[:-1]
        return out

    def _output(self, sampled: list[ScheduledRequest], result: SamplerOutput,
                out: ModelRunnerOutput | None = None) -> ModelRunnerOutput:
        out = ModelRunnerOutput() if out is None else out
        for it, token, lp in zip(sampled, result.token_ids, result.logprobs):
            out.sampled_token_ids[it.request.request_id] = token
            if lp is not None:
                out.logprobs[it.request.request_id] = lp
        return out

    def _sampling_row(self, it: ScheduledRequest) -> SamplingRow:
        """The request's SamplingRow, built once and reused while it runs (its token lists are the
        request's own, which grow in place); only the min_tokens block list changes per step."""
        req, params = it.request, it.request.sampling_params
        cached = self.rows.get(req.request_id)
        if cached is None or cached[0] is not req:
            gen = None
            if params.seed is not None and not params.is_greedy:
                gen = self.generators.get(req.request_id)
                if gen is None:
                    gen = self.generators[req.request_id] = torch.Generator(device=self.device).manual_seed(
                        params.seed)
            cached = self.rows[req.request_id] = (req, SamplingRow(
                params, req.prompt_token_ids, req.output_token_ids, gen, [],
                None if req.grammar is None else req.grammar.new_state()))
        row = cached[1]
        if params.min_tokens:
            blocked = []
            # the token sampled now is output number num_output_tokens + placeholders - 1 (the
            # placeholders count this step's token and, under async scheduling, the last step's)
            if req.num_output_tokens + req.num_placeholders - 1 < params.min_tokens:
                blocked = list(params.stop_token_ids or [])
                if req.eos_token_id is not None and not params.ignore_eos:
                    blocked.append(req.eos_token_id)
            row.blocked_token_ids = blocked
        return row

    def _attention_metadata(self, items: list[ScheduledRequest], slot_mapping: torch.Tensor) -> AttentionMetadata:
        dev, bs = self.device, self.block_size
        meta = AttentionMetadata(slot_mapping=slot_mapping)
        decodes = [it for it in items if it.num_scheduled_tokens == 1]
        if decodes:
            ctx = [it.num_computed_tokens + 1 for it in decodes]
            max_ctx = max(ctx)
            max_blocks = -(-max_ctx // bs)
            if self.invariant_decode:          # keys padded to a multiple of 16, always masked
                max_blocks = -(-padded_keys(max_ctx) // bs)
            meta.num_decodes = len(decodes)
            meta.decode_context_len = max_ctx
            meta.decode_block_tables = torch.tensor(
                [(it.block_ids[:max_blocks] + [0] * max_blocks)[:max_blocks] for it in decodes],
                dtype=torch.long, device=dev)                                            # [B, max_blocks]
            if dev.type == "cpu":
                meta.decode_context_lens = torch.tensor(ctx, dtype=torch.long)
            if self.decode_mask_needed and (min(ctx) != max_ctx or self.invariant_decode):
                pos = torch.arange(max_blocks * bs, device=dev)
                ctx_t = meta.decode_context_lens if dev.type == "cpu" else torch.tensor(ctx, device=dev)
                meta.decode_mask = (pos[None, :] < ctx_t[:, None])[:, None, None, :]      # [B, 1, 1, L_pad]
        start = len(decodes)
        for it in items[len(decodes):]:
            n, ctx = it.num_scheduled_tokens, it.num_computed_tokens + it.num_scheduled_tokens
            table = torch.tensor(it.block_ids[:-(-ctx // bs)], dtype=torch.long, device=dev)
            mask = None if it.num_computed_tokens == 0 else bottom_right_causal_mask(n, ctx, dev)
            meta.prefills.append(PrefillChunk(start, n, ctx, table, mask))
            start += n
        return meta
