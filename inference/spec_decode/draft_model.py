"""Draft-model proposer: a second, cheaper model with the target's tokenizer proposes k tokens
autoregressively; `self_int4` uses the target's own weights quantized to int4 (round-to-nearest,
inference/quantization) as the draft.

The draft has its own paged KV cache and block manager. Per request it remembers how far its KV
matches the request's tokens: after a verification, the drafts it fed that the target kept stay
valid, the rest are recomputed on the next proposal together with the tokens it has not seen.

    step 1 (batched): feed tokens[draft_computed:T]  -> d1        (catch-up + first draft)
    step j (batched): feed d(j-1) at position T+j-2  -> dj        (for requests that want j)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from inference.config import CacheConfig, ModelConfig
from inference.core.block_manager import BlockManager
from inference.core.request import Request
from inference.interfaces import ScheduledRequest
from inference.loader.model_loader import load_model
from inference.spec_decode.config import SpeculativeConfig
from inference.worker.sampler import SamplingRow, draw, processed_probs

PROBE_TEXT = "def add(a, b):\n    return a + b  # Hello, world! Ünïcödé 123"


@dataclass(eq=False)
class _DraftSeq:
    """A request as the draft's block manager sees it."""
    request_id: str
    num_computed_tokens: int = 0      # positions whose draft KV matches the request's tokens
    base: int = 0                     # the request's length when the drafts in `fed` were fed
    fed: list[int] = field(default_factory=list)    # drafts whose KV sits at base, base + 1, ...


@dataclass(eq=False)
class _View:
    """What the runner reads of a sequence: its id and tokens (the request's, then drafts)."""
    request_id: str
    all_token_ids: list[int]


