"""The collectives a tensor-parallel model needs, over one torch.distributed process group.

The group is built directly on a store (no default process group), so one process may hold
several engines (tests) and nothing global is set: gloo on the CPU, NCCL on CUDA. Ops are
synchronous for the caller (`wait()`); on CUDA that only makes the current stream wait.
"""
from __future__ import annotations

import contextlib
import datetime

import torch
import torch.distributed as dist


class TPComm:
    """all_reduce / all_gather over the ranks of one tensor-parallel group."""

    def __init__(self, group, rank: int, world_size: int):
        self.group, self.rank, self.world_size = group, rank, world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place (x must be contiguous)."""
        self.group.allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., n] of every rank, concatenated along the last dim in rank order: [..., N * n]."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.group.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def min_int(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's `value` (e.g. KV blocks that fit on every device)."""
        t = torch.tensor([value], dtype=torch.int64, device=device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.group.allreduce([t], opts).wait()
        return int(t.item())

    def abort(self) -> None:
        """Best effort: fail the collectives in flight (NCCL has abort; gloo fails by itself
        once a peer's sockets close)."""
        abort = getattr(self.group, "abort", None)
        if abort is not None:
            with contextlib.suppress(RuntimeError):     # already torn down, or not supported here
                abort()


def connect(host: str, port: int, rank: int, world_size: int, device: torch.device,
            timeout_s: float, prefix: str = "tp") -> TPComm:
    """Join the group whose store rank 0 serves at host:port (every rank calls this)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    return from_store(store, rank, world_size, device, timeout_s, prefix)


def from_store(store, rank: int, world_size: int, device: torch.device, timeout_s: float,
               prefix: str = "tp") -> TPComm:
    timeout = datetime.timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        # not yet run on multi-GPU hardware (docs/engine/tensor-parallelism.md).
        # NCCL binds its communicator to the current device on the first collective.
        torch.cuda.set_device(device)
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    return TPComm(group, rank, world_size)


def serve_store(world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store on a free local port (`.port`)."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                         timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
