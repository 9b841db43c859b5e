"""Engine statistics as plain dataclasses; the metrics exporter (a separate module) turns them
into Prometheus metrics. Names mirror vLLM's metric set."""
from __future__ import annotations

from dataclasses import dataclass, field

from inference.core.scheduler import SchedulerStats
from inference.spec_decode.speculator import SpecDecodeStats


@dataclass
class FinishedRequestStats:
    request_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    e2e_latency: float
    queue_time: float
    time_to_first_token: float | None


@dataclass
class IterationStats:
    """What one engine step did."""
    num_scheduled_tokens: int = 0
    num_prompt_tokens: int = 0            # prefill tokens computed this step
    num_generation_tokens: int = 0        # tokens sampled this step
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)
    step_time: float = 0.0


@dataclass
class EngineStats:
    scheduler: SchedulerStats
    iteration: IterationStats
    spec_decode: SpecDecodeStats | None = None      # cumulative; None without speculative decoding
