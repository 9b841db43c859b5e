"""Tensor parallelism on several GPUs (issue 10's device figures). Needs a multi-GPU device kind
(nvidia-h200-x2 / -x4 / -x8); it has no result yet (bench/journal/2026-12-02-what-is-left.md):

    python3 -m bench.gpu.tp_gpu --out $OUT/tp_gpu.json [--sections 7b,70b] [--max-tp 8]

  ceiling   copy bandwidth of one GPU, measured in the same run (the roofline's denominator)
  7b        random:llama-2-7b, bf16, TP 1 / 2 / 4: batch-1 decode tok/s (prompt 128, 256 new
            tokens) against the roofline N x bandwidth / weight bytes, and offline throughput
            (256 requests of 128 prompt / 128 output tokens)
  70b       random:llama-2-70b shape, bf16 (~138 GB), TP 2 / 4 / 8: the same two figures

TP sizes above the visible GPU count are skipped (recorded as such). Each engine is shut down
before the next one starts. Random weights: rank r's shard is the slice of the full model's draws
(inference/parallel/loader.py), built on meta, so no GPU ever holds the whole 70B model.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

# KINDS.md: NVLink multicast stays off on the lent machines (set before any rank starts)
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402

from bench.harness import copy_bandwidth, result_path, tagged_log, write_result  # noqa: E402
from inference import LLM, SamplingParams  # noqa: E402
from inference.loader.presets import preset_config  # noqa: E402
from inference.models.arch import ModelArch  # noqa: E402

SECTIONS = {"7b": ("llama-2-7b", (1, 2, 4)), "70b": ("llama-2-70b", (2, 4, 8))}
PROMPT, DECODE, THROUGHPUT_REQS, THROUGHPUT_LEN = 128, 256, 256, 128


log = tagged_log("tp_gpu")


def prompts(n: int, length: int, vocab: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, vocab, (length,), generator=g).tolist()} for _ in range(n)]


def run_one(preset: str, tp: int, bandwidth: float) -> dict:
    arch = ModelArch.from_hf_config(preset_config(preset))
    weight_bytes = arch.num_params() * 2
    t0 = time.perf_counter()
    llm = LLM(f"random:{preset}", dtype="bfloat16", device="cuda", tensor_parallel_size=tp, max_model_len=2048,
              max_num_seqs=256, max_num_batched_tokens=4096, gpu_memory_utilization=0.88)
    load_s = time.perf_counter() - t0
    try:
        one = prompts(1, PROMPT, arch.vocab_size, 0)
        llm.generate(one, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)  # warm
        t = time.perf_counter()
        llm.generate(one, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
        prefill_s = time.perf_counter() - t
        t = time.perf_counter()
        llm.generate(one, SamplingParams(temperature=0, max_tokens=DECODE + 1, ignore_eos=True), use_tqdm=False)
        decode_tok_s = DECODE / (time.perf_counter() - t - prefill_s)
        roofline = tp * bandwidth / weight_bytes
        batch = prompts(THROUGHPUT_REQS, PROMPT, arch.vocab_size, 1)
        t = time.perf_counter()
        outs = llm.generate(batch, SamplingParams(temperature=0, max_tokens=THROUGHPUT_LEN, ignore_eos=True),
                            use_tqdm=False)
        wall = time.perf_counter() - t
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return dict(model=preset, tp=tp, load_s=round(load_s, 1), weight_gb=round(weight_bytes / 1e9, 2),
                    kv_blocks=llm.engine.runner.num_blocks, bs1_decode_tok_s=round(decode_tok_s, 1),
                    roofline_tok_s=round(roofline, 1), roofline_fraction=round(decode_tok_s / roofline, 3),
                    throughput_out_tok_s=round(out_tokens / wall, 1), throughput_requests=THROUGHPUT_REQS)
    finally:
        llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=result_path("tp_gpu.json"))
    p.add_argument("--sections", default="7b,70b")
    p.add_argument("--max-tp", type=int, default=8)
    args = p.parse_args()
    if not torch.cuda.is_available():
        log("no CUDA device: this benchmark runs on a multi-GPU device kind only")
        return 1
    gpus = torch.cuda.device_count()
    result: dict = {"gpus": gpus, "gpu": torch.cuda.get_device_name(0), "runs": []}
    result["copy_bandwidth_gb_s"] = round(copy_bandwidth(1 << 30) / 1e9, 1)     # 2 GiB of bf16, read + written
    log(f"{gpus} x {result['gpu']}, copy bandwidth {result['copy_bandwidth_gb_s']} GB/s per GPU")
    for section in args.sections.split(","):
        preset, sizes = SECTIONS[section]
        for tp in sizes:
            if tp > min(gpus, args.max_tp):
                result["runs"].append(dict(model=preset, tp=tp, skipped=f"{gpus} GPUs visible"))
                continue
            log(f"{preset} TP {tp} ...")
            try:
                run = run_one(preset, tp, result["copy_bandwidth_gb_s"] * 1e9)
            except Exception as exc:                 # noqa: BLE001 - recorded, next size runs
                traceback.print_exc()
                run = dict(model=preset, tp=tp, error=f"{type(exc).__name__}: {exc}"[:2000])
            result["runs"].append(run)
            log(json.dumps(run))
            write_result(args.out, result, indent=2)
    print(f"\n{'model':<12} {'TP':>3} {'bs1 tok/s':>10} {'roofline':>9} {'ratio':>6} {'128/128 out tok/s':>18}")
    for r in result["runs"]:
        if "bs1_decode_tok_s" in r:
            print(f"{r['model']:<12} {r['tp']:>3} {r['bs1_decode_tok_s']:>10} {r['roofline_tok_s']:>9} "
                  f"{r['roofline_fraction']:>6} {r['throughput_out_tok_s']:>18}")
        else:
            print(f"{r['model']:<12} {r['tp']:>3} {r.get('skipped') or r.get('error')}")
    write_result(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
