"""Decode GEMVs at batch 1 (run on the device): chains of a whole 7B step's GEMVs in one graph
(cuBLAS vs our bf16 GEMV, int8; programmatic dependent launch on and off) and of small kernels,
then the plain-weight Triton GEMV's tile sweep (kernels/quant_gemv.py, BITS=16) against bf16
cuBLAS on Llama-2-7B's four linear shapes. (Run 22 also timed SiLU-and-mul in the down GEMV's
prologue: slower in every format, removed; bench/NOTES.md.)

Every time comes from one CUDA graph over enough weight copies (>= 600 MB) that each call reads
its weight from DRAM, not L2 (bench/quant_gpu.py's graph_time); GB/s count the weight bytes.

    python3 bench/gemv_bench.py --out $OUT/gemv.json [--sections pdl,bf16]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_kernels import log  # noqa: E402
from quant_gpu import SHAPES, graph_time, quantized_copies  # noqa: E402

from kernels.quant_gemv import gemv, quant_gemv  # noqa: E402
from kernels.rms_norm import rms_norm  # noqa: E402

TILES = [(bn, bk, w) for bn in (2, 4, 8) for bk in (512, 1024) for w in (4, 8)]


def bf16_sweep() -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(6e8 // (n * k * 2)))
        ws = [torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        t_cublas = graph_time(lambda i: torch.nn.functional.linear(x, ws[i]), copies)
        ref = torch.nn.functional.linear(x.float(), ws[0].float())
        best = None
        for bn, bk, warps in TILES + [(None, None, None)]:
            tiles = None if bn is None else (bn, bk)
            try:
                got = gemv(x, ws[0], tiles=tiles, num_warps=warps).float()
                err = float((got - ref).norm() / ref.norm())
                t = graph_time(lambda i: gemv(x, ws[i], tiles=tiles, num_warps=warps), copies)
            except Exception as e:                                         # out of registers
                log(f"  {name} {bn}/{bk}/{warps}: {type(e).__name__}: {e}"[:200])
                continue
            row = {"shape": name, "n": n, "k": k, "block_n": bn, "block_k": bk, "warps": warps,
                   "default": bn is None, "us": t * 1e6, "GBps": n * k * 2 / t / 1e9, "rel_err": err,
                   "cublas_us": t_cublas * 1e6, "cublas_GBps": n * k * 2 / t_cublas / 1e9}
            rows.append(row)
            if err < 1e-2 and bn is not None and (best is None or t < best["us"] / 1e6):
                best = row
        d = rows[-1]
        log(f"bf16 gemv {name}: cuBLAS {t_cublas * 1e6:.1f} us ({d['cublas_GBps']:.0f} GB/s) | default "
            f"{d['us']:.1f} us | best {best['us']:.1f} us ({best['GBps']:.0f} GB/s) at "
            f"{best['block_n']}/{best['block_k']}/{best['warps']}")
        ws = None
        torch.cuda.empty_cache()
    return rows


def pdl_chains() -> list[dict]:
    """One CUDA graph of a 7B decode step's 128 int8 GEMVs (32 layers x 4 shapes, every layer its
    own weights), and one of 256 back-to-back RMSNorms, with and without programmatic dependent
    launch: what PDL saves per kernel boundary."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    layers = [{name: quantized_copies(n, k, 8, 1, gen)[0][:4] for name, (n, k) in SHAPES.items()} for _ in range(32)]
    xs = {name: torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
    h = torch.randn(1, 4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    res, w = torch.randn_like(h), torch.randn(4096, generator=gen, device="cuda", dtype=torch.bfloat16)
    bf16 = [{name: torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
             for name, (n, k) in SHAPES.items()} for _ in range(32)]
    chains = {
        "int8 gemv x128": (128, lambda pdl: [quant_gemv(xs[name], *layer[name][:3], 8, layer[name][3], pdl=pdl)
                                             for layer in layers for name in SHAPES]),
        "bf16 gemv x128": (128, lambda pdl: [gemv(xs[name], layer[name], pdl=pdl)
                                             for layer in bf16 for name in SHAPES]),
        "bf16 cuBLAS x128 (pdl: n/a)": (128, lambda pdl: [torch.nn.functional.linear(xs[name], layer[name])
                                                          for layer in bf16 for name in SHAPES]),
        "rms_norm x256": (256, lambda pdl: [rms_norm(h, w, 1e-5, res, pdl=pdl) for _ in range(256)]),
    }
    rows = []
    for name, (count, chain) in chains.items():
        times = {}
        for pdl in (False, True, False, True):                # twice each: the spread between repeats
            times.setdefault(pdl, []).append(graph_time(lambda i: chain(pdl), 1))
        off, on = min(times[False]), min(times[True])
        rows.append({"chain": name, "kernels": count, "off_us": off * 1e6, "on_us": on * 1e6,
                     "all_off_us": [t * 1e6 for t in times[False]], "all_on_us": [t * 1e6 for t in times[True]],
                     "saved_us_per_kernel": (off - on) * 1e6 / count})
        log(f"PDL {name}: off {off * 1e6:.1f} us, on {on * 1e6:.1f} us -> {(off - on) * 1e6 / count:.2f} us "
            f"per kernel (repeats off {[round(t * 1e6, 1) for t in times[False]]}, on "
            f"{[round(t * 1e6, 1) for t in times[True]]})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/gpu_gemv.json"))
    ap.add_argument("--sections", default="pdl,bf16")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    import triton

    from cpu_engine import git_commit
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "commit": git_commit()}
    for name, fn in (("pdl", pdl_chains), ("bf16", bf16_sweep)):
        if name not in sections:
            continue
        res[name] = fn()
        Path(args.out).write_text(json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
