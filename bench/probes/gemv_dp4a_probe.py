"""Probe: an int8 decode GEMV on integer dot products (run on the device).

Hypothesis (journal runs 16-19, 30, 35; the outcome is run 39): the int8 GEMV streams at ~77% of copy because
each code costs ~2.5 instructions (PRMT into fp16, HADD2.F32, FFMA, reduction adds), not because
of the bytes. If x came as 8-bit digits, the codes could go straight into DP4A (4 products and
the sum in one instruction) with no conversion at all:

    x[8c + j] ~= 2^-e_c * (256 * hi[8c + j] + lo[8c + j])      per 8-column chunk c, |x * 2^e_c| < 2^14,
                                                                  hi, lo signed bytes (balanced digits)
    sum_j (q - 128) x  =  2^-e_c * (256 * dp4a(q ^ 0x80, hi) + dp4a(q ^ 0x80, lo))

so 8 codes cost 2 XOR + 4 DP4A + 1 MAD + I2F + FFMA (~1.3 instructions a byte). The digits are
precomputed here (torch, untimed): this measures the GEMV's best case before anyone builds the
producers that would emit them. Peer in the same run: today's int8 GEMV (CONVERT 2, default
tiles) and the bf16 GEMV, all timed in one CUDA graph over >= 600 MB of weight copies.

    python3 -m bench.probes.gemv_dp4a_probe --out $OUT/gemv_dp4a_probe.json [--bits 8,4]

int4 (group 128, nibble pairs): the codes' low and high nibbles (even / odd columns) are split
with AND / SHR, each against its own digit words: 8 codes cost 3 logic ops + 4 DP4A + MAD + I2F +
FFMA (~2.5 instructions a byte against the HFMA2 path's ~4).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import triton
import triton.language as tl

from bench.harness import gpu_env, graph_time, log, result_path, write_result
from bench.workloads import SHAPES, quantized_copies
from inference.kernels.quant_gemv import gemv, quant_gemv

_ASM = tl.constexpr("""{
.reg .b32 a, b, h0, h1, l0, l1, ph, pl;
mov.b64 {a, b}, $1;
mov.b64 {h0, h1}, $2;
mov.b64 {l0, l1}, $3;
xor.b32 a, a, 0x80808080;
xor.b32 b, b, 0x80808080;
dp4a.s32.s32 ph, a, h0, 0;
dp4a.s32.s32 ph, b, h1, ph;
dp4a.s32.s32 pl, a, l0, 0;
dp4a.s32.s32 pl, b, l1, pl;
mad.lo.s32 $0, ph, 256, pl;
}""")


@triton.jit
def _dp4a_gemv_kernel(QW, XH, XL, XS, S, Z, x_sum, OUT, N, NC, stride_qn,
                      BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rows = QW + rn.to(tl.int64)[:, None] * stride_qn                  # int64 words of 8 codes
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, NC, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cm = c < NC
        w = tl.load(rows + c[None, :], mask=n_mask[:, None] & cm[None, :], other=0)        # [BN, BC]
        xh = tl.load(XH + c, mask=cm, other=0)
        xl = tl.load(XL + c, mask=cm, other=0)
        xs = tl.load(XS + c, mask=cm, other=0.0)
        r = tl.inline_asm_elementwise(_ASM, "=r,l,l,l", [w, xh[None, :], xl[None, :]], dtype=tl.int32,
                                      is_pure=True, pack=1)
        acc += tl.sum(r.to(tl.float32) * xs[None, :], 1)
    s = tl.load(S + rn, mask=n_mask, other=0.0)
    z = tl.load(Z + rn, mask=n_mask, other=0.0)
    tl.store(OUT + rn, (s * (acc - (z - 128.0) * x_sum)).to(OUT.dtype.element_ty), mask=n_mask)


_ASM4 = tl.constexpr("""{
.reg .b32 e, o, ph, pl;
and.b32 e, $1, 0x0F0F0F0F;
shr.u32 o, $1, 4;
and.b32 o, o, 0x0F0F0F0F;
dp4a.u32.s32 ph, e, $2, 0;
dp4a.u32.s32 ph, o, $4, ph;
dp4a.u32.s32 pl, e, $3, 0;
dp4a.u32.s32 pl, o, $5, pl;
mad.lo.s32 $0, ph, 256, pl;
}""")


@triton.jit
def _dp4a_int4_gemv_kernel(QW, XHE, XLE, XHO, XLO, XS, XG, S, Z, OUT, N, NC, stride_qn, stride_sn, NUM_GROUPS,
                           BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, CHUNKS_PER_GROUP: tl.constexpr):
    """int4 (nibble pairs, low = even column) as int32 words of 8 codes; x digits split by column
    parity; per-group scales / zeros [N, G] and the digitised x's per-group sums XG."""
    GPT: tl.constexpr = BLOCK_C // CHUNKS_PER_GROUP
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rows = QW + rn.to(tl.int64)[:, None] * stride_qn
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, NC, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cm = c < NC
        w = tl.load(rows + c[None, :], mask=n_mask[:, None] & cm[None, :], other=0)
        he = tl.load(XHE + c, mask=cm, other=0)
        le = tl.load(XLE + c, mask=cm, other=0)
        ho = tl.load(XHO + c, mask=cm, other=0)
        lo = tl.load(XLO + c, mask=cm, other=0)
        xs = tl.load(XS + c, mask=cm, other=0.0)
        r = tl.inline_asm_elementwise(_ASM4, "=r,r,r,r,r,r", [w, he[None, :], le[None, :], ho[None, :], lo[None, :]],
                                      dtype=tl.int32, is_pure=True, pack=1)
        part = tl.sum(tl.reshape(r.to(tl.float32) * xs[None, :], [BLOCK_N, GPT, CHUNKS_PER_GROUP]), 2)
        g = c0 // CHUNKS_PER_GROUP + tl.arange(0, GPT)
        gm = n_mask[:, None] & (g < NUM_GROUPS)[None, :]
        sg = tl.load(S + rn[:, None] * stride_sn + g[None, :], mask=gm, other=0.0)
        zg = tl.load(Z + rn[:, None] * stride_sn + g[None, :], mask=gm, other=0.0)
        xg = tl.load(XG + g, mask=g < NUM_GROUPS, other=0.0)
        acc += tl.sum(sg * (part - zg * xg[None, :]), 1)
    tl.store(OUT + rn, acc.to(OUT.dtype.element_ty), mask=n_mask)


