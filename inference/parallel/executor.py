"""TPExecutor: what the engine talks to in place of a runner when tensor_parallel_size > 1.

    engine process (rank 0)                      worker processes (ranks 1..N-1, worker.py)
    scheduler -> SchedulerOutput
      | StepMessage (plain data) --- pipe --->   mirror -> SchedulerOutput
      v                                            v
    driver runner: forward  <==== all-reduce / all-gather (gloo | NCCL) ====>  runner: forward
      v
    sample (rank 0 only) -> ModelRunnerOutput

The scheduler and block manager run once, in the engine; block ids mean the same slots on every
rank. Steps run in turn (no async scheduling): a worker needs each step's input tokens on the
host. A watchdog thread waits on the workers' process sentinels: a worker that exits while the
engine runs fails the engine's current and every later step with a RuntimeError naming the rank
and exit code, and the other ranks are stopped (their sockets close, so no collective waits out
its timeout). The workers stop when the engine shuts down, is garbage-collected, or its process
exits (they also die with it: worker.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import threading
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing import connection

import torch

from inference.config import EngineConfig
from inference.interfaces import ModelRunnerOutput, Runner, SchedulerOutput, StepHandle
from inference.loader.model_loader import LoadedModel, LoadPlan, plan_load
from inference.parallel.comm import TPComm, from_store, serve_store
from inference.parallel.step import step_message
from inference.parallel.tp_transform import (
    TPPlan,
    check_tp_supported,
    install_parallel_layers,
)
from inference.worker.model_runner import ModelRunner
from inference.worker.runner_factory import build_runner

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 1800.0        # loading a big checkpoint on every rank takes a while
STOP_GRACE_S = 5.0                # a worker asked to stop gets this long before it is terminated
DEATH_NOTICE_S = 5.0              # after a failed collective: how long to wait for a dead worker to show


def check_tp_config(config: EngineConfig, load: LoadPlan) -> None:
    """Everything that rules out tensor_parallel_size for this engine, before any weight loads."""
    n = config.parallel.tensor_parallel_size
    check_tp_supported(load.arch, n, repr(config.model.model))
    if config.speculative is not None:
        raise ValueError("tensor_parallel_size > 1: speculative decoding is not supported with tensor "
                         "parallelism yet; drop speculative_config or use tensor_parallel_size=1")
    if config.cache.swap_space:
        raise ValueError("tensor_parallel_size > 1: the host KV tier (swap_space) is not supported with "
                         "tensor parallelism yet; set swap_space=0 or use tensor_parallel_size=1")
    if load.checkpoint_quant is not None:
        raise ValueError(f"tensor_parallel_size > 1: {config.model.model!r} is a pre-quantized (AWQ / GPTQ) "
                         "checkpoint, which is not sharded yet; quantization='int8' / 'int4' on load works")
    if config.model.quantization in ("fp8", "sparse24"):
        raise ValueError(f"tensor_parallel_size > 1: quantization={config.model.quantization!r} is not "
                         "supported with tensor parallelism yet (int8 / int4 are)")
    if load.device.type == "cuda":
        visible = torch.cuda.device_count()
        if n > visible:
            raise ValueError(f"tensor_parallel_size: {n} ranks need {n} GPUs, but {visible} are visible")
        if load.device.index not in (None, 0):
            raise ValueError(f"device: tensor parallelism runs rank r on cuda:r; use device='cuda', "
                             f"not {config.model.device!r}")


@dataclass
class WorkerHandle:
    rank: int
    process: object               # multiprocessing Process (spawn)
    conn: connection.Connection   # rank 0's end of the worker's pipe


@dataclass
class _Shared:
    """What the watchdog thread and the finalizer share with the executor (never the executor
    itself, so an unused engine can be garbage-collected and its workers stopped)."""
    workers: list[WorkerHandle]
    comm: TPComm | None = None
    stopping: bool = False
    failure: str | None = None    # why the group is unusable, once it is
    lock: threading.Lock = field(default_factory=threading.Lock)


def _exit_text(w: WorkerHandle) -> str:
    """'tensor-parallel worker R exited with code C' plus the worker's own traceback, if it sent one."""
    text = f"tensor-parallel worker {w.rank} exited with code {w.process.exitcode}"
    try:
        while w.conn.poll(0):
            kind, detail = pickle.loads(w.conn.recv_bytes())
            if kind == "error":
                text += f"; its error:\n{detail}"
    except (EOFError, OSError, pickle.UnpicklingError):
        pass
    return text


