"""Weight-only quantized matrix-vector product for decode (a few rows): W8A16 / W4A16 on CUDA cores.

Same formats as kernels/quant_matmul.py (codes uint8 [N, K] or nibble-packed [N, K / 2], fp32
scales / zeros [N, G]). At batch 1 a tensor-core tile of 16 rows wastes 15/16 of its work and
the kernel is bound by how fast the codes stream in, so this one takes one activation row per
program and a [BLOCK_N, BLOCK_K] slab of codes per step, with no split-K (no atomics, no fp32
output to zero and cast):

    grid (M, cdiv(N, BLOCK_N))       each row streams the codes again, so only batch 1 runs at
                                     their rate (GEMV_MAX_ROWS)

    slab [BLOCK_N, BLOCK_K] = GROUPS_PER_TILE groups of GROUP_TILE columns:
      part[n, g] = sum_k x[k] * q[n, k]             (per group, in fp32)
      acc[n]    += sum_g s[n, g] * (part[n, g] - z[n, g] * sum_k x[k])

BITS=16 streams a plain float weight [N, K] (the model's dtype) through the same loop, no groups:
`gemv`, the batch-1 path of unquantized linears, 2 rows x 1024 columns per step, which beats
cuBLAS on every 7B shape at M=1 (bench/NOTES.md run 22: 104.6 vs 119 us per layer).

How codes become numbers (CONVERT, `quant_gemv(..., convert=)`; the int8 / int4 GEMVs are bound
by instructions, not bytes: bench/NOTES.md runs 16-19):

    0  u8 -> fp32 per code (I2F, 16 a clock per SM on Hopper), fp32 FMA with x
    1  fp16 magic: PRMT (int8) / LOP3 (int4) puts codes into the mantissa of fp16 1024 (0x6400),
       two a register, SUB.F16X2 / FMA.F16X2 makes them exact codes, fp16 -> fp32 (HADD2.F32,
       full rate), fp32 FMA: same numbers as 0
    2  as 1 without the subtract: 1024 + q (int4 odd columns: 1024 + 16 q, x / 16) in fp32, the
       offset taken off per group with the zero point (~7 bits of fp32 cancel: ~1e-5 relative)
    3  HFMA2: 8 codes a call (an int4 32-bit word / an int8 64-bit word), exact fp16 codes times
       fp16 x pairs in HFMA2, two lanes of 4 products each summed in fp32; x is scaled by a power
       of two per program so that a lane cannot overflow fp16 (|x| < 2^9 int4, 2^5 int8); fp16
       products: ~1e-3 relative error per 8-code chunk (the bf16 output rounds at 4e-3)

Defaults (`choose_convert`, H200 sweep, bench/NOTES.md run 30): int8 2, int4 3 (1 where its
words do not fit). 1-3 are PTX (tl.inline_asm_elementwise) on the GPU; under the interpreter (CPU) the same bit
operations run as Triton integer / fp16 ops (EMULATE), so the CPU tests check the layout logic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_utils import (
    grid_dependency_launch,
    grid_dependency_wait,
    pdl_options,
    use_pdl,
)

# Up to this many rows the GEMV beats the tensor-core kernel (H200, bench/quant_gpu.py --sections
# gemv: int8 qkv at 2 rows 29 vs 47 us, at 4 rows 53 vs 48 us). Each row re-reads the codes, so
# only one row runs at the codes' full rate: 1.3-1.5x bf16 cuBLAS at int8.
GEMV_MAX_ROWS = 2

CONVERTS = (0, 1, 2, 3)

# The bit tricks' constants, shared by the PTX below, the interpreter's emulation and the
# pure-PyTorch test of the PTX semantics (tests/kernels/test_quant_gemv.py).
F16_1024 = 0x6400                 # fp16 1024.0; 0x6400 | m is 1024 + m for m < 1024
F16X2_1024 = 0x64006400
F16X2_SIXTEENTH = 0x2C002C00      # 1/16 in both halves
F16X2_NEG_64 = 0xD400D400         # -64 in both halves
PRMT_BYTES = 0x64646464           # prmt's second source: bytes 4..7 are all 0x64
PRMT_SEL_01 = 0x4140              # result bytes [a.0, 0x64, a.1, 0x64]: halves (1024 + q0, 1024 + q1)
PRMT_SEL_23 = 0x4342              # [a.2, 0x64, a.3, 0x64]: halves (1024 + q2, 1024 + q3)
NIB_LO = 0x000F000F               # lop3 masks: bits 0-3 and 16-19 (low nibbles of bytes 0 and 2)
NIB_HI = 0x00F000F0               # bits 4-7 and 20-23 (high nibbles: 1024 + 16 q)
LOP3_AND_OR = 0xEA                # lop3 LUT of (a & b) | c: (0xF0 & 0xCC) | 0xAA
HFMA2_X_MAX_LOG2 = {4: 9, 8: 5}   # |x'| < 2^E: a lane sums 4 products, 4 * 15 * 2^9 / 4 * 255 * 2^5 < 65504
# x pairs of CONVERT=3, as (column of the low half, of the high half) within a chunk of 8 columns:
# the order in which the PTX puts the codes into fp16 pairs. int8: PRMT keeps byte order; int4:
# LOP3 on a word takes nibbles 16 bits apart, (byte 0, byte 2) = columns (0, 4), (1, 5), ...
PAIRS = {8: ((0, 1), (2, 3), (4, 5), (6, 7)), 4: ((0, 4), (1, 5), (2, 6), (3, 7))}

_CVT4 = ("mov.b32 {a0, a1}, h01;\nmov.b32 {a2, a3}, h23;\n"
         "cvt.f32.f16 $0, a0;\ncvt.f32.f16 $1, a1;\ncvt.f32.f16 $2, a2;\ncvt.f32.f16 $3, a3;\n")
# pack 4: $0-$3 the four codes as fp32, $4 the four bytes (element j = byte j)
ASM_U8 = {
    c: "{\n.reg .b32 h01, h23, m;\n.reg .b16 a0, a1, a2, a3;\n"
       f"prmt.b32 h01, $4, {PRMT_BYTES:#x}, {PRMT_SEL_01:#x};\n"
       f"prmt.b32 h23, $4, {PRMT_BYTES:#x}, {PRMT_SEL_23:#x};\n"
       + (f"mov.b32 m, {F16X2_1024:#x};\nsub.f16x2 h01, h01, m;\nsub.f16x2 h23, h23, m;\n" if c == 1 else "")
       + _CVT4 + "}"
    for c in (1, 2)
}
# pack 4, two results: $0-$3 the low nibbles of bytes 0-3 (even columns), $4-$7 the high ones
# (odd columns), $8 the four bytes. e02: (byte 0, byte 2) low nibbles, e13: bytes 1, 3 (after >> 8).
ASM_U4 = {
    c: "{\n.reg .b32 t8, e02, e13, o02, o13, m, s16, n64;\n.reg .b16 a<8>;\n"
       "shr.b32 t8, $8, 8;\n"
       f"lop3.b32 e02, $8, {NIB_LO:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 o02, $8, {NIB_HI:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 e13, t8, {NIB_LO:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 o13, t8, {NIB_HI:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       + (f"mov.b32 m, {F16X2_1024:#x};\nmov.b32 s16, {F16X2_SIXTEENTH:#x};\nmov.b32 n64, {F16X2_NEG_64:#x};\n"
          "sub.f16x2 e02, e02, m;\nsub.f16x2 e13, e13, m;\n"
          "fma.rn.f16x2 o02, o02, s16, n64;\nfma.rn.f16x2 o13, o13, s16, n64;\n" if c == 1 else "")
       + "mov.b32 {a0, a2}, e02;\nmov.b32 {a1, a3}, e13;\nmov.b32 {a4, a6}, o02;\nmov.b32 {a5, a7}, o13;\n"
       + "".join(f"cvt.f32.f16 ${i}, a{i};\n" for i in range(8)) + "}"
    for c in (1, 2)
}
_HFMA2_TAIL = ("mul.rn.f16x2 acc, h0, $2;\nfma.rn.f16x2 acc, h1, $3, acc;\n"
               "fma.rn.f16x2 acc, h2, $4, acc;\nfma.rn.f16x2 acc, h3, $5, acc;\n"
               "mov.b32 {lo, hi}, acc;\ncvt.f32.f16 fl, lo;\ncvt.f32.f16 fh, hi;\nadd.f32 $0, fl, fh;\n}")
_HFMA2_REGS = "{\n.reg .b32 wl, wh, t8, h0, h1, h2, h3, m, s16, n64, acc;\n.reg .b16 lo, hi;\n.reg .f32 fl, fh;\n"
# pack 1: $0 the chunk's sum (fp32), $1 the codes' word, $2-$5 the x pairs PAIRS[bits] (fp16x2)
ASM_HFMA2 = {
    8: _HFMA2_REGS + "mov.b64 {wl, wh}, $1;\n"
       f"prmt.b32 h0, wl, {PRMT_BYTES:#x}, {PRMT_SEL_01:#x};\nprmt.b32 h1, wl, {PRMT_BYTES:#x}, {PRMT_SEL_23:#x};\n"
       f"prmt.b32 h2, wh, {PRMT_BYTES:#x}, {PRMT_SEL_01:#x};\nprmt.b32 h3, wh, {PRMT_BYTES:#x}, {PRMT_SEL_23:#x};\n"
       f"mov.b32 m, {F16X2_1024:#x};\n"
       "sub.f16x2 h0, h0, m;\nsub.f16x2 h1, h1, m;\nsub.f16x2 h2, h2, m;\nsub.f16x2 h3, h3, m;\n" + _HFMA2_TAIL,
    4: _HFMA2_REGS + "shr.b32 t8, $1, 8;\n"
       f"lop3.b32 h0, $1, {NIB_LO:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 h1, $1, {NIB_HI:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 h2, t8, {NIB_LO:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"lop3.b32 h3, t8, {NIB_HI:#x}, {F16X2_1024:#x}, {LOP3_AND_OR:#x};\n"
       f"mov.b32 m, {F16X2_1024:#x};\nmov.b32 s16, {F16X2_SIXTEENTH:#x};\nmov.b32 n64, {F16X2_NEG_64:#x};\n"
       "sub.f16x2 h0, h0, m;\nfma.rn.f16x2 h1, h1, s16, n64;\nsub.f16x2 h2, h2, m;\nfma.rn.f16x2 h3, h3, s16, n64;\n"
       + _HFMA2_TAIL,
}

_ASM_U8_EXACT = tl.constexpr(ASM_U8[1])
_ASM_U8_BIASED = tl.constexpr(ASM_U8[2])
_ASM_U4_EXACT = tl.constexpr(ASM_U4[1])
_ASM_U4_BIASED = tl.constexpr(ASM_U4[2])
_ASM_HFMA2_8 = tl.constexpr(ASM_HFMA2[8])
_ASM_HFMA2_4 = tl.constexpr(ASM_HFMA2[4])
_F16_1024 = tl.constexpr(F16_1024)


@triton.jit
def _f16_bits(t):
    """Integer t holding an fp16 in its low 16 bits -> that fp16."""
    return (t & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _codes8(q, CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """uint8 codes [BLOCK_N, BLOCK_K] -> fp32: q (CONVERT 0, 1) or 1024 + q (2)."""
    if CONVERT == 0:
        f = q.to(tl.float32)
    elif EMULATE:                                  # the PRMT's halves 0x64qq, as Triton ops
        h = _f16_bits(q.to(tl.int32) | _F16_1024)
        if CONVERT == 1:
            h = h - 1024.0
        f = h.to(tl.float32)
    else:
        f = tl.inline_asm_elementwise(_ASM_U8_EXACT if CONVERT == 1 else _ASM_U8_BIASED, "=r,=r,=r,=r,r",
                                      [q], dtype=tl.float32, is_pure=True, pack=4)
    return f


@triton.jit
def _codes4(qb, CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """Nibble-packed bytes [BLOCK_N, BLOCK_K / 2] -> (even column, odd column) codes in fp32:
    (q_even, q_odd) for CONVERT 0 and 1, (1024 + q_even, 1024 + 16 q_odd) for 2."""
    if CONVERT == 0:
        lo, hi = (qb & 0xF).to(tl.float32), (qb >> 4).to(tl.float32)
    elif EMULATE:                                  # the LOP3's halves, as Triton ops
        b = qb.to(tl.int32)
        lo = _f16_bits((b & 0xF) | _F16_1024)                              # 1024 + q
        hi = _f16_bits((b & 0xF0) | _F16_1024)                             # 1024 + 16 q
        if CONVERT == 1:
            lo = lo - 1024.0
            hi = hi * 0.0625 - 64.0
        lo, hi = lo.to(tl.float32), hi.to(tl.float32)
    else:
        lo, hi = tl.inline_asm_elementwise(_ASM_U4_EXACT if CONVERT == 1 else _ASM_U4_BIASED,
                                           "=r,=r,=r,=r,=r,=r,=r,=r,r", [qb], dtype=(tl.float32, tl.float32),
                                           is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _x_pow2_scale(x_row, K, BLOCK_K: tl.constexpr, X_MAX_LOG2: tl.constexpr):
    """(2^e, 2^-e) with max|x| * 2^e < 2^X_MAX_LOG2, over the whole row (one pass before the
    slabs: one scale for all of them, no reduction per slab)."""
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)))
    eb = (tl.max(amax, 0).to(tl.int32, bitcast=True) >> 23) & 0xFF    # max|x| < 2^(eb - 126)
    sb = tl.minimum(tl.maximum(253 + X_MAX_LOG2 - eb, 1), 253)        # biased exponent of 2^e
    return (sb << 23).to(tl.float32, bitcast=True), ((254 - sb) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _f16_pair(lo, hi):
    """Two fp32 tensors -> int32 words holding (fp16(lo), fp16(hi)), lo in the low 16 bits."""
    a = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    b = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    return a | (b << 16)


@triton.jit
def _emu_hfma2(c0, c1, c2, c3, c4, c5, c6, c7, p0, p1, p2, p3):
    """CPU model of the HFMA2 tail: codes c0-c3 pair with the low halves of p0-p3, c4-c7 with the
    high halves (the lanes of one fp16x2 accumulator), each lane summed in fp16."""
    lane0 = c0 * _f16_bits(p0) + c1 * _f16_bits(p1) + c2 * _f16_bits(p2) + c3 * _f16_bits(p3)
    lane1 = c4 * _f16_bits(p0 >> 16) + c5 * _f16_bits(p1 >> 16) + c6 * _f16_bits(p2 >> 16) + c7 * _f16_bits(p3 >> 16)
    return lane0.to(tl.float32) + lane1.to(tl.float32)


@triton.jit
def _chunks_hfma2(w, x_row, kc, K, x_scale, BITS: tl.constexpr, EMULATE: tl.constexpr):
    """CONVERT 3: words of 8 codes [BLOCK_N, BLOCK_K / 8] (int8: int64, int4: int32) and the
    chunks' first columns kc [BLOCK_K / 8] -> (sum of each chunk's 8 products [BLOCK_N, BLOCK_K / 8],
    sum of each chunk's 8 scaled x [BLOCK_K / 8]). x pairs follow PAIRS[BITS]."""
    x0 = tl.load(x_row + kc, mask=kc < K, other=0.0).to(tl.float32) * x_scale
    x1 = tl.load(x_row + kc + 1, mask=kc + 1 < K, other=0.0).to(tl.float32) * x_scale
    x2 = tl.load(x_row + kc + 2, mask=kc + 2 < K, other=0.0).to(tl.float32) * x_scale
    x3 = tl.load(x_row + kc + 3, mask=kc + 3 < K, other=0.0).to(tl.float32) * x_scale
    x4 = tl.load(x_row + kc + 4, mask=kc + 4 < K, other=0.0).to(tl.float32) * x_scale
    x5 = tl.load(x_row + kc + 5, mask=kc + 5 < K, other=0.0).to(tl.float32) * x_scale
    x6 = tl.load(x_row + kc + 6, mask=kc + 6 < K, other=0.0).to(tl.float32) * x_scale
    x7 = tl.load(x_row + kc + 7, mask=kc + 7 < K, other=0.0).to(tl.float32) * x_scale
    x_chunk = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    if BITS == 8:                                  # PRMT keeps byte order: pairs (0, 1) (2, 3) (4, 5) (6, 7)
        p0, p1, p2, p3 = _f16_pair(x0, x1), _f16_pair(x2, x3), _f16_pair(x4, x5), _f16_pair(x6, x7)
    else:                                          # LOP3 takes nibbles 16 bits apart: (0, 4) (1, 5) (2, 6) (3, 7)
        p0, p1, p2, p3 = _f16_pair(x0, x4), _f16_pair(x1, x5), _f16_pair(x2, x6), _f16_pair(x3, x7)
    if EMULATE:
        if BITS == 8:                              # halves 0x64qq - 1024, byte j = column j
            q0 = _f16_bits((w & 0xFF) | _F16_1024) - 1024.0
            q1 = _f16_bits(((w >> 8) & 0xFF) | _F16_1024) - 1024.0
            q2 = _f16_bits(((w >> 16) & 0xFF) | _F16_1024) - 1024.0
            q3 = _f16_bits(((w >> 24) & 0xFF) | _F16_1024) - 1024.0
            q4 = _f16_bits(((w >> 32) & 0xFF) | _F16_1024) - 1024.0
            q5 = _f16_bits(((w >> 40) & 0xFF) | _F16_1024) - 1024.0
            q6 = _f16_bits(((w >> 48) & 0xFF) | _F16_1024) - 1024.0
            q7 = _f16_bits(((w >> 56) & 0xFF) | _F16_1024) - 1024.0
            # h0 = (q0, q1) pairs with p0 = (x0, x1): lane 0 takes q0 q2 q4 q6, lane 1 q1 q3 q5 q7
            chunk = _emu_hfma2(q0, q2, q4, q6, q1, q3, q5, q7, p0, p1, p2, p3)
        else:                                      # byte b: column 2b low nibble, 2b + 1 high
            q0 = _f16_bits((w & 0xF) | _F16_1024) - 1024.0
            q1 = _f16_bits((w & 0xF0) | _F16_1024) * 0.0625 - 64.0
            q2 = _f16_bits(((w >> 8) & 0xF) | _F16_1024) - 1024.0
            q3 = _f16_bits(((w >> 8) & 0xF0) | _F16_1024) * 0.0625 - 64.0
            q4 = _f16_bits(((w >> 16) & 0xF) | _F16_1024) - 1024.0
            q5 = _f16_bits(((w >> 16) & 0xF0) | _F16_1024) * 0.0625 - 64.0
            q6 = _f16_bits(((w >> 24) & 0xF) | _F16_1024) - 1024.0
            q7 = _f16_bits(((w >> 24) & 0xF0) | _F16_1024) * 0.0625 - 64.0
            # h0 = (q0, q4) with p0 = (x0, x4), h1 = (q1, q5), h2 = (q2, q6), h3 = (q3, q7)
            chunk = _emu_hfma2(q0, q1, q2, q3, q4, q5, q6, q7, p0, p1, p2, p3)
    elif BITS == 8:
        chunk = tl.inline_asm_elementwise(_ASM_HFMA2_8, "=r,l,r,r,r,r", [w, p0, p1, p2, p3], dtype=tl.float32,
                                          is_pure=True, pack=1)
    else:
        chunk = tl.inline_asm_elementwise(_ASM_HFMA2_4, "=r,r,r,r,r,r", [w, p0, p1, p2, p3], dtype=tl.float32,
                                          is_pure=True, pack=1)
    return chunk, x_chunk


