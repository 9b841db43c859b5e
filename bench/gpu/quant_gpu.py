"""Quantized weights on the GPU (run on the device): the W8A16 / W4A16 kernel against bf16 cuBLAS
on Llama-2-7B's linear shapes, and batch-1 decode of the whole model per format, in one run.

  kernels  per shape and M: time, and for M=1 the achieved bandwidth over the bytes it must read
           (codes + scales + zeros) vs bf16 F.linear reading 2 bytes per weight
  tiles    M=1: every tile / split-K / warps / stages variant on the qkv and o shapes (int8, int4)
  gemv     the decode GEMV (inference/kernels/quant_gemv.py): a tile / warps sweep at M=1 on all four
           shapes, then M=1..8 against the tensor-core kernel; timed in a CUDA graph over enough
           weight copies that they do not fit in L2, so GB/s are DRAM figures
  decode   random:llama-2-7b, bf16 / int8 / int4 (round-to-nearest on load) / fp8 / sparse24,
           batch-1 tok/s, the bytes a step reads and its roofline at the copy bandwidth
  throughput  1000 x 128/128 output tok/s for bf16 and fp8 weights, each with a bf16 and an
           fp8_e4m3 KV cache

    python3 -m bench.gpu.quant_gpu --out $OUT/quant_gpu.json [--formats bf16,int8,int4] [--sections ...]
"""
from __future__ import annotations

import argparse
import gc

import torch

from bench.engine_runs import decode_bench as engine_decode_bench
from bench.engine_runs import step_bytes, throughput_bench
from bench.harness import gpu_env, graph_time, log, result_path, timed, write_result
from bench.workloads import SHAPES, quantized_copies
from inference.kernels.quant_gemv import quant_gemv
from inference.kernels.quant_matmul import quant_matmul
from inference.quantization.config import QuantConfig
from inference.quantization.int_quant import pack_int4, quantize_rtn

# The decode roofline's copy bandwidth: a fixed H200 figure (DESIGN §4, a document not in this
# repo), not measured in the run; the in-run ceilings in the journal read 4.16-4.26 TB/s.
COPY_BW = 4.28e12


def kernel_bench(ms: list[int]) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        packs = {}
        for bits, cfg in ((8, QuantConfig("rtn", 8, -1, True)), (4, QuantConfig("rtn", 4, 128))):
            codes, s, z = quantize_rtn(w, cfg)
            packs[bits] = (pack_int4(codes) if bits == 4 else codes, s, z, cfg.group_len(k))
        for m in ms:
            x = torch.randn(m, k, generator=gen, device="cuda", dtype=torch.bfloat16)
            t_bf16 = timed(lambda: torch.nn.functional.linear(x, w), reps=20)
            row = {"shape": name, "n": n, "k": k, "m": m, "bf16_us": t_bf16 * 1e6,
                   "bf16_GBps": (n * k * 2) / t_bf16 / 1e9}
            for bits, (qw, s, z, gl) in packs.items():
                t = timed(lambda: quant_matmul(x, qw, s, z, bits, gl), reps=20)
                nbytes = qw.numel() + 8 * s.numel()
                row.update({f"int{bits}_us": t * 1e6, f"int{bits}_GBps": nbytes / t / 1e9,
                            f"int{bits}_speedup": t_bf16 / t})
            rows.append(row)
            log(f"{name} m={m}: bf16 {row['bf16_us']:.1f} us ({row['bf16_GBps']:.0f} GB/s) | int8 {row['int8_us']:.1f} "
                f"us ({row['int8_speedup']:.2f}x) | int4 {row['int4_us']:.1f} us ({row['int4_speedup']:.2f}x)")
        w = packs = None                  # free before the next shape
        torch.cuda.empty_cache()
    return rows