def _stop_workers(shared: _Shared) -> None:
    """Ask every worker to stop, then terminate / kill the ones that do not (idempotent)."""
    with shared.lock:
        already, shared.stopping = shared.stopping, True
    if already:
        return
    for w in shared.workers:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send_bytes(pickle.dumps(None))
    deadline = time.monotonic() + STOP_GRACE_S
    for w in shared.workers:
        w.process.join(max(0.0, deadline - time.monotonic()))
    for sig in ("terminate", "kill"):
        alive = [w for w in shared.workers if w.process.is_alive()]
        for w in alive:
            getattr(w.process, sig)()
        for w in alive:
            w.process.join(2.0)
    for w in shared.workers:
        with contextlib.suppress(OSError):
            w.conn.close()


def _watch(shared: _Shared) -> None:
    """Watchdog thread: the first worker to exit on its own fails the group and stops the rest."""
    pending = {w.process.sentinel: w for w in shared.workers}
    while pending and not shared.stopping:
        for sentinel in connection.wait(list(pending), timeout=0.5):
            w = pending.pop(sentinel)
            if shared.stopping:
                return
            w.process.join(1.0)                  # reap it: exitcode is None until then
            with shared.lock:
                if shared.failure is None:
                    shared.failure = _exit_text(w)
            log.error("%s: stopping the other ranks", shared.failure)
            if shared.comm is not None:
                shared.comm.abort()
            for other in shared.workers:
                if other.process.is_alive():
                    other.process.terminate()
            return


class TPExecutor(Runner):
    """Runner-shaped (launch / collect / remove_requests / num_blocks); anything else is rank
    0's runner's."""
    overlaps = False              # steps in turn: workers need every input token on the host
    kv_tier_store = None          # no KV tiers under tensor parallelism yet

    def __init__(self, driver: ModelRunner, shared: _Shared):
        self.driver = driver
        self.world_size = len(shared.workers) + 1
        self._shared = shared
        self._removed: list[str] = []            # req_ids the workers should forget next step
        self._finalizer = weakref.finalize(self, _stop_workers, shared)
        self._watchdog = threading.Thread(target=_watch, args=(shared,), name="tp-watchdog", daemon=True)
        self._watchdog.start()

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "driver":
            raise AttributeError(name)
        return getattr(self.driver, name)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._shared.workers]

    def launch(self, sched: SchedulerOutput, prev: StepHandle | None = None) -> StepHandle:
        """Send the step to every worker, then run rank 0's part of it."""
        self._check()
        data = pickle.dumps(step_message(sched, self._removed), protocol=pickle.HIGHEST_PROTOCOL)
        self._removed = []
        try:
            for w in self._shared.workers:
                w.conn.send_bytes(data)
            return self.driver.launch(sched, prev)
        except BaseException as exc:
            raise self._fail(exc) from exc

    def collect(self, handle: StepHandle) -> ModelRunnerOutput:
        try:
            return self.driver.collect(handle)
        except BaseException as exc:
            raise self._fail(exc) from exc

    def remove_requests(self, req_ids) -> None:
        req_ids = list(req_ids)
        self.driver.remove_requests(req_ids)
        self._removed.extend(req_ids)

    def shutdown(self) -> None:
        """Stop every worker (the engine cannot run steps afterwards)."""
        with self._shared.lock:
            if self._shared.failure is None:
                self._shared.failure = "the tensor-parallel engine was shut down"
        self._finalizer()

    def _check(self) -> None:
        failure = self._shared.failure
        if failure is not None:
            raise RuntimeError(f"tensor-parallel engine unusable: {failure}")

    def _fail(self, exc: BaseException) -> BaseException:
        """A step failed part-way: the ranks are out of step now, so stop them all. Returns the
        error to raise (the dead worker's exit, when one died)."""
        shared = self._shared
        if isinstance(exc, (RuntimeError, OSError)) and shared.failure is None:
            deadline = time.monotonic() + DEATH_NOTICE_S      # a collective failed: did a worker die?
            while time.monotonic() < deadline and shared.failure is None and \
                    all(w.process.is_alive() for w in shared.workers):
                time.sleep(0.02)
            for w in shared.workers:
                if not w.process.is_alive() and shared.failure is None:
                    w.process.join(0.1)
                    with shared.lock:
                        shared.failure = shared.failure or _exit_text(w)
        with shared.lock:
            if shared.failure is None:
                shared.failure = f"a step failed on rank 0: {type(exc).__name__}: {exc}"
            failure = shared.failure
        self._finalizer()
        if not failure.startswith("tensor-parallel worker") and not isinstance(exc, (RuntimeError, OSError)):
            return exc                   # Ctrl-C, or rank 0's own error: raised as it is
        return RuntimeError(f"{failure} (all tensor-parallel ranks stopped)")


