"""Where the device time of the offline 128/128 throughput run goes (run on the device).

The 1000 x 128/128 workload of bench/gpu/gpu_engine.py / bench/gpu/quant_gpu.py under torch.profiler
(CUDA kernels only), per weights / KV-cache format: wall time, summed kernel time (one stream, so
the device's busy time), the idle remainder, and kernel time grouped into families (GEMMs,
decode attention, prefill attention, FP8 activation quantization, norms, ...), each with its
share and launches, so a gap to the throughput floor can be pinned on a family.

    python3 -m bench.gpu.throughput_profile --out $OUT/throughput_profile.json [--variants bf16/auto,fp8/auto]
"""
from __future__ import annotations

import argparse
import collections
import gc
import time

import torch

from bench.harness import gpu_env, log, result_path, write_result
from bench.workloads import random_prompts
from inference import LLM, SamplingParams

FAMILIES = (            # first match wins; names are lower-cased kernel names
    ("decode attention", ("_decode_split", "_decode_merge")),
    ("prefill attention", ("_prefill_kernel",)),
    ("fp8 activation quant", ("_per_token_fp8",)),
    ("gemm (cublas)", ("nvjet", "gemm", "cutlass", "sm90_xmma", "splitk")),
    ("gemv (triton)", ("_quant_gemv",)),
    ("quant gemm (triton)", ("_quant_matmul", "_w8a16", "_w4a16")),
    ("rms norm", ("_rms_norm",)),
    ("rope + kv write", ("_rotary", "_kv_cache", "reshape_and_cache")),
    ("silu", ("_silu",)),
    ("sampling / elementwise (torch)", ("at::native", "elementwise", "reduce", "softmax", "argmax", "index",
                                        "copy", "fill", "cat", "scatter", "gather", "sort")),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def profiled_run(llm: LLM, variant: str, n: int, params: SamplingParams, vocab: int, plain_wall: float,
                 plain_tok_s: float) -> dict:
    """The same workload on fresh prompts under torch.profiler: wall, kernel and idle time, and
    kernel time by family."""
    from torch.profiler import ProfilerActivity, profile
    fresh = random_prompts(n, [128] * n, vocab, seed=101)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        llm.generate(fresh, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            k = by_name[ev.name.split("(")[0][:90]]
            k[0] += 1
            k[1] += ev.device_time / 1e6                    # seconds
    busy = sum(t for _, t in by_name.values())
    fams: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for name, (c, t) in by_name.items():
        f = fams[family(name)]
        f[0] += c
        f[1] += t
    top = sorted(({"kernel": k, "launches": c, "s": t} for k, (c, t) in by_name.items()), key=lambda r: -r["s"])[:25]
    res = {"profiled_wall_s": wall, "kernel_s": busy, "idle_s": wall - busy,
           "families": {f: {"launches": c, "s": t, "share": t / busy} for f, (c, t) in
                        sorted(fams.items(), key=lambda kv: -kv[1][1])},
           "top_kernels": top}
    log(f"\n== {variant}: {plain_tok_s:.0f} output tok/s (wall {plain_wall:.2f} s; profiled {wall:.2f} s, "
        f"kernels {busy:.2f} s, idle {wall - busy:.2f} s)")
    for f, r in res["families"].items():
        log(f"  {f:32s} {r['s']:7.3f} s  {r['share']:6.1%}  {r['launches']:8.0f} launches")
    for r in top[:12]:
        log(f"    {r['s']:7.3f} s {r['launches']:7.0f}x  {r['kernel']}")
    return res


def profile_run(variant: str, n: int, plain_only: bool = False) -> dict:
    """variant: weights/kv[/max_num_seqs[/max_num_batched_tokens]] (defaults 512 / 8192). The plain
    run's wall time, then (unless plain_only) the profiled pass that explains it."""
    weights, kv, *rest = variant.split("/")
    seqs, budget = (int(v) for v in (rest + ["512", "8192"][len(rest):]))
    llm = LLM("random:llama-2-7b", device="cuda", dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.9,
              max_num_seqs=seqs, max_num_batched_tokens=budget,
              quantization=None if weights == "bf16" else weights, kv_cache_dtype=kv)
    vocab = 32000
    llm.generate(random_prompts(64, [128] * 64, vocab, seed=3),
                 SamplingParams(max_tokens=32, temperature=0, ignore_eos=True), use_tqdm=False)
    prompts = random_prompts(n, [128] * n, vocab, seed=100)
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    # the same workload without the profiler first: its wall time is the figure the profile
    # explains. The profiled run gets fresh prompts of the same shape: the plain run's prompts
    # would hit the prefix cache and skip most of the prefill (runs 29-32 did; journal run 33)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    plain_wall = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {"variant": variant, "requests": n, "output_tokens": n_out, "plain_wall_s": plain_wall,
           "plain_output_tok_s": n_out / plain_wall, "num_kv_blocks": llm.engine.runner.num_blocks,
           "num_preemptions": llm.engine.scheduler.num_preemptions}
    if plain_only:
        log(f"\n== {variant}: {n_out / plain_wall:.0f} output tok/s (wall {plain_wall:.2f} s, "
            f"{llm.engine.runner.num_blocks} KV blocks, {llm.engine.scheduler.num_preemptions} preemptions)")
    else:
        res.update(profiled_run(llm, variant, n, params, vocab, plain_wall, n_out / plain_wall))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("throughput_profile.json"))
    ap.add_argument("--variants", default="bf16/auto,fp8/auto,fp8/fp8_e4m3")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--plain", action="store_true", help="wall time only, no profiled pass")
    ap.add_argument("--fp8-attn", default=None,
                    help="warps/stages of the float8-cache decode attention, e.g. 4/1 "
                         "(an A/B against inference.kernels.decode_attention.FP8_WARPS_STAGES)")
    args = ap.parse_args()
    import inference.kernels.decode_attention as decode_attention_module
    if args.fp8_attn:
        decode_attention_module.FP8_WARPS_STAGES = tuple(int(v) for v in args.fp8_attn.split("/"))

    res = {**gpu_env(), "fp8_attn_warps_stages": decode_attention_module.FP8_WARPS_STAGES, "runs": []}
    for v in args.variants.split(","):
        res["runs"].append(profile_run(v, args.num_requests, args.plain))
        write_result(args.out, res)


if __name__ == "__main__":
    main()
