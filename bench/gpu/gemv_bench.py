"""Decode GEMVs at batch 1 (run on the device): chains of a whole 7B step's GEMVs in one graph
(cuBLAS vs our bf16 GEMV, int8; programmatic dependent launch on and off) and of small kernels,
then the plain-weight Triton GEMV's tile sweep (inference/kernels/quant_gemv.py, BITS=16) against bf16
cuBLAS on Llama-2-7B's four linear shapes. (Variants once timed here and removed, such as SiLU in
the down GEMV's prologue: bench/journal/2026-12-01-batch1-decode-profile.md, run 22.)

Section `quant`: the int8 (per channel) / int4 (group 128) GEMV's code conversions at M=1
(inference/kernels/quant_gemv.py CONVERT 0 = today's I2F, 1 = fp16 magic, 2 = fp16 magic with the offset in
the zero point, 3 = HFMA2 chunks) over a tile sweep on every 7B shape, each config's relative
error against the fp32 dequantized reference, bf16 cuBLAS as the peer; per (format, variant) the
SASS opcode counts, registers and spills of its default-tile kernel. A config that fails to
compile or run is logged and skipped.

Every time comes from one CUDA graph over enough weight copies (>= 600 MB) that each call reads
its weight from DRAM, not L2 (bench/harness.py's graph_time); GB/s count the weight bytes.

    python3 -m bench.gpu.gemv_bench --out $OUT/gemv.json [--sections pdl,bf16]
    python3 -m bench.gpu.gemv_bench --sections quant --out $OUT/gemv_quant.json [--converts 0,1,2,3]
    python3 -m bench.gpu.gemv_bench --sections fp8 --out $OUT/gemv_fp8.json [--tiles 4/2048/2,...]
    python3 -m bench.gpu.gemv_bench --sections fused --out $OUT/gemv_fused.json [--tiles 2/4096/2,...]
"""
from __future__ import annotations

import argparse
import collections
import re
import time
from pathlib import Path

import torch

import inference.kernels.quant_gemv as quant_gemv_module
from bench.harness import gpu_env, graph_time, log, result_path, write_result
from bench.workloads import SHAPES, quantized_copies
from inference.kernels.quant_gemv import gemv, gemv_fp8, quant_gemv
from inference.kernels.rms_norm import rms_norm

TILES = [(bn, bk, w) for bn in (2, 4, 8) for bk in (512, 1024) for w in (4, 8)]
QUANT_TILES = [(bn, bk, w) for bn in (8, 16, 32) for bk in (512, 1024) for w in (2, 4, 8)]
MAX_PRODUCTS_PER_THREAD = 256       # larger tiles spill (run 17) and take long to compile: skipped
SASS_OPS = ("I2F", "I2FP", "F2F", "PRMT", "LOP3", "SHF", "HADD2", "HMUL2", "HFMA2", "FFMA", "FADD", "FMUL",
            "F2FP", "SHFL", "LDG", "LDS", "STS", "BAR")


def compiled_kernels() -> list:
    """The quant GEMV's compiled kernels in Triton's in-memory cache (best effort: the cache's
    layout differs between Triton versions)."""
    found = []
    for cache in getattr(quant_gemv_module._quant_gemv_kernel, "device_caches", {}).values():
        for part in cache if isinstance(cache, tuple) else (cache,):
            if isinstance(part, dict):
                found += [k for k in part.values() if hasattr(k, "asm")]
    return found


def kernel_profile(kernel) -> dict:
    """Registers, spills and the SASS opcode counts that tell the conversions apart."""
    out = {"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None)}
    try:
        sass = kernel.asm["sass"]
        ops = collections.Counter(m.group(1).split(".")[0] for m in
                                  re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass))
        out["sass_total"] = sum(ops.values())
        out["sass"] = {op: ops.get(op, 0) for op in SASS_OPS}
    except Exception as e:                                                 # no cuobjdump / nvdisasm
        out["sass_error"] = f"{type(e).__name__}: {e}"[:200]
        ptx = kernel.asm.get("ptx", "")
        ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s+(?:@%p\d+\s+)?([a-z][a-z0-9_.]*)", ptx, re.M))
        out["ptx"] = {op: n for op, n in ops.most_common(25)}
    return out


