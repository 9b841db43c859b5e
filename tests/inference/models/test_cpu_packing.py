"""Packed bf16 linears (inference/models/cpu_packing.py): row counts are padded to a few buckets so
oneDNN compiles a bounded set of primitives, and padding changes no row's result."""
from __future__ import annotations

import pytest
import torch

from inference.models.cpu_packing import (
    PackedLinear,
    cpu_packing_available,
    padded_rows,
)


def test_padded_rows_are_few_and_waste_at_most_a_quarter():
    sizes = [padded_rows(m) for m in range(1, 513)]
    assert all(p >= m for m, p in zip(range(1, 513), sizes))
    assert sizes == sorted(sizes)
    assert [padded_rows(m) for m in (1, 2, 3, 5, 8, 9, 17, 33, 100, 512)] == [1, 2, 4, 8, 8, 10, 20, 40, 112, 512]
    assert max(padded_rows(m) / m for m in range(9, 4097)) <= 1.25
    assert len(set(sizes)) <= 28          # every step size up to max_num_batched_tokens=512


@pytest.mark.skipif(not cpu_packing_available(torch.bfloat16, torch.device("cpu")),
                    reason="oneDNN's packed bf16 layout does not run on this CPU")
@pytest.mark.parametrize("num_rows", [1, 3, 9, 37, 130])
def test_padding_changes_no_row(num_rows):
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64, dtype=torch.bfloat16), torch.randn(96, dtype=torch.bfloat16)
    layer = PackedLinear(weight, bias)
    x = torch.randn(num_rows, 64, dtype=torch.bfloat16)
    exact = torch.ops.mkldnn._linear_pointwise(x, layer.packed_weight, bias, "none", [], "")   # unpadded
    with torch.inference_mode():
        out = layer(x)
        assert out.shape == (num_rows, 96)
        torch.testing.assert_close(out, exact, rtol=0, atol=0)
        torch.testing.assert_close(out.float(), x.float() @ weight.float().T + bias.float(), rtol=2e-2, atol=2e-1)
        assert layer(x.view(1, num_rows, 64)).shape == (1, num_rows, 96)
