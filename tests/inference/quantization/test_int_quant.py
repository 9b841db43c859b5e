"""Integer quantization math, GPTQ and AWQ on fresh random data (no model)."""
from __future__ import annotations

import pytest
import torch

from inference.quantization.awq import search_scale
from inference.quantization.calibration import InputStats
from inference.quantization.config import QuantConfig
from inference.quantization.gptq import gptq_quantize
from inference.quantization.int_quant import dequantize, pack_int4, quantize_rtn, unpack_int4


@pytest.mark.parametrize("cfg", [QuantConfig("rtn", 4, 32), QuantConfig("rtn", 4, 128, True),
                                 QuantConfig("rtn", 8, -1, True), QuantConfig("rtn", 8, 64)])
@pytest.mark.parametrize("in_features", [96, 200])            # 200: a short last group
def test_rtn_error_is_within_half_a_step(cfg, in_features):
    gen = torch.Generator().manual_seed(in_features + cfg.bits + cfg.group_size)
    w = torch.randn(48, in_features, generator=gen) * torch.rand(48, 1, generator=gen)
    codes, scales, zeros = quantize_rtn(w, cfg)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= cfg.qmax
    assert scales.shape == zeros.shape == (48, cfg.groups(in_features))
    gl = cfg.group_len(in_features)
    deq = dequantize(codes, scales, zeros, gl)
    step = scales.repeat_interleave(gl, 1)[:, :in_features]
    # half a step of rounding (asymmetric: up to a whole step at the range's ends, where the
    # integer zero point has shifted the grid), plus the fp16 rounding of the scale
    bound = 0.5 if cfg.symmetric else 1.0
    assert ((deq - w).abs() <= step * (bound + 2e-3 * cfg.qmax) + 1e-6).all()
    assert ((deq - w).abs() <= step * 0.5 + 1e-6).float().mean() > 0.97       # the bulk: half a step
    assert torch.equal(scales, scales.half().float()), "scales must be fp16-representable"


def test_pack_int4_round_trip_odd_width():
    codes = torch.randint(0, 16, (7, 33), dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (7, 17)
    assert torch.equal(unpack_int4(packed, 33), codes)


def test_config_rejects_bad_values():
    for kw, msg in ((dict(method="nf4"), "method"), (dict(bits=3), "bits"), (dict(method="awq", bits=8), "4-bit"),
                    (dict(group_size=100), "group_size"), (dict(group_size=16), "group_size"),
                    (dict(method="awq", symmetric=True), "zero point")):
        with pytest.raises(ValueError, match=msg):
            QuantConfig(**kw)
    with pytest.raises(ValueError, match="not supported"):
        QuantConfig.from_hf({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True})
    with pytest.raises(ValueError, match="not supported"):
        QuantConfig.from_hf({"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match="GEMM"):
        QuantConfig.from_hf({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})


def correlated_inputs(n: int, d: int, gen) -> torch.Tensor:
    """Rows with correlated channels and a few loud ones, like a real layer's inputs."""
    mix = torch.randn(d, d, generator=gen) / d ** 0.5
    x = torch.randn(n, d, generator=gen) @ (torch.eye(d) + mix)
    x[:, :4] *= 12
    return x


@pytest.mark.parametrize("group", [32, -1])
def test_gptq_beats_rtn_on_the_layer_output(group):
    gen = torch.Generator().manual_seed(group + 100)
    w = torch.randn(64, 256, generator=gen) * 0.05
    x = correlated_inputs(2048, 256, gen)
    cfg = QuantConfig("gptq", 4, group)
    ref = x @ w.t()

    def out_err(codes, scales, zeros):
        return float((x @ dequantize(codes, scales, zeros, cfg.group_len(256)).t() - ref).norm() / ref.norm())
    rtn = out_err(*quantize_rtn(w, cfg))
    gptq = out_err(*gptq_quantize(w, x.t() @ x, cfg))
    assert gptq < 0.8 * rtn, (gptq, rtn)


def test_gptq_rejects_a_mismatched_hessian():
    with pytest.raises(ValueError, match="Hessian"):
        gptq_quantize(torch.randn(4, 64), torch.eye(16), QuantConfig("gptq", 4, 32))


def test_awq_search_beats_rtn_with_salient_channels():
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(64, 256, generator=gen) * 0.05
    x = correlated_inputs(1024, 256, gen)
    stats = InputStats()
    stats.add(x, with_hessian=False, sample_rows=512, per_call=512)
    cfg = QuantConfig("awq", 4, 64)
    s, alpha = search_scale(w, stats, cfg)
    xs = stats.sample_rows()
    ref = xs @ w.t()

    def err(weight, inputs):
        codes, sc, z = quantize_rtn(weight, cfg)
        return float((inputs @ dequantize(codes, sc, z, 64).t() - ref).norm())
    assert alpha > 0
    assert err(w * s, xs / s) < err(w, xs)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, -1)])
