"""Host work per generated token on the CUDA runner's code path, with the model stubbed out.

The GPU benchmark showed host work as ~40% of an offline 128/128 run (journal run 5); this
measures that work on any machine: the real engine (scheduler, block manager, output processing
with the overlap on) and the real CudaModelRunner host path (staging, metadata, sampling rows,
device-side sampling on CPU tensors), with a model whose forward returns random hidden states.
1000 requests of 128 prompt / 128 output tokens, max_num_seqs 512, as in the GPU run. No peer: a
regression tracker.

    .venv/bin/python -m bench.cpu.host_overhead [--reps 3]
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

from bench.harness import result_path, write_result  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.llm import LLM  # noqa: E402
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=result_path("host_overhead.json"))
    args = ap.parse_args()
    config = EngineConfig.load(model="random:tiny", dtype="float32", max_model_len=512, max_num_seqs=512,
                               max_num_batched_tokens=8192, kv_cache_memory_bytes=256 << 20)
    with patch("inference.core.engine.build_runner", stub_runner):
        llm = LLM.from_config(config)
    llm.engine.async_scheduling = True                    # as on CUDA
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(128)]} for _ in range(1000)]
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    llm.generate(prompts[:16], params, use_tqdm=False)    # warm-up
    per_token = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        per_token.append((time.perf_counter() - t0) / (1000 * 128) * 1e6)
    result = {"host_us_per_token": per_token, "median": statistics.median(per_token),
              "per_512_row_step_ms": statistics.median(per_token) * 512 / 1e3}
    print("| host us/token (median) | reps | per 512-row decode step |")
    print(f"| {result['median']:.1f} | {', '.join(f'{x:.1f}' for x in per_token)} | "
          f"{result['per_512_row_step_ms']:.1f} ms |")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
