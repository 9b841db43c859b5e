"""OnlineEngine: the engine loop in a background thread, for servers and the terminal chat.

`add_request(...)` is thread-safe: it validates in the caller's thread (bad input raises
ValueError there and never reaches the loop), then hands the request to the loop, which owns the
engine exclusively. Each request gets a `RequestStream` to iterate for `StreamDelta`s.
`abort(request_id)` takes effect before the next step, and its blocks are freed then.
"""
from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import torch

from inference.config import EngineConfig
from inference.core.engine import LLMEngine, PromptType, check_messages
from inference.core.stats import EngineStats
from inference.outputs import StreamDelta
from inference.sampling_params import SamplingParams

log = logging.getLogger(__name__)


def device_error_is_fatal(exc: BaseException) -> bool:
    """A CUDA error other than out-of-memory (an illegal address, a failed launch, ECC) leaves
    the context unusable: every later step would fail too, so the loop stops and the service
    reports not ready instead of failing each request. Out-of-memory is recoverable."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    accel = getattr(torch, "AcceleratorError", ())
    return isinstance(exc, accel) or (isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


class RequestStream:
    """Iterator of StreamDelta for one request; ends after every sample has finished."""

    def __init__(self, request_id: str, n: int, engine: OnlineEngine):
        self.request_id = request_id
        self._queue: queue.Queue[StreamDelta] = queue.Queue()
        self._remaining = n                  # consumer side: finals not yet read
        self._open = set(range(n))           # producer side: samples without a final delta
        self._engine = engine

    def put(self, delta: StreamDelta) -> None:
        if delta.finished:
            self._open.discard(delta.index)
        self._queue.put(delta)

    def __iter__(self) -> Iterator[StreamDelta]:
        while self._remaining > 0:
            delta = self._queue.get()
            if delta.finished:
                self._remaining -= 1
            yield delta

    def get(self, timeout: float | None = None) -> StreamDelta:
        delta = self._queue.get(timeout=timeout)
        if delta.finished:
            self._remaining -= 1
        return delta

    @property
    def finished(self) -> bool:
        return self._remaining <= 0

    @property
    def open_indices(self) -> list[int]:
        """Samples that have not been sent their final delta yet."""
        return sorted(self._open)

    def abort(self) -> None:
        self._engine.abort(self.request_id)


class OnlineEngine:
    def __init__(self, model: str = "smollm2", config: EngineConfig | None = None, **engine_args: Any):
        self.config = config or EngineConfig.load(model=model, **engine_args)
        self.engine = LLMEngine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}     # req_id -> its stream (loop thread only)
        self._validate_lock = threading.Lock()            # tokenizer + id bookkeeping
        self._pending_ids: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._stats_listeners: list = []                 # called with EngineStats after each step
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    # ---- public, any thread ----------------------------------------------------------------
    def add_request(self, prompt: PromptType, params: SamplingParams, request_id: str | None = None,
                    priority: int = 0) -> RequestStream:
        if not self.is_alive():
            raise RuntimeError(f"engine loop is not running: {self.error!r}")
        request_id = uuid.uuid4().hex if request_id is None else str(request_id)
        with self._validate_lock:
            if request_id in self._pending_ids:
                raise ValueError(f"request_id: {request_id!r} is already in use")
            req = self.engine.validate(prompt, params, request_id, priority)
            self._pending_ids.add(request_id)
        stream = RequestStream(request_id, params.n, self)
        self._inbox.put(("add", (req, stream)))
        self._wake.set()
        return stream

    def chat(self, messages: list[dict[str, str]], params: SamplingParams,
             request_id: str | None = None) -> RequestStream:
        check_messages(messages)
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.add_request({"prompt_token_ids": ids}, params, request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> EngineStats | None:
        return self.engine.last_stats

    def expert_load(self) -> dict[int, list[int]]:
        return self.engine.expert_load()

    def add_stats_listener(self, listener) -> None:
        """`listener(stats: EngineStats)` runs in the engine thread after every step; keep it cheap."""
        self._stats_listeners.append(listener)

    @property
    def num_unfinished(self) -> int:
        """Requests accepted and not yet finished (waiting, running or still in the inbox)."""
        return len(self._pending_ids)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        if not self._thread.is_alive():          # nobody may wait forever on a stopped engine
            self._fail_all(RuntimeError("engine shut down"))
            self.engine.shutdown()               # tensor-parallel workers, if any

    # ---- the loop (engine thread) ----------------------------------------------------------
    def _loop(self) -> None:
        engine = self.engine
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not engine.has_unfinished():
                    if engine.has_pending_stats():       # e.g. an abort retired while idle
                        self._notify(engine.idle_stats())
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                try:
                    for state in engine.step():
                        self._publish(state)
                    self._notify(engine.last_stats)
                except Exception as exc:
                    if device_error_is_fatal(exc):
                        raise                             # below: error set, readiness false
                    # A failing step (e.g. out of memory) fails the requests in flight, not the
                    # loop: their blocks are freed and later requests are served.
                    log.exception("engine step failed; aborting %d requests", len(engine.states))
                    self._fail_all(exc)
        except BaseException as exc:                      # never leave callers hanging
            log.exception("engine loop died")
            self.error = exc
            self._fail_all(exc)
            raise

    def _notify(self, stats: EngineStats | None) -> None:
        for listener in self._stats_listeners:
            try:
                listener(stats)
            except Exception:                            # metrics must never stop the engine
                log.exception("stats listener failed")

    def _take_inbox(self):
        """(kind, payload) messages from callers, until the inbox is empty."""
        while True:
            try:
                yield self._inbox.get_nowait()
            except queue.Empty:
                return

    def _fail_stream(self, req_id: str, stream: RequestStream, exc: BaseException) -> None:
        for index in stream.open_indices:
            stream.put(StreamDelta(req_id, index, "", [], finish_reason="abort", error=repr(exc)))

    def _fail_all(self, exc: BaseException) -> None:
        for kind, payload in self._take_inbox():     # requests not yet handed to the engine
            if kind == "add":
                req, stream = payload
                self._streams.setdefault(req.request_id, stream)
        for req_id in list(self.engine.states):
            self.engine.abort_request(req_id)
            self.engine.retire_aborted(req_id)
        for req_id, stream in list(self._streams.items()):
            self._fail_stream(req_id, stream, exc)
        self._streams.clear()
        with self._validate_lock:
            self._pending_ids.clear()

    def _drain_inbox(self) -> None:
        for kind, payload in self._take_inbox():
            if kind == "add":
                req, stream = payload
                self._streams[req.request_id] = stream
                try:
                    self.engine.add_request(req)
                except Exception as exc:             # validated already; never kill the loop
                    log.exception("could not queue request %s", req.request_id)
                    self.engine.abort_request(req.request_id)
                    self.engine.retire_aborted(req.request_id)
                    self._streams.pop(req.request_id, None)
                    self._fail_stream(req.request_id, stream, exc)
                    with self._validate_lock:
                        self._pending_ids.discard(req.request_id)
            elif kind == "abort":
                state = self.engine.states.get(payload)
                if state is None:
                    continue
                self.engine.abort_request(payload)
                self._publish(state)

    def _publish(self, state) -> None:
        stream = self._streams.get(state.request_id)
        for delta in state.take_deltas():
            if stream is not None:
                stream.put(delta)
        if state.finished:
            self._streams.pop(state.request_id, None)
            self.engine.retire_aborted(state.request_id)
            with self._validate_lock:
                self._pending_ids.discard(state.request_id)