def draft_model_config(config: SpeculativeConfig, target: ModelConfig) -> ModelConfig:
    if config.method == "self_int4":
        if target.quantization not in (None, "int8", "int4"):
            raise ValueError(f"speculative_config.method 'self_int4': the target is loaded with "
                             f"quantization={target.quantization!r}; self-drafting quantizes full-precision weights")
        return dataclasses.replace(target, quantization="int4", router_weights_threshold=0.0)
    return ModelConfig(model=config.model, dtype=target.dtype, max_model_len=target.max_model_len,
                       seed=target.seed, device=target.device, enforce_eager=True)


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, engine):
        from inference.worker.kv_sizing import default_cpu_kv_bytes, num_kv_blocks
        from inference.worker.model_runner import ModelRunner
        if engine.runner.device.type != "cpu":
            raise ValueError(f"speculative_config.method {config.method!r}: draft models run on the CPU path "
                             "only so far; use method 'ngram' on CUDA")
        loaded = load_model(draft_model_config(config, engine.config.model))
        if loaded.arch.vocab_size != engine.arch.vocab_size or \
                loaded.tokenizer.encode(PROBE_TEXT) != engine.tokenizer.encode(PROBE_TEXT):
            raise ValueError(f"speculative_config.model: {config.model!r} does not share the target's tokenizer "
                             f"(vocabulary {loaded.arch.vocab_size} vs {engine.arch.vocab_size}, or different "
                             "token ids for the same text)")
        if loaded.max_model_len < engine.max_model_len:
            raise ValueError(f"speculative_config.model: the draft's context ({loaded.max_model_len}) is shorter "
                             f"than the target's max_model_len {engine.max_model_len}")
        cache = CacheConfig(block_size=engine.config.cache.block_size, enable_prefix_caching=False)
        kv_bytes = (config.draft_kv_cache_memory_bytes or engine.config.cache.kv_cache_memory_bytes
                    or default_cpu_kv_bytes(loaded, cache))
        num_blocks = num_kv_blocks(loaded, cache, kv_bytes, "speculative_config.draft_kv_cache_memory_bytes")
        self.runner = ModelRunner(loaded, cache, num_blocks, engine.config.model.seed + 1)
        self.block_manager = BlockManager(num_blocks, cache.block_size, enable_prefix_caching=False)
        self.target_runner = engine.runner            # receives the draft distributions
        self.seqs: dict[str, _DraftSeq] = {}          # req_id -> the draft's view of it
        self.generators: dict[str, torch.Generator] = {}     # req_id -> seeded draft generator

    def propose(self, wanted: list[tuple[Request, int]]) -> list[list[int]]:
        drafts: dict[str, list[int]] = {}
        probs: dict[str, list[torch.Tensor]] = {}
        first = []
        for request, k in wanted:
            seq = self._sync(request)
            n = request.num_tokens - seq.num_computed_tokens
            if not self.block_manager.allocate_slots(seq, n + k - 1):
                continue                  # the draft's cache is full: this request decodes plainly
            first.append((request, k, seq, n))
            drafts[request.request_id], probs[request.request_id] = [], []
        active = first
        for j in range(max((k for _, k, _, _ in first), default=0)):
            active = [a for a in active if a[1] > j]
            items = []
            for request, _, seq, n in active:
                own = drafts[request.request_id]
                tokens = request.all_token_ids + own if own else request.all_token_ids
                c = seq.num_computed_tokens
                items.append(ScheduledRequest(_View(request.request_id, tokens), c, n if j == 0 else 1,
                                              self.block_manager.block_table(request.request_id), True))
            ordered, logits = self.runner.forward(items)          # one row per item, decodes first
            row_of = {id(it): r for r, it in enumerate(ordered)}
            logits = logits[torch.tensor([row_of[id(it)] for it in items], device=logits.device)]
            tokens, q = self._draw([a[0] for a in active], logits)
            for row, (request, _, seq, _) in enumerate(active):
                rid = request.request_id
                if j == 0:
                    seq.num_computed_tokens, seq.base, seq.fed = request.num_tokens, request.num_tokens, []
                else:
                    seq.fed.append(drafts[rid][-1])
                    seq.num_computed_tokens += 1
                drafts[rid].append(tokens[row])
                if q is not None and not request.sampling_params.is_greedy:
                    probs[rid].append(q[row])
        for rid, rows in probs.items():
            if rows:
                self.target_runner.draft_probs[rid] = torch.stack(rows)           # [k, vocab]
        return [drafts.get(request.request_id, []) for request, _ in wanted]

    def _sync(self, request: Request) -> _DraftSeq:
        """The draft's state for `request`, rolled back to the KV that still matches its tokens
        (always leaving its last token to feed)."""
        rid = request.request_id
        seq = self.seqs.get(rid)
        if seq is None:
            seq = self.seqs[rid] = _DraftSeq(rid)
        tokens, match = request.all_token_ids, 0
        while match < len(seq.fed) and seq.base + match < len(tokens) and tokens[seq.base + match] == seq.fed[match]:
            match += 1
        seq.num_computed_tokens = min(seq.num_computed_tokens, seq.base + match, request.num_tokens - 1)
        seq.fed = seq.fed[:match]
        return seq

    def _draw(self, requests: list[Request], logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """One draft token per row: argmax for greedy requests, else drawn from the draft's own
        processed distribution q (returned, for the target's rejection sampling)."""
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(requests) if not r.sampling_params.is_greedy]
        q = None
        if random_rows:
            rows = [SamplingRow(requests[i].sampling_params, [], [], self._generator(requests[i]), [])
                    for i in random_rows]
            q = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
            index = torch.tensor(random_rows, device=logits.device)
            q[index] = processed_probs(logits[index].float(), rows)
            tokens[index] = draw(q[index], [r.generator for r in rows], self.runner.default_generator)
        return tokens.tolist(), q

    def _generator(self, request: Request) -> torch.Generator | None:
        seed = request.sampling_params.seed
        if seed is None:
            return None
        gen = self.generators.get(request.request_id)
        if gen is None:
            gen = self.generators[request.request_id] = torch.Generator(
                device=self.runner.device).manual_seed(seed ^ 0x5EED)
        return gen

    def remove(self, req_ids) -> None:
        for rid in req_ids:
            seq = self.seqs.pop(rid, None)
            if seq is not None:
                self.block_manager.free(seq)
            self.generators.pop(rid, None)
        self.runner.remove_requests(req_ids)
