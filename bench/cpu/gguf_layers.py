"""CPU kernel benchmark on a real GGUF file's layers: every decoder linear (q|k|v, o, gate|up, down, as
the model fuses them) and the LM head, built from the file's own codes as the engine builds them, run
by the GGUF kernel of the selected ISA level (INFERENCE_CPU_ISA) at 1 activation row (a decode step)
and at 16 (a concurrent batch). The peer is the memory roofline measured in the same run: reading the
same number of bytes with torch's 2-thread sum.

Per file type (a linear's segments each count under their own type, by bytes) it prints the bytes a
pass reads, ms, GB/s and the fraction of the measured read bandwidth; then the whole pass and the
batch-1 tok/s it bounds (linears only).

    INFERENCE_CPU_ISA=avx2 .venv/bin/python -m bench.cpu.gguf_layers [--model qwen2.5-coder-0.5b] [--reps 30]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from collections import defaultdict

import torch

from bench.harness import cpu_model, git_commit, host_times, result_path, write_result
from inference.kernels.cpu_ops import cpu_isa
from inference.loader.gguf_codes import QUANTIZED, GGUFFile
from inference.loader.model_loader import gguf_source
from inference.models.gguf_cpu_linear import GGUFCpuLinear, gguf_matmul_available
from inference.quantization.gguf_linears import LINEARS


def build(f: GGUFFile) -> list[tuple[str, GGUFCpuLinear]]:
    """(name, linear) for every quantized decoder linear, fused as the model fuses them, and the head."""
    out = []
    layer = 0
    while f"blk.{layer}.attn_q.weight" in f.tensors:
        for (_, name), parts in LINEARS.items():
            names = [f"blk.{layer}.{p}.weight" for p in parts]
            if all(f.kind(n) in QUANTIZED for n in names):
                out.append((f"{layer}.{name}", GGUFCpuLinear([f.codes(n) for n in names])))
        layer += 1
    head = "output.weight" if "output.weight" in f.tensors else "token_embd.weight"
    out.append(("lm_head", GGUFCpuLinear([f.codes(head)])))
    return out


def read_bandwidth(reps: int) -> float:
    """Bytes per second of a 2-thread sum over 512 MiB: what a pass over the weights can reach."""
    x = torch.ones(128 << 20, dtype=torch.float32)
    return x.numel() * 4 / min(host_times(x.sum, reps))


def segment_bytes(lin: GGUFCpuLinear) -> list[tuple[str, int]]:
    return [(t, c.numel() + s.numel() * s.element_size() + m.numel() * m.element_size())
            for t, c, s, m in zip(lin.types, lin.codes, lin.scales, lin.mins)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--out", default=result_path("gguf_layers.json"))
    args = ap.parse_args()
    if not gguf_matmul_available():
        raise SystemExit("gguf_layers: the GGUF kernels do not run on this CPU or build")
    torch.set_num_threads(2)
    path = gguf_source(args.model)
    if path is None:
        raise SystemExit(f"gguf_layers: {args.model} is not a GGUF model")
    linears = build(GGUFFile(path))
    bw = read_bandwidth(args.reps)
    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in {li.in_features for _, li in linears}}
        # whole passes in the model's order, so the weights stream from memory as in a decode step
        # (one linear timed on its own would run from the cache); each linear's time is its median
        per_linear = [[] for _ in linears]
        for _ in range(args.reps + 1):
            for i, (_, li) in enumerate(linears):
                t0 = time.perf_counter()
                li(xs[li.in_features])
                per_linear[i].append(time.perf_counter() - t0)
        by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])     # type -> [bytes, seconds]
        total_s = 0.0
        for (_, li), times in zip(linears, per_linear):
            t = statistics.median(times[1:])
            total_s += t
            segs = segment_bytes(li)
            nbytes = sum(b for _, b in segs)
            for kind, b in segs:                     # a fused linear's time, split by its segments' bytes
                by_type[kind][0] += b
                by_type[kind][1] += t * b / nbytes
        for kind, (b, s) in sorted(by_type.items()) + [("all", (sum(v[0] for v in by_type.values()), total_s))]:
            table.append({"rows": rows, "type": kind, "mb": round(b / 1e6, 1), "ms": round(1e3 * s, 3),
                          "gb_s": round(b / s / 1e9, 1), "of_read_bw": round(b / s / bw, 3)})
    isa = cpu_isa()
    print(f"ISA {isa}; read bandwidth {bw / 1e9:.1f} GB/s (2-thread sum)")
    print(f"{'M':>3} {'type':<6} {'MB':>7} {'ms':>8} {'GB/s':>6} {'of bw':>6}")
    for r in table:
        print(f"{r['rows']:>3} {r['type']:<6} {r['mb']:>7.1f} {r['ms']:>8.3f} {r['gb_s']:>6.1f} "
              f"{r['of_read_bw']:>6.2f}")
    for r in (r for r in table if r["type"] == "all"):
        print(f"{r['rows']} rows, linears only: {r['rows'] * 1e3 / r['ms']:.1f} tok/s; memory roofline "
              f"{r['rows'] * bw / (r['mb'] * 1e6):.1f} tok/s")
    result = {"bench": "gguf_layers", "model": args.model, "isa": isa, "cpu": cpu_model(),
              "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": git_commit(),
              "read_bw_gb_s": round(bw / 1e9, 2), "reps": args.reps, "table": table}
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
