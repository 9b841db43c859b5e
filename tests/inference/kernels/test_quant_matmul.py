"""W8A16 / W4A16 quantized matmul kernel vs its fp32 dequantize-then-matmul reference.

CPU: Triton interpreter at small shapes (CI). GPU: real 7B shapes. Fresh random codes, scales
and inputs in every case; ragged M, N and K tails, short last groups, split-K.
"""
from __future__ import annotations

import pytest
import torch

from inference.kernels.quant_gemv import GEMV_MAX_ROWS, gemv, gemv_fp8, quant_gemv
from inference.kernels.quant_matmul import choose_tiles, quant_matmul, quant_matmul_reference
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import pack_int4, quantize_rtn

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: 1e-4, torch.bfloat16: 1.5e-2}


def run_case(kernel, m, n, k, bits, group, dtype, seed, tiles):
    """Relative error of kernel(x, codes, scales, zeros, bits, group_len, tiles=...) against the
    fp32 reference on fresh random weights and inputs."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device=DEVICE) * 0.05
    cfg = QuantConfig("rtn", bits, group)
    codes, scales, zeros = quantize_rtn(w, cfg)
    qweight = pack_int4(codes) if bits == 4 else codes
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
    gl = cfg.group_len(k)
    out = kernel(x, qweight, scales, zeros, bits, gl, tiles=tiles)
    ref = quant_matmul_reference(x, codes, scales, zeros, gl)
    assert out.shape == (m, n) and out.dtype == dtype and not out.isnan().any()
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def case(m, n, k, bits, group, dtype, seed, tiles=None):
    return run_case(quant_matmul, m, n, k, bits, group, dtype, seed, tiles)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,n,k,group", [(1, 48, 64, 32), (5, 80, 96, 32), (33, 24, 160, 64), (3, 40, 96, -1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_shapes(bits, m, n, k, group, dtype):
    tiles = (16, 16, 32 if group == 32 else 32, 1)
    assert case(m, n, k, bits, group, dtype, seed=m * 7 + n + k + bits, tiles=tiles) < TOL[dtype]


@pytest.mark.parametrize("bits", [4, 8])
def test_split_k_and_short_last_group(bits):
    # K = 176 at group 32: 5 whole groups and one of 16; 3 splits of K, one of them partly empty
    assert case(2, 32, 176, bits, 32, torch.float32, seed=bits, tiles=(16, 16, 32, 3)) < TOL[torch.float32]


def test_choose_tiles():
    assert choose_tiles(1, 4096, 4096, 128, 132)[3] > 1            # decode o_proj: split K
    assert choose_tiles(2048, 4096, 4096, 128, 132)[3] == 1         # prefill: enough tiles
    assert choose_tiles(1, 576, 576, 128, 132)[2] == 128            # K tiles stay inside a group
    assert choose_tiles(1, 4096, 4096, 4096, 132)[2] == 256         # per channel: the longest tile


def test_bad_inputs():
    x = torch.randn(2, 64)
    q = torch.zeros(8, 32, dtype=torch.uint8)
    s = torch.ones(8, 2)
    with pytest.raises(ValueError, match="bits"):
        quant_matmul(x, q, s, s, 3, 32)
    with pytest.raises(ValueError, match="uint8"):
        quant_matmul(x, q, s, s, 8, 32)                               # 8-bit wants [8, 64]
    with pytest.raises(ValueError, match="scales"):
        quant_matmul(x, q, torch.ones(8, 3), s, 4, 32)
    with pytest.raises(ValueError, match="divide"):
        quant_matmul(x, q, torch.ones(8, 3), torch.ones(8, 3), 4, 24, tiles=(16, 16, 32, 1))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 7, 64, 300])
@pytest.mark.parametrize("n,k", [(4096, 4096), (12288, 4096), (4096, 11008)])
def test_real_shapes(bits, m, n, k):
    assert case(m, n, k, bits, 128, torch.bfloat16, seed=m + n + k + bits) < TOL[torch.bfloat16]


@pytest.mark.parametrize("bits,group", [(4, 32), (8, -1), (4, 64)])
def test_large_m_dequantize_path(bits, group):
    from inference.kernels.quant_matmul import DEQUANT_MIN_ROWS
    assert case(DEQUANT_MIN_ROWS + 3, 24, 192, bits, group, torch.float32, seed=bits + 50) < TOL[torch.float32]


def gemv_case(m, n, k, bits, group, dtype, seed, tiles):
    return run_case(quant_gemv, m, n, k, bits, group, dtype, seed, tiles)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,n,k,group,tiles", [
    (1, 40, 128, 32, (16, 64)),         # two groups per slab, ragged N
    (3, 24, 96, 32, (16, 64)),          # K tail: the last slab half empty
    (2, 16, 176, 32, (8, 32)),          # short last group (K = 5.5 groups)
    (1, 20, 160, 64, (16, 32)),         # slabs shorter than a group
    (2, 24, 200, -1, (16, 64)),         # per channel, K not a power of two
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv(bits, m, n, k, group, tiles, dtype):
    assert gemv_case(m, n, k, bits, group, dtype, seed=m + n + k + bits, tiles=tiles) < TOL[dtype]


def test_few_rows_take_the_gemv():
    # the dispatcher: quant_matmul's default for M <= GEMV_MAX_ROWS is the GEMV, same result
    assert case(GEMV_MAX_ROWS, 48, 256, 4, 128, torch.float32, seed=11) < TOL[torch.float32]
    assert case(1, 48, 200, 8, -1, torch.float32, seed=12) < TOL[torch.float32]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("bits,group", [(4, 128), (4, 32), (8, -1)])
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("n,k", [(4096, 4096), (22016, 4096), (4096, 11008)])
def test_gemv_real_shapes(bits, group, m, n, k):
    assert gemv_case(m, n, k, bits, group, torch.bfloat16, seed=m + n + k + bits, tiles=None) < TOL[torch.bfloat16]


@pytest.mark.usefixtures("nan_filled_empty")
@pytest.mark.parametrize("m,n,k,tiles", [(1, 40, 128, (16, 64)), (3, 24, 96, (16, 64)), (2, 5, 200, (4, 128)),
                                         (1, 7, 1000, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_gemv(m, n, k, tiles, dtype):
    assert torch.isnan(torch.empty(4, device=DEVICE)).all()
    gen = torch.Generator(device=DEVICE).manual_seed(m * 100 + n + k)
    w = (torch.randn(n, k, generator=gen, device=DEVICE) * 0.05).to(dtype)
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
    out = gemv(x, w, tiles=tiles)
    ref = (x.float() @ w.float().t()).to(dtype)
    assert out.shape == (m, n) and not out.isnan().any()
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[dtype]


def fp8_case(m: int, n: int, k: int, seed: int, pdl: bool | None = None, tiles=None) -> float:
    """gemv_fp8 against x @ (e4m3 weight x its row scales)^T in fp32; the relative error."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device=DEVICE) * 0.05
    scale = (w.abs().amax(1) / 448).float()                             # [N], as Fp8Linear
    # e4m3 values exactly (the interpreter's fp32 -> fp8 cast misrounds: go through uint8 codes)
    w8 = (w / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn) if CUDA else \
        torch.randint(0, 256, (n, k), generator=gen, device=DEVICE, dtype=torch.uint8).view(torch.float8_e4m3fn)
    if not CUDA:
        w8 = w8.float().nan_to_num(0.0).clamp(-448, 448).to(torch.float8_e4m3fn)   # grid values: exact
    x = torch.randn(m, k, generator=gen, device=DEVICE).bfloat16()
    out = gemv_fp8(x, w8, scale.view(1, n), pdl=pdl, tiles=tiles)
    ref = x.float() @ (w8.float() * scale[:, None]).t()
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and not out.isnan().any()
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("m,n,k,tiles", [(1, 40, 128, (4, 64)), (2, 24, 200, (8, 64)), (1, 8, 96, None)])
def test_fp8_gemv(m, n, k, tiles):
    assert fp8_case(m, n, k, seed=m + n + k, tiles=tiles) < TOL[torch.bfloat16]


