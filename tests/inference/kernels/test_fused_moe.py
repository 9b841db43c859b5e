"""The fused mixture-of-experts path (inference/kernels/fused_moe.py) against the per-expert PyTorch
reference: under the Triton interpreter on the CPU at small sizes, compiled on a GPU (plus a
Mixtral-sized layer there). Fresh random inputs per case; routes with dropped assignments
(router threshold), experts that get no token, more experts than tokens."""
from __future__ import annotations

import zlib

import pytest
import torch

from inference.kernels.fused_moe import fused_experts
from inference.kernels.moe_routing import align_assignments, fused_route
from inference.models.moe import experts_reference, route

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _case(t, h, inter, e, k, dtype, threshold, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(
        zlib.crc32(repr((t, h, inter, e, k, dtype, threshold, seed)).encode()))
    x = torch.randn(t, h, generator=gen, device=DEVICE).to(dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=gen, device=DEVICE) * h ** -0.5).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=gen, device=DEVICE) * inter ** -0.5).to(dtype)
    logits = torch.randn(t, e, generator=gen, device=DEVICE) * 3
    weights, ids = route(logits, k, renormalize=True, threshold=threshold)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("t,e,k,threshold", [(1, 4, 2, 0.0), (5, 8, 2, 0.0), (33, 4, 1, 0.0), (19, 6, 3, 0.3),
                                             (3, 16, 2, 0.0), (2, 8, 2, 0.45)])
def test_fused_experts_match_the_reference(t, e, k, threshold):
    x, w13, w2, weights, ids = _case(t, 32, 48, e, k, torch.float32, threshold, 0)
    got = fused_experts(x, w13, w2, weights, ids, block_m=16, block_n=32, block_k=16, gemv=False)
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("t,e,k,threshold", [(1, 4, 2, 0.0), (2, 8, 2, 0.45), (5, 6, 3, 0.3)])
def test_gemv_path_matches_the_reference(t, e, k, threshold):
    """Few tokens: no alignment, one program per (assignment, rows); dropped assignments read nothing."""
    x, w13, w2, weights, ids = _case(t, 48, 40, e, k, torch.float32, threshold, 1)
    assert threshold == 0 or (weights == 0).any()
    got = fused_experts(x, w13, w2, weights, ids, gemv=True)
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("bits,group", [(8, -1), (8, 32), (4, 32), (4, 128)])
@pytest.mark.parametrize("gemv", [True, False])
def test_quantized_experts_match_the_reference(bits, group, gemv):
    """int8 / int4 codes (group-wise, or one group per row) dequantized as the tiles load, against
    the reference over the same QuantExperts (dequantized per expert)."""
    from inference.quantization.config import QuantConfig
    from inference.quantization.moe_experts import QuantExperts
    x, w13, w2, weights, ids = _case(7 if not gemv else 2, 64, 96, 6, 2, torch.float32, 0.2, bits)
    cfg = QuantConfig(method="rtn", bits=bits, group_size=group)
    q13, q2 = QuantExperts(w13, cfg).to(DEVICE), QuantExperts(w2, cfg).to(DEVICE)
    kw = dict(block_m=16, block_n=16, block_k=16) if not gemv else {}
    got = fused_experts(x, q13, q2, weights, ids, gemv=gemv, **kw)
    want = experts_reference(x, q13, q2, weights, ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    # and close to the unquantized layer (the codes are the weights, not noise)
    full = experts_reference(x, w13, w2, weights, ids)
    assert (got - full).abs().max() < (0.05 if bits == 8 else 0.3) * full.abs().max()


@pytest.mark.parametrize("bits,group", [(8, -1), (4, 32), (4, 128)])
def test_quantized_experts_gemv_with_16_bit_activations(bits, group):
    """bf16 activations take the dense GEMV's packed conversions (int8 CONVERT 2, int4 CONVERT 3;
    on the CPU their bit operations as Triton ops): against the fp32 reference over the same codes."""
    import copy

    from inference.kernels.quant_gemv import gemv_config
    from inference.quantization.config import QuantConfig
    from inference.quantization.moe_experts import QuantExperts
    x, w13, w2, weights, ids = _case(2, 256, 128, 4, 2, torch.bfloat16, 0.3, bits)
    cfg = QuantConfig(method="rtn", bits=bits, group_size=group)
    q13, q2 = QuantExperts(w13, cfg).to(DEVICE), QuantExperts(w2, cfg).to(DEVICE)
    assert gemv_config(128, 256, bits, q13.group_len, q13.qweight, x.dtype)["CONVERT"] == (2 if bits == 8 else 3)
    got = fused_experts(x, q13, q2, weights, ids, gemv=True).float()
    r13, r2 = copy.copy(q13), copy.copy(q2)          # the same codes, dequantized in fp32
    r13.dtype = r2.dtype = torch.float32
    want = experts_reference(x.float(), r13, r2, weights, ids)
    assert float((got - want).norm() / want.norm()) < 1e-2


@pytest.mark.parametrize("t,e,k,renormalize,threshold", [(1, 8, 2, True, 0.0), (7, 8, 2, True, 0.3),
                                                         (5, 6, 3, False, 0.2), (4, 60, 4, False, 0.0)])
def test_router_kernel_matches_route_and_counts(t, e, k, renormalize, threshold):
    gen = torch.Generator(device=DEVICE).manual_seed(t * 100 + e)
    logits = torch.randn(t, e, generator=gen, device=DEVICE) * 2
    want_w, want_ids = route(logits, k, renormalize, threshold)
    counts = torch.zeros(e, dtype=torch.int64, device=DEVICE)
    got_w, got_ids = fused_route(logits, k, renormalize, torch.full((1,), threshold, device=DEVICE), counts)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-6)
    want_counts = torch.zeros(e, dtype=torch.int64, device=DEVICE)
    want_counts.index_add_(0, want_ids.flatten(), (want_w > 0).flatten().long())
    assert torch.equal(counts, want_counts)


