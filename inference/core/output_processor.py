"""Per-request output state: detokenisation, stop strings, logprobs, timing, n > 1 fan-in.

A request with n samples runs as n child sequences (`<id>#<i>`) that share the prompt (and its
prefix-cache blocks); this module folds them back into one RequestOutput.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from inference.core.detokenizer import IncrementalDetokenizer
from inference.core.tokenizer import Tokenizer
from inference.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, StreamDelta
from inference.sampling_params import SamplingParams


def child_id(request_id: str, index: int, n: int) -> str:
    return request_id if n == 1 else f"{request_id}#{index}"


@dataclass
class SampleState:
    index: int
    detok: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    sent_tokens: int = 0               # token ids already streamed
    sent_logprobs: int = 0
    finish_reported: bool = False
    last_token_time: float | None = None


class RequestState:
    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, tokenizer: Tokenizer, arrival_time: float):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        self.samples = [SampleState(i, IncrementalDetokenizer(tokenizer, params, prompt_token_ids),
                                    logprobs=[] if params.logprobs is not None else None)
                        for i in range(params.n)]
        self.tokenizer = tokenizer
        self.num_cached_tokens = 0          # prompt tokens the prefix cache served (set when scheduled)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples)

    def add_token(self, index: int, token: int, logprobs: dict[int, tuple[float, int]] | None,
                  now: float) -> tuple[str | None, float | None]:
        """Record one sampled token. Returns (matched stop string, inter-token latency)."""
        s = self.samples[index]
        itl = None if s.last_token_time is None else now - s.last_token_time
        s.last_token_time = now
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.last_token_time = now
        if s.finish_reason is not None:
            return None, itl
        s.token_ids.append(token)
        if logprobs is not None and s.logprobs is not None:
            s.logprobs.append({t: Logprob(lp, rank, self.tokenizer.decode([t], False))
                               for t, (lp, rank) in logprobs.items()})
            s.cumulative_logprob += logprobs[token][0]
        return s.detok.add_tokens([token]), itl

    def finish(self, index: int, reason: str, stop_reason: str | int | None, now: float) -> None:
        s = self.samples[index]
        if s.finish_reason is None:
            s.finish_reason, s.stop_reason = reason, stop_reason
        if self.finished:
            self.metrics.finished_time = now

    def take_deltas(self) -> list[StreamDelta]:
        """What each sample produced since the last call (finished samples report once more)."""
        deltas = []
        for s in self.samples:
            done = s.finish_reason is not None
            text = s.detok.take_delta(finished=done)
            new_ids = s.token_ids[s.sent_tokens:]
            if s.finish_reported or (not text and not new_ids and not done):
                continue
            lps = None
            if s.logprobs is not None:
                lps, s.sent_logprobs = s.logprobs[s.sent_logprobs:], len(s.logprobs)
            deltas.append(StreamDelta(self.request_id, s.index, text, new_ids, s.finish_reason, s.stop_reason,
                                      lps, len(self.prompt_token_ids), len(s.token_ids),
                                      num_cached_tokens=self.num_cached_tokens))
            s.sent_tokens, s.finish_reported = len(s.token_ids), done
        return deltas

    def to_output(self) -> RequestOutput:
        outs = []
        for s in self.samples:
            done = s.finish_reason is not None
            text = s.detok.text if done else s.detok.output_text
            outs.append(CompletionOutput(s.index, text, list(s.token_ids), s.finish_reason, s.stop_reason,
                                         s.logprobs, s.cumulative_logprob if s.logprobs is not None else None))
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outs, self.finished, self.metrics,
                             self.num_cached_tokens)


def now() -> float:
    return time.time()
