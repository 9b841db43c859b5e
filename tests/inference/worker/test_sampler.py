"""Sampler on hand-made logits: filters keep exactly the right tokens, draws follow the distribution."""
from __future__ import annotations

import pytest
import torch

from inference.sampling_params import SamplingParams
from inference.worker.sampler import SamplingRow, sample

PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])


def _row(**kw):
    return SamplingRow(SamplingParams(**kw), [0], [], None, [])


def _draw(num: int, **kw) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    rows = [_row(**kw) for _ in range(num)]
    logits = PROBS.log().repeat(num, 1)
    return torch.tensor(sample(logits, rows, gen).token_ids)


@pytest.mark.parametrize("kw, allowed", [
    ({"top_k": 2}, {0, 1}),
    ({"top_p": 0.5}, {0, 1}),                  # 0.40 < 0.5: the token crossing top_p is kept
    ({"top_p": 0.75}, {0, 1, 2}),
    ({"min_p": 0.3}, {0, 1, 2}),               # >= 0.3 * 0.40 = 0.12
    ({}, {0, 1, 2, 3, 4, 5}),
])
def test_filters_keep_exactly_the_allowed_tokens(kw, allowed):
    draws = _draw(4000, temperature=1.0, **kw)
    assert set(draws.tolist()) == allowed


def test_draws_follow_renormalised_distribution():
    draws = _draw(20000, temperature=1.0, top_k=3)
    freq = torch.bincount(draws, minlength=6).float() / len(draws)
    expected = torch.zeros(6)
    expected[:3] = PROBS[:3] / PROBS[:3].sum()
    assert torch.allclose(freq, expected, atol=0.015)


def test_low_temperature_sharpens_and_greedy_is_argmax():
    sharp = _draw(4000, temperature=0.2)
    assert (sharp == 0).float().mean() > 0.85
    assert set(_draw(50, temperature=0).tolist()) == {0}


def test_blocked_tokens_and_penalties():
    logits = PROBS.log()[None].clone()
    row = SamplingRow(SamplingParams(temperature=0), [0], [], None, [0])
    assert sample(logits, [row]).token_ids == [1]                       # EOS-like id 0 blocked
    rep = SamplingRow(SamplingParams(temperature=0, frequency_penalty=2.0), [5], [0, 0], None, [])
    assert sample(PROBS.log()[None].clone(), [rep]).token_ids == [1]    # 0 penalised twice


def test_seeded_rows_independent_of_neighbours():
    def run(num_others):
        gen = torch.Generator().manual_seed(num_others)
        seeded = SamplingRow(SamplingParams(temperature=1.0, seed=5), [0], [], torch.Generator().manual_seed(5), [])
        rows = [_row(temperature=1.0) for _ in range(num_others)] + [seeded]
        out = []
        for _ in range(20):
            out.append(sample(PROBS.log().repeat(len(rows), 1), rows, gen).token_ids[-1])
        return out
    assert run(0) == run(3) == run(7)


def test_logprobs_ranks_and_values():
    row = _row(temperature=0, logprobs=3)
    out = sample(PROBS.log()[None].clone(), [row])
    lps = out.logprobs[0]
    assert out.token_ids == [0] and set(lps) == {0, 1, 2}
    for token, (lp, rank) in lps.items():
        assert rank == token + 1 and lp == pytest.approx(float(PROBS[token].log()), abs=1e-5)
