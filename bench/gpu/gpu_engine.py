"""GPU benchmark (run on the device): our engine vs HF transformers `generate()` and the roofline.

Everything is measured in one run on one GPU, random-weight models in bf16:
  ceilings   copy bandwidth (device-to-device copy, bytes read + written) and bf16 matmul TFLOP/s
  kernels    decode attention achieved bandwidth (bs 64, ctx 4096) vs the copy ceiling; causal
             prefill attention TFLOP/s at 4k, d=128 (torch SDPA flash on contiguous tensors beside it)
  decode     batch-1 decode tok/s vs the bandwidth roofline (weights + mean KV bytes per token),
             and HF generate() at batch 1
  throughput offline output tok/s: N requests of 128 in / 128 out, and a mixed set (in and out
             uniform in 100..1024); HF generate() on static 128/128 batches (its best batch size)
  serve      in-process OnlineEngine under Poisson arrivals (8 req/s, mixed lengths): P50/P99 TTFT
             and inter-token latency

    python3 -m bench.gpu.gpu_engine --out $OUT/gpu_engine.json [--models llama-2-7b,llama-3-8b]
        [--sections ceilings,kernels,decode,throughput,serve] [--quick]
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import random
import statistics
import threading
import time

import torch

from bench.attention_bench import kernel_bench
from bench.engine_runs import decode_bench, throughput_bench
from bench.harness import copy_bandwidth, git_commit, log, result_path, timed, write_result
from bench.harness import percentile as pct
from inference import SamplingParams
from inference.llm import LLM
from inference.loader.presets import preset_config

TARGETS = {"decode_roofline_fraction": 0.90, "throughput_128_tok_s": 20000, "throughput_vs_hf": 10.0,
           "serve_p99_ttft_ms": 150, "serve_p99_itl_ms": 30, "decode_attn_bw_fraction": 0.80,
           "prefill_attn_tflops": 400}


# ---- ceilings ----------------------------------------------------------------------------------

def ceilings() -> dict:
    copy_bw = copy_bandwidth(1 << 31)                             # 4 GiB of bf16 per buffer
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: a @ b)
    out = {"copy_bandwidth_GBps": copy_bw / 1e9, "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / t / 1e12}
    a = b = None
    torch.cuda.empty_cache()
    return out


# ---- HF peer -----------------------------------------------------------------------------------

def hf_model(preset: str):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = dict(preset_config(preset))
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def hf_generate_time(model, batch: int, prompt_len: int, new_tokens: int, vocab: int) -> float:
    ids = torch.randint(3, vocab, (batch, prompt_len), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def hf_bench(preset: str, sections: set[str], batches: list[int]) -> dict:
    model = hf_model(preset)
    vocab = model.config.vocab_size
    out = {}
    hf_generate_time(model, 1, 16, 8, vocab)                      # warm-up
    if "decode" in sections:
        t1 = statistics.median(hf_generate_time(model, 1, 128, 1, vocab) for _ in range(3))
        t65 = statistics.median(hf_generate_time(model, 1, 128, 65, vocab) for _ in range(2))
        out["bs1_decode_tok_s"] = 64 / (t65 - t1)
        log(f"HF bs1 decode: {out['bs1_decode_tok_s']:.1f} tok/s")
    if "throughput" in sections:
        out["static_128_128"] = {}
        for b in batches:
            try:
                t = hf_generate_time(model, b, 128, 128, vocab)
            except torch.OutOfMemoryError:
                log(f"HF batch {b}: out of memory")
                torch.cuda.empty_cache()
                continue
            out["static_128_128"][b] = b * 128 / t
            log(f"HF batch {b} 128/128: {b * 128 / t:.0f} output tok/s")
        out["best_tok_s"] = max(out["static_128_128"].values())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out


# ---- our engine --------------------------------------------------------------------------------

def serve_bench(model: str, engine_kw: dict, vocab: int, rate: float, n: int) -> dict:
    from inference.online_engine import OnlineEngine
    eng = OnlineEngine(model, **engine_kw)
    rng = random.Random(7)
    work = [([rng.randrange(3, vocab) for _ in range(rng.randint(100, 1024))], rng.randint(100, 1024))
            for _ in range(n)]
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    results: list[dict | None] = [None] * n

    def one(i: int) -> None:
        ids, m = work[i]
        t0 = time.perf_counter()
        stream = eng.add_request({"prompt_token_ids": ids}, SamplingParams(max_tokens=m, temperature=0,
                                                                           ignore_eos=True))
        events = []
        for d in stream:
            if d.error:
                raise RuntimeError(d.error)
            if d.token_ids:
                events.append(time.perf_counter())
        results[i] = {"ttft": events[0] - t0, "itl": [b - a for a, b in zip(events, events[1:])],
                      "at": t0 - start, "prompt": len(ids)}

    warm = eng.add_request({"prompt_token_ids": work[0][0]}, SamplingParams(max_tokens=8, ignore_eos=True))
    list(warm)
    threads = []
    start = time.perf_counter()     # read by one() through the closure
    for i, at in enumerate(arrivals):
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    eng.shutdown()
    ttft = sorted(r["ttft"] for r in results)
    itl = sorted(x for r in results for x in r["itl"])

    slowest = sorted(results, key=lambda r: -r["ttft"])[:5]
    out = {"rate": rate, "requests": n, "wall_s": wall,
           "ttft_ms": {"p50": pct(ttft, 50) * 1e3, "p99": pct(ttft, 99) * 1e3},
           "itl_ms": {"p50": pct(itl, 50) * 1e3, "p99": pct(itl, 99) * 1e3}, "engine": engine_kw,
           "slowest_ttft": [{"ttft_ms": r["ttft"] * 1e3, "arrived_s": r["at"], "prompt_tokens": r["prompt"]}
                            for r in slowest]}
    log(f"  slowest TTFTs: {out['slowest_ttft']}")
    log(f"serve {rate} req/s x {n}: TTFT p50 {out['ttft_ms']['p50']:.1f} p99 {out['ttft_ms']['p99']:.1f} ms; "
        f"ITL p50 {out['itl_ms']['p50']:.1f} p99 {out['itl_ms']['p99']:.1f} ms")
    return out


def engine_kwargs(args, **over) -> dict:
    kw = dict(device="cuda", dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.9,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enforce_eager=args.eager)
    kw.update(over)
    return kw


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--sections", default="ceilings,kernels,decode,throughput,serve")
    ap.add_argument("--out", default=result_path("gpu_engine.json"))
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--num-mixed", type=int, default=400)
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--serve-requests", type=int, default=160)
    ap.add_argument("--serve-rate", type=float, default=8.0)
    # the engine's default budget (configs/engine.yaml); journal run 13 sweeps 512 / 768 / 1024
    ap.add_argument("--serve-batched-tokens", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--hf-batches", default="64,256")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (to measure what they buy)")
    ap.add_argument("--skip-hf", action="store_true", help="no HF peer (quick checks only)")
    ap.add_argument("--kernel-parts", default="decode,prefill")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the 128/128 throughput run's host work")
    args = ap.parse_args()
    if args.quick:
        args.num_requests, args.num_mixed, args.decode_tokens, args.serve_requests = 200, 50, 128, 40
    sections = set(args.sections.split(","))
    import transformers
    import triton
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                 "transformers": transformers.__version__, "commit": git_commit(),
                 "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                 "args": vars(args), "targets": TARGETS, "models": {}}
    log(f"{res['gpu']} torch {res['torch']} triton {res['triton']} commit {res['commit']}")
    copy_bw = 4.28e12
    if "ceilings" in sections:
        res["ceilings"] = ceilings()
        copy_bw = res["ceilings"]["copy_bandwidth_GBps"] * 1e9
        log(f"ceilings: {res['ceilings']}")
    if "kernels" in sections:
        res["kernels"] = kernel_bench(copy_bw, set(args.kernel_parts.split(",")))
    for preset in args.models.split(","):
        model = f"random:{preset}"
        vocab = preset_config(preset)["vocab_size"]
        r: dict = {}
        res["models"][preset] = r
        if sections & {"decode", "throughput"} and not args.skip_hf:
            r["hf"] = hf_bench(preset, sections, [int(b) for b in args.hf_batches.split(",")])
        if sections & {"decode", "throughput"}:
            t0 = time.perf_counter()
            llm = LLM(model, **engine_kwargs(args))
            r["startup_s"] = time.perf_counter() - t0
            r["num_kv_blocks"] = llm.engine.runner.num_blocks
            log(f"ours {preset}: started in {r['startup_s']:.1f} s, {r['num_kv_blocks']} KV blocks")
            if "decode" in sections:
                r["decode"] = decode_bench(llm, copy_bw, vocab, args.decode_tokens)
                r["decode"]["hf_tok_s"] = r.get("hf", {}).get("bs1_decode_tok_s")
            if "throughput" in sections:
                r["throughput"] = throughput_bench(llm, vocab, args.num_requests, args.num_mixed, args.profile)
                if "hf" in r:
                    r["throughput"]["vs_hf_best"] = r["throughput"]["128_128"]["output_tok_s"] / r["hf"]["best_tok_s"]
            del llm
            gc.collect()
            torch.cuda.empty_cache()
        if "serve" in sections:
            r["serve"] = serve_bench(model, engine_kwargs(args, max_num_batched_tokens=args.serve_batched_tokens),
                                     vocab, args.serve_rate, args.serve_requests)
            gc.collect()
            torch.cuda.empty_cache()
        write_result(args.out, res)
    write_result(args.out, res)
    print_table(res)


def print_table(res: dict) -> None:
    log("\n=== summary ===")
    if "ceilings" in res:
        c = res["ceilings"]
        log(f"copy {c['copy_bandwidth_GBps']:.0f} GB/s, bf16 matmul {c['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    for d in res.get("kernels", {}).get("decode", []):
        log(f"decode attn H{d['heads']}/KV{d['kv_heads']} bs{d['batch']} ctx{d['ctx']}: {d['GBps']:.0f} GB/s "
            f"= {d['fraction_of_copy']:.1%} of copy (target 80%)")
    for p in res.get("kernels", {}).get("prefill", []):
        log(f"prefill attn H{p['heads']}/KV{p['kv_heads']} {p.get('prefix', 0)}+{p['tokens']} causal: "
            f"{p['TFLOPs']:.0f} TFLOP/s (torch SDPA {p.get('torch_sdpa_TFLOPs', float('nan')):.0f}; target 400)")
    for name, r in res["models"].items():
        if "decode" in r:
            d = r["decode"]
            log(f"{name} bs1 decode: {d['tok_s']:.1f} tok/s = {d['fraction_of_roofline']:.1%} of "
                f"{d['roofline_tok_s']:.0f} (HF {d['hf_tok_s'] or float('nan'):.1f})")
        for k, t in r.get("throughput", {}).items():
            if isinstance(t, dict):
                log(f"{name} throughput {k}: {t['output_tok_s']:.0f} output tok/s")
        if "vs_hf_best" in r.get("throughput", {}):
            log(f"{name} 128/128 vs HF best ({r['hf']['best_tok_s']:.0f}): {r['throughput']['vs_hf_best']:.1f}x")
        if "serve" in r:
            s = r["serve"]
            log(f"{name} serve {s['rate']} req/s: TTFT p99 {s['ttft_ms']['p99']:.1f} ms, "
                f"ITL p99 {s['itl_ms']['p99']:.1f} ms")


if __name__ == "__main__":
    main()
