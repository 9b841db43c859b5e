"""The scheduler's view of one sequence: token ids, how many are computed, its status.

A request's token list is prompt + generated tokens. The scheduler's only job per step is to let
`num_computed_tokens` catch up with `num_tokens` (vLLM v1's rule): prefill, chunked prefill,
prefix-cache hits and recompute after preemption are all the same thing.
"""
from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


def hash_block(parent_hash: bytes | None, token_ids: list[int]) -> bytes:
    """Chained block hash: a block's identity includes every token before it."""
    h = hashlib.blake2b(parent_hash or b"root", digest_size=16)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    max_tokens: int                       # resolved: never past max_model_len
    # the vocabulary's other end-of-generation tokens (<|endoftext|> after a FIM middle, ...)
    end_token_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1           # prefix-cache hit on first scheduling (-1: not yet)
    num_preemptions: int = 0
    # tokens sampled by launched steps that have not come back yet (async scheduling schedules
    # the next step before the last one's token is known; at most 2, one per step in flight)
    num_placeholders: int = 0
    block_hashes: list[bytes] = field(default_factory=list)   # one per full block of all_token_ids
    # speculative decoding: tokens proposed for after the last one, checked by the next step
    # (the scheduler takes them, trimmed to what fits, and clears them)
    spec_token_ids: list[int] = field(default_factory=list)
    stop_reason: str | int | None = None
    first_scheduled_time: float | None = None
    # structured outputs: the compiled grammar (inference/structured), opaque to the scheduler; the
    # model runner keeps each sequence's position in it
    grammar: Any = None
    # shifted KV reuse (inference/core/kv_reuse.py): only blocks before this many tokens hold exact
    # KV and may join the prefix cache (None: all); and a run whose KV the admitting step copies:
    # once computed reaches its start, computing resumes at its end (start, end)
    num_exact_tokens: int | None = None
    reuse_jump: tuple[int, int] | None = None
    reuse_base: int = 0               # computed before the admitting step copied anything

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def update_block_hashes(self, block_size: int) -> None:
        """Extend `block_hashes` to cover every full block of tokens (cheap: only new blocks)."""
        num_full = self.num_tokens // block_size
        while len(self.block_hashes) < num_full:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if i else None
            self.block_hashes.append(hash_block(parent, self.all_token_ids[i * block_size:(i + 1) * block_size]))

    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None
