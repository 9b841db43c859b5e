"""Is an eager (prefill-carrying) step bound by host launches or by the device? (run on the device)

For step shapes (decodes + prefill tokens) on a random-weight model in bf16, three numbers:
  host    seconds to launch the forward + logits from Python (no sync)
  device  the same work's device time alone: launched behind a long `torch.cuda._sleep`, so all
          kernels are queued before the first one starts and the events see no launch gaps
  wall    launch + sync, as the engine sees one step run on its own
host > device means the step is launch-bound: a CUDA graph (or fewer kernels) would shorten it.
Also the per-launch host cost of one small Triton kernel and of one small torch op.

    python3 -m bench.probes.step_launch --model random:llama-2-7b --out $OUT/step_launch.json
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.harness import result_path, write_result
from inference.kernels.decode_attention import choose_num_splits
from inference.kernels.rms_norm import rms_norm
from inference.llm import LLM
from inference.models.triton_layers import KernelAttentionMetadata

SHAPES = ((0, 512), (64, 256), (64, 512), (64, 1024), (256, 768), (128, 0))


def step_meta(runner, nd: int, tp: int, ctx: int, gen) -> tuple[torch.Tensor, torch.Tensor, KernelAttentionMetadata]:
    dev = runner.device
    tables = torch.randint(0, runner.num_blocks, (nd + 1, runner.max_blocks), generator=gen, device=dev,
                           dtype=torch.int32)
    i32 = dict(dtype=torch.int32, device=dev)
    t = nd + tp
    meta = KernelAttentionMetadata(torch.full((t,), -1, dtype=torch.long, device=dev))   # no KV writes
    if nd:
        meta.num_decodes, meta.decode_block_tables = nd, tables[:nd]
        meta.decode_context_lens = torch.full((nd,), ctx, **i32)
        meta.num_splits = choose_num_splits(nd, runner.arch.num_key_value_heads, ctx, runner.num_sms)
    if tp:
        meta.prefill_block_tables = tables[nd:nd + 1]
        meta.prefill_query_start = torch.tensor([0, tp], **i32)
        meta.prefill_context_lens = torch.tensor([tp], **i32)
        meta.max_query_len = tp
    ids = torch.randint(0, runner.arch.vocab_size, (t,), generator=gen, device=dev)
    pos = torch.cat([torch.full((nd,), ctx - 1, device=dev), torch.arange(tp, device=dev)]).long()
    return ids, pos, meta


@torch.inference_mode()
def measure(runner, nd: int, tp: int, gen, reps: int = 7) -> dict:
    ids, pos, meta = step_meta(runner, nd, tp, 1024, gen)
    rows = torch.arange(nd + tp, device=runner.device)[:nd + (1 if tp else 0)]

    def fwd():
        hidden = runner.model(ids, pos, runner.kv_caches, meta)
        return runner.model.compute_logits(hidden[rows])
    fwd()
    torch.cuda.synchronize()
    host, wall, device = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fwd()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(3e8))           # ~0.15 s: every kernel is queued before `a` fires
        a.record()
        fwd()
        b.record()
        b.synchronize()
        device.append(a.elapsed_time(b) / 1e3)
    med = {k: statistics.median(v) * 1e3 for k, v in (("host_ms", host), ("wall_ms", wall), ("device_ms", device))}
    med.update(decodes=nd, prefill_tokens=tp, launch_bound=med["host_ms"] > med["device_ms"])
    return med


@torch.inference_mode()
def launch_cost(dev) -> dict:
    x = torch.randn(4, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    out = {}
    for name, fn in (("triton_rms_norm_us", lambda: rms_norm(x, w, 1e-5)), ("torch_add_us", lambda: x + x)):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        out[name] = (time.perf_counter() - t0) / 2000 * 1e6
        torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random:llama-2-7b")
    ap.add_argument("--out", default=result_path("step_launch.json"))
    args = ap.parse_args()
    llm = LLM(args.model, device="cuda", dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.9,
              max_num_seqs=256, max_num_batched_tokens=2048)
    runner = llm.engine.runner
    gen = torch.Generator(device=runner.device).manual_seed(0)
    res = {"model": args.model, "gpu": torch.cuda.get_device_name(0), "launch": launch_cost(runner.device),
           "steps": [measure(runner, nd, tp, gen) for nd, tp in SHAPES]}
    write_result(args.out, res)
    print(f"{args.model}: per launch {res['launch']}")
    print(f"{'decodes':>8} {'prefill':>8} {'host ms':>8} {'device ms':>10} {'wall ms':>8}")
    for s in res["steps"]:
        print(f"{s['decodes']:>8} {s['prefill_tokens']:>8} {s['host_ms']:>8.2f} {s['device_ms']:>10.2f} "
              f"{s['wall_ms']:>8.2f}")


if __name__ == "__main__":
    main()
