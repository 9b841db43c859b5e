"""GGUFCpuLinear (the AVX-512 VNNI kernel over GGUF 4-bit blocks, inference/kernels/gguf_matmul.cpp)
against dequantize-then-matmul of the same codes, and its rows' independence from the batch."""
from __future__ import annotations

import pytest
import torch

from inference.models.gguf_cpu_linear import GGUFCpuLinear, gguf_matmul_available

pytestmark = pytest.mark.skipif(not gguf_matmul_available(), reason="no AVX-512 VNNI build of the CPU kernels here")


def _layer(out: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, n), generator=g)
    d = (torch.rand(out, n // 32, generator=g) * 0.02).half().float()
    m = (-8 * d + (torch.rand(out, n // 32, generator=g) - 0.5) * 0.01).half().float()
    w = (codes.view(out, -1, 32).float() * d[..., None] + m[..., None]).view(out, n)
    return GGUFCpuLinear(codes, d, m), w


@pytest.mark.parametrize("out,n", [(96, 576), (64, 1536), (40, 64), (33, 96)])   # 18, 48, 2, 3 groups
def test_matches_dequantize_then_matmul(out, n):
    layer, w = _layer(out, n, seed=n)
    x = torch.randn(11, n, generator=torch.Generator().manual_seed(1)).bfloat16()
    want = x.double() @ w.double().T
    got = layer(x).double()
    # int8 activations per 32 values (as llama.cpp's q8 dot) and a bf16 result
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
    assert float((got - want).norm() / want.norm()) < 1e-2


def test_a_row_gets_the_same_bits_alone_and_in_any_batch():
    layer, _ = _layer(128, 576, seed=3)
    x = torch.randn(21, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    batch = layer(x)                                         # tiles of 8 rows, then single rows
    for r in range(21):
        assert torch.equal(layer(x[r:r + 1]), batch[r:r + 1])
    assert torch.equal(layer(x[5:14]), batch[5:14])


def test_leading_dimensions_are_kept():
    layer, _ = _layer(32, 64, seed=4)
    x = torch.randn(2, 3, 64).bfloat16()
    assert torch.equal(layer(x), layer(x.reshape(6, 64)).view(2, 3, 32))


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match="scales"):
        GGUFCpuLinear(torch.zeros(4, 64, dtype=torch.long), torch.zeros(4, 3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="0..15"):
        GGUFCpuLinear(torch.full((4, 64), 16), torch.zeros(4, 2), torch.zeros(4, 2))
    layer, _ = _layer(8, 64, seed=5)
    with pytest.raises(RuntimeError, match="does not fit"):
        layer(torch.zeros(1, 96).bfloat16())


@pytest.mark.parametrize("out,n", [(300, 576), (17, 96)])      # 18 and 3 groups (a half chunk at the end)
def test_q8_0_matches_dequantize_then_matmul_and_ignores_the_batch(out, n):
    from inference.models.gguf_cpu_linear import GGUFQ8CpuLinear
    g = torch.Generator().manual_seed(out)
    codes = torch.randint(-128, 128, (out, n), generator=g).to(torch.int8)
    d = (torch.rand(out, n // 32, generator=g) * 0.02).half().float()
    w = (codes.view(out, -1, 32).float() * d[..., None]).view(out, n)
    layer = GGUFQ8CpuLinear(codes, d)
    x = torch.randn(9, n, generator=g).bfloat16()
    want = x.double() @ w.double().T
    got = layer(x)
    assert float((got.double() - want).norm() / want.norm()) < 1e-2
    for r in range(9):
        assert torch.equal(layer(x[r:r + 1]), got[r:r + 1])
