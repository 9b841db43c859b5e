"""A tensor-parallel worker: one process per rank > 0, spawned by the engine (executor.py).

    load the shard -> "loaded" -> join the group -> build the runner -> "ready" (its KV blocks)
    loop: StepMessage from rank 0's pipe -> runner.launch / collect (the collectives inside the
          model meet rank 0's) -> next; None or a closed pipe (rank 0 gone) -> exit

A failure is sent to rank 0 as ("error", traceback) before the process exits with code 1. The
worker also dies with its parent (Linux PR_SET_PDEATHSIG), so no rank outlives the engine.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass

from inference.config import EngineConfig


@dataclass(frozen=True)
class WorkerSpec:
    config: EngineConfig
    rank: int
    world_size: int
    store_port: int               # rank 0's TCPStore on 127.0.0.1
    num_threads: int              # CPU threads for this rank's ops


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
        except OSError:
            pass


def worker_main(spec: WorkerSpec, conn) -> None:
    """Entry point of a spawned worker process (conn: its end of the pipe to rank 0)."""
    _die_with_parent()
    os.environ["OMP_NUM_THREADS"] = str(spec.num_threads)
    try:
        import torch
        torch.set_num_threads(spec.num_threads)
        from inference.loader.model_loader import plan_load
        from inference.parallel.comm import connect
        from inference.parallel.loader import load_rank_model
        from inference.parallel.step import RequestMirror
        from inference.parallel.tp_transform import TPPlan, install_parallel_layers
        from inference.worker.runner_factory import build_runner

        config = spec.config
        load = plan_load(config.model)
        plan = TPPlan(load.arch, spec.rank, spec.world_size)
        loaded = load_rank_model(config.model, plan, None, load)
        conn.send_bytes(pickle.dumps(("loaded", None)))
        comm = connect("127.0.0.1", spec.store_port, spec.rank, spec.world_size, loaded.device,
                       config.parallel.collective_timeout_s)
        install_parallel_layers(loaded.model, plan, comm)
        runner = build_runner(loaded, config, comm)
        conn.send_bytes(pickle.dumps(("ready", runner.num_blocks)))
        mirror = RequestMirror()
        while True:
            try:
                msg = pickle.loads(conn.recv_bytes())
            except EOFError:                   # rank 0 is gone
                return
            if msg is None:
                return
            mirror.remove(msg.removed_req_ids)
            runner.remove_requests(msg.removed_req_ids)
            if msg.items:
                runner.collect(runner.launch(mirror.scheduler_output(msg)))
    except BaseException:                      # noqa: BLE001 - reported to rank 0, then exit 1
        try:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        except OSError:
            pass
        sys.exit(1)
