"""Where one batch-1 decode step's device time goes (run on the device): torch.profiler over
replays of the captured batch-1 CUDA graph, kernels grouped by name.

For each weight format: the replay's wall time (CUDA events), the sum of its kernels' own
durations, and per kernel name its launches per step and mean / total microseconds. The gap
(replay - sum of kernels) is the time the GPU spends between kernels of the graph.

    python3 -m bench.gpu.decode_profile --out $OUT/decode_profile.json [--formats bf16,int8,int4]
        [--variants]

--variants re-captures the batch-1 graph with each split count of the decode attention (1-16)
and times each replay on the same inputs, so the A/B comes from one process and one cache.
"""
from __future__ import annotations

import argparse
import gc

import torch

from bench.engine_runs import profile_replay
from bench.harness import gpu_env, log, result_path, timed, write_result
from inference import LLM, SamplingParams


def run_format(fmt: str, context: int, reps: int, variants: bool = False) -> dict:
    llm = LLM("random:llama-2-7b", device="cuda", dtype="bfloat16", max_model_len=1024,
              gpu_memory_utilization=0.5, max_num_seqs=8, max_num_batched_tokens=1024,
              quantization=None if fmt == "bf16" else fmt)
    runner = llm.engine.runner
    prompt = {"prompt_token_ids": list(range(3, 3 + context))}
    llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)
    graph = runner.graphs[1][0]                  # replays the last step's inputs: context ~ prompt + 8
    replay = timed(graph.replay, reps=50)
    kernels, kernel_sum = profile_replay(graph, reps)
    layers = llm.engine.arch.num_hidden_layers
    rows = sorted(({"kernel": n, "per_step": c, "mean_us": t / c, "us_per_step": t}
                   for n, (c, t) in kernels.items()), key=lambda r: -r["us_per_step"])
    out = {"format": fmt, "context": context, "replay_ms": replay * 1e3, "kernel_sum_ms": kernel_sum / 1e3,
           "gap_ms": replay * 1e3 - kernel_sum / 1e3, "kernels_per_step": sum(r["per_step"] for r in rows),
           "layers": layers, "kernels": rows}
    log(f"\n== {fmt}: replay {out['replay_ms']:.3f} ms, kernels {out['kernel_sum_ms']:.3f} ms, "
        f"gaps {out['gap_ms']:.3f} ms, {out['kernels_per_step']:.0f} kernels/step")
    for r in rows[:16]:
        log(f"  {r['per_step']:6.1f} x {r['mean_us']:7.2f} us = {r['us_per_step'] / 1e3:6.3f} ms  {r['kernel']}")
    if variants:
        out["variants"] = run_variants(runner, reps)
    del llm, runner, graph
    gc.collect()
    torch.cuda.empty_cache()
    return out


def run_variants(runner, reps: int) -> list[dict]:
    """The batch-1 graph re-captured with each split count of the decode attention; replay time
    and kernel sum of each, on the same inputs."""
    default = runner._graph_splits(1)
    rows = []
    for splits in sorted({1, 2, 4, 8, 16, default}):
        meta = runner._decode_meta(1, splits)
        runner.graphs.capture(1, lambda meta=meta: runner._decode_forward(1, meta))
        graph = runner.graphs[1][0]
        replay = timed(graph.replay, reps=100)
        kernels, kernel_sum = profile_replay(graph, reps)
        attn_us = sum(t for n, (c, t) in kernels.items() if "decode" in n)
        row = {"splits": splits, "default": splits == default, "replay_ms": replay * 1e3, "tok_s": 1 / replay,
               "kernel_sum_ms": kernel_sum / 1e3, "attention_us_per_step": attn_us}
        log(f"  splits {splits:3d}{' (default)' if splits == default else ''}: replay {row['replay_ms']:.3f} ms "
            f"= {row['tok_s']:.1f} tok/s, attention kernels {attn_us:.0f} us/step")
        rows.append(row)
    meta = runner._decode_meta(1, default)          # leave the default graph in place
    runner.graphs.capture(1, lambda meta=meta: runner._decode_forward(1, meta))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("gpu_decode_profile.json"))
    ap.add_argument("--formats", default="bf16,int8,int4")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", action="store_true", help="A/B the split counts (see the docstring)")
    args = ap.parse_args()
    res = {**gpu_env(), "args": vars(args), "formats": {}}
    for fmt in args.formats.split(","):
        res["formats"][fmt] = run_format(fmt, args.context, args.reps, args.variants)
        write_result(args.out, res)
    write_result(args.out, res)


if __name__ == "__main__":
    main()
