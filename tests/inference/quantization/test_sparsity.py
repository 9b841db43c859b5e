"""2:4 structured sparsity: the mask, the transform, the engine option, the errors."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.llm import LLM
from inference.quantization.sparsity import SparseLinear, mask_2_4, sparsify_model
from inference.sampling_params import SamplingParams


def test_mask_keeps_the_two_largest_of_every_four():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 64, generator=gen)
    mask = mask_2_4(w)
    groups = mask.view(24, 16, 4)
    assert (groups.sum(-1) == 2).all()
    kept = (w.abs() * mask).view(24, 16, 4)
    dropped = (w.abs() * ~mask).view(24, 16, 4)
    assert (kept.max(-1).values >= dropped.max(-1).values).all()
    assert (kept.sum(-1) >= dropped.sum(-1)).all()        # the kept pair is the larger pair


def test_wanda_scores_weigh_inputs():
    # equal weights: the input norms alone decide; the two loudest channels of each 4 survive
    w = torch.ones(2, 8)
    norms = torch.tensor([1.0, 9.0, 3.0, 2.0, 5.0, 0.5, 0.1, 7.0])
    assert mask_2_4(w, norms)[0].tolist() == [False, True, True, False, True, False, False, True]


def test_sparse_linear_matches_masked_dense():
    gen = torch.Generator().manual_seed(1)
    lin = nn.Linear(64, 32, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(32, 64, generator=gen))
    sparse = SparseLinear(lin)
    x = torch.randn(3, 5, 64, generator=gen)
    want = x @ (lin.weight * mask_2_4(lin.weight)).t() + lin.bias
    torch.testing.assert_close(sparse(x), want, rtol=1e-5, atol=1e-5)
    assert sparse.weight_bytes() == 32 * 64 * 9 // 8            # half the bf16 values + 2-bit indices


def test_input_dim_not_a_multiple_of_four():
    with pytest.raises(ValueError, match="multiple of 4"):
        mask_2_4(torch.randn(4, 6))


def test_engine_option_prunes_every_decoder_linear_and_generates():
    llm = LLM("random:tiny", device="cpu", dtype="float32", max_model_len=128, quantization="sparse24")
    model = llm.engine.runner.model
    sparse = [m for m in model.modules() if isinstance(m, SparseLinear)]
    assert len(sparse) == 4 * len(model.layers)
    for m in sparse:
        assert (m.weight.view(m.out_features, -1, 4).ne(0).sum(-1) <= 2).all()
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4


def test_wanda_calibration_differs_from_magnitude():
    a = LLM("random:tiny", device="cpu", dtype="float32", max_model_len=128).engine.runner.model
    b = LLM("random:tiny", device="cpu", dtype="float32", max_model_len=128).engine.runner.model
    sparsify_model(a)
    windows = [[(7 * i + 3 * j) % 250 + 3 for j in range(32)] for i in range(3)]
    sparsify_model(b, windows)
    ma = a.layers[0].mlp.down_proj.weight != 0
    mb = b.layers[0].mlp.down_proj.weight != 0
    assert (mb.view(mb.shape[0], -1, 4).sum(-1) == 2).all()
    assert not torch.equal(ma, mb)
