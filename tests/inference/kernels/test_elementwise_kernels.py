"""Element-wise Triton kernels (RMSNorm, SiLU-and-mul, rotary, KV-cache write) against their references.

On a machine without CUDA, conftest turns on TRITON_INTERPRET and the kernels run on CPU tensors at
small sizes; with CUDA the same tests run compiled on the GPU, plus the real-size cases (marked gpu).
Every test draws fresh random inputs; outputs the wrapper allocates come back NaN-filled from
torch.empty (see `_nan_filled_empty`), in-place targets are prefilled with sentinels.
"""
from __future__ import annotations

import os
import zlib

import pytest
import torch

from inference.kernels.activation import silu_and_mul, silu_and_mul_reference
from inference.kernels.kv_cache import write_kv_cache, write_kv_cache_reference
from inference.kernels.rms_norm import rms_norm, rms_norm_reference
from inference.kernels.rotary import rotary_embedding, rotary_reference
from inference.kernels.rotary_kv_cache import rotary_kv_cache, rotary_kv_cache_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
FP8 = torch.float8_e4m3fn
# Kernel output vs the fp32-math reference cast to the same dtype: both round nearly the same fp32
# value, so they differ by at most ~1 ulp (bf16 ulp is 2^-8..2^-7 relative, fp16 2^-11..2^-10).
TOL = {
    FP32: {"rtol": 1e-5, "atol": 1e-5},
    BF16: {"rtol": 1.6e-2, "atol": 1e-2},
    FP16: {"rtol": 2e-3, "atol": 2e-3},
}
# Values that must be bit-exact on the GPU (a rounded residual sum, a cast into the cache) may be 1 ulp
# off under the interpreter, whose fp32 -> bf16 cast truncates instead of rounding to nearest even.
EXACT = {"rtol": 0, "atol": 0}
EXACT_OR_INTERP_ULP = {FP32: EXACT, FP16: EXACT, BF16: {"rtol": 2 ** -7, "atol": 0} if INTERPRETED else EXACT}


@pytest.fixture(autouse=True)
def _nan_filled_empty(nan_filled_empty):
    """Every test here runs with NaN-filled torch.empty (tests/inference/kernels/conftest.py)."""