def tile_sweep() -> list[dict]:
    """M=1 (decode): time every tile / split / warps / stages variant on two shapes per format."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for name in ("qkv", "o"):
        n, k = SHAPES[name]
        w = torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(x, w).float()
        for bits, cfg in ((8, QuantConfig("rtn", 8, -1, True)), (4, QuantConfig("rtn", 4, 128))):
            codes, sc, z = quantize_rtn(w, cfg)
            qw = pack_int4(codes) if bits == 4 else codes
            nbytes = qw.numel() + 8 * sc.numel()
            best = None
            for bn in (64, 128, 256):
                for bk in ((128, 256) if bits == 8 else (128,)):
                    for split in (1, 4):
                        for warps in (4, 8):
                            for stages in (3,):
                                def fn():
                                    return quant_matmul(x, qw, sc, z, bits, cfg.group_len(k), tiles=(16, bn, bk, split),
                                                        num_warps=warps, num_stages=stages)
                                try:
                                    out = fn().float()
                                except Exception as e:            # e.g. out of shared memory
                                    log(f"  {name} int{bits} {bn}/{bk}/{split}/{warps}/{stages}: {type(e).__name__}")
                                    continue
                                err = float((out - ref).norm() / ref.norm())
                                t = timed(fn, reps=10, warmup=2)
                                row = {"shape": name, "bits": bits, "block_n": bn, "block_k": bk, "split": split,
                                       "warps": warps, "stages": stages, "us": t * 1e6, "GBps": nbytes / t / 1e9,
                                       "rel_err_vs_bf16": err}
                                rows.append(row)
                                # int4 g128 of Gaussian weights is ~0.1 off bf16 by itself; a wrong kernel is ~1
                        if err < 0.2 and (best is None or row["us"] < best["us"]):
                                    best = row
            log(f"tiles {name} int{bits} M=1 best: {best}")
        w = None
        torch.cuda.empty_cache()
    return rows


def gemv_bench(bit_widths: list[int]) -> dict:
    """The GEMV's tiles at M=1 (all shapes, both formats), then rows 1..8: GEMV vs tensor-core
    kernel vs bf16 cuBLAS, DRAM GB/s over the bytes each must read."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    sweep, rows = [], []
    for bits in bit_widths:
        for name, (n, k) in SHAPES.items():
            copies = max(2, int(6e8 // (n * k * bits / 8)))             # >= 600 MB of codes: past L2
            packs = quantized_copies(n, k, bits, copies, gen)
            nbytes = packs[0][0].numel() + 8 * packs[0][1].numel()
            xs = torch.randn(8, k, generator=gen, device="cuda", dtype=torch.bfloat16)
            best = None
            # int4 also tries slabs of one group (no in-slab group split) and taller slabs
            for bn in (8, 16, 32) if bits == 8 else (8, 16, 32, 64):
                for bk in (256, 512, 1024) if bits == 8 else (128, 256, 512, 1024):
                    for warps in (2, 4) if bits == 8 else (2, 4, 8):
                        x = xs[:1]
                        try:
                            ref = torch.nn.functional.linear(x, packs[0][4]).float()
                            got = quant_gemv(x, packs[0][0], packs[0][1], packs[0][2], bits, packs[0][3],
                                             tiles=(bn, bk), num_warps=warps).float()
                            err = float((got - ref).norm() / ref.norm())
                            t = graph_time(lambda i: quant_gemv(x, packs[i][0], packs[i][1], packs[i][2], bits,
                                                                packs[i][3], tiles=(bn, bk), num_warps=warps), copies)
                        except Exception as e:                            # out of registers / shared memory
                            log(f"  gemv {name} int{bits} {bn}/{bk}/{warps}: {type(e).__name__}: {e}"[:200])
                            continue
                        row = {"shape": name, "bits": bits, "block_n": bn, "block_k": bk, "warps": warps,
                               "us": t * 1e6, "GBps": nbytes / t / 1e9, "rel_err_vs_bf16": err}
                        sweep.append(row)
                        # int4 g128 of Gaussian weights is ~0.1 off bf16 by itself; a wrong kernel is ~1
                        if err < 0.2 and (best is None or row["us"] < best["us"]):
                            best = row
            log(f"gemv {name} int{bits} M=1 best: {best}")
            if best is None:
                continue
            bf16 = [p[4] for p in packs]
            for m in (1, 2, 4, 8):
                x = xs[:m]
                t_bf16 = graph_time(lambda i: torch.nn.functional.linear(x, bf16[i]), copies)
                t_gemv = graph_time(lambda i: quant_gemv(x, packs[i][0], packs[i][1], packs[i][2], bits, packs[i][3],
                                                         tiles=(best["block_n"], best["block_k"]),
                                                         num_warps=best["warps"]), copies)
                t_default = graph_time(lambda i: quant_gemv(x, packs[i][0], packs[i][1], packs[i][2], bits,
                                                            packs[i][3]), copies)
                t_tc = graph_time(lambda i: quant_matmul(x, packs[i][0], packs[i][1], packs[i][2], bits, packs[i][3],
                                                         tiles=(16, 128, min(256, packs[i][3]), 1)), copies)
                r = {"shape": name, "bits": bits, "m": m, "bf16_us": t_bf16 * 1e6,
                     "bf16_GBps": n * k * 2 / t_bf16 / 1e9, "gemv_best_us": t_gemv * 1e6,
                     "gemv_default_us": t_default * 1e6, "gemv_GBps": nbytes / t_gemv / 1e9,
                     "tensor_core_us": t_tc * 1e6, "speedup_vs_bf16": t_bf16 / t_gemv}
                rows.append(r)
                log(f"  {name} int{bits} m={m}: bf16 {r['bf16_us']:.1f} us ({r['bf16_GBps']:.0f} GB/s) | gemv best "
                    f"{r['gemv_best_us']:.1f} default {r['gemv_default_us']:.1f} us ({r['gemv_GBps']:.0f} GB/s, "
                    f"{r['speedup_vs_bf16']:.2f}x) | tensor-core {r['tensor_core_us']:.1f} us")
            packs = bf16 = None
            torch.cuda.empty_cache()
    return {"sweep": sweep, "rows": rows}


def decode_bench(formats: list[str], n_tokens: int) -> dict:
    from inference import LLM
    out = {}
    for fmt in formats:
        try:
            llm = LLM("random:llama-2-7b", device="cuda", dtype="bfloat16", max_model_len=1024,
                      gpu_memory_utilization=0.5, max_num_seqs=8, max_num_batched_tokens=1024,
                      quantization=None if fmt == "bf16" else fmt)
        except Exception as e:
            log(f"decode {fmt}: {type(e).__name__}: {e}")
            out[fmt] = {"error": f"{type(e).__name__}: {e}"}
            continue
        model = llm.engine.runner.model
        weights = step_bytes(model)
        try:
            r = engine_decode_bench(llm, COPY_BW, 32000, n_tokens)
        except Exception as e:
            log(f"decode {fmt}: {type(e).__name__}: {e}")
            out[fmt] = {"error": f"{type(e).__name__}: {e}"}
            del llm, model
            gc.collect()
            torch.cuda.empty_cache()
            continue
        r["step_weight_bytes"] = weights                   # the roofline's bytes: these + the mean KV
        out[fmt] = r
        log(f"decode {fmt}: {r['tok_s']:.1f} tok/s, {weights / 1e9:.2f} GB/step, {r['fraction_of_roofline']:.1%} "
            f"of its roofline {r['roofline_tok_s']:.0f}")
        del llm, model
        gc.collect()
        torch.cuda.empty_cache()
    base = out.get("bf16", {}).get("tok_s")
    for _fmt, r in out.items():
        if base and "tok_s" in r:
            r["vs_bf16"] = r["tok_s"] / base
    return out


def throughput(variants: list[str], n: int) -> dict:
    """variant 'weights/kv', e.g. 'bf16/auto', 'fp8/fp8_e4m3'."""
    from inference import LLM
    out = {}
    for v in variants:
        weights, kv = v.split("/")
        llm = LLM("random:llama-2-7b", device="cuda", dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.9,
                  max_num_seqs=512, max_num_batched_tokens=8192, quantization=None if weights == "bf16" else weights,
                  kv_cache_dtype=kv)
        r = throughput_bench(llm, 32000, n, 0)["128_128"]
        r["num_kv_blocks"] = llm.engine.runner.num_blocks
        out[v] = r
        log(f"throughput {v}: {r['output_tok_s']:.0f} output tok/s, {r['num_kv_blocks']} KV blocks")
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("quant_gpu.json"))
    ap.add_argument("--ms", default="1,16,256,2048")
    ap.add_argument("--formats", default="bf16,int8,int4,fp8,sparse24")
    ap.add_argument("--throughput", default="bf16/auto,bf16/fp8_e4m3,fp8/auto,fp8/fp8_e4m3")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--gemv-bits", default="8,4")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--sections", default="kernels,decode")
    args = ap.parse_args()
    res = gpu_env()
    sections = set(args.sections.split(","))
    if "kernels" in sections:
        res["kernels"] = kernel_bench([int(m) for m in args.ms.split(",")])
    if "tiles" in sections:
        res["tiles"] = tile_sweep()
    for name, fn in (("gemv", lambda: gemv_bench([int(b) for b in args.gemv_bits.split(",")])),
                     ("decode", lambda: decode_bench(args.formats.split(","), args.decode_tokens)),
                     ("throughput", lambda: throughput(args.throughput.split(","), args.num_requests))):
        if name in sections:
            res[name] = fn()
            write_result(args.out, res, default=str)     # what is done so far
    write_result(args.out, res, default=str)
    for fmt, r in res.get("decode", {}).items():
        if "tok_s" in r:
            log(f"{fmt}: {r['tok_s']:.1f} tok/s ({r.get('vs_bf16', float('nan')):.2f}x bf16), "
                f"{r['step_weight_bytes'] / 1e9:.2f} GB read per step, {r['fraction_of_roofline']:.1%} of roofline")
    for v, r in res.get("throughput", {}).items():
        log(f"128/128 {v}: {r['output_tok_s']:.0f} output tok/s")


if __name__ == "__main__":
    main()
