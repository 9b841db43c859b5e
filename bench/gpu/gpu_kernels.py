"""Attention kernel microbenchmarks (run on the device), each beside its ceiling or peer:

  decode   paged decode attention, bs 64 x ctx 4096, d 128: achieved bandwidth vs the copy ceiling
  prefill  causal prefill attention at 4k, d 128, 32 heads (MHA and GQA-4, and GQA-4 after a cached
           3072-token prefix): TFLOP/s of every PREFILL_VARIANTS entry (the chunk's own K/V from the
           strided qkv rows, pointer loads or TMA) and PAGED_VARIANTS (everything through the block
           table), timed round-robin with torch SDPA (flash, contiguous tensors) as the peer of a
           fresh prompt; outputs poisoned with NaN first and checked against the fp32 reference.

    python3 -m bench.gpu.gpu_kernels --out $OUT/gpu_kernels.json [--parts decode,prefill] [--baseline OLD.py]

--baseline times an earlier inference/kernels/prefill_attention.py (its 64x64/4w/3s tile) in the same rounds.
Compiling the prefill variants takes most of the run; `--compile-shard I/N` (N processes in
parallel, then the real run) fills Triton's cache first.

The benchmarks themselves are bench/attention_bench.py (`kernel_bench` is also the `kernels`
section of bench/gpu/gpu_engine.py).
"""
from __future__ import annotations

import argparse

from bench.attention_bench import kernel_bench, load_module
from bench.harness import gpu_env, log, result_path, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("gpu_kernels.json"))
    ap.add_argument("--parts", default="decode,prefill")
    ap.add_argument("--copy-bw", type=float, default=4.26e12)
    ap.add_argument("--baseline", help="an earlier inference/kernels/prefill_attention.py to time beside this tree's")
    ap.add_argument("--compile-shard", help="I/N: only compile the prefill variants i, i+N, ... (no timing, "
                    "no output): run N of these in parallel first to fill Triton's cache")
    args = ap.parse_args()
    baseline = load_module(args.baseline) if args.baseline else None
    if args.compile_shard:
        i, n = map(int, args.compile_shard.split("/"))
        kernel_bench(args.copy_bw, {"prefill"}, baseline, (i, n))
        return
    res = {**gpu_env(), "kernels": kernel_bench(args.copy_bw, set(args.parts.split(",")), baseline)}
    write_result(args.out, res)
    for d in res["kernels"]["decode"]:
        log(f"decode H{d['heads']}/KV{d['kv_heads']}: {d['GBps']:.0f} GB/s = {d['fraction_of_copy']:.1%} of copy")
    for p in res["kernels"]["prefill"]:
        parts = [f"{m} {(p['best_' + m] or {}).get('TFLOPs', 0):.0f} ({(p['best_' + m] or {}).get('label')})"
                 for m in ("new", "tma", "paged", "baseline") if p.get("best_" + m)]
        sdpa = p.get("torch_sdpa_TFLOPs", float("nan"))
        log(f"prefill H{p['heads']}/KV{p['kv_heads']} {p['prefix']}+{p['tokens']} TFLOP/s: default "
            f"{p['default']['TFLOPs']:.0f}, best {', '.join(parts)}, SDPA {sdpa:.0f}")


if __name__ == "__main__":
    main()
