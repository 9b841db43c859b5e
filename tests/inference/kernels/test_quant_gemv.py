"""The decode GEMV's code conversions (inference/kernels/quant_gemv.py, CONVERT 1-3).

The PTX strings (inference/kernels/gemv_codes.py) cannot run on the CPU, so they run here through a small model
of the PTX they use (prmt, lop3, shr, mov, f16x2 sub / mul / fma, cvt, add): the same strings the kernel hands to
tl.inline_asm_elementwise, fed words packed the way Triton packs them (element j of a pack in byte
j, little-endian), checked against the codes' column order (int8: byte j = column j; int4: byte b
holds column 2b in its low nibble and 2b + 1 in its high one). The kernel's variants also run
under the interpreter, where the same bit operations are Triton ops (EMULATE). On a GPU: every
variant against the reference on the 7B shapes, outputs poisoned with NaN first.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from inference.kernels import gemv_codes as gc
from inference.kernels import quant_gemv as qg
from tests.inference.kernels.test_quant_matmul import CUDA, DEVICE, TOL, run_case

MASK32 = 0xFFFFFFFF


# ---- a model of the PTX subset the conversions use, on int64 tensors of bit patterns ----------

def f16_of(bits16: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(bits16.numpy().astype(np.uint16).view(np.float16).astype(np.float64))


def bits_of_f16(v: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(v.numpy().astype(np.float16).view(np.uint16).astype(np.int64))


def halves(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return f16_of(r & 0xFFFF), f16_of((r >> 16) & 0xFFFF)


def pack_halves(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """fp64 values, each rounded once to fp16 (an f16x2 op's single rounding)."""
    return bits_of_f16(lo) | (bits_of_f16(hi) << 16)


def prmt(a: torch.Tensor, b: torch.Tensor, sel: int) -> torch.Tensor:
    """Default mode: result byte i = byte (sel >> 4i) & 7 of {b, a} (a = bytes 0-3, b = 4-7)."""
    src = (a & MASK32) | ((b & MASK32) << 32)
    out = torch.zeros_like(a)
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        assert nib < 8, "sign-replicating selectors are not modelled"
        out |= ((src >> (8 * nib)) & 0xFF) << (8 * i)
    return out


def lop3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, lut: int) -> torch.Tensor:
    """Bit k of the result = bit (4 a_k + 2 b_k + c_k) of lut."""
    out = torch.zeros_like(a)
    for idx in range(8):
        if lut >> idx & 1:
            ta = a if idx & 4 else ~a
            tb = b if idx & 2 else ~b
            tc = c if idx & 1 else ~c
            out |= ta & tb & tc
    return out & MASK32