def test_fp8_gemv_bad_inputs():
    w8 = torch.zeros(8, 64, device=DEVICE).to(torch.float8_e4m3fn)
    x = torch.zeros(1, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="e4m3 weight"):
        gemv_fp8(x, w8.float(), torch.ones(8, device=DEVICE))            # not an fp8 weight
    with pytest.raises(ValueError, match="fp32 scales"):
        gemv_fp8(x, w8, torch.ones(4, device=DEVICE))                    # a scale per row
    with pytest.raises(ValueError, match="bf16/fp16"):
        gemv_fp8(x.float(), w8, torch.ones(8, device=DEVICE))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32000, 4096)])
def test_fp8_gemv_real_shapes(n, k):
    for pdl in (False, True):
        assert fp8_case(1, n, k, seed=n + k, pdl=pdl) < TOL[torch.bfloat16]


def test_gemv_bad_inputs():
    x = torch.randn(1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        gemv(x, torch.randn(8, 32, device=DEVICE))
    with pytest.raises(ValueError, match="weight"):
        gemv(x, torch.randn(8, 64, device=DEVICE).to(torch.bfloat16))          # dtypes differ
    with pytest.raises(ValueError, match="contiguous"):
        gemv(x, torch.randn(64, 8, device=DEVICE).t())


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.usefixtures("nan_filled_empty")
@pytest.mark.parametrize("n,k", [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008), (32000, 4096)])
def test_plain_gemv_real_shapes(n, k):
    gen = torch.Generator(device=DEVICE).manual_seed(n + k)
    w = (torch.randn(n, k, generator=gen, device=DEVICE) * 0.05).bfloat16()
    x = torch.randn(1, k, generator=gen, device=DEVICE).bfloat16()
    ref = torch.nn.functional.linear(x.float(), w.float())
    for pdl in (False, True):
        out = gemv(x, w, pdl=pdl)
        assert not out.isnan().any()
        assert float((out.float() - ref).norm() / ref.norm()) < TOL[torch.bfloat16]