def balanced_digits(x: torch.Tensor):
    """x [K] (K % 8 == 0) -> (hi, lo, scale): per 8-column chunk c a power of two 2^e_c with
    |x * 2^e_c| < 2^14, and signed-byte digits with x ~= scale_c * (256 * hi + lo); hi, lo int32
    [K/8, 8], scale fp32 [K/8]."""
    xc = x.float().view(-1, 8)
    m = xc.abs().amax(1).clamp(min=1e-30)
    e = (13 - torch.floor(torch.log2(m))).clamp(-120, 120)
    xi = torch.round(xc * torch.exp2(e)[:, None]).to(torch.int32)           # |xi| <= 2^14
    lo = ((xi + 128) & 255) - 128
    hi = (xi - lo) >> 8
    return hi, lo, torch.exp2(-e).float().contiguous()


def digitised(hi: torch.Tensor, lo: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The x the digits stand for, [K/8, 8] fp32."""
    return (hi * 256 + lo).float() * scale[:, None]


def digits4(x: torch.Tensor, group: int = 128):
    """For int4: x [K] -> int32 digit words of the even and odd columns of each 8-column chunk
    (hi even, lo even, hi odd, lo odd), chunk scales, per-group sums of the digitised x."""
    hi, lo, scale = balanced_digits(x)
    pack = lambda d: d.to(torch.int8).contiguous().view(torch.int32).view(-1)    # noqa: E731
    xg = digitised(hi, lo, scale).view(-1, group).sum(1)
    return (pack(hi[:, 0::2]), pack(lo[:, 0::2]), pack(hi[:, 1::2]), pack(lo[:, 1::2]), scale, xg.contiguous())


def dp4a_int4_gemv(qw32, dg, s, z, n, tiles, group=128):
    bn, bc, warps = tiles
    he, le, ho, lo, xs, xg = dg
    out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    _dp4a_int4_gemv_kernel[(triton.cdiv(n, bn),)](qw32, he, le, ho, lo, xs, xg, s, z, out, n, xs.numel(),
                                                  qw32.stride(0), s.stride(0), s.shape[1], BLOCK_N=bn, BLOCK_C=bc,
                                                  CHUNKS_PER_GROUP=group // 8, num_warps=warps)
    return out


def digits(x: torch.Tensor):
    """x [K] (K % 8 == 0) -> (hi words int64 [K/8], lo words, chunk scales 2^-e fp32, sum of the digitised x)."""
    hi, lo, scale = balanced_digits(x)
    pack = lambda d: d.to(torch.int8).contiguous().view(torch.int64).view(-1)    # noqa: E731
    return pack(hi), pack(lo), scale, float(digitised(hi, lo, scale).sum())


def dp4a_gemv(qw64, xh, xl, xs, s, z, x_sum, n, tiles):
    bn, bc, warps = tiles
    out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    _dp4a_gemv_kernel[(triton.cdiv(n, bn),)](qw64, xh, xl, xs, s, z, x_sum, out, n, xh.numel(), qw64.stride(0),
                                             BLOCK_N=bn, BLOCK_C=bc, num_warps=warps)
    return out


TILES = [(bn, bc, w) for bn in (2, 4, 8, 16) for bc in (64, 128, 256, 512) for w in (2, 4)
         if bn * bc / (32 * w) <= 64]
# int4: chunks a slab must hold whole groups of 128 columns (16 chunks)
TILES4 = [(bn, bc, w) for bn in (4, 8, 16, 32) for bc in (16, 32, 64, 128) for w in (2, 4)
          if bn * bc / (32 * w) <= 64]


def sweep(name: str, tiles: list, run, ref: torch.Tensor, copies: int, nbytes: int) -> tuple[list, dict | None]:
    """Each tile setting: rel_err of run(0, tiles) against ref, time of run(i, tiles) over the copies."""
    rows = []
    for t in tiles:
        try:
            err = float((run(0, t).float() - ref).norm() / ref.norm())
            sec = graph_time(lambda i: run(i, t), copies)
        except Exception as e:                               # noqa: BLE001 - a probe: log and go on
            log(f"  {name} {t} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        rows.append({"tiles": t, "us": sec * 1e6, "err": err, "GBps": nbytes / sec / 1e9})
    ok = [r for r in rows if r["err"] < 2e-2]
    return rows, (min(ok, key=lambda r: r["us"]) if ok else None)


def outlier_x(k: int, gen) -> torch.Tensor:
    x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
    x[0, :: 97] *= 40                                        # a few outlier features, as LLM activations have
    return x


def report(res: dict, key: str, name: str, row: dict, total: dict, nbytes: int) -> None:
    best = row["best"]
    res[key][name] = row
    if name in SHAPES:
        total["bf16"] += row["bf16_us"]
        total["today"] += row["today_us"]
        total["dp4a"] += best["us"] if best else float("nan")
    log(f"{key} {name:12s} bf16 {row['bf16_us']:6.1f} us  today {row['today_us']:6.1f} us "
        f"({nbytes / row['today_us'] / 1e3:.0f} GB/s, err {row['today_err']:.1e})  dp4a "
        + (f"{best['us']:6.1f} us ({best['GBps']:.0f} GB/s, err {best['err']:.1e}) at {best['tiles']}"
           if best else "none correct"))


def section(bits: int, res: dict, gen, out: Path) -> None:
    key = f"int{bits}"
    res[key] = {}
    total = {"bf16": 0.0, "today": 0.0, "dp4a": 0.0}
    # one weight as large as a whole layer's four (202 MB of int8 codes): what the same bytes
    # stream at without three kernel boundaries
    for name, (n, k) in dict(SHAPES, layer_merged=(49408, 4096)).items():
        nbytes = n * k * bits // 8
        copies = max(2, int(6e8 // nbytes))
        packs = quantized_copies(n, k, bits, copies, gen)
        x = outlier_x(k, gen)
        qw0, s0, z0, gl = packs[0][:4]
        codes = qw0 if bits == 8 else torch.stack([qw0 & 0xF, qw0 >> 4], -1).reshape(n, -1)
        ref = x.float() @ ((codes.float() - z0.repeat_interleave(gl, 1)[:, :k])
                           * s0.repeat_interleave(gl, 1)[:, :k]).t()
        row = {"n": n, "k": k, "bytes": nbytes,
               "bf16_us": graph_time(lambda i: gemv(x, packs[i][4]), copies) * 1e6,
               "today_us": graph_time(lambda i: quant_gemv(x, *packs[i][:3], bits, gl), copies) * 1e6,
               "today_err": float((quant_gemv(x, qw0, s0, z0, bits, gl).float() - ref).norm() / ref.norm())}
        if bits == 8:
            xh, xl, xs, x_sum = digits(x[0])
            q = [p[0].view(torch.int64) for p in packs]
            sz = [(p[1].view(-1).contiguous(), p[2].view(-1).contiguous()) for p in packs]

            def run(i, t):
                return dp4a_gemv(q[i], xh, xl, xs, *sz[i], x_sum, n, t)
        else:
            dg = digits4(x[0], gl)
            q = [p[0].view(torch.int32) for p in packs]

            def run(i, t):
                return dp4a_int4_gemv(q[i], dg, packs[i][1], packs[i][2], n, t, gl)
        row["sweep"], row["best"] = sweep(name, TILES if bits == 8 else TILES4, run, ref, copies, nbytes)
        report(res, key, name, row, total, nbytes)
        packs = q = None
        torch.cuda.empty_cache()
        write_result(out, res)
    res[key + "_layer_us"] = total
    log(f"{key} layer (qkv + o + gate_up + down): bf16 {total['bf16']:.1f} us, today {total['today']:.1f}, "
        f"dp4a {total['dp4a']:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("gemv_dp4a_probe.json"))
    ap.add_argument("--bits", default="8,4")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(11)
    res = gpu_env()
    out = Path(args.out)
    for bits in (int(b) for b in args.bits.split(",")):
        section(bits, res, gen, out)
    write_result(out, res)


if __name__ == "__main__":
    main()
