"""Host work per engine step on the CUDA runner's code path, with the model stubbed out.

The GPU benchmark showed host work as ~40% of an offline 128/128 run (journal run 5), and at 1024
running sequences as 35-60% of the 8B's wall time (issue 32); this measures that work on any
machine: the real engine (scheduler, block manager, output processing with the overlap on) and the
real CudaModelRunner host path (staging, metadata, sampling rows, device-side sampling on CPU
tensors), with a model whose forward returns random hidden states (vocabulary 512), and a real
tokenizer (--tokenizer, a model name; `byte` for the byte tokenizer): detokenising is host work.

Per --seqs (max_num_seqs; as many requests, 128 prompt / 128 output tokens, all admitted at
once): the run's wall time over its engine steps, and the decode steps' median time divided by
the sequences they ran: microseconds of host work per step per running sequence, the figure that
must stay flat as the batch grows; and the same in the engine thread's own CPU time (the Python
host work, which the stub's torch threads do not blur). No peer: a regression tracker (the GPU
runs are the peers). Compare trees run by run, alternated: this VM's figures drift by 30%.

    .venv/bin/python -m bench.cpu.host_overhead [--seqs 256 512 1024] [--reps 3] [--tokenizer qwen2.5-coder-0.5b]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from unittest.mock import patch

os.environ.setdefault("TRITON_INTERPRET", "1")     # the runner imports the kernels; none runs here

import torch  # noqa: E402

from bench.harness import cpu_model, git_commit, result_path, write_result  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.llm import LLM  # noqa: E402
from inference.loader.model_loader import resolve_model_dir  # noqa: E402
from inference.sampling_params import SamplingParams  # noqa: E402
from inference.worker.cuda_runner import CudaModelRunner  # noqa: E402
from inference.worker.kv_sizing import num_kv_blocks  # noqa: E402


class StubModel(torch.nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.hidden = hidden
        self.lm_head = torch.randn(vocab, hidden)

    def forward(self, ids, positions, kv_caches, meta):
        return torch.randn(ids.shape[0], self.hidden)     # [T, hidden]

    def compute_logits(self, hidden):
        return hidden @ self.lm_head.T                     # [S, vocab]


def stub_runner(loaded, cfg):
    blocks = num_kv_blocks(loaded, cfg.cache, cfg.cache.kv_cache_memory_bytes, "kv_cache_memory_bytes")
    runner = CudaModelRunner(loaded, cfg.cache, cfg.scheduler, blocks, cfg.model.seed, enforce_eager=True)
    runner.model = StubModel(loaded.arch.hidden_size, loaded.arch.vocab_size)
    return runner


def run(num_seqs: int, reps: int, tokenizer: str) -> dict:
    config = EngineConfig.load(model="random:tiny", dtype="float32", max_model_len=512, max_num_seqs=num_seqs,
                               max_num_batched_tokens=8192, kv_cache_memory_bytes=512 << 20,
                               tokenizer=None if tokenizer == "byte" else str(resolve_model_dir(tokenizer)))
    with patch("inference.core.engine.build_runner", stub_runner):
        llm = LLM.from_config(config)
    engine = llm.engine
    engine.async_scheduling = True                        # as on CUDA
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(128)]} for _ in range(num_seqs)]
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    llm.generate(prompts[:16], params, use_tqdm=False)    # warm-up
    step = engine.step
    # (wall seconds, the engine thread's CPU seconds, sequences running when it began)
    steps: list[tuple[float, float, int]] = []

    def timed_step():
        running = len(engine.scheduler.running)
        t0, c0 = time.perf_counter(), time.thread_time()
        out = step()
        steps.append((time.perf_counter() - t0, time.thread_time() - c0, running))
        return out
    engine.step = timed_step
    per_token, per_seq_step, cpu_per_seq_step = [], [], []
    for _ in range(reps):
        steps.clear()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        per_token.append((time.perf_counter() - t0) / (num_seqs * 128) * 1e6)
        # decode steps with (nearly) every sequence running: the steady state of the batch
        full = [(wall / n * 1e6, cpu / n * 1e6) for wall, cpu, n in steps if n >= 0.9 * num_seqs]
        per_seq_step.append(statistics.median(w for w, _ in full) if full else float("nan"))
        cpu_per_seq_step.append(statistics.median(c for _, c in full) if full else float("nan"))
    engine.step = step
    return {"seqs": num_seqs, "host_us_per_token": per_token, "median_us_per_token": statistics.median(per_token),
            "us_per_step_per_seq": per_seq_step, "median_us_per_step_per_seq": statistics.median(per_seq_step),
            # the engine thread's own CPU time: the Python host work, without the stub's torch threads
            "cpu_us_per_step_per_seq": cpu_per_seq_step,
            "median_cpu_us_per_step_per_seq": statistics.median(cpu_per_seq_step),
            "step_ms_at_full_batch": statistics.median(per_seq_step) * num_seqs / 1e3, "steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokenizer", default="qwen2.5-coder-0.5b", help="a model name, or byte")
    ap.add_argument("--out", default=result_path("host_overhead.json"))
    args = ap.parse_args()
    rows = [run(n, args.reps, args.tokenizer) for n in args.seqs]
    print(f"tokenizer: {args.tokenizer}")
    print("| running seqs | host us/token | wall us per step per seq | engine-thread CPU us per step per seq "
          "| full-batch step ms |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seqs']} | {r['median_us_per_token']:.1f} | {r['median_us_per_step_per_seq']:.2f} "
              f"({', '.join(f'{x:.1f}' for x in r['us_per_step_per_seq'])}) "
              f"| {r['median_cpu_us_per_step_per_seq']:.2f} "
              f"({', '.join(f'{x:.1f}' for x in r['cpu_us_per_step_per_seq'])}) "
              f"| {r['step_ms_at_full_batch']:.1f} |")
    write_result(args.out, {"bench": "host_overhead", "commit": git_commit(), "cpu": cpu_model(),
                            "tokenizer": args.tokenizer, "rows": rows})


if __name__ == "__main__":
    main()
