"""A tensor-parallel group of threads in one process (tests): each rank runs its shard in its own
thread and the collectives meet at a barrier, so the transform can be checked without spawning."""
from __future__ import annotations

import threading
from collections.abc import Callable

import torch


class ThreadGroup:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def comm(self, rank: int) -> ThreadComm:
        return ThreadComm(self, rank)


class ThreadComm:
    """TPComm's interface; sums in rank order, so every rank gets the same bits."""

    def __init__(self, group: ThreadGroup, rank: int):
        self.g, self.rank, self.world_size = group, rank, group.world_size

    def _exchange(self, x: torch.Tensor) -> list[torch.Tensor]:
        self.g.slots[self.rank] = x.clone()
        self.g.barrier.wait()
        parts = list(self.g.slots)
        self.g.barrier.wait()                 # nobody overwrites a slot before all have read
        return parts

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        parts = self._exchange(x)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return x.copy_(total)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self._exchange(x.contiguous()), dim=-1)


def run_ranks(world_size: int, fn: Callable[[int, ThreadComm], object]) -> list:
    """fn(rank, comm) on world_size threads; their results in rank order (re-raises errors)."""
    group = ThreadGroup(world_size)
    results, errors = [None] * world_size, []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank, group.comm(rank))
        except BaseException as exc:          # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
