"""Probe: an int8 decode GEMV on integer dot products (run on the device).

Hypothesis (bench/NOTES.md runs 16-19, 30, 35): the int8 GEMV streams at ~77% of copy because
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

    python3 bench/gemv_dp4a_probe.py --out $OUT/gemv_dp4a_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_kernels import log
from quant_gpu import SHAPES, graph_time, quantized_copies

from kernels.quant_gemv import gemv, quant_gemv

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


def digits(x: torch.Tensor):
    """x [K] (K % 8 == 0) -> (hi words int64 [K/8], lo words, chunk scales 2^-e fp32, sum of the digitised x)."""
    xc = x.float().view(-1, 8)
    m = xc.abs().amax(1).clamp(min=1e-30)
    e = (13 - torch.floor(torch.log2(m))).clamp(-120, 120)
    xi = torch.round(xc * torch.exp2(e)[:, None]).to(torch.int32)           # |xi| <= 2^14
    lo = ((xi + 128) & 255) - 128
    hi = (xi - lo) >> 8
    pack = lambda d: d.to(torch.int8).contiguous().view(torch.int64).view(-1)    # noqa: E731
    scale = torch.exp2(-e).float()
    x_sum = float(((hi * 256 + lo).float() * scale[:, None]).sum())
    return pack(hi), pack(lo), scale.contiguous(), x_sum


def dp4a_gemv(qw64, xh, xl, xs, s, z, x_sum, n, tiles):
    bn, bc, warps = tiles
    out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    _dp4a_gemv_kernel[(triton.cdiv(n, bn),)](qw64, xh, xl, xs, s, z, x_sum, out, n, xh.numel(), qw64.stride(0),
                                             BLOCK_N=bn, BLOCK_C=bc, num_warps=warps)
    return out


TILES = [(bn, bc, w) for bn in (2, 4, 8, 16) for bc in (64, 128, 256, 512) for w in (2, 4)
         if bn * bc / (32 * w) <= 64]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/gemv_dp4a_probe.json"))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(11)
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "shapes": {}}
    total = {"bf16": 0.0, "int8 c2": 0.0, "dp4a": 0.0}
    # one weight as large as a whole layer's four (202 MB of int8 codes): what the same bytes
    # stream at without three kernel boundaries
    shapes = dict(SHAPES, layer_merged=(49408, 4096))
    for name, (n, k) in shapes.items():
        copies = max(2, int(6e8 // (n * k)))
        packs = quantized_copies(n, k, 8, copies, gen)
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        x[0, :: 97] *= 40                                    # a few outlier features, as LLM activations have
        qw0, s0, z0 = packs[0][:3]
        ref = x.float() @ ((qw0.float() - z0) * s0).t()
        xh, xl, xs, x_sum = digits(x[0])
        q64 = [p[0].view(torch.int64) for p in packs]
        s1 = [p[1].view(-1).contiguous() for p in packs]
        z1 = [p[2].view(-1).contiguous() for p in packs]
        row = {"n": n, "k": k}
        err_c2 = float((quant_gemv(x, qw0, s0, z0, 8, k).float() - ref).norm() / ref.norm())
        row["bf16_us"] = graph_time(lambda i: gemv(x, packs[i][4]), copies) * 1e6
        row["int8_c2_us"] = graph_time(lambda i: quant_gemv(x, packs[i][0], packs[i][1], packs[i][2], 8, k),
                                       copies) * 1e6
        row["int8_c2_err"] = err_c2
        sweep = []
        for tiles in TILES:
            try:
                got = dp4a_gemv(q64[0], xh, xl, xs, s1[0], z1[0], x_sum, n, tiles).float()
                err = float((got - ref).norm() / ref.norm())
                t = graph_time(lambda i: dp4a_gemv(q64[i], xh, xl, xs, s1[i], z1[i], x_sum, n, tiles), copies)
            except Exception as e:                           # noqa: BLE001 - a probe: log and go on
                log(f"  {name} {tiles} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            sweep.append({"tiles": tiles, "us": t * 1e6, "err": err, "GBps": n * k / t / 1e9})
        ok = [r for r in sweep if r["err"] < 2e-2]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        row.update(sweep=sweep, best=best)
        res["shapes"][name] = row
        if name in SHAPES:
            total["bf16"] += row["bf16_us"]
            total["int8 c2"] += row["int8_c2_us"]
            total["dp4a"] += best["us"] if best else float("nan")
        log(f"{name:8s} bf16 {row['bf16_us']:6.1f} us  int8 c2 {row['int8_c2_us']:6.1f} us ({n * k / row['int8_c2_us'] / 1e3:.0f} GB/s,"
            f" err {err_c2:.1e})  dp4a " + (f"{best['us']:6.1f} us ({best['GBps']:.0f} GB/s, err {best['err']:.1e}) at {best['tiles']}"
                                           if best else "none correct"))
        packs = q64 = None
        torch.cuda.empty_cache()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    res["layer_us"] = total
    log(f"layer (qkv + o + gate_up + down): bf16 {total['bf16']:.1f} us, int8 c2 {total['int8 c2']:.1f}, "
        f"dp4a {total['dp4a']:.1f}")
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
