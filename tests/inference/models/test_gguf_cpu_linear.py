"""GGUFCpuLinear (the AVX-512 VNNI kernel over a GGUF file's blocks, inference/kernels/gguf_matmul.cpp)
against dequantize-then-matmul of the same codes, for every type it runs, alone and as segments of
one fused layer, with a bias; and its rows' independence from the batch."""
from __future__ import annotations

import pytest
import torch

from inference.loader.gguf_codes import BlockCodes, decode_blocks
from inference.models.gguf_cpu_linear import GGUFCpuLinear, gguf_matmul_available
from tests.helpers.gguf_blocks import ALL_KINDS, random_blocks

pytestmark = pytest.mark.skipif(not gguf_matmul_available(), reason="no AVX-512 VNNI build of the CPU kernels here")


def _codes(kind: str, out: int, n: int, seed: int) -> BlockCodes:
    return decode_blocks(random_blocks(kind, out, n, seed), "w", kind, out, n)


def _check(layer: GGUFCpuLinear, w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    want = x.double() @ w.double().T + (0 if bias is None else bias.double())
    got = layer(x)
    err = (got.double() - want)
    # int8 activations per 32 values (as llama.cpp's q8 dot) and a bf16 result
    assert float(err.norm() / want.norm()) < 1e-2
    assert float(err.abs().max() / want.abs().max()) < 3e-2
    return got


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("out,n", [(48, 512), (40, 768)])          # 40: a last block of 8 rows
def test_each_type_matches_dequantize_then_matmul(kind, out, n):
    codes = _codes(kind, out, n, seed=out + ALL_KINDS.index(kind))
    x = torch.randn(13, n, generator=torch.Generator().manual_seed(n)).bfloat16()
    _check(GGUFCpuLinear([codes]), codes.dequantized(), x)


def test_mixed_segments_with_a_bias_match_one_dequantized_weight():
    """q (Q5_0) | k (Q6_K) | v (Q8_0) fused, as a Qwen2 layer of a Q4_K_M file."""
    parts = [_codes("Q5_0", 64, 256, 1), _codes("Q6_K", 32, 256, 2), _codes("Q8_0", 32, 256, 3)]
    bias = torch.randn(128, generator=torch.Generator().manual_seed(4))
    layer = GGUFCpuLinear(parts, bias)
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(5)).bfloat16()
    _check(layer, torch.cat([p.dequantized() for p in parts]), x, bias)
    assert layer.out_features == 128 and layer.types == ["Q5_0", "Q6_K", "Q8_0"]


@pytest.mark.parametrize("kind", ["Q5_0", "Q4_K", "Q6_K", "Q8_0"])
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(kind):
    layer = GGUFCpuLinear([_codes(kind, 64, 512, seed=3)], torch.randn(64))
    x = torch.randn(21, 512, generator=torch.Generator().manual_seed(2)).bfloat16()
    batch = layer(x)                                         # tiles of 6 rows, then the rest
    for r in range(21):
        assert torch.equal(layer(x[r:r + 1]), batch[r:r + 1])
    assert torch.equal(layer(x[5:14]), batch[5:14])


@pytest.mark.parametrize("kind", ["Q5_0", "Q6_K", "Q8_0"])
def test_fp32_outputs_are_the_bf16_outputs_before_rounding(kind):
    """The LM head's logits come out in fp32: the same sums, not rounded to bf16's 8 mantissa bits."""
    codes, bias = _codes(kind, 48, 512, seed=7), torch.randn(48, generator=torch.Generator().manual_seed(8))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(9)).bfloat16()
    rounded = GGUFCpuLinear([codes], bias)(x)
    full = GGUFCpuLinear([codes], bias, f32_out=True)(x)
    assert rounded.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert torch.equal(full.bfloat16(), rounded)
    assert (full != rounded.float()).float().mean() > 0.9
    _check(GGUFCpuLinear([codes], bias, f32_out=True), codes.dequantized(), x, bias)


def test_leading_dimensions_are_kept():
    layer = GGUFCpuLinear([_codes("Q4_1", 32, 64, seed=4)])
    x = torch.randn(2, 3, 64).bfloat16()
    assert torch.equal(layer(x), layer(x.reshape(6, 64)).view(2, 3, 32))


def test_bad_shapes_and_codes_are_value_errors():
    good = _codes("Q4_1", 8, 64, seed=5)
    with pytest.raises(ValueError, match="scales"):
        GGUFCpuLinear([BlockCodes("Q4_1", good.codes, good.scale[:, :1], good.zero[:, :1])])
    with pytest.raises(ValueError, match="codes must lie in 0..15"):
        GGUFCpuLinear([BlockCodes("Q4_1", torch.full((8, 64), 16, dtype=torch.uint8), good.scale, good.zero)])
    with pytest.raises(ValueError, match="multiple of 16"):
        GGUFCpuLinear([good, good])                          # 8 rows, then more: a block would straddle
    with pytest.raises(ValueError, match="type Q3_K"):
        GGUFCpuLinear([BlockCodes("Q3_K", good.codes, good.scale, good.zero)])
    with pytest.raises(ValueError, match="x has 96 features, the weight 64"):
        GGUFCpuLinear([good])(torch.zeros(1, 96).bfloat16())


def _lower_levels() -> list[str]:
    from inference.kernels.cpu_ops import selected_isa, supported_isa_levels
    levels = supported_isa_levels()
    return levels[levels.index(selected_isa()) + 1:] if selected_isa() in levels else []


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_lower_isa_level_gives_the_same_bits(kind):
    """The AVX2 build (VPMADDUBSW) against the selected one (AVX-512 VNNI here): same integers, same
    fp32 operations in the same order. A machine with only the lowest level has nothing to compare."""
    from inference.kernels.cpu_ops import cpu_ops_at
    levels = _lower_levels()
    if not levels:
        pytest.skip("this CPU runs one ISA level only: nothing lower to compare with")
    layer = GGUFCpuLinear([_codes(kind, 48, 512, seed=7), _codes("Q8_0", 40, 512, seed=8)], torch.randn(88))
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(6)).bfloat16() * 3
    want = layer.ops.gguf_linear(x, layer.codes, layer.scales, layer.mins, layer.kinds, layer.bias, False)
    for isa in levels:
        ops = cpu_ops_at(isa)
        assert ops.gguf_matmul_isa() == isa
        got = ops.gguf_linear(x, layer.codes, layer.scales, layer.mins, layer.kinds, layer.bias, False)
        assert torch.equal(got, want), isa