def test_quant_linear_kernel_path_matches_dequantize_path(bits, group):
    from inference.quantization.quant_linear import QuantLinear
    # the kernel on CPU tensors (interpreter) vs the dequantize path; on a GPU, CUDA tensors vs
    # the same layer's dequantize path on the CPU
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(bits)
    w, bias = torch.randn(40, 96, generator=gen) * 0.1, torch.randn(40, generator=gen)
    cfg = QuantConfig("rtn", bits, group, symmetric=bits == 8)
    layer = QuantLinear(*quantize_rtn(w, cfg), cfg, bias)
    x = torch.randn(3, 5, 96, generator=gen)
    want = layer(x)
    layer.use_kernel = True
    got = layer.to(device)(x.to(device)).cpu()
    assert got.shape == (3, 5, 40)
    assert torch.allclose(got, want, atol=1e-4), float((got - want).abs().max())


def test_awq_clip_lowers_the_output_error_and_only_narrows_ranges():
    from inference.quantization.awq import search_clip
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(32, 200, generator=gen) * 0.05                     # 200: a short last group
    w[:, 7] *= 8                                                       # an outlier column
    x = torch.randn(256, 200, generator=gen)
    cfg = QuantConfig("awq", 4, 64)
    clipped = search_clip(w, x, cfg)
    assert clipped.shape == w.shape and (clipped.abs() <= w.abs() + 1e-7).all()
    ref = x @ w.t()

    def err(weight):
        codes, s, z = quantize_rtn(weight, cfg)
        return float((x @ dequantize(codes, s, z, 64).t() - ref).norm())
    assert err(clipped) < err(w)


def uneven_inputs(n: int, d: int, gen) -> torch.Tensor:
    """Correlated rows whose channel energies spread over two orders of magnitude, loudest
    channels scattered (not first), as act-order meets them in a real layer."""
    x = correlated_inputs(n, d, gen)[:, torch.randperm(d, generator=gen)]
    return x * torch.logspace(-1, 1, d)[torch.randperm(d, generator=gen)]


def output_error(w, x, codes, scales, zeros, cfg) -> float:
    ref = x @ w.t()
    return float((x @ dequantize(codes, scales, zeros, cfg.group_len(w.shape[1])).t() - ref).norm() / ref.norm())


@pytest.mark.parametrize("group", [32, 128, -1])
def test_gptq_act_order_lowers_the_output_error_and_keeps_the_layout(group):
    gen = torch.Generator().manual_seed(group + 300)
    w = torch.randn(96, 320, generator=gen) * 0.05                # 320: a short last group at 128
    x = uneven_inputs(4096, 320, gen)
    cfg = QuantConfig("gptq", 4, group, act_order=True)
    h = x.t() @ x / x.shape[0]
    natural = gptq_quantize(w, h, cfg, act_order=False)
    ordered = gptq_quantize(w, h, cfg, act_order=True)
    codes, scales, zeros = ordered
    assert codes.shape == w.shape and scales.shape == zeros.shape == (96, cfg.groups(320))
    assert int(zeros.min()) >= 1 and int(codes.max()) <= cfg.qmax         # GPTQ v1's zero >= 1
    assert torch.equal(scales, scales.half().float())
    # the codes come back in W's own column order, on W's own groups: each weight within a few
    # steps of its original value (permuted columns would be off by the whole weight)
    step = scales.repeat_interleave(cfg.group_len(320), 1)[:, :320]
    deq = dequantize(codes, scales, zeros, cfg.group_len(320))
    assert ((deq - w).abs() <= 4 * step).float().mean() > 0.99
    err_natural, err_ordered = output_error(w, x, *natural, cfg), output_error(w, x, *ordered, cfg)
    assert err_ordered < 0.9 * err_natural, (err_ordered, err_natural)


@pytest.mark.parametrize("group", [32, 128])
def test_gptq_clip_search_lowers_the_output_error(group):
    gen = torch.Generator().manual_seed(group + 500)
    w = torch.randn(96, 256, generator=gen) * 0.05
    x = uneven_inputs(4096, 256, gen)
    cfg = QuantConfig("gptq", 4, group)
    h = x.t() @ x / x.shape[0]
    minmax = output_error(w, x, *gptq_quantize(w, h, cfg, act_order=True, clip_search=False), cfg)
    clipped = output_error(w, x, *gptq_quantize(w, h, cfg, act_order=True, clip_search=True), cfg)
    # a group's extreme weights are rare: a narrower grid rounds the bulk more finely (a few % on
    # Gaussian weights; -4 points of the model's perplexity delta on SmolLM2)
    assert clipped < 0.98 * minmax, (clipped, minmax)
    rtn = output_error(w, x, *quantize_rtn(w, cfg), cfg)
    assert clipped < 0.8 * rtn, (clipped, rtn)


def test_hessian_is_the_fp64_mean_and_gptq_ignores_its_scale():
    gen = torch.Generator().manual_seed(17)
    x = uneven_inputs(600, 64, gen)
    stats = InputStats()
    for part in x.split(200):                                          # three forwards
        stats.add(part, with_hessian=True, sample_rows=0, per_call=0)
    x64 = x.double()
    assert stats.hessian.dtype == torch.float64 and stats.num_rows == 600
    assert torch.allclose(stats.hessian, x64.t() @ x64 / 600, rtol=1e-5, atol=1e-6)
    # dampening is relative to the mean diagonal: H and 1000 H give the same codes
    w = torch.randn(16, 64, generator=gen)
    cfg = QuantConfig("gptq", 4, 32)
    a = gptq_quantize(w, stats.hessian, cfg, act_order=True)
    b = gptq_quantize(w, stats.hessian * 1000, cfg, act_order=True)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
