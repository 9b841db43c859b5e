"""The contracts between the engine core and the runners.

The scheduler hands a runner a `SchedulerOutput` (which requests compute which tokens this step,
and which KV-tier copies come first); the runner answers with a `ModelRunnerOutput` (a sampled
token per request that needed one). `Runner` is the interface the engine drives: the CPU runner,
the CUDA runner and the tensor-parallel executor each implement it. Nothing here imports torch at
runtime, so the scheduler stays tensor-free.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from inference.core.kv_reuse import KVShift
from inference.core.kv_tiers import KVTransfer
from inference.core.request import Request

if TYPE_CHECKING:
    import torch

    from inference.worker.kv_tier_store import KVTierStore
    from inference.worker.sampler import PendingSample


@dataclass(slots=True)
class ScheduledRequest:
    """What the runner needs to compute one request's tokens this step."""
    request: Request
    num_computed_tokens: int       # tokens already in the KV cache before this step
    num_scheduled_tokens: int      # tokens computed this step
    block_ids: list[int]           # the request's whole block table
    needs_sample: bool             # this step reaches the end of its tokens -> sample one
    # speculative decoding: drafts scheduled after the request's last token (part of
    # num_scheduled_tokens); the runner samples a token at each of their 1 + k rows and verifies
    spec_token_ids: list[int] = field(default_factory=list)

    def token_ids(self) -> list[int]:
        """The input tokens of this step: the request's, then its drafts."""
        start, n = self.num_computed_tokens, self.num_scheduled_tokens
        ids = self.request.all_token_ids[start:start + n]
        if len(ids) < n and self.spec_token_ids:
            ids = ids + self.spec_token_ids[:n - len(ids)]
        return ids


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_req_ids: list[str] = field(default_factory=list)
    total_num_scheduled_tokens: int = 0
    # copies between KV tiers the runner makes before this step's forward (inference/core/kv_tiers.py)
    kv_transfers: list[KVTransfer] = field(default_factory=list)
    # KV copied from a recent request, keys rotated, before anything else (inference/core/kv_reuse.py)
    kv_shifts: list[KVShift] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """The runner's answer for one step: a sampled token per request that needed one."""
    sampled_token_ids: dict[str, int] = field(default_factory=dict)              # req_id -> token
    # req_id -> drafts accepted before its sampled token (speculative decoding; absent: none)
    accepted_draft_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, dict[int, tuple[float, int]]] = field(default_factory=dict)
    # req_id -> {token_id: (logprob, rank)} (sampled token + top-k), only when asked


@dataclass
class StepHandle:
    """A launched step. Synchronous runners return it with `output` set; the CUDA runner returns
    it while the device still works, and `collect` waits for the sampled tokens."""
    output: ModelRunnerOutput | None = None
    sampled: list[ScheduledRequest] = field(default_factory=list)   # items that sample, in order
    pending: PendingSample | None = None
    host_tokens: torch.Tensor | None = None     # pinned: the sampled ids land here
    done: torch.cuda.Event | None = None        # fires when host_tokens holds them


class Runner(Protocol):
    """What the engine needs from whatever runs the model: one step launched, then collected."""
    num_blocks: int                         # KV blocks the block manager may hand out
    overlaps: bool                          # launch() returns before the device finishes
    kv_tier_store: KVTierStore | None       # host / disk KV slots below the cache, if any
    model: Any                              # the (rank 0) model module
    device: Any

    def launch(self, sched: SchedulerOutput, prev: StepHandle | None = None) -> StepHandle:
        """Start one step. `prev` is the step still in flight (async scheduling)."""
        ...

    def collect(self, handle: StepHandle) -> ModelRunnerOutput:
        """Wait for a launched step's sampled tokens."""
        ...

    def remove_requests(self, req_ids: Iterable[str]) -> None:
        """Forget finished or aborted requests' per-request state."""
        ...
