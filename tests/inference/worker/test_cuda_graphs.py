"""Step shapes for CUDA graphs (inference/worker/cuda_graphs.py): every step the scheduler can build maps
to the tightest captured shape, or runs eagerly."""
from __future__ import annotations

import random

import pytest

from inference.worker.cuda_graphs import (
    MAX_MIXED_CHUNKS,
    MAX_MIXED_TOKENS,
    bucket,
    capped,
    mixed_shape_for,
    mixed_shapes,
)


def test_bucket_and_capped():
    assert bucket([1, 4, 8], 3) == 4 and bucket([1, 4, 8], 8) == 8 and bucket([1, 4, 8], 9) is None
    assert capped((0, 8, 16, 32), 20) == [0, 8, 16, 20]
    assert capped((0, 8, 16), 8) == [0, 8]


@pytest.mark.parametrize("max_seqs,budget", [(512, 1024), (256, 8192), (300, 700), (4, 40)])
def test_every_reachable_step_gets_its_tightest_shape(max_seqs, budget):
    shapes = mixed_shapes(max_seqs, budget)
    assert len(set(shapes)) == len(shapes)
    decodes = sorted({d for d, _ in shapes})
    prefills = sorted({p for _, p in shapes})
    assert decodes[-1] <= max_seqs and prefills[-1] <= min(budget, MAX_MIXED_TOKENS)
    rng = random.Random(max_seqs + budget)
    for _ in range(3000):
        tp = rng.randint(1, min(budget, MAX_MIXED_TOKENS + 50))
        nd = rng.randint(0, min(max_seqs, budget - tp))
        got = mixed_shape_for(nd, tp, 1, shapes)
        if tp > MAX_MIXED_TOKENS:
            assert got is None                     # big steps are device-bound: eager
            continue
        assert got == (bucket(decodes, nd), bucket(prefills, tp)), (nd, tp, got)
        assert got in shapes


def test_too_many_chunks_run_eagerly():
    shapes = mixed_shapes(64, 1024)
    assert mixed_shape_for(3, 100, MAX_MIXED_CHUNKS, shapes) is not None
    assert mixed_shape_for(3, 100, MAX_MIXED_CHUNKS + 1, shapes) is None
    assert mixed_shape_for(3, 100, 1, []) is None