def _gen(*params) -> torch.Generator:
    """A generator seeded from the test's parameters: fresh inputs per case, reproducible."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(params).encode()))


def _randn(shape, dtype, gen, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=DEVICE) * scale).to(dtype)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: dict) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.float(), expected.float(), **tol)


def test_outputs_come_back_poisoned():
    assert torch.isnan(torch.empty(64, device=DEVICE)).all()
    assert torch.isnan(torch.empty(64, device=DEVICE, dtype=BF16)).all()


# --- RMSNorm -------------------------------------------------------------------------------------

def _check_rms_norm(num_tokens, hidden, dtype, with_residual, weight_dtype=None, row_pad=0):
    gen = _gen("rms_norm", num_tokens, hidden, dtype, with_residual, weight_dtype, row_pad)
    eps = 1e-5
    # Rows padded to hidden + row_pad: the kernel must honour the row stride and leave the pad alone.
    x_buf = _randn((num_tokens, hidden + row_pad), dtype, gen)
    x = x_buf[:, :hidden]                                              # [T, N], row stride N + pad
    weight = _randn((hidden,), weight_dtype or dtype, gen)
    if not with_residual:
        out = rms_norm(x, weight, eps)
        _assert_close(out, rms_norm_reference(x, weight, eps), TOL[dtype])
        assert out.is_contiguous()
        return
    res_buf = _randn((num_tokens, hidden + row_pad), dtype, gen, scale=4.0)
    residual = res_buf[:, :hidden]                                     # [T, N]
    res_before, x_before = res_buf.clone(), x_buf.clone()
    ref_out, ref_sum = rms_norm_reference(x, weight, eps, res_before[:, :hidden])
    out, returned = rms_norm(x, weight, eps, residual)
    assert returned is residual
    _assert_close(residual, ref_sum, EXACT_OR_INTERP_ULP[dtype])       # x + residual, in place
    _assert_close(out, ref_out, TOL[dtype])
    assert torch.equal(res_buf[:, hidden:], res_before[:, hidden:])    # row padding untouched
    assert torch.equal(x_buf, x_before)                                # x is read only


@pytest.mark.parametrize("dtype", [FP32, BF16, FP16])
@pytest.mark.parametrize("hidden", [7, 576, 4096])
@pytest.mark.parametrize("num_tokens", [1, 3, 17])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(num_tokens, hidden, dtype, with_residual):
    _check_rms_norm(num_tokens, hidden, dtype, with_residual)


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_rms_norm_strided_rows(dtype, with_residual):
    _check_rms_norm(5, 576, dtype, with_residual, row_pad=40)


def test_rms_norm_fp32_weight_with_bf16_activations():
    _check_rms_norm(3, 576, BF16, True, weight_dtype=FP32)


def test_rms_norm_no_tokens():
    x = torch.randn(0, 64, device=DEVICE)
    assert rms_norm(x, torch.ones(64, device=DEVICE), 1e-5).shape == (0, 64)


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("hidden", [4096, 8192])
@pytest.mark.parametrize("num_tokens", [1, 4096])
@pytest.mark.gpu
@requires_cuda
def test_rms_norm_real_size(num_tokens, hidden, dtype, with_residual):
    _check_rms_norm(num_tokens, hidden, dtype, with_residual)


# --- SiLU and mul --------------------------------------------------------------------------------

def _check_silu_and_mul(num_tokens, inter, dtype, scale=1.0, row_pad=0):
    gen = _gen("silu", num_tokens, inter, dtype, scale, row_pad)
    x = _randn((num_tokens, 2 * inter + row_pad), dtype, gen, scale)[:, :2 * inter]   # [T, 2I]
    out = silu_and_mul(x)
    assert out.is_contiguous()
    _assert_close(out, silu_and_mul_reference(x), TOL[dtype])


@pytest.mark.parametrize("dtype", [FP32, BF16, FP16])
@pytest.mark.parametrize("inter", [7, 1000, 1536, 2500])              # 1536: SmolLM2; >1024: several blocks
@pytest.mark.parametrize("num_tokens", [1, 3, 17])
def test_silu_and_mul(num_tokens, inter, dtype):
    _check_silu_and_mul(num_tokens, inter, dtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")   # numpy, interpreter
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_silu_and_mul_large_inputs_and_strided_rows(dtype):
    _check_silu_and_mul(4, 300, dtype, scale=30.0, row_pad=24)         # sigmoid saturates both ways


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("inter", [11008, 14336])
@pytest.mark.parametrize("num_tokens", [1, 4096])
@pytest.mark.gpu
@requires_cuda
def test_silu_and_mul_real_size(num_tokens, inter, dtype):
    _check_silu_and_mul(num_tokens, inter, dtype)


# --- Rotary embedding ----------------------------------------------------------------------------

def _cos_sin_cache(max_pos: int, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=DEVICE) / head_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64, device=DEVICE), inv_freq)   # [P, D/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()       # [P, D]


def _check_rotary(num_tokens, num_heads, num_kv_heads, head_dim, dtype, max_pos, strided=True):
    gen = _gen("rotary", num_tokens, num_heads, num_kv_heads, head_dim, dtype, max_pos, strided)
    cache = _cos_sin_cache(max_pos, head_dim)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen, device=DEVICE)
    positions[0] = max_pos - 1                                         # the table's last row
    q_k_size = (num_heads + num_kv_heads) * head_dim
    if strided:   # q and k rotated inside the fused qkv buffer, as the model does
        qkv = _randn((num_tokens, q_k_size + num_kv_heads * head_dim), dtype, gen)
        x = qkv[:, :q_k_size].view(num_tokens, num_heads + num_kv_heads, head_dim)   # [T, H + Hkv, D]
    else:
        qkv = _randn((num_tokens, q_k_size), dtype, gen)
        x = qkv.view(num_tokens, num_heads + num_kv_heads, head_dim)
    before = qkv.clone()
    expected = rotary_reference(positions, x, cache)
    assert rotary_embedding(positions, x, cache) is x
    _assert_close(x, expected, TOL[dtype])
    assert torch.equal(qkv[:, q_k_size:], before[:, q_k_size:])       # v untouched


@pytest.mark.parametrize("dtype", [FP32, BF16, FP16])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (3, 1)])
@pytest.mark.parametrize("num_tokens", [1, 3, 17])
def test_rotary(num_tokens, num_heads, num_kv_heads, head_dim, dtype):
    _check_rotary(num_tokens, num_heads, num_kv_heads, head_dim, dtype, max_pos=64)


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("head_dim", [32, 256])
def test_rotary_contiguous_and_many_heads(head_dim, dtype):
    # 9 + 3 heads of 256 span two programs (8 heads each); the second is partly masked.
    _check_rotary(5, 9, 3, head_dim, dtype, max_pos=300, strided=False)


def test_rotary_is_a_rotation():
    """Independent of the reference: rotating by p then by -p (transposed table) gives x back."""
    gen = _gen("rotary-inverse")
    cache = _cos_sin_cache(16, 64)
    x = _randn((6, 4, 64), FP32, gen)
    positions = torch.randint(0, 16, (6,), generator=gen, device=DEVICE)
    original = x.clone()
    rotary_embedding(positions, x, cache)
    assert not torch.allclose(x[positions > 0], original[positions > 0])
    inverse = torch.cat((cache[:, :32], -cache[:, 32:]), dim=-1).contiguous()   # cos(-a), sin(-a)
    rotary_embedding(positions, x, inverse)
    torch.testing.assert_close(x, original, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("num_tokens", [1, 4096])
@pytest.mark.gpu
@requires_cuda
def test_rotary_real_size(num_tokens, dtype):
    _check_rotary(num_tokens, 32, 8, 128, dtype, max_pos=8192)


# --- KV-cache write ------------------------------------------------------------------------------

SENTINEL = -1234.0          # exactly representable in fp16/bf16/fp32; randn never produces it


def _check_write_kv(num_tokens, num_kv_heads, head_dim, block_size, dtype, cache_dtype,
                    num_blocks, num_padding):
    gen = _gen("kv", num_tokens, num_kv_heads, head_dim, block_size, dtype, cache_dtype, num_blocks, num_padding)
    kv_size = num_kv_heads * head_dim
    # k and v as strided views of a fused qkv buffer (2 query heads in front).
    qkv = _randn((num_tokens, 2 * head_dim + 2 * kv_size), dtype, gen)
    k = qkv[:, 2 * head_dim:2 * head_dim + kv_size].view(num_tokens, num_kv_heads, head_dim)
    v = qkv[:, 2 * head_dim + kv_size:].view(num_tokens, num_kv_heads, head_dim)
    num_slots = num_blocks * block_size
    slot_mapping = torch.randperm(num_slots, generator=gen, device=DEVICE)[:num_tokens]   # distinct
    padded = torch.randperm(num_tokens, generator=gen, device=DEVICE)[:num_padding]
    slot_mapping[padded] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, SENTINEL, dtype=cache_dtype, device=DEVICE)
    v_cache = torch.full(shape, SENTINEL, dtype=cache_dtype, device=DEVICE)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    write_kv_cache_reference(k, v, k_expected, v_expected, slot_mapping)

    assert write_kv_cache(k, v, k_cache, v_cache, slot_mapping) is None

    written = torch.zeros(num_slots, dtype=torch.bool, device=DEVICE)
    written[slot_mapping[slot_mapping >= 0]] = True
    for cache, expected, src in ((k_cache, k_expected, k), (v_cache, v_expected, v)):
        flat = cache.view(num_slots, num_kv_heads, head_dim)
        assert (flat[~written] == SENTINEL).all()                      # other slots untouched
        exact = EXACT if dtype == cache_dtype else EXACT_OR_INTERP_ULP[cache_dtype]
        _assert_close(cache, expected, exact)
        valid = slot_mapping >= 0
        _assert_close(flat[slot_mapping[valid]].float(), src[valid].float(),
                      EXACT if cache_dtype == FP32 or dtype == cache_dtype else TOL[cache_dtype])


@pytest.mark.parametrize("dtype, cache_dtype", [(FP32, FP32), (BF16, BF16), (FP16, FP16), (BF16, FP32), (FP32, BF16)])
@pytest.mark.parametrize("num_kv_heads, head_dim", [(1, 16), (2, 64), (3, 128), (2, 80)])
@pytest.mark.parametrize("num_tokens, num_padding", [(1, 0), (3, 1), (17, 4)])
def test_write_kv_cache(num_tokens, num_padding, num_kv_heads, head_dim, dtype, cache_dtype):
    _check_write_kv(num_tokens, num_kv_heads, head_dim, 4, dtype, cache_dtype, num_blocks=8, num_padding=num_padding)


@pytest.mark.parametrize("block_size", [16, 32])
def test_write_kv_cache_all_padding_and_block_sizes(block_size):
    _check_write_kv(5, 2, 64, block_size, BF16, BF16, num_blocks=2, num_padding=5)
    _check_write_kv(5, 2, 64, block_size, BF16, BF16, num_blocks=2, num_padding=0)


@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_tokens, num_padding", [(1, 0), (4096, 100)])
@pytest.mark.gpu
@requires_cuda
def test_write_kv_cache_real_size(num_tokens, num_padding, block_size, dtype):
    _check_write_kv(num_tokens, 8, 128, block_size, dtype, dtype, num_blocks=8192 // block_size * 2,
                    num_padding=num_padding)


def _check_write_kv_fp8(num_tokens, num_kv_heads, head_dim, block_size, dtype, seed):
    """Into a float8 e4m3 cache: bytes equal to PyTorch's cast after saturation at +-448.

    Under the interpreter the inputs lie on the e4m3 grid (its fp32 -> fp8 rounding is wrong next
    to powers of two); on the GPU they are arbitrary, so the cast's rounding is checked too."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (num_tokens, num_kv_heads, head_dim)
    if INTERPRETED:
        k, v = (torch.randint(0, 256, shape, generator=gen, device=DEVICE, dtype=torch.uint8)
                .view(torch.float8_e4m3fn).float().nan_to_num(0.0).to(dtype) for _ in range(2))
    else:
        k, v = ((torch.randn(shape, generator=gen, device=DEVICE) * 60).to(dtype) for _ in range(2))
    k.view(-1)[:3] = torch.tensor([1000.0, -1e4, 448.0], dtype=dtype)        # saturate, not NaN
    num_blocks = -(-num_tokens // block_size) + 2
    slot_mapping = torch.randperm(num_blocks * block_size, generator=gen, device=DEVICE)[:num_tokens]
    slot_mapping[1::5] = -1                                                      # padding rows
    caches = [torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.float8_e4m3fn, device=DEVICE)
              for _ in range(4)]
    write_kv_cache(k, v, caches[0], caches[1], slot_mapping)
    write_kv_cache_reference(k, v, caches[2], caches[3], slot_mapping)
    for out, ref in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
    flat = caches[0].view(-1, num_kv_heads, head_dim)
    assert flat[slot_mapping[0], 0, :3].float().tolist() == [448.0, -448.0, 448.0]


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_write_kv_cache_fp8(dtype):
    _check_write_kv_fp8(9, 2, 32, 4, dtype, seed=1)


