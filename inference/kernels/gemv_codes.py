"""How the decode GEMV (inference/kernels/quant_gemv.py) turns int8 / int4 codes into numbers: the PTX of
its CONVERT 1-3 (tl.inline_asm_elementwise) and, for the interpreter, the same bit operations as
Triton ops (EMULATE). See quant_gemv.py's docstring for what each CONVERT does and why; the
constants here are shared with the pure-PyTorch model of the PTX in tests/inference/kernels/test_quant_gemv.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

# The bit tricks' constants, shared by the PTX below, the interpreter's emulation and the
# pure-PyTorch test of the PTX semantics (tests/inference/kernels/test_quant_gemv.py).
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
