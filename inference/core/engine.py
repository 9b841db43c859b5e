"""LLMEngine: validate inputs, then loop schedule -> run model -> apply outputs.

Single-threaded; `LLM` drives it for offline batches and `OnlineEngine` runs it in a background
thread for servers.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

from inference.config import EngineConfig
from inference.core.block_manager import BlockManager
from inference.core.output_processor import RequestState, child_id, now
from inference.core.request import Request, RequestStatus
from inference.core.scheduler import Scheduler
from inference.core.stats import EngineStats, FinishedRequestStats, IterationStats
from inference.interfaces import SchedulerOutput, StepHandle
from inference.loader.model_loader import load_model
from inference.outputs import StreamDelta
from inference.sampling_params import SamplingParams
from inference.worker.kv_tier_store import tier_index_for
from inference.worker.runner_factory import build_runner

PromptType = str | dict[str, Any]


@dataclass
class ValidatedRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    grammar: Any = None                   # params.structured_outputs compiled (inference/structured)


def load_engine_model(config: EngineConfig):
    """The model and the runner-shaped object that runs it: one runner in this process, or with
    tensor_parallel_size > 1 the executor of N ranks (inference/parallel/executor.py)."""
    if config.parallel.tensor_parallel_size > 1:
        from inference.parallel.executor import build_tp_executor
        return build_tp_executor(config)
    loaded = load_model(config.model)
    return loaded, build_runner(loaded, config)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        loaded, runner = load_engine_model(config)
        self.model_name = config.model.model
        self.arch = loaded.arch
        self.tokenizer = loaded.tokenizer
        self.max_model_len = loaded.max_model_len
        self.runner = runner
        self.block_manager = BlockManager(self.runner.num_blocks, config.cache.block_size,
                                          config.cache.enable_prefix_caching, tier_index_for(self.runner))
        self.block_manager.enable_kv_reuse = (config.cache.enable_prefix_caching
                                              and getattr(self.runner, "supports_kv_shift", False))
        self.scheduler = Scheduler(config.scheduler, self.block_manager, self.max_model_len)
        eos = self.tokenizer.eos_token_id
        self.eos_token_id = eos if eos is not None else (self.arch.eos_token_ids or [None])[0]
        self.end_token_ids = frozenset(getattr(self.tokenizer, "end_token_ids", ())) - {self.eos_token_id}
        self.states: dict[str, RequestState] = {}                 # parent req_id -> output state
        self.children: dict[str, tuple[str, int]] = {}            # child req_id -> (parent, index)
        self._ids = itertools.count()
        self._finished: list[FinishedRequestStats] = []        # retired since the last step's stats
        # the launched step whose tokens are not collected yet: (its schedule, the runner's handle)
        self._inflight: tuple[SchedulerOutput, StepHandle] | None = None
        self.speculator = None
        if config.speculative is not None:
            from inference.spec_decode.speculator import build_speculator
            self.speculator = build_speculator(config.speculative, self)
        # drafts for step N+1 need step N's tokens: speculative decoding runs steps in turn
        self.async_scheduling = self.runner.overlaps and self.speculator is None
        self.last_stats: EngineStats | None = None
        self._grammar_backend = None
        self._grammar_lock = threading.Lock()

    # ---- inputs --------------------------------------------------------------------------
    def validate(self, prompt: PromptType, params: SamplingParams, request_id: str | None = None,
                 priority: int = 0) -> ValidatedRequest:
        """Tokenise and check a request; raises ValueError naming the bad parameter."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params: expected SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: must not be empty")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, token_ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            vocab = self.arch.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in token_ids):
                raise ValueError(f"prompt_token_ids: every id must be an integer in [0, {vocab})")
        else:
            raise ValueError("prompt: must be a string or a {'prompt_token_ids': [...]} dict")
        if not token_ids:
            raise ValueError("prompt: must not be empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"prompt: {len(token_ids)} tokens leave no room to generate within the "
                             f"model's context (max_model_len={self.max_model_len})")
        if params.stop_token_ids and any(t >= self.arch.vocab_size for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids: every id must be < the vocabulary size {self.arch.vocab_size}")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority: must be an integer, got {priority!r}")
        if self.scheduler.config.policy != "priority" and priority != 0:
            raise ValueError("priority: only supported with scheduling_policy='priority'")
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if "#" in request_id or not request_id:
            raise ValueError(f"request_id: must be non-empty and must not contain '#' (reserved for the "
                             f"n samples of a request), got {request_id!r}")
        if request_id in self.states:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        return ValidatedRequest(request_id, text, token_ids, params, priority, now(), self.compile_grammar(params))

    def compile_grammar(self, params: SamplingParams):
        """The request's structured_outputs compiled (cached per constraint), or None. validate()
        calls it; a server may call it first, outside its admission lock, so that a new schema's
        compile does not hold other requests back."""
        if params.structured_outputs is None:
            return None
        if self.config.parallel.tensor_parallel_size > 1:
            raise ValueError("structured_outputs: not supported with tensor parallelism yet")
        with self._grammar_lock:
            if self._grammar_backend is None:
                self._grammar_backend = self.new_grammar_backend()
        return self._grammar_backend.compile(params.structured_outputs)

    def new_grammar_backend(self):
        """A grammar backend over this engine's tokenizer, ending at its end-of-generation tokens."""
        from inference.structured import grammar_backend
        ends = sorted(self.end_token_ids | ({self.eos_token_id} if self.eos_token_id is not None else set()))
        return grammar_backend(self.tokenizer, self.arch.vocab_size, ends)

    def add_request(self, req: ValidatedRequest) -> None:
        """Queue a validated request (its n samples run as n sequences)."""
        params = req.params
        room = self.max_model_len - len(req.prompt_token_ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self.states[req.request_id] = RequestState(req.request_id, req.prompt, req.prompt_token_ids, params,
                                                   self.tokenizer, req.arrival_time)
        for i in range(params.n):
            cid = child_id(req.request_id, i, params.n)
            self.children[cid] = (req.request_id, i)
            self.scheduler.add_request(Request(
                request_id=cid, prompt_token_ids=req.prompt_token_ids, sampling_params=params.for_child(i),
                eos_token_id=self.eos_token_id, max_tokens=max_tokens, priority=req.priority,
                end_token_ids=self.end_token_ids, grammar=req.grammar))

    def abort_request(self, request_id: str) -> None:
        """Abort every sample of a request; its blocks return to the pool now (a step still in
        flight for it only writes KV that nobody reads, and its token is dropped)."""
        state = self.states.get(request_id)
        if state is None:
            return
        t = now()
        for i in range(state.params.n):
            self.scheduler.finish_request(child_id(request_id, i, state.params.n), RequestStatus.FINISHED_ABORTED)
            state.finish(i, "abort", None, t)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    # ---- the loop ------------------------------------------------------------------------
    def step(self) -> list[RequestState]:
        """One engine step. Returns the states that changed (call `take_deltas` / `to_output`).

        With async scheduling (an overlapping runner: CUDA) the device never waits for the host
        between steps: step N+1 is scheduled and launched while step N still runs, and only then
        are N's tokens collected and processed (detokenised, checked for stops, streamed):

            schedule N+1 | launch N+1 | collect N | outputs of N
                                 '-- device: N, then N+1 --'

        A decode in N+1 takes its input token from N's device output. A request that N finishes
        (EOS, stop string) has one wasted token computed in N+1, which is dropped. Requests with
        penalties need their previous token on the host, so a step with one waits for N first.
        """
        t0 = time.perf_counter()
        it = IterationStats()
        changed: dict[str, RequestState] = {}
        inflight, self._inflight = self._inflight, None
        sched = None
        try:
            if inflight is not None and (not self.async_scheduling or self._needs_host_tokens(inflight[0])):
                self._finish_step(*inflight, changed, it)
                inflight = None
            sched = self.scheduler.schedule()
            it.num_scheduled_tokens = sched.total_num_scheduled_tokens
            if not sched.is_empty:
                handle = self.runner.launch(sched, prev=inflight[1] if inflight else None)
                self._inflight = (sched, handle)
            if inflight is not None:
                self._finish_step(*inflight, changed, it)
            if self._inflight is not None and not self.async_scheduling:
                self._finish_step(*self._inflight, changed, it)
                self._inflight = None
            if self.speculator is not None:
                self.speculator.propose(self.scheduler.running)
        except BaseException:
            # Neither step's KV can be trusted: undo their scheduling (the caller aborts them).
            for failed in (sched, inflight and inflight[0]):
                if failed:
                    self.scheduler.rollback(failed)
            self._inflight = None
            raise
        for state in changed.values():
            if state.finished:
                self._retire(state)
        it.finished, self._finished = self._finished, []
        it.step_time = time.perf_counter() - t0
        if self.speculator is not None and sched is not None:
            self.speculator.observe_step(sched, it.step_time)
        self.last_stats = self._stats(it)
        return list(changed.values())

    @staticmethod
    def _needs_host_tokens(sched: SchedulerOutput) -> bool:
        # penalties, and a grammar's next mask, need the last token on the host
        return any(item.needs_sample and (item.request.sampling_params.needs_penalties
                                          or item.request.grammar is not None) for item in sched.scheduled)

    def _finish_step(self, sched: SchedulerOutput, handle, changed: dict[str, RequestState],
                     it: IterationStats) -> None:
        """Wait for a launched step's tokens and hand them to the scheduler and output states."""
        result = self.runner.collect(handle)
        if self.speculator is not None:
            self.speculator.record(sched, result)
        for item in sched.scheduled:           # prompt tokens computed this step
            end = min(item.request.num_prompt_tokens, item.num_computed_tokens + item.num_scheduled_tokens)
            it.num_prompt_tokens += max(0, end - item.num_computed_tokens)
        t = now()
        for request, tokens in self.scheduler.update_from_output(sched, result):
            parent, index = self.children.get(request.request_id, (None, 0))
            for k, token in enumerate(tokens):     # several when drafts were accepted
                if parent is None or self.states[parent].samples[index].finish_reason is not None:
                    break                          # aborted (and maybe retired), or stopped
                state = self._apply_token(request, token, result.logprobs.get(request.request_id), t, it,
                                          last=k == len(tokens) - 1)
                changed[state.request_id] = state

    def _apply_token(self, request: Request, token: int, logprobs, t: float, it: IterationStats,
                     last: bool = True) -> RequestState:
        """Hand a request's new token to its output state; finish it on a stop string (or, for
        the last of this step's tokens, with the scheduler's finish reason)."""
        parent, index = self.children[request.request_id]
        state = self.states[parent]
        first = state.metrics.first_token_time is None
        stop_hit, itl = state.add_token(index, token, logprobs, t)
        it.num_generation_tokens += 1
        if first:
            state.num_cached_tokens = max(0, request.num_cached_tokens)
            it.time_to_first_tokens.append(t - state.metrics.arrival_time)
            # request times are monotonic; metrics are wall-clock: carry the queueing interval over
            state.metrics.first_scheduled_time = state.metrics.arrival_time + (
                request.first_scheduled_time - request.arrival_time)
        elif itl is not None:
            it.inter_token_latencies.append(itl)
        if stop_hit is not None:
            if not request.status.is_finished:
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
            state.finish(index, "stop", stop_hit, t)     # the stop string wins over length
        elif request.status.is_finished and last:
            state.finish(index, request.status.value, request.stop_reason, t)
        return state

    def shutdown(self) -> None:
        """Release what outlives the engine object: tensor-parallel worker processes."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()

    def has_pending_stats(self) -> bool:
        return bool(self._finished)

    def idle_stats(self) -> EngineStats:
        """Stats for a moment without a step: flushes requests retired since the last step."""
        it = IterationStats()
        it.finished, self._finished = self._finished, []
        self.last_stats = self._stats(it)
        return self.last_stats

    def _stats(self, it: IterationStats) -> EngineStats:
        spec = self.speculator.stats if self.speculator is not None else None
        return EngineStats(self.scheduler.stats(), it, spec)

    def expert_load(self) -> dict[int, list[int]]:
        """Mixture-of-experts models: layer -> tokens routed to each expert so far ({} if dense)."""
        from inference.models.moe import expert_load
        return expert_load(self.runner.model)

    def retire_aborted(self, request_id: str) -> RequestState | None:
        """Forget an aborted request's state (after its final output was taken)."""
        state = self.states.get(request_id)
        if state is not None and state.finished:
            self._retire(state)
        return state

    def _retire(self, state: RequestState) -> None:
        """Drop a finished request's bookkeeping; its stats go out with the next step's."""
        parent, n = state.request_id, state.params.n
        self.states.pop(parent, None)
        ids = [child_id(parent, i, n) for i in range(n)]
        for cid in ids:
            self.children.pop(cid, None)
        self.runner.remove_requests(ids)
        if self.speculator is not None:
            self.speculator.remove(ids)
        m = state.metrics
        reason = next((s.finish_reason for s in state.samples if s.finish_reason != "abort"), "abort")
        self._finished.append(FinishedRequestStats(
            parent, reason, len(state.prompt_token_ids), sum(len(s.token_ids) for s in state.samples),
            (m.finished_time or now()) - m.arrival_time,
            (m.first_scheduled_time or m.arrival_time) - m.arrival_time, m.time_to_first_token))

    def take_deltas(self, states: list[RequestState]) -> list[StreamDelta]:
        return [d for s in states for d in s.take_deltas()]


def check_messages(conv: Any) -> None:
    """A chat conversation: a non-empty list of {"role": system|user|assistant, "content": str}."""
    if not isinstance(conv, list) or not conv:
        raise ValueError("messages: must be a non-empty list of {'role', 'content'} dicts")
    for m in conv:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("messages: each message needs role in system/user/assistant and string content")