@pytest.mark.gpu
@requires_cuda
def test_write_kv_cache_fp8_real_size():
    _check_write_kv_fp8(4096, 8, 128, 16, BF16, seed=2)


# --- Bad inputs ----------------------------------------------------------------------------------

def _t(*shape, dtype=BF16):
    return torch.randn(shape, device=DEVICE).to(dtype)


def _kv_args(**over):
    args = {"k": _t(3, 2, 16), "v": _t(3, 2, 16), "k_cache": _t(2, 4, 2, 16), "v_cache": _t(2, 4, 2, 16),
            "slot_mapping": torch.arange(3, device=DEVICE)}
    args.update(over)
    return args


def _rot_args(**over):
    args = {"positions": torch.arange(3, device=DEVICE), "x": _t(3, 2, 16), "cos_sin_cache": _t(8, 16, dtype=FP32)}
    args.update(over)
    return args


BAD_INPUTS = {
    "rms 1-D x": (lambda: rms_norm(_t(64), _t(64), 1e-5), "must be 2-D"),
    "rms int x": (lambda: rms_norm(_t(2, 64, dtype=torch.int32), _t(64), 1e-5), "dtype"),
    "rms fp64 x": (lambda: rms_norm(_t(2, 64, dtype=torch.float64), _t(64), 1e-5), "dtype"),
    "rms weight len": (lambda: rms_norm(_t(2, 64), _t(63), 1e-5), r"weight must have shape \[64\]"),
    "rms weight dtype": (lambda: rms_norm(_t(2, 64), _t(64, dtype=FP16), 1e-5), "weight dtype"),
    "rms strided last dim": (lambda: rms_norm(_t(64, 2).t(), _t(64), 1e-5), "contiguous"),
    "rms residual shape": (lambda: rms_norm(_t(2, 64), _t(64), 1e-5, _t(3, 64)), "residual must have shape"),
    "rms residual dtype": (lambda: rms_norm(_t(2, 64), _t(64), 1e-5, _t(2, 64, dtype=FP32)), "residual dtype"),
    "rms residual overlap": (lambda: rms_norm(_t(2, 64), _t(64), 1e-5, _t(1, 64).expand(2, 64)), "overlap"),
    "silu odd width": (lambda: silu_and_mul(_t(2, 7)), "even"),
    "silu 3-D": (lambda: silu_and_mul(_t(2, 2, 8)), "2-D"),
    "silu int": (lambda: silu_and_mul(_t(2, 8, dtype=torch.int64)), "dtype"),
    "silu strided last dim": (lambda: silu_and_mul(_t(8, 2).t()), "contiguous"),
    "rot 2-D x": (lambda: rotary_embedding(**_rot_args(x=_t(3, 32))), "3-D"),
    "rot head_dim 24": (lambda: rotary_embedding(**_rot_args(x=_t(3, 2, 24), cos_sin_cache=_t(8, 24, dtype=FP32))),
                        "power of two"),
    "rot int32 positions": (lambda: rotary_embedding(**_rot_args(positions=torch.arange(3, device=DEVICE,
                                                                                         dtype=torch.int32))),
                            "int64"),
    "rot positions len": (lambda: rotary_embedding(**_rot_args(positions=torch.arange(4, device=DEVICE))),
                          r"positions must have shape \[3\]"),
    "rot bf16 cache": (lambda: rotary_embedding(**_rot_args(cos_sin_cache=_t(8, 16))), "float32"),
    "rot cache width": (lambda: rotary_embedding(**_rot_args(cos_sin_cache=_t(8, 32, dtype=FP32))),
                        r"\[max_pos, 16\]"),
    "rot strided last dim": (lambda: rotary_embedding(**_rot_args(x=_t(3, 16, 2).transpose(1, 2))), "contiguous"),
    "rot overlapping heads": (lambda: rotary_embedding(**_rot_args(x=_t(3, 1, 16).expand(3, 2, 16))), "overlap"),
    "kv v shape": (lambda: write_kv_cache(**_kv_args(v=_t(3, 1, 16))), "v shape"),
    "kv cache 3-D": (lambda: write_kv_cache(**_kv_args(k_cache=_t(8, 2, 16), v_cache=_t(8, 2, 16))), "4-D"),
    "kv cache heads": (lambda: write_kv_cache(**_kv_args(k_cache=_t(2, 4, 1, 16), v_cache=_t(2, 4, 1, 16))),
                       "must match"),
    "kv k/v dtypes": (lambda: write_kv_cache(**_kv_args(v=_t(3, 2, 16, dtype=FP32))), "share a dtype"),
    "kv cache dtypes": (lambda: write_kv_cache(**_kv_args(v_cache=_t(2, 4, 2, 16, dtype=FP32))), "share a dtype"),
    "kv fp64 k": (lambda: write_kv_cache(**_kv_args(k=_t(3, 2, 16, dtype=torch.float64),
                                                    v=_t(3, 2, 16, dtype=torch.float64))), "dtype"),
    "kv int32 slots": (lambda: write_kv_cache(**_kv_args(slot_mapping=torch.arange(3, device=DEVICE,
                                                                                    dtype=torch.int32))), "int64"),
    "kv slots len": (lambda: write_kv_cache(**_kv_args(slot_mapping=torch.arange(2, device=DEVICE))),
                     r"slot_mapping must have shape \[3\]"),
    "kv strided cache": (lambda: write_kv_cache(**_kv_args(k_cache=_t(4, 2, 2, 16).transpose(0, 1))),
                         "contiguous"),
    "kv strided last dim": (lambda: write_kv_cache(**_kv_args(k=_t(3, 16, 2).transpose(1, 2))), "contiguous"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_inputs_raise_value_error(name):
    call, message = BAD_INPUTS[name]
    with pytest.raises(ValueError, match=message):
        call()


# --- RoPE + KV-cache write in one kernel ---------------------------------------------------------

def _check_rotary_kv_cache(num_tokens, num_heads, num_kv_heads, head_dim, block_size, dtype, cache_dtype,
                           num_padding, max_pos=64):
    """The fused kernel against the unfused reference (rotary_reference, then the cache write), on
    qkv rows with padding after each token (a wider token stride) and a cache prefilled with a
    sentinel: q/k rotated in place, v untouched, the pad untouched, only the tokens' slots written."""
    gen = _gen("rope-kv", num_tokens, num_heads, num_kv_heads, head_dim, block_size, dtype, cache_dtype, num_padding)
    cache = _cos_sin_cache(max_pos, head_dim)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen, device=DEVICE)
    positions[0] = max_pos - 1
    rows = num_heads + 2 * num_kv_heads
    if cache_dtype == FP8 and INTERPRETED:
        # on the e4m3 grid, so v's cast is exact (the interpreter's fp32 -> fp8 rounding is wrong)
        buf = (torch.randint(0, 256, (num_tokens, rows * head_dim + 8), generator=gen, device=DEVICE,
                             dtype=torch.uint8).view(FP8).float().nan_to_num(0.0).to(dtype))
    else:
        buf = _randn((num_tokens, rows * head_dim + 8), dtype, gen, scale=60.0 if cache_dtype == FP8 else 1.0)
    qkv = buf[:, :rows * head_dim].view(num_tokens, rows, head_dim)   # [T, H + 2 Hkv, D], token stride + 8
    if cache_dtype == FP8:
        qkv[:, num_heads + num_kv_heads, :2] = torch.tensor([1000.0, -1e4], dtype=dtype)   # saturate, not NaN
    num_blocks = -(-num_tokens // block_size) + 2
    num_slots = num_blocks * block_size
    slot_mapping = torch.randperm(num_slots, generator=gen, device=DEVICE)[:num_tokens]
    slot_mapping[torch.randperm(num_tokens, generator=gen, device=DEVICE)[:num_padding]] = -1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if cache_dtype == FP8:
        k_cache, v_cache = (torch.zeros(shape, dtype=FP8, device=DEVICE) for _ in range(2))
    else:
        k_cache, v_cache = (torch.full(shape, SENTINEL, dtype=cache_dtype, device=DEVICE) for _ in range(2))
    expected_buf, k_expected, v_expected = buf.clone(), k_cache.clone(), v_cache.clone()
    expected_qkv = expected_buf[:, :rows * head_dim].view(num_tokens, rows, head_dim)
    rotary_kv_cache_reference(positions, expected_qkv, cache, k_expected, v_expected, slot_mapping,
                              num_heads, num_kv_heads)

    assert rotary_kv_cache(positions, qkv, cache, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads) is None

    assert torch.equal(buf[:, rows * head_dim:], expected_buf[:, rows * head_dim:])          # row pad
    assert torch.equal(qkv[:, num_heads + num_kv_heads:], expected_qkv[:, num_heads + num_kv_heads:])   # v
    _assert_close(qkv[:, :num_heads + num_kv_heads], expected_qkv[:, :num_heads + num_kv_heads], TOL[dtype])
    if cache_dtype == FP8:
        # bytes equal to PyTorch's saturating cast; the rotated k only on the GPU, as its values are
        # off the e4m3 grid, where the interpreter's cast misrounds
        assert torch.equal(v_cache.view(torch.uint8), v_expected.view(torch.uint8))
        if not INTERPRETED:
            # the rotation's fp32 rounding (FMA or not) may tip a bf16 k, and so its e4m3 code, by
            # one step: close within one e4m3 step (2^-3 relative), and rarely off at all
            k_out, k_ref = k_cache.float(), k_expected.float()
            torch.testing.assert_close(k_out, k_ref, rtol=2 ** -3, atol=2 ** -9)
            assert (k_out != k_ref).float().mean() < 0.01
        assert v_cache.float().isfinite().all() and v_cache.float().abs().max() == 448   # saturated
        return
    written = torch.zeros(num_slots, dtype=torch.bool, device=DEVICE)
    written[slot_mapping[slot_mapping >= 0]] = True
    for out, _ref in ((k_cache, k_expected), (v_cache, v_expected)):
        flat = out.view(num_slots, num_kv_heads, head_dim)
        assert (flat[~written] == SENTINEL).all()
    # v is copied exactly; k is the rotated value, within the rotation's rounding
    _assert_close(v_cache, v_expected, EXACT if dtype == cache_dtype else EXACT_OR_INTERP_ULP[cache_dtype])
    _assert_close(k_cache, k_expected, TOL[dtype])        # rounded to qkv's dtype on both sides
    # and the cached k is exactly the k the kernel left in qkv (the attention reads either)
    valid = slot_mapping >= 0
    if dtype == cache_dtype:
        cached_k = k_cache.view(num_slots, num_kv_heads, head_dim)[slot_mapping[valid]]
        assert torch.equal(cached_k, qkv[valid, num_heads:num_heads + num_kv_heads])


@pytest.mark.parametrize("dtype, cache_dtype", [(FP32, FP32), (BF16, BF16), (FP16, FP16), (BF16, FP32)])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 2, 16), (3, 3, 64), (8, 1, 32)])
@pytest.mark.parametrize("num_tokens, num_padding", [(1, 0), (5, 2)])
def test_rotary_kv_cache(num_tokens, num_padding, num_heads, num_kv_heads, head_dim, dtype, cache_dtype):
    _check_rotary_kv_cache(num_tokens, num_heads, num_kv_heads, head_dim, 4, dtype, cache_dtype, num_padding)


