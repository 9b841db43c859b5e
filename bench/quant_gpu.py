"""Quantized weights on the GPU (run on the device): the W8A16 / W4A16 kernel against bf16 cuBLAS
on Llama-2-7B's linear shapes, and batch-1 decode of the whole model per format, in one run.

  kernels  per shape and M: time, and for M=1 the achieved bandwidth over the bytes it must read
           (codes + scales + zeros) vs bf16 F.linear reading 2 bytes per weight
  tiles    M=1: every tile / split-K / warps / stages variant on the qkv and o shapes (int8, int4)
  decode   random:llama-2-7b, bf16 / int8 / int4 (round-to-nearest on load), batch-1 tok/s and the
           decoder-linear weight bytes

    python3 bench/quant_gpu.py --out $OUT/quant_gpu.json [--formats bf16,int8,int4]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_kernels import log, timed  # noqa: E402

from inference.quantization.config import QuantConfig  # noqa: E402
from inference.quantization.int_quant import pack_int4, quantize_rtn  # noqa: E402
from kernels.quant_matmul import quant_matmul  # noqa: E402

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}


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
                                if err < 0.1 and (best is None or row["us"] < best["us"]):
                                    best = row
            log(f"tiles {name} int{bits} M=1 best: {best}")
        w = None
        torch.cuda.empty_cache()
    return rows


def decode_bench(formats: list[str], n_tokens: int) -> dict:
    from inference import LLM, SamplingParams
    from inference.quantization.quant_linear import QuantLinear
    out = {}
    for fmt in formats:
        llm = LLM("random:llama-2-7b", device="cuda", dtype="bfloat16", max_model_len=1024,
                  gpu_memory_utilization=0.5, max_num_seqs=8, max_num_batched_tokens=1024,
                  quantization=None if fmt == "bf16" else fmt)
        model = llm.engine.runner.model
        linear_bytes = sum(m.weight_bytes() if isinstance(m, QuantLinear) else m.weight.numel() * 2
                           for name, m in model.named_modules() if name.endswith(("_proj",)) and "layers" in name)
        prompt = {"prompt_token_ids": list(range(100, 228))}
        llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
        o = llm.generate(prompt, SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True), use_tqdm=False)[0]
        m = o.metrics
        rate = (len(o.outputs[0].token_ids) - 1) / (m.last_token_time - m.first_token_time)
        out[fmt] = {"tok_s": rate, "decoder_linear_bytes": linear_bytes}
        log(f"decode {fmt}: {rate:.1f} tok/s, decoder linears {linear_bytes / 1e9:.2f} GB")
        del llm, model
        gc.collect()
        torch.cuda.empty_cache()
    base = out.get("bf16", {}).get("tok_s")
    for fmt, r in out.items():
        if base:
            r["vs_bf16"] = r["tok_s"] / base
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/quant_gpu.json"))
    ap.add_argument("--ms", default="1,16,256,2048")
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--sections", default="kernels,decode")
    args = ap.parse_args()
    import triton
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}
    sections = set(args.sections.split(","))
    if "kernels" in sections:
        res["kernels"] = kernel_bench([int(m) for m in args.ms.split(",")])
    if "tiles" in sections:
        res["tiles"] = tile_sweep()
    if "decode" in sections:
        res["decode"] = decode_bench(args.formats.split(","), args.decode_tokens)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    for fmt, r in res.get("decode", {}).items():
        log(f"{fmt}: {r['tok_s']:.1f} tok/s ({r.get('vs_bf16', float('nan')):.2f}x bf16), "
            f"{r['decoder_linear_bytes'] / 1e9:.2f} GB of decoder linears")


if __name__ == "__main__":
    main()
