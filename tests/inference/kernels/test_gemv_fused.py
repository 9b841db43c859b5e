"""The batch-1 decode GEMVs with fused epilogues (inference/kernels/gemv_fused.py) against their PyTorch
reference: residual add + sum of squares, norm-scaled SiLU-and-mul over paired gate / up rows,
norm-scaled RoPE + KV-cache write over paired head rows; plain, int8, int4 and fp8 weights.

CPU: the interpreter at small shapes (CI). GPU: the 7B / Llama-3 shapes. Fresh random inputs each
case, outputs and caches poisoned with NaN first.
"""
from __future__ import annotations

import pytest
import torch

from inference.kernels.gemv_fused import (
    RESIDUAL,
    ROPE,
    SILU,
    STATS_LANES,
    GemvWeight,
    RopeKV,
    gemv_fused_reference,
    gemv_residual,
    gemv_rope_kv,
    gemv_silu,
    norm_stats,
)
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import dequantize, pack_int4, quantize_rtn
from tests.inference.kernels.test_quant_matmul import CUDA, DEVICE

TOL = {torch.float32: 2e-5, torch.bfloat16: 1.2e-2}
FORMATS = ["plain", "int8", "int4"] + (["fp8"] if CUDA else [])


def weight_of(fmt: str, n: int, k: int, dtype: torch.dtype, gen) -> tuple[GemvWeight, torch.Tensor]:
    """(the GEMV's operand, the dense weight it stands for)."""
    w = torch.randn(n, k, generator=gen, device=DEVICE) * 0.05
    if fmt == "plain":
        w = w.to(dtype)
        return GemvWeight.plain(w), w
    if fmt == "fp8":
        scale = w.abs().amax(1) / 448.0
        codes = (w / scale[:, None]).to(torch.float8_e4m3fn)
        return (GemvWeight(codes.view(torch.uint8), scale.view(n, 1), scale, 16, k, fp8=True),
                codes.float() * scale[:, None])
    bits = 8 if fmt == "int8" else 4
    cfg = QuantConfig("rtn", bits, 32)
    codes, scales, zeros = quantize_rtn(w, cfg)
    qweight = pack_int4(codes) if bits == 4 else codes
    gl = cfg.group_len(k)
    return GemvWeight(qweight, scales, zeros, bits, gl), dequantize(codes, scales, zeros, gl, torch.float32)


def lanes(row_sums: torch.Tensor) -> torch.Tensor:
    """[M] sums spread over the lanes as the producers leave them (uneven parts)."""
    parts = torch.rand(row_sums.shape[0], STATS_LANES, dtype=torch.float64, device=row_sums.device)
    return (parts / parts.sum(1, keepdim=True) * row_sums[:, None]).contiguous()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def dtypes(fmt: str) -> list[torch.dtype]:
    return [torch.bfloat16] if fmt == "fp8" else [torch.float32, torch.bfloat16]


