"""Decode attention at throughput shapes (run on the device): the paged decode kernel over a
tile / warps / stages sweep, bf16 vs float8 caches (a float8 cache read as float8 tiles, "tile",
or as int32 words of four codes converted in registers, "words"), and a CUDA-core variant for MHA
(one query head per KV head: no tl.dot, K and V tiles used from registers), each against the copy
ceiling.

The shape is the 7B 128/128 throughput run's decode step (bench/gpu/throughput_profile.py: decode
attention is 44-62% of its kernel time): batch 512, context 192, 32 heads, d 128, block size 16.

    python3 -m bench.probes.decode_attn_sweep --out $OUT/decode_attn_sweep.json [--kinds tile,words,vector]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench.harness import gpu_env, log, rel_err, result_path, timed, write_result
from bench.workloads import paged_cache
from inference.kernels.decode_attention import decode_attention, decode_attention_reference
from inference.kernels.triton_utils import LOG2E


@triton.jit
def _mha_vector_kernel(Q, K_CACHE, V_CACHE, BLOCK_TABLES, CONTEXT_LENS, OUT, scale_log2e,
                       stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
                       HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    ctx = tl.load(CONTEXT_LENS + b)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qt + h * stride_qh + d).to(tl.float32)
    m = float("-inf")
    l_sum = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    table = BLOCK_TABLES + b * stride_bt
    for n0 in range(0, ctx, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < ctx
        blk = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        off = blk * stride_cb + (n % BLOCK_SIZE) * stride_cs + h * stride_ch
        k = tl.load(K_CACHE + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
        v = tl.load(V_CACHE + off[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], 1) * scale_log2e
        s = tl.where(n_mask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new)
        l_sum = l_sum * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), 0)
        m = m_new
    tl.store(OUT + b * stride_ot + h * stride_oh + d, (acc / l_sum).to(OUT.dtype.element_ty))


def mha_vector(q, k, v, tables, lens, scale, out, block_n, warps, stages):
    B, H, D = q.shape
    _mha_vector_kernel[(B, H)](q, k, v, tables, lens, out, scale * LOG2E, q.stride(0), q.stride(1),
                               k.stride(0), k.stride(1), k.stride(2), tables.stride(0), out.stride(0), out.stride(1),
                               HEAD_DIM=D, BLOCK_SIZE=k.shape[1], BLOCK_N=block_n, num_warps=warps, num_stages=stages)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("decode_attn_sweep.json"))
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=192)
    ap.add_argument("--copy-bw", type=float, default=4.26e12)
    ap.add_argument("--kinds", default="tile,words,vector")
    ap.add_argument("--block-n", default="32,64,128")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="2,3,4")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, CTX, H, D, BS = args.batch, args.ctx, 32, 128, 16
    kb, vb, tables = paged_cache(B, CTX, H, D, BS, gen)
    q = torch.randn(B, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    lens = torch.full((B,), CTX, dtype=torch.int32, device="cuda")
    rows = []
    for cache in ("bf16", "fp8"):
        k, v = (kb, vb) if cache == "bf16" else (kb.to(torch.float8_e4m3fn), vb.to(torch.float8_e4m3fn))
        nbytes = 2 * B * CTX * H * D * k.element_size()
        ref = decode_attention_reference(q[:8], k, v, tables[:8], lens[:8], D ** -0.5)
        kinds = [k for k in args.kinds.split(",") if cache == "fp8" or k != "words"]
        cands = [(kind, bn, w, st) for kind in kinds if kind != "vector"
                 for bn in map(int, args.block_n.split(",")) for w in map(int, args.warps.split(","))
                 for st in map(int, args.stages.split(","))]
        if "vector" in kinds:
            cands += [("vector", bn, w, st) for bn in (16, 32, 64) for w in (4, 8) for st in (2, 3)]
        for kind, bn, w, st in cands:
            out = torch.full_like(q, float("nan"))
            if kind in ("tile", "words"):
                fn = lambda: decode_attention(q, k, v, tables, lens, D ** -0.5, num_splits=1, out=out,  # noqa: E731
                                              block_n=bn, num_warps=w, num_stages=st, words=kind == "words")
            else:
                fn = lambda: mha_vector(q, k, v, tables, lens, D ** -0.5, out, bn, w, st)  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:
                log(f"  {cache} {kind} {bn}/{w}/{st} failed: {type(e).__name__} {str(e)[:80]}")
                continue
            err = rel_err(out[:8], ref)
            t = timed(fn, reps=20)
            r = {"cache": cache, "kind": kind, "block_n": bn, "warps": w, "stages": st, "us": t * 1e6,
                 "GBps": nbytes / t / 1e9, "fraction_of_copy": nbytes / t / args.copy_bw, "rel_err": err}
            rows.append(r)
        for kind in kinds:
            ok = [r for r in rows if r["cache"] == cache and r["kind"] == kind and r["rel_err"] < 3e-2]
            ok.sort(key=lambda r: r["us"])
            for r in ok[:4]:
                log(f"{cache} {kind:6s} bn {r['block_n']:3d} w {r['warps']} st {r['stages']}: {r['us']:8.1f} us "
                    f"{r['GBps']:6.0f} GB/s ({r['fraction_of_copy']:.0%}) err {r['rel_err']:.1e}")
        default = [r for r in rows if r["cache"] == cache and r["kind"] == "tile" and r["block_n"] == 64
                   and r["warps"] == 4 and r["stages"] == 2]
        if default:
            log(f"{cache} engine default (tile 64/4/2): {default[0]['us']:.1f} us {default[0]['GBps']:.0f} GB/s")
    write_result(args.out, {**gpu_env(), "shape": [B, CTX, H, D, BS], "rows": rows})


if __name__ == "__main__":
    main()