def test_rotary_kv_cache_fp8_and_many_heads():
    _check_rotary_kv_cache(6, 4, 2, 32, 4, BF16, FP8, num_padding=1)
    # 16 + 2 x 8 heads of 128 span two programs of 16 heads: k and v rows in the second one
    _check_rotary_kv_cache(3, 16, 8, 128, 16, BF16, BF16, num_padding=1, max_pos=300)


def test_rotary_kv_cache_bad_inputs():
    qkv = torch.zeros(2, 8, 16, device=DEVICE)
    cache = torch.zeros(2, 4, 2, 16, device=DEVICE)
    pos = torch.zeros(2, dtype=torch.long, device=DEVICE)
    table = _cos_sin_cache(4, 16)
    with pytest.raises(ValueError, match="heads"):
        rotary_kv_cache(pos, qkv, table, cache, cache.clone(), pos, 3, 2)
    with pytest.raises(ValueError, match="packed"):
        rotary_kv_cache(pos, torch.zeros(2, 8, 32, device=DEVICE)[..., :16], table, cache, cache.clone(), pos, 4, 2)
    with pytest.raises(ValueError, match="int64"):
        rotary_kv_cache(pos.int(), qkv, table, cache, cache.clone(), pos, 4, 2)


@pytest.mark.parametrize("num_tokens, num_padding", [(1, 0), (4096, 100)])
@pytest.mark.gpu
@requires_cuda
def test_rotary_kv_cache_real_size(num_tokens, num_padding):
    _check_rotary_kv_cache(num_tokens, 32, 32, 128, 16, BF16, BF16, num_padding, max_pos=8192)
    _check_rotary_kv_cache(num_tokens, 32, 8, 128, 16, BF16, BF16, num_padding, max_pos=8192)
    _check_rotary_kv_cache(num_tokens, 32, 8, 128, 16, BF16, FP8, num_padding, max_pos=8192)