@pytest.mark.parametrize("use_kernel", [True, False])
def test_alignment_puts_each_live_assignment_once_in_its_experts_blocks(use_kernel):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 5, (23, 2), generator=gen)
    weights = torch.rand(23, 2, generator=gen)
    weights[::4, 1] = 0                                              # dropped by a threshold
    sorted_ids, block_expert = align_assignments(ids.to(DEVICE), weights.to(DEVICE), 5, 8, use_kernel=use_kernel)
    sorted_ids, block_expert = sorted_ids.cpu(), block_expert.cpu()
    live = [a for a in range(46) if weights.flatten()[a] > 0]
    real = sorted_ids[sorted_ids < 46]
    assert sorted(real.tolist()) == live
    for row, a in enumerate(sorted_ids.tolist()):
        if a < 46:
            assert block_expert[row // 8] == ids.flatten()[a]
    assert sorted_ids.numel() % 8 == 0 and (block_expert[block_expert >= 0].diff() >= 0).all()


def test_alignment_kernel_agrees_with_the_sort():
    gen = torch.Generator().manual_seed(8)
    ids = torch.randint(0, 8, (300, 2), generator=gen).to(DEVICE)
    weights = (torch.rand(300, 2, generator=gen) * (torch.rand(300, 2, generator=gen) > 0.1)).to(DEVICE)
    for got, want in zip(align_assignments(ids, weights, 8, 16, use_kernel=True),
                         align_assignments(ids, weights, 8, 16, use_kernel=False)):
        assert torch.equal(got, want)


def test_bad_shapes_are_refused():
    x, w13, w2, weights, ids = _case(4, 32, 48, 4, 2, torch.float32, 0.0, 1)
    with pytest.raises(ValueError, match="shapes do not agree"):
        fused_experts(x, w13, w2[:, :16], weights, ids)
    with pytest.raises(ValueError, match="ids and weights"):
        fused_experts(x, w13, w2, weights[:, :1], ids)
    with pytest.raises(ValueError, match="must share"):
        fused_experts(x, w13.half(), w2, weights, ids)


@requires_cuda
@pytest.mark.parametrize("t", [1, 2, 7, 64, 512, 3000])
def test_mixtral_sized_layer_in_bf16(t):
    """Every path the defaults pick (GEMV, each grouped config, the sort above ALIGN_KERNEL_MAX)."""
    x, w13, w2, weights, ids = _case(t, 4096, 1792, 8, 2, torch.bfloat16, 0.0, 2)   # 1/8 of Mixtral's I
    got = fused_experts(x, w13, w2, weights, ids)
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(got.float(), ref, rtol=3e-2, atol=3e-2)


@requires_cuda
@pytest.mark.parametrize("t", [1, 64])
def test_mixtral_layer_at_real_shape_under_a_cuda_graph(t):
    """Router kernel + experts at Mixtral's full shape (I 14336), captured and replayed on new inputs."""
    x, w13, w2, _, _ = _case(t, 4096, 14336, 8, 2, torch.bfloat16, 0.0, 3)
    gate = torch.randn(8, 4096, device=DEVICE, dtype=torch.bfloat16) * 0.05
    threshold = torch.zeros(1, device=DEVICE)

    def layer():
        weights, ids = fused_route(x @ gate.T, 2, True, threshold)
        return fused_experts(x, w13, w2, weights, ids)

    layer()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer()
    x.copy_(torch.randn_like(x))
    graph.replay()
    weights, ids = route(x @ gate.T, 2, True)
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights, ids)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