def run_ptx(asm: str, inputs: list[torch.Tensor], num_outputs: int) -> list[torch.Tensor]:
    """Interpret asm with $0..$(num_outputs - 1) as outputs and the rest as inputs (bit patterns;
    64-bit inputs as int64)."""
    regs = {f"${num_outputs + i}": t.clone() for i, t in enumerate(inputs)}
    shape = inputs[0].shape

    def val(tok: str) -> torch.Tensor:
        tok = tok.strip()
        if tok.startswith("0x"):
            return torch.full(shape, int(tok, 16), dtype=torch.int64)
        if tok.isdigit():
            return torch.full(shape, int(tok), dtype=torch.int64)
        return regs[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op in ("mov.b32", "mov.b64") and rest.startswith("{"):
            names, src = re.match(r"\{(.*)\},\s*(\S+)", rest).groups()
            lo, hi = (n.strip() for n in names.split(","))
            width = 16 if op == "mov.b32" else 32
            regs[lo] = val(src) & ((1 << width) - 1)
            regs[hi] = (val(src) >> width) & ((1 << width) - 1)
            continue
        d, *srcs = (t.strip() for t in rest.split(","))
        v = [val(s) for s in srcs]
        if op == "prmt.b32":
            regs[d] = prmt(v[0], v[1], int(srcs[2], 16))
        elif op == "lop3.b32":
            regs[d] = lop3(v[0], v[1], v[2], int(srcs[3], 16))
        elif op == "shr.b32":                                   # logical: zero fill
            regs[d] = (v[0] & MASK32) >> int(srcs[1])
        elif op == "mov.b32":
            regs[d] = v[0] & MASK32
        elif op in ("sub.f16x2", "mul.rn.f16x2", "fma.rn.f16x2"):
            (a0, a1), (b0, b1) = halves(v[0]), halves(v[1])
            if op == "sub.f16x2":
                regs[d] = pack_halves(a0 - b0, a1 - b1)
            elif op == "mul.rn.f16x2":
                regs[d] = pack_halves(a0 * b0, a1 * b1)
            else:
                c0, c1 = halves(v[2])
                regs[d] = pack_halves(a0 * b0 + c0, a1 * b1 + c1)
        elif op == "cvt.f32.f16":
            regs[d] = torch.from_numpy(f16_of(v[0]).numpy().astype(np.float32).view(np.uint32).astype(np.int64))
        elif op == "add.f32":
            f = [torch.from_numpy((t & MASK32).numpy().astype(np.uint32).view(np.float32)) for t in v]
            regs[d] = torch.from_numpy((f[0] + f[1]).numpy().view(np.uint32).astype(np.int64))
        else:
            raise AssertionError(f"PTX op not modelled: {op}")
    return [regs[f"${i}"] for i in range(num_outputs)]


def as_f32(bits: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy((bits & MASK32).numpy().astype(np.uint32).view(np.float32))


def pack_bytes(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n] -> little-endian words [..., n / w] of w = n bytes each (int64 bit patterns)."""
    b = b.to(torch.int64)
    return sum(b[..., j] << (8 * j) for j in range(b.shape[-1]))


# ---- the PTX strings, in that model ------------------------------------------------------------

@pytest.mark.parametrize("convert", [1, 2])
def test_ptx_int8_codes_keep_byte_order(convert):
    gen = torch.Generator().manual_seed(convert)
    q = torch.randint(0, 256, (512, 4), generator=gen, dtype=torch.uint8)
    q[0] = torch.tensor([0, 255, 1, 128], dtype=torch.uint8)
    outs = run_ptx(gc.ASM_U8[convert], [pack_bytes(q)], 4)          # pack 4: element j = byte j
    got = torch.stack([as_f32(o) for o in outs], -1)
    want = q.float() + (1024 if convert == 2 else 0)
    assert torch.equal(got, want)


@pytest.mark.parametrize("convert", [1, 2])
def test_ptx_int4_codes_even_low_odd_high(convert):
    gen = torch.Generator().manual_seed(10 + convert)
    nib = torch.randint(0, 16, (512, 8), generator=gen, dtype=torch.uint8)    # columns 0..7 of 4 bytes
    nib[0] = torch.tensor([0, 15, 15, 0, 1, 2, 14, 13], dtype=torch.uint8)
    byte = nib[:, 0::2] | (nib[:, 1::2] << 4)                                  # inference/quantization pack_int4
    outs = [as_f32(o) for o in run_ptx(gc.ASM_U4[convert], [pack_bytes(byte)], 8)]
    lo, hi = torch.stack(outs[:4], -1), torch.stack(outs[4:], -1)             # results 0 / 1, element j = byte j
    if convert == 1:
        assert torch.equal(lo, nib[:, 0::2].float()) and torch.equal(hi, nib[:, 1::2].float())
    else:                                                                      # the kernel takes these offsets off
        assert torch.equal(lo, 1024 + nib[:, 0::2].float()) and torch.equal(hi, 1024 + 16 * nib[:, 1::2].float())


@pytest.mark.parametrize("bits", [8, 4])
def test_ptx_hfma2_pairs_match_columns(bits):
    """An 8-column chunk of one row: word of codes + x pairs per gc.PAIRS -> the chunk's dot."""
    gen = torch.Generator().manual_seed(bits)
    n = 2048
    q = torch.randint(0, 2 ** bits, (n, 8), generator=gen, dtype=torch.uint8)  # columns 0..7
    scale_log2 = gc.HFMA2_X_MAX_LOG2[bits]
    x = (torch.rand(n, 8, generator=gen) * 2 - 1) * 2.0 ** scale_log2          # |x'| < 2^E, as the kernel scales
    x[0] = 2.0 ** scale_log2 * 0.999                                           # the largest products
    q[0] = 2 ** bits - 1
    x16 = x.half().double()                                                    # what the pairs hold
    word = pack_bytes(q if bits == 8 else q[:, 0::2] | (q[:, 1::2] << 4))
    pairs = [pack_halves(x16[:, a], x16[:, b]) for a, b in gc.PAIRS[bits]]
    (out,) = run_ptx(gc.ASM_HFMA2[bits], [word] + pairs, 1)
    got = as_f32(out).double()
    want = (q.double() * x16).sum(1)
    assert torch.isfinite(got).all()
    scale = (q.double() * x16.abs()).sum(1)                                    # the products' magnitude
    assert ((got - want).abs() / scale).max() < 2e-3


def test_ptx_model_itself():
    a = torch.tensor([0x11223344], dtype=torch.int64)
    assert prmt(a, torch.tensor([0x55667788]), 0x4140).item() == 0x88338844   # bytes [a0, b0, a1, b0]
    assert (lop3(a, torch.tensor([0x0F0F0F0F]), torch.tensor([0x80000000]), 0xEA).item()
            == (0x11223344 & 0x0F0F0F0F) | 0x80000000)
    assert f16_of(torch.tensor([gc.F16_1024 | 7])).item() == 1031.0
    assert halves(torch.tensor([gc.F16X2_SIXTEENTH]))[0].item() == 1 / 16
    assert halves(torch.tensor([gc.F16X2_NEG_64]))[1].item() == -64.0


# ---- the kernel's variants under the interpreter (EMULATE) or on the GPU ----------------------

@pytest.mark.parametrize("convert", [1, 2, 3])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m,n,k,group,tiles", [
    (1, 40, 128, 32, (16, 64)),         # two groups per slab, ragged N
    (3, 24, 96, 32, (16, 64)),          # K tail: the last slab half empty
    (2, 16, 176, 32, (8, 32)),          # short last group (K = 5.5 groups)
    (2, 24, 200, -1, (16, 64)),         # per channel, K not a power of two
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_variants(convert, bits, m, n, k, group, tiles, dtype):
    def kernel(*args, **kw):
        return qg.quant_gemv(*args, convert=convert, **kw)
    tol = TOL[dtype] if convert != 3 else max(TOL[dtype], 3e-3)       # CONVERT 3: fp16 products
    assert run_case(kernel, m, n, k, bits, group, dtype, seed=m + n + k + bits, tiles=tiles) < tol


def test_variant_input_checks():
    x = torch.randn(1, 100, device=DEVICE)
    q = torch.zeros(8, 100, dtype=torch.uint8, device=DEVICE)
    s = torch.ones(8, 1, device=DEVICE)
    with pytest.raises(ValueError, match="convert"):
        qg.quant_gemv(x, q, s, s, 8, 100, convert=5)
    with pytest.raises(ValueError, match="8 codes"):
        qg.quant_gemv(x, q, s, s, 8, 100, convert=3)                 # K = 100: not whole words
    with pytest.raises(ValueError, match="plain weight"):
        qg.quant_gemv(x, x, x, x, 16, 100, convert=1)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.usefixtures("nan_filled_empty")
@pytest.mark.parametrize("bits,group", [(8, -1), (4, 128)])
@pytest.mark.parametrize("n,k", [(4096, 4096), (12288, 4096), (22016, 4096), (4096, 11008)])
@pytest.mark.parametrize("outlier", [False, True])
def test_gemv_variants_real_shapes(bits, group, n, k, outlier):
    """Each variant vs the fp32 reference (bf16 output: 1.5e-2) and vs CONVERT 0 (1 is the same
    arithmetic; 2 loses ~1e-5 to its offsets; 3 multiplies in fp16); with outlier, x carries
    activations of 3000 (as Llama's down_proj inputs do) so that CONVERT 3's scaling must act."""
    from inference.kernels.quant_matmul import quant_matmul_reference
    from inference.quantization.config import QuantConfig
    from inference.quantization.int_quant import pack_int4, quantize_rtn
    assert torch.isnan(torch.empty(4, device="cuda")).all()
    gen = torch.Generator(device="cuda").manual_seed(n + k + bits)
    w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
    cfg = QuantConfig("rtn", bits, group, symmetric=bits == 8)
    codes, scales, zeros = quantize_rtn(w, cfg)
    qweight = pack_int4(codes) if bits == 4 else codes
    x = torch.randn(1, k, generator=gen, device="cuda")
    if outlier:
        x[0, 7], x[0, k // 2 + 3] = 3000.0, -2500.0
    x = x.bfloat16()
    gl = cfg.group_len(k)
    ref = quant_matmul_reference(x, codes, scales, zeros, gl).float()
    base = qg.quant_gemv(x, qweight, scales, zeros, bits, gl, convert=0).float()
    for convert, tol_vs_base in ((1, 1e-3), (2, 2e-3), (3, 6e-3)):
        for pdl in (False, True):
            out = qg.quant_gemv(x, qweight, scales, zeros, bits, gl, convert=convert, pdl=pdl)
            assert out.dtype == torch.bfloat16 and not out.isnan().any(), (convert, pdl)
            out = out.float()
            assert float((out - ref).norm() / ref.norm()) < TOL[torch.bfloat16], (convert, pdl)
            assert float((out - base).norm() / base.norm()) < tol_vs_base, (convert, pdl)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the interpreter has no grid limits)")
@pytest.mark.gpu
@pytest.mark.usefixtures("nan_filled_empty")
@pytest.mark.parametrize("m", [1, 2])
def test_more_row_blocks_than_a_y_grid_axis_holds(m):
    """A 152k-vocabulary LM head at batch 1-2 (Qwen2.5's): 76k blocks of 2 rows, past the 65535
    blocks a CUDA y / z grid axis takes; every row computed (the outputs start as NaN). The grid's
    index arithmetic (row of x fastest) runs in every CPU case with M > 1 above."""
    n, k = 152064, 128
    gen = torch.Generator(device=DEVICE).manual_seed(m)
    w = (torch.randn(n, k, generator=gen, device=DEVICE) * 0.1).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(torch.bfloat16)
    got = qg.gemv(x, w).float()
    want = x.float() @ w.float().t()
    assert not got.isnan().any()                                  # no row block left unwritten
    assert float((got - want).norm() / want.norm()) < TOL[torch.bfloat16]