def unpacked_codes(qw: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    if bits == 8:
        return qw
    return torch.stack([qw & 0xF, qw >> 4], -1).reshape(qw.shape[0], -1)[:, :k]


def quant_sweep(converts: list[int], tiles: list[tuple[int, int, int]], bit_widths: list[int],
                out_path: Path, res: dict) -> dict:
    """Every (format, shape, CONVERT, tile) at M=1, timed in one CUDA graph over >= 600 MB of code
    copies; rel_err against fp32 x @ dequantized W. Writes what is done after each shape."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    sweep, best_rows, failures, profiles = [], [], [], {}
    done = res.setdefault("quant", {"sweep": sweep, "best": best_rows, "failures": failures, "kernels": profiles})
    t_start = time.time()
    for bits in bit_widths:
        for name, (n, k) in SHAPES.items():
            copies = max(2, int(6e8 // (n * k * bits / 8)))             # >= 600 MB of codes: past L2
            packs = quantized_copies(n, k, bits, copies, gen)
            qw0, s0, z0, gl = packs[0][:4]
            nbytes = qw0.numel() + 8 * s0.numel()
            x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
            deq = ((unpacked_codes(qw0, bits, k).float() - z0.repeat_interleave(gl, 1)[:, :k])
                   * s0.repeat_interleave(gl, 1)[:, :k])
            ref = x.float() @ deq.t()
            deq = None
            bf16 = [p[4] for p in packs]
            t_bf16 = graph_time(lambda i: torch.nn.functional.linear(x, bf16[i]), copies)
            bf16 = None
            per_convert = {}
            for convert in converts:
                for tile in [None] + tiles:
                    bn, bk, warps = tile if tile else (None, None, None)
                    cfg = f"int{bits} {name} convert={convert} " + (f"{bn}/{bk}/{warps}" if tile else "default")
                    if tile and bn * bk / (32 * warps) > MAX_PRODUCTS_PER_THREAD:
                        continue
                    kw = {"tiles": (bn, bk) if tile else None, "num_warps": warps, "convert": convert}
                    before = {id(c) for c in compiled_kernels()}
                    try:
                        got = quant_gemv(x, qw0, s0, z0, bits, gl, **kw).float()
                        err = float((got - ref).norm() / ref.norm())
                        t = graph_time(lambda i: quant_gemv(x, packs[i][0], packs[i][1], packs[i][2], bits, packs[i][3],
                                                            **kw), copies)
                    except Exception as e:                                 # compile failure, bad PTX, registers
                        msg = f"{type(e).__name__}: {e}"
                        log(f"  FAILED {cfg}: {msg[:300]}")
                        failures.append({"config": cfg, "error": msg[:2000]})
                        continue
                    if tile is None:
                        new = [c for c in compiled_kernels() if id(c) not in before]
                        key = f"int{bits} convert={convert} n={n}"
                        if new and key not in profiles:
                            profiles[key] = kernel_profile(new[-1])
                    row = {"shape": name, "n": n, "k": k, "bits": bits, "convert": convert, "block_n": bn,
                           "block_k": bk, "warps": warps, "default": tile is None, "us": t * 1e6,
                           "GBps": nbytes / t / 1e9, "rel_err": err, "bf16_us": t_bf16 * 1e6,
                           "speedup_vs_bf16": t_bf16 / t}
                    sweep.append(row)
                    ok = err < 2e-2          # the fp32 reference: a right kernel is ~1e-3 (bf16 output)
                    cur = per_convert.get(convert)
                    if ok and (cur is None or t * 1e6 < cur["us"]):
                        per_convert[convert] = row
                    if not ok:
                        log(f"  WRONG {cfg}: rel_err {err:.3g}")
            base = next((r["us"] for r in sweep if r["shape"] == name and r["bits"] == bits and r["convert"] == 0
                         and r["default"]), None)
            for convert, row in sorted(per_convert.items()):
                row = dict(row, vs_today_default=(base / row["us"]) if base else None)
                best_rows.append(row)
                log(f"int{bits} {name:8s} convert={convert}: best {row['us']:6.1f} us ({row['GBps']:5.0f} GB/s, "
                    f"{row['speedup_vs_bf16']:.2f}x bf16 {row['bf16_us']:.1f} us"
                    + (f", {row['vs_today_default']:.2f}x today's default" if base else "")
                    + f") at {row['block_n']}/{row['block_k']}/{row['warps']}, rel_err {row['rel_err']:.2e}")
            log(f"  [{time.time() - t_start:.0f} s]")
            packs = None
            torch.cuda.empty_cache()
            write_result(out_path, res)
    log("\nbest per variant (us):  " + "  ".join(f"c{c}" for c in converts))
    for bits in bit_widths:
        for name in SHAPES:
            cells = {r["convert"]: r["us"] for r in best_rows if r["bits"] == bits and r["shape"] == name}
            log(f"  int{bits} {name:8s} " + "  ".join(f"{cells[c]:6.1f}" if c in cells else "   n/a" for c in converts))
    for key, prof in profiles.items():
        log(f"  {key}: regs {prof.get('n_regs')} spills {prof.get('n_spills')} "
            + (" ".join(f"{op}={c}" for op, c in prof["sass"].items() if c) if "sass" in prof
               else prof.get("sass_error", "")))
    return done


def bf16_sweep(sweep_tiles: list[tuple[int, int, int]]) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(6e8 // (n * k * 2)))
        ws = [torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        t_cublas = graph_time(lambda i: torch.nn.functional.linear(x, ws[i]), copies)
        ref = torch.nn.functional.linear(x.float(), ws[0].float())
        best = None
        for bn, bk, warps in sweep_tiles + [(None, None, None)]:
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


FUSED_TILES = [(bn, bk, w) for bn in (2, 4, 8) for bk in (1024, 2048, 4096) for w in (2, 4)
               if bn * bk // (32 * w) <= MAX_PRODUCTS_PER_THREAD]


def fused_sweep(tiles: list[tuple[int, int, int]]) -> list[dict]:
    """The fused decode GEMVs (inference/kernels/gemv_fused.py) on the 7B's bf16 shapes at M=1, each with its
    layer's epilogue (qkv: norm scale + RoPE + KV write; o / down: residual + squares; gate_up:
    norm scale + SiLU over paired rows), over a tile sweep; the plain GEMV at its default tiles
    is the peer on the same weights."""
    from inference.kernels.gemv_fused import STATS_LANES, GemvWeight, RopeKV, gemv_residual, gemv_rope_kv, gemv_silu
    gen = torch.Generator(device="cuda").manual_seed(5)
    dev = "cuda"
    stats = torch.rand(1, STATS_LANES, dtype=torch.float64, device=dev) * 100
    out_rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(6e8 // (n * k * 2)))
        ws = [torch.randn(n, k, generator=gen, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, generator=gen, device=dev, dtype=torch.bfloat16)
        residual = torch.zeros(1, n, device=dev, dtype=torch.bfloat16)
        stats_out = torch.zeros(1, STATS_LANES, dtype=torch.float64, device=dev)
        cache = torch.zeros(8, 16, 32, 128, device=dev, dtype=torch.bfloat16)
        cos_sin = torch.rand(64, 128, device=dev)
        rope = RopeKV(torch.tensor([3], device=dev), cos_sin, cache, cache.clone(), torch.tensor([17], device=dev),
                      32, 32, cos_sin[3:4].contiguous())

        def fused(i, t):
            w = GemvWeight.plain(ws[i])
            if name == "qkv":
                return gemv_rope_kv(x, w, stats, 1e-5, rope, tiles=t)
            if name == "gate_up":
                return gemv_silu(x, w, stats, 1e-5, tiles=t)
            return gemv_residual(x, w, residual, stats_out, tiles=t)
        t_plain = graph_time(lambda i: gemv(x, ws[i]), copies)
        best = None
        for cfg in tiles + [None]:
            try:
                t = graph_time(lambda i: fused(i, cfg), copies)
            except Exception as e:                                         # out of registers / shared memory
                log(f"  fused {name} {cfg}: {type(e).__name__}: {e}"[:200])
                continue
            row = {"shape": name, "n": n, "k": k, "tiles": cfg, "default": cfg is None, "us": t * 1e6,
                   "GBps": n * k * 2 / t / 1e9, "plain_gemv_us": t_plain * 1e6}
            out_rows.append(row)
            if cfg is not None and (best is None or t < best["us"] / 1e6):
                best = row
        d = out_rows[-1]
        log(f"fused {name}: plain gemv {t_plain * 1e6:.1f} us | fused default {d['us']:.1f} us | best "
            f"{best['us']:.1f} us ({best['GBps']:.0f} GB/s) at {best['tiles']}")
        ws = None
        torch.cuda.empty_cache()
    return out_rows


def fp8_sweep(tiles: list[tuple[int, int, int]]) -> list[dict]:
    """The weight-only FP8 GEMV (`gemv_fp8`: e4m3 codes, one fp32 scale a row) at M=1 over a tile
    sweep on the 7B shapes, bf16 cuBLAS the peer; rel_err against fp32 x @ the dequantized W."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(6e8 // (n * k)))
        packs = []
        for _ in range(copies):
            w = torch.randn(n, k, generator=gen, device="cuda") * 0.02
            scale = w.abs().amax(1) / 448.0
            packs.append(((w / scale[:, None]).to(torch.float8_e4m3fn), scale.contiguous(), w.bfloat16()))
        x = torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ (packs[0][0].float() * packs[0][1][:, None]).t()
        t_bf16 = graph_time(lambda i: torch.nn.functional.linear(x, packs[i][2]), copies)
        best = None
        for tile in [None] + tiles:
            bn, bk, warps = tile if tile else (None, None, None)
            if tile and bn * bk / (32 * warps) > MAX_PRODUCTS_PER_THREAD:
                continue
            kw = {"tiles": (bn, bk) if tile else None, "num_warps": warps}
            try:
                err = float((gemv_fp8(x, packs[0][0], packs[0][1], **kw).float() - ref).norm() / ref.norm())
                t = graph_time(lambda i: gemv_fp8(x, packs[i][0], packs[i][1], **kw), copies)
            except Exception as e:                                         # out of registers
                log(f"  fp8 {name} {bn}/{bk}/{warps}: {type(e).__name__}: {e}"[:200])
                continue
            row = {"shape": name, "n": n, "k": k, "block_n": bn, "block_k": bk, "warps": warps,
                   "default": tile is None, "us": t * 1e6, "GBps": n * k / t / 1e9, "rel_err": err,
                   "bf16_us": t_bf16 * 1e6}
            rows.append(row)
            if err < 2e-2 and (best is None or t < best["us"] / 1e6):
                best = row
        default = next((r for r in rows if r["shape"] == name and r["default"]), None)
        log(f"fp8 gemv {name}: bf16 cuBLAS {t_bf16 * 1e6:.1f} us | default "
            + (f"{default['us']:.1f} us" if default else "failed") + " | best "
            + (f"{best['us']:.1f} us ({best['GBps']:.0f} GB/s) at {best['block_n']}/{best['block_k']}/{best['warps']}"
               if best else "none within tolerance"))
        packs = None
        torch.cuda.empty_cache()
    return rows


