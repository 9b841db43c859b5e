"""Per-token FP8 activation quantization kernel vs its PyTorch reference.

Under the CPU interpreter the inputs are e4m3 grid values times a power of two per row (so no
rounding happens: the interpreter's fp32 -> fp8 cast misrounds next to powers of two); on a GPU
they are arbitrary and the bytes must equal PyTorch's cast.
"""
from __future__ import annotations

import pytest
import torch

from inference.kernels.fp8_quant import per_token_fp8, per_token_fp8_reference

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def inputs(m: int, k: int, dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    if CUDA:
        return (torch.randn(m, k, generator=gen, device=DEVICE) * 3).to(dtype)
    codes = torch.randint(0, 256, (m, k), generator=gen, device=DEVICE, dtype=torch.uint8)
    grid = codes.view(torch.float8_e4m3fn).float().nan_to_num(0.0).clamp(-448, 448)
    grid[:, 0] = 448.0                                                  # every row's max: 448 * 2^e
    scale = 2.0 ** torch.randint(-12, 2, (m, 1), generator=gen, device=DEVICE).float()
    return (grid * scale).to(dtype)


@pytest.mark.parametrize("m,k,pad", [(1, 64, 16), (5, 200, 16), (16, 96, 16), (3, 40, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("one_pass", [True, False])
def test_matches_reference(m, k, pad, dtype, one_pass):
    x = inputs(m, k, dtype, seed=m + k)
    x[m // 2] = 0                                                       # an all-zero row: tiny scale, zeros
    # two passes: several 32-column blocks per row; one pass: the row padded to a power of two
    q, s = per_token_fp8(x, pad_rows_to=pad, block_k=32, one_pass=one_pass)
    rq, rs = per_token_fp8_reference(x, pad_rows_to=pad)
    assert q.shape == rq.shape == (-(-m // pad) * pad, k) and s.shape == (q.shape[0], 1)
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert (q[m:].float() == 0).all() and (s[m:] == 1).all()           # padding rows


def test_bad_inputs():
    with pytest.raises(ValueError, match="2-D"):
        per_token_fp8(torch.zeros(2, 3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        per_token_fp8(torch.zeros(8, 4, device=DEVICE).t())
    with pytest.raises(ValueError, match="fp32/fp16/bf16"):
        per_token_fp8(torch.zeros(2, 4, dtype=torch.int32, device=DEVICE))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("m,k", [(1, 4096), (7, 11008), (300, 4096), (2048, 4096), (3, 20000)])
def test_real_shapes(m, k):
    x = inputs(m, k, torch.bfloat16, seed=m)
    q, s = per_token_fp8(x)
    rq, rs = per_token_fp8_reference(x, pad_rows_to=16)
    torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
    assert (q.float() - rq.float()).abs().max() == 0
