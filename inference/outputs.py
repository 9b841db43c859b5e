"""What the engine hands back: vLLM-shaped RequestOutput / CompletionOutput."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    logprob: float
    rank: int                      # 1 = most likely token
    decoded_token: str | None = None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None          # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None      # the stop string or stop token that ended it
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0      # prompt tokens served from the prefix cache (vLLM's field)


@dataclass
class StreamDelta:
    """One incremental update of one request's output, as the online engine streams it."""
    request_id: str
    index: int                      # which of the n samples
    text: str                       # new text since the previous delta
    token_ids: list[int]            # new token ids since the previous delta
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0      # total so far for this sample
    num_cached_tokens: int = 0      # prompt tokens served from the prefix cache
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