@contextlib.contextmanager
def _child_env(**values: str):
    """Environment for spawned children (read at spawn time, before they import torch)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _expect(workers: list[WorkerHandle], tag: str) -> None:
    """Wait for every worker's `tag` message; a worker that fails or exits first raises."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    for w in workers:
        while True:
            ready = connection.wait([w.conn, w.process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"tensor-parallel worker {w.rank}: no {tag!r} within {STARTUP_TIMEOUT_S:.0f} s")
            message = None
            if w.conn in ready:
                with contextlib.suppress(EOFError, OSError):
                    message = pickle.loads(w.conn.recv_bytes())
            if message is not None:
                kind, detail = message
                if kind == "error":
                    raise RuntimeError(f"tensor-parallel worker {w.rank} failed while starting:\n{detail}")
                if kind == tag:
                    break
                continue
            w.process.join(1.0)
            raise RuntimeError(_exit_text(w) + " while starting")


def build_tp_executor(config: EngineConfig) -> tuple[LoadedModel, TPExecutor]:
    """Spawn ranks 1..N-1, load rank 0's shard here, join the group and build every rank's runner.
    Returns the LoadedModel the engine sees (the full model's arch) and the executor."""
    import multiprocessing as mp

    from inference.parallel.loader import load_rank_model
    from inference.parallel.worker import WorkerSpec, worker_main

    n = config.parallel.tensor_parallel_size
    load = plan_load(config.model)
    check_tp_config(config, load)
    timeout = config.parallel.collective_timeout_s
    store = serve_store(n, timeout)
    ctx = mp.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // n)
    shared = _Shared([])
    try:
        with _child_env(OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE")):
            for rank in range(1, n):
                ours, theirs = ctx.Pipe(duplex=True)
                spec = WorkerSpec(config, rank, n, store.port, threads)
                proc = ctx.Process(target=worker_main, args=(spec, theirs), name=f"tp-worker-{rank}", daemon=True)
                proc.start()
                theirs.close()
                shared.workers.append(WorkerHandle(rank, proc, ours))
        plan = TPPlan(load.arch, 0, n)
        loaded = load_rank_model(config.model, plan, None, load)
        _expect(shared.workers, "loaded")
        comm = shared.comm = from_store(store, 0, n, loaded.device, timeout)
        install_parallel_layers(loaded.model, plan, comm)
        driver = build_runner(loaded, config, comm)
        _expect(shared.workers, "ready")
    except BaseException:
        _stop_workers(shared)
        raise
    driver._tp_store = store          # the store lives as long as rank 0's runner
    return dataclasses.replace(loaded, arch=load.arch), TPExecutor(driver, shared)