def pdl_chains() -> list[dict]:
    """One CUDA graph of a 7B decode step's 128 int8 GEMVs (32 layers x 4 shapes, every layer its
    own weights), and one of 256 back-to-back RMSNorms, with and without programmatic dependent
    launch: what PDL saves per kernel boundary."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    layers = [{name: quantized_copies(n, k, 8, 1, gen)[0][:4] for name, (n, k) in SHAPES.items()} for _ in range(32)]
    xs = {name: torch.randn(1, k, generator=gen, device="cuda", dtype=torch.bfloat16)
          for name, (n, k) in SHAPES.items()}
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
    ap.add_argument("--out", default=result_path("gpu_gemv.json"))
    ap.add_argument("--sections", default="pdl,bf16", help="pdl, bf16, quant, fp8, fused")
    ap.add_argument("--converts", default="0,1,2,3", help="quant: inference/kernels/quant_gemv.py CONVERT values")
    ap.add_argument("--bits", default="8,4", help="quant: formats")
    ap.add_argument("--tiles", default=None,
                    help="bf16 / fp8 / quant: BLOCK_N/BLOCK_K/warps list, e.g. 16/1024/4,8/512/2 "
                         "(default: TILES / QUANT_TILES)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    res = gpu_env()
    given = [tuple(int(v) for v in t.split("/")) for t in args.tiles.split(",")] if args.tiles else None
    for name, fn in (("pdl", pdl_chains), ("bf16", lambda: bf16_sweep(given or TILES)),
                     ("fp8", lambda: fp8_sweep(given or QUANT_TILES)),
                     ("fused", lambda: fused_sweep(given or FUSED_TILES))):
        if name not in sections:
            continue
        res[name] = fn()
        write_result(args.out, res)
    if "quant" in sections:
        tiles = given or QUANT_TILES
        quant_sweep([int(c) for c in args.converts.split(",")], tiles, [int(b) for b in args.bits.split(",")],
                    Path(args.out), res)
    write_result(args.out, res)


if __name__ == "__main__":
    main()
