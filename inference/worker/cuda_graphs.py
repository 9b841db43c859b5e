"""Step shapes the CUDA runner replays as CUDA graphs, and the graphs themselves.

An eager step launches ~10 kernels per layer from Python (a Triton launch costs ~40 us of host
time on the H200's host), so a step carrying a few hundred prefill tokens takes longer to launch
than to run. Graphs are captured for padded shapes and replayed with the real step's inputs in
persistent buffers:

    decode graph  (batch B):        rows [0, B)            decodes (padding rows: slot -1, ctx 1)
    mixed graph   (decodes Bd,      rows [0, Bd)           decodes, padded like the decode graph
                   prefill Tp):     rows [Bd, Bd + Tp)     up to MAX_MIXED_CHUNKS prefill chunks
                                                           back to back, then padding (slot -1,
                                                           in no chunk: never attended to)

Only the kernels' grids depend on the shape (decode: B x Hkv x splits; prefill: chunks x
cdiv(Tp, BLOCK_M) x H); every length, table and offset is read from device memory, so one graph
serves every step that fits its shape. Steps larger than MAX_MIXED_TOKENS prefill tokens are
device-bound and run eagerly.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
MIXED_DECODE_SIZES = (0, 8, 16, 32, 64, 128, 256, 512)
MIXED_PREFILL_SIZES = (64, 128, 256, 512, 768, 1024, 1536, 2048)
MAX_MIXED_TOKENS = MIXED_PREFILL_SIZES[-1]
MAX_MIXED_CHUNKS = 16


def bucket(sizes: list[int], n: int) -> int | None:
    """The smallest size >= n, or None."""
    return next((s for s in sizes if s >= n), None)


def capped(sizes: tuple[int, ...], cap: int) -> list[int]:
    """sizes below cap, then cap itself: every n <= cap has a bucket, none is larger than cap."""
    return [s for s in sizes if s < cap] + [cap]


def mixed_shapes(max_num_seqs: int, max_num_batched_tokens: int) -> list[tuple[int, int]]:
    """(decode rows, prefill rows) shapes a step can need: a decode bucket and a prefill bucket
    whose smallest members fit the token budget together."""
    decodes = capped(MIXED_DECODE_SIZES, min(max_num_seqs, max_num_batched_tokens - 1))
    prefills = capped(MIXED_PREFILL_SIZES, min(MAX_MIXED_TOKENS, max_num_batched_tokens))
    shapes = []
    for i, bd in enumerate(decodes):
        lo_d = decodes[i - 1] + 1 if i else 0
        for j, tp in enumerate(prefills):
            lo_p = prefills[j - 1] + 1 if j else 1
            if lo_d + lo_p <= max_num_batched_tokens:
                shapes.append((bd, tp))
    return shapes


def mixed_shape_for(num_decodes: int, num_prefill_tokens: int, num_chunks: int,
                    shapes: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The padded shape a mixed step runs as, or None (eager)."""
    if num_chunks > MAX_MIXED_CHUNKS or not shapes:
        return None
    # shapes is a grid of buckets less the unreachable corner, so the smallest fitting prefill
    # bucket, then the smallest fitting decode bucket, is the tightest shape
    fits = [s for s in shapes if s[0] >= num_decodes and s[1] >= num_prefill_tokens]
    return min(fits, key=lambda s: (s[1], s[0]), default=None)


class GraphSet:
    """Captured graphs by key, sharing one memory pool. Capture the largest shapes first: the
    smaller ones then fit in memory the pool already holds. Graphs that share a pool must not run
    concurrently; the runner replays them one step at a time on one stream."""

    def __init__(self):
        self.graphs: dict[object, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}   # key -> (graph, output)
        self.pool = None

    def capture(self, key, forward: Callable[[], torch.Tensor]) -> None:
        forward()                       # compiles and allocates outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        self.pool = graph.pool()
        self.graphs[key] = (graph, out)

    def replay(self, key) -> torch.Tensor:
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def __contains__(self, key) -> bool:
        return key in self.graphs

    def __getitem__(self, key) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        return self.graphs[key]

    def __len__(self) -> int:
        return len(self.graphs)