@triton.jit
def _load_codes(q_rows, w_rows, k0, K, n_mask, BITS: tl.constexpr, BLOCK_K: tl.constexpr, CONVERT: tl.constexpr):
    """The slab's codes from column k0: [BLOCK_N, BLOCK_K] weights (BITS 16) / bytes (8),
    [BLOCK_N, BLOCK_K / 2] bytes (4), or [BLOCK_N, BLOCK_K / 8] words of 8 codes (CONVERT 3)."""
    if CONVERT == 3:
        c = tl.arange(0, BLOCK_K // 8)
        codes = tl.load(w_rows + (k0 // 8 + c)[None, :], mask=n_mask[:, None] & (k0 + 8 * c < K)[None, :], other=0)
    elif BITS == 4:
        j = tl.arange(0, BLOCK_K // 2)
        codes = tl.load(q_rows + (k0 // 2 + j)[None, :], mask=n_mask[:, None] & (k0 + 2 * j < K)[None, :], other=0)
    else:
        rk = k0 + tl.arange(0, BLOCK_K)
        codes = tl.load(q_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0)
    return codes


@triton.jit
def _slab(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
          BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
          CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """One slab's contribution to the rows' sums [BLOCK_N], from its codes (_load_codes)."""
    if BITS == 16:
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)                     # [BLOCK_K]
        w = codes
        if w.dtype == tl.float8e4nv:             # e4m3 -> fp16: one packed cvt per two values
            w = w.to(tl.float16)
        res = tl.sum(w.to(tl.float32) * x[None, :], 1)
    else:
        res = _group_sums(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                          BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE)
    return res


@triton.jit
def _group_sums(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
                CONVERT: tl.constexpr, EMULATE: tl.constexpr):
    """sum_g s[n, g] * (part[n, g] - z[n, g] * sum_k x[k]) over the slab's groups (BITS 8, 4)."""
    GROUPS_PER_TILE: tl.constexpr = BLOCK_K // GROUP_TILE
    g = (k0 + tl.arange(0, GROUPS_PER_TILE) * GROUP_TILE) // group_len      # [GPT] the slab's groups
    gn_mask = n_mask[:, None] & (g < num_groups)[None, :]
    s = tl.load(S + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)       # [BLOCK_N, GPT]
    z = tl.load(Z + rn[:, None] * stride_sn + g[None, :], mask=gn_mask, other=0.0)
    if CONVERT == 3:
        kc = k0 + 8 * tl.arange(0, BLOCK_K // 8)                           # each chunk's first column
        chunk, x_chunk = _chunks_hfma2(codes, x_row, kc, K, x_scale, BITS, EMULATE)   # [BLOCK_N, BLOCK_K / 8]
        part = tl.sum(tl.reshape(chunk, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE // 8]), 2)
        x_sum = tl.sum(tl.reshape(x_chunk, [GROUPS_PER_TILE, GROUP_TILE // 8]), 1)      # of the scaled x
    elif BITS == 8:
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)                 # [BLOCK_K]
        prod = _codes8(codes, CONVERT, EMULATE) * x[None, :]                       # [BLOCK_N, BLOCK_K]
        part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE]), 2)
        x_sum = tl.sum(tl.reshape(x, [GROUPS_PER_TILE, GROUP_TILE]), 1)                # [GPT]
        if CONVERT == 2:                                                   # the codes came as 1024 + q
            part = part - 1024.0 * x_sum[None, :]
    else:
        ke = k0 + 2 * tl.arange(0, BLOCK_K // 2)                           # the slab's even columns
        x_even = tl.load(x_row + ke, mask=ke < K, other=0.0).to(tl.float32)            # [BLOCK_K / 2]
        x_odd = tl.load(x_row + ke + 1, mask=ke < K, other=0.0).to(tl.float32)
        q_even, q_odd = _codes4(codes, CONVERT, EMULATE)
        if CONVERT == 2:                                # odd codes come as 1024 + 16 q: x / 16 (exact)
            prod = q_even * x_even[None, :] + q_odd * (x_odd * 0.0625)[None, :]
        else:
            prod = q_even * x_even[None, :] + q_odd * x_odd[None, :]
        part = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS_PER_TILE, GROUP_TILE // 2]), 2)
        if CONVERT == 2:                                # 1024 + q_even and (1024 + 16 q_odd) / 16
            xe_sum = tl.sum(tl.reshape(x_even, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
            xo_sum = tl.sum(tl.reshape(x_odd, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
            x_sum = xe_sum + xo_sum
            part = part - (1024.0 * xe_sum + 64.0 * xo_sum)[None, :]
        else:
            x_sum = tl.sum(tl.reshape(x_even + x_odd, [GROUPS_PER_TILE, GROUP_TILE // 2]), 1)
    return tl.sum(s * (part - z * x_sum[None, :]), 1)


@triton.jit
def _quant_gemv_kernel(
    X, QW, S, Z, OUT, N, K, group_len, num_groups,
    stride_xm, stride_qn, stride_sn, stride_om,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_TILE: tl.constexpr,
    CONVERT: tl.constexpr,      # how codes become numbers (module docstring); 0 for BITS=16
    EMULATE: tl.constexpr,      # interpreter: CONVERT 1-3's PTX as Triton ops
    PDL: tl.constexpr,          # launched as a programmatic dependent launch (kernels/triton_utils.py)
    FP8: tl.constexpr,          # BITS 16 with e4m3 codes (passed as bytes), the sums times S[n]
):
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    x_row = X + m * stride_xm
    q_rows = QW + rn.to(tl.int64)[:, None] * stride_qn                       # [BLOCK_N, 1]
    w_rows = q_rows
    if CONVERT == 3:                                                         # words of 8 codes
        if BITS == 8:
            w_rows = QW.to(tl.pointer_type(tl.int64)) + rn.to(tl.int64)[:, None] * (stride_qn // 8)
        else:
            w_rows = QW.to(tl.pointer_type(tl.int32)) + rn.to(tl.int64)[:, None] * (stride_qn // 4)
    grid_dependency_wait(PDL)
    x_scale = 1.0
    x_unscale = 1.0
    if CONVERT == 3:                                 # HFMA2_X_MAX_LOG2: a lane of 4 products fits fp16
        x_scale, x_unscale = _x_pow2_scale(x_row, K, BLOCK_K, 9 if BITS == 4 else 5)
    # Tried on the H200 (bench/NOTES.md runs 17-18): an element-wise accumulator summed once after
    # the loop (holds BLOCK_N x BLOCK_K fp32 and spills: 2x slower) and int-to-float replaced by
    # the 2^23 mantissa trick (3-7% slower). Each slab's products are summed as it arrives.
    # Loading the first slab's codes before the PDL wait (they do not depend on the previous
    # kernel) made no difference: bench/NOTES.md run 27.
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        codes = _load_codes(q_rows, w_rows, k0, K, n_mask, BITS, BLOCK_K, CONVERT)
        if FP8:
            codes = codes.to(tl.float8e4nv, bitcast=True)
        acc += _slab(codes, k0, x_row, K, S, Z, rn, n_mask, group_len, num_groups, stride_sn, x_scale,
                     BITS, BLOCK_N, BLOCK_K, GROUP_TILE, CONVERT, EMULATE)
    if CONVERT == 3:
        acc = acc * x_unscale
    if FP8:
        acc = acc * tl.load(S + rn, mask=n_mask, other=0.0)
    grid_dependency_launch(PDL)        # late: the next kernel's programs only overlap this one's tail
    tl.store(OUT + m * stride_om + rn, acc.to(OUT.dtype.element_ty), mask=n_mask)


def choose_gemv_tiles(n: int, k: int, bits: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps), the leaders of the H200 sweeps at M=1 for each format's
    default conversion (bench/NOTES.md runs 16, 19 and 30): bf16 2 rows x 1024 columns; int8
    (CONVERT 2) 8 rows, 1024-column slabs x 4 warps on the 4096-row shapes and 512 x 2 on the
    wide ones; int4 (CONVERT 3) 8 x 1024 x 4 up to 4096 rows, 16 x 1024 x 4 to 16k, 16 x 512 x 2
    beyond."""
    block_k = min(1024, triton.next_power_of_2(k))
    if bits == 16:
        return (2, block_k, 4)
    if bits == 8:
        return (8, block_k, 4) if n <= 4096 else (8, min(512, block_k), 2)
    if n <= 4096:
        return (8, block_k, 4)
    return (16, block_k, 4) if n < 16384 else (16, min(512, block_k), 2)


def choose_convert(bits: int, k: int, block_k: int, group_tile: int, qweight: torch.Tensor,
                   x_dtype: torch.dtype) -> int:
    """The default conversion, by the H200 sweep (bench/NOTES.md run 30, M=1 on the 7B shapes):
    int8 CONVERT 2 (1.02-1.41x the old default tiles, 1.49-1.87x bf16), int4 CONVERT 3 (1.7-3.5x,
    1.55-2.07x bf16) where its 8-code words fit the rows, else 1 (exact, like 0, and faster).
    fp32 activations (the exactness mode) take 1: the same numbers as 0."""
    if bits == 16:
        return 0
    if x_dtype == torch.float32:
        return 1
    if bits == 8:
        return 2
    try:
        check_convert(3, bits, k, block_k, group_tile, qweight)
    except ValueError:
        return 1
    return 3


def check_convert(convert: int, bits: int, k: int, block_k: int, group_tile: int, qweight: torch.Tensor) -> None:
    """CONVERT 1-3 are for the quantized formats; 3 reads the codes as 8-code words (int8: 8
    bytes, int4: 4), so rows, slabs and groups must hold whole words."""
    if convert not in CONVERTS:
        raise ValueError(f"quant_gemv: convert must be one of {CONVERTS}, got {convert!r}")
    if convert and bits == 16:
        raise ValueError("quant_gemv: convert applies to int8 / int4 codes, not to a plain weight")
    if convert == 3:
        word = 8 if bits == 8 else 4
        if k % 8 or block_k % 8 or group_tile % 8 or qweight.stride(0) % word or qweight.data_ptr() % word:
            raise ValueError(f"quant_gemv: convert=3 reads {word}-byte words of 8 codes: wants K, BLOCK_K and the "
                             f"group tile divisible by 8 and aligned rows; got K {k}, BLOCK_K {block_k}, "
                             f"group tile {group_tile}, row stride {qweight.stride(0)}")


def quant_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
               group_len: int, tiles: tuple[int, int] | None = None, num_warps: int | None = None,
               pdl: bool | None = None, convert: int | None = None, fp8: bool = False) -> torch.Tensor:
    """x [M, K] (few rows, last dim contiguous) -> y [M, N] in x's dtype. Inputs are checked by
    quant_matmul, which dispatches here; group_len is K for per-channel scales.

    pdl: a programmatic dependent launch (default: where the GPU has it, kernels/triton_utils.py),
    letting the next kernel launch only after this one's loop (bench/NOTES.md runs 22-26).
    fp8: BITS 16 with e4m3 codes (qweight as uint8 bytes) and one fp32 scale a row in `scales` (`gemv_fp8`).
    convert: how codes become numbers (CONVERTS, the module docstring; default `choose_convert`);
    3 wants K % 8 == 0."""
    m, k = x.shape
    n = qweight.shape[0]
    block_n, block_k, default_warps = choose_gemv_tiles(n, k, bits)
    if tiles is not None:
        block_n, block_k = tiles
    per_channel = group_len >= k                 # one group: every slab lies in it
    group_tile = block_k if per_channel else min(group_len, block_k)
    if not per_channel and (block_k % group_tile or group_len % group_tile):
        raise ValueError(f"quant_gemv: BLOCK_K {block_k} and the group length {group_len} must nest")
    if convert is None:
        convert = choose_convert(bits, k, block_k, group_tile, qweight, x.dtype)
    check_convert(convert, bits, k, block_k, group_tile, qweight)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (m, triton.cdiv(n, block_n))
    pdl = use_pdl(x, pdl)
    _quant_gemv_kernel[grid](
        x, qweight, scales, zeros, out, n, k, group_len, scales.shape[1],
        x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_TILE=group_tile,
        CONVERT=convert, EMULATE=x.device.type != "cuda", PDL=pdl, FP8=fp8,
        num_warps=num_warps or default_warps, **pdl_options(pdl))
    return out


def gemv(x: torch.Tensor, weight: torch.Tensor, tiles: tuple[int, int] | None = None,
         num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] times a plain weight [N, K] of x's dtype (contiguous) -> y [M, N]: F.linear
    without bias as one Triton GEMV; each row streams the weight again, so M = 1 is its case."""
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"gemv: want x [M, K] with a contiguous last dim and a contiguous weight [N, K], "
                         f"got {tuple(x.shape)} / {tuple(weight.shape)}")
    k = x.shape[1]
    if weight.shape[1] != k or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"gemv: weight {tuple(weight.shape)} {weight.dtype} does not take x {tuple(x.shape)} {x.dtype}")
    return quant_gemv(x, weight, weight, weight, 16, k, tiles=tiles, num_warps=num_warps, pdl=pdl)


def gemv_fp8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, tiles: tuple[int, int] | None = None,
             num_warps: int | None = None, pdl: bool | None = None) -> torch.Tensor:
    """x [M, K] (bf16 / fp16) times an e4m3 weight [N, K] with one fp32 scale per output row
    (`scale`: N contiguous values, e.g. [1, N] or [N, 1]) -> y [M, N] in x's dtype. Weight-only
    FP8 for decode: at one row cuBLASLt's FP8 GEMM pads to a 128-row tile and the activation must
    be quantized first (two kernels, 27 + 6 us on the 7B's gate_up, bench/NOTES.md run 31); this
    streams the e4m3 codes once, with x unquantized."""
    if x.dim() != 2 or x.stride(1) != 1 or weight.dim() != 2 or not weight.is_contiguous():
        raise ValueError(f"gemv_fp8: want x [M, K] with a contiguous last dim and a contiguous weight [N, K], "
                         f"got {tuple(x.shape)} / {tuple(weight.shape)}")
    n, k = weight.shape
    if (weight.dtype != torch.float8_e4m3fn or x.dtype not in (torch.bfloat16, torch.float16)
            or x.shape[1] != k or scale.numel() != n or scale.dtype != torch.float32 or not scale.is_contiguous()):
        raise ValueError(f"gemv_fp8: want x [M, {k}] bf16/fp16, an e4m3 weight [N, K] and {n} contiguous fp32 scales; "
                         f"got x {tuple(x.shape)} {x.dtype}, weight {weight.dtype}, scale {tuple(scale.shape)} {scale.dtype}")
    return quant_gemv(x, weight.view(torch.uint8), scale.view(n, 1), scale, 16, k, tiles=tiles,
                      num_warps=num_warps, pdl=pdl, fp8=True)