def shapes(small, large):
    return large if CUDA else small


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 2])
def test_residual_epilogue(fmt, m, nan_filled_empty):
    for dtype in dtypes(fmt):
        n, k = shapes((96, 128), (4096, 11008))
        gen = torch.Generator(device=DEVICE).manual_seed(n + k + m)
        w, dense = weight_of(fmt, n, k, dtype, gen)
        x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
        residual = torch.randn(m, n, generator=gen, device=DEVICE).to(dtype)
        want_h, want_ss = gemv_fused_reference(x, dense.to(dtype), RESIDUAL, residual=residual)
        stats = torch.full((m, STATS_LANES), 0.25, dtype=torch.float64, device=DEVICE)   # added to, not overwritten
        out = gemv_residual(x, w, residual, stats)
        assert out.data_ptr() == residual.data_ptr()
        assert rel(residual, want_h) < TOL[dtype]
        torch.testing.assert_close(stats.sum(1) - 0.25 * STATS_LANES, want_ss, rtol=2 * TOL[dtype], atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_silu_epilogue_pairs_gate_and_up_rows(fmt, nan_filled_empty):
    for dtype in dtypes(fmt):
        inter, k = shapes((72, 96), (11008, 4096))            # 72: the last program's pairs are partly empty
        m = 1
        gen = torch.Generator(device=DEVICE).manual_seed(inter + k)
        w, dense = weight_of(fmt, 2 * inter, k, dtype, gen)
        x = (torch.randn(m, k, generator=gen, device=DEVICE) * 3).to(dtype)
        stats = lanes(x.double().pow(2).sum(1))
        got = gemv_silu(x, w, stats, 1e-5)
        assert got.shape == (m, inter) and not got.isnan().any()
        assert rel(got, gemv_fused_reference(x, dense.to(dtype), SILU, stats, 1e-5)) < TOL[dtype]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cache_dtype", ["model", "fp8"])
def test_rope_kv_epilogue(fmt, cache_dtype, nan_filled_empty):
    for dtype in dtypes(fmt):
        h, hkv, d = shapes((4, 2, 16), (32, 8, 128))
        k = shapes(64, 4096)
        m, block_size, blocks, max_pos = 2, 4, 6, 64
        gen = torch.Generator(device=DEVICE).manual_seed(h + d + k + (cache_dtype == "fp8"))
        w, dense = weight_of(fmt, (h + 2 * hkv) * d, k, dtype, gen)
        x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
        stats = lanes(x.double().pow(2).sum(1))
        pos = torch.randint(0, max_pos, (m,), generator=gen, device=DEVICE)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d))
        freqs = torch.outer(torch.arange(max_pos, device=DEVICE).float(), inv)
        cos_sin = torch.cat((freqs.cos(), freqs.sin()), -1).contiguous()
        cdtype = torch.float8_e4m3fn if cache_dtype == "fp8" else dtype
        slots = torch.tensor([5, -1], device=DEVICE)                  # the second row is padding: not cached
        caches = [torch.full((blocks, block_size, hkv, d), float("nan"), device=DEVICE).to(cdtype) for _ in range(4)]
        rope = RopeKV(pos, cos_sin, caches[0], caches[1], slots, h, hkv)
        got = gemv_rope_kv(x, w, stats, 1e-6, rope)
        want = gemv_fused_reference(x, dense.to(dtype), ROPE, stats, 1e-6,
                                    rope=RopeKV(pos, cos_sin, caches[2], caches[3], slots, h, hkv))
        assert rel(got, want) < TOL[dtype]
        for mine, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
            flat_mine, flat_ref = mine.view(-1, hkv, d).float(), ref.view(-1, hkv, d).float()
            assert flat_mine[5].isfinite().all() and rel(flat_mine[5], flat_ref[5]) < max(TOL[dtype], 0.07)
            others = torch.arange(flat_mine.shape[0], device=DEVICE) != 5
            assert flat_mine[others].isnan().all()                   # nothing written outside the slot


def test_norm_stats_writes_the_first_slot_and_zeroes_the_rest():
    x = torch.randn(3, 80, device=DEVICE)
    stats = torch.full((5, 3, STATS_LANES), 7.0, dtype=torch.float64, device=DEVICE)
    norm_stats(x, stats)
    torch.testing.assert_close(stats[0, :, 0], x.double().pow(2).sum(1), rtol=1e-6, atol=0)
    assert (stats[0, :, 1:] == 0).all() and (stats[1:] == 0).all()


def test_bad_inputs_name_what_is_wrong():
    w = GemvWeight.plain(torch.randn(8, 16, device=DEVICE))
    x = torch.randn(1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="stats_out must be a contiguous fp64"):
        gemv_residual(x, w, torch.zeros(1, 8, device=DEVICE), torch.zeros(1, STATS_LANES, device=DEVICE))
    with pytest.raises(ValueError, match="residual must be"):
        gemv_residual(x, w, torch.zeros(1, 9, device=DEVICE),
                      torch.zeros(1, STATS_LANES, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="does not take x"):
        gemv_silu(torch.randn(1, 12, device=DEVICE), w,
                  torch.zeros(1, STATS_LANES, dtype=torch.float64, device=DEVICE), 1e-6)
    cache = torch.zeros(2, 4, 1, 4, device=DEVICE)
    rope = RopeKV(torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.zeros(8, 4, device=DEVICE), cache, cache,
                  torch.zeros(1, dtype=torch.int64, device=DEVICE), 1, 1)
    with pytest.raises(ValueError, match="qkv rows are not"):
        gemv_rope_kv(torch.randn(1, 16, device=DEVICE), GemvWeight.plain(torch.randn(10, 16, device=DEVICE)),
                     torch.zeros(1, STATS_LANES, dtype=torch.float64, device=DEVICE), 1e-6, rope)
