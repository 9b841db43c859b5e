"""Mixture of experts on the GPU (run on the device), issue 11's figures in one script:

  layer    one Mixtral-8x7B MoE layer (8 experts, top 2, H 4096, I 14336, bf16): the fused grouped
           GEMMs (kernels/fused_moe.py) against the per-expert loop (experts_reference) at several
           batch sizes, and the fused layer's bandwidth at batch 1 over the bytes of the experts it
           must read; outputs compared first
  decode   random:mixtral-8x7b, batch-1 tok/s against the roofline of the bytes a token reads
           (attention + 2 of 8 experts per layer + lm_head, at the copy bandwidth)
  throughput  128/128 output tok/s with 256 and 1000 requests

    python3 bench/moe_gpu.py --out $OUT/moe_gpu.json [--sections layer,decode,throughput]
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

from gpu_kernels import log, timed  # noqa: E402

from inference.models.moe import experts_reference, route  # noqa: E402
from kernels.fused_moe import fused_experts  # noqa: E402

COPY_BW = 4.28e12           # DESIGN §4
H, I, E, K = 4096, 14336, 8, 2


def layer_bench(batches: list[int]) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    gate = (torch.randn(E, H, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    rows = []
    for t in batches:
        x = torch.randn(t, H, generator=gen, device="cuda").to(torch.bfloat16)
        weights, ids = route(x @ gate.T, K, renormalize=True)
        fused = fused_experts(x, w13, w2, weights, ids)
        ref = experts_reference(x, w13, w2, weights, ids)
        err = ((fused.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        t_fused = timed(lambda: fused_experts(x, w13, w2, weights, ids), reps=10)
        t_loop = timed(lambda: experts_reference(x, w13, w2, weights, ids), reps=10)
        used = len(set(ids.flatten().tolist()))
        nbytes = used * 3 * H * I * 2
        row = {"batch": t, "experts_used": used, "fused_ms": t_fused * 1e3, "loop_ms": t_loop * 1e3,
               "speedup": t_loop / t_fused, "fused_TBps": nbytes / t_fused / 1e12, "max_rel_err": err}
        log(f"layer bs={t:4d}  experts {used}  fused {t_fused * 1e3:7.3f} ms  loop {t_loop * 1e3:7.3f} ms  "
            f"x{t_loop / t_fused:5.2f}  {nbytes / t_fused / 1e12:.2f} TB/s  err {err:.1e}")
        rows.append(row)
    return rows


def decode_bench(n_tokens: int) -> dict:
    from gpu_engine import random_prompts

    from inference import LLM, SamplingParams
    llm = LLM("random:mixtral-8x7b", device="cuda", dtype="bfloat16", max_model_len=2048, gpu_memory_utilization=0.95)
    arch = llm.engine.arch
    prompt = random_prompts(1, [128], arch.vocab_size, seed=1)
    llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    import time
    t0 = time.perf_counter()
    llm.generate(random_prompts(1, [128], arch.vocab_size, seed=2),
                 SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    rate = n_tokens / (time.perf_counter() - t0)
    # bytes a decode token reads: every weight but the embedding table, only top-k of the experts
    active = (arch.num_params(active=True) - arch.vocab_size * arch.hidden_size) * 2
    kv = arch.kv_bytes_per_token(2) * (128 + n_tokens / 2)
    roofline = COPY_BW / (active + kv)
    log(f"decode bs1 {rate:.1f} tok/s = {rate / roofline:.1%} of {roofline:.1f} (active bytes {active / 1e9:.1f} GB)")
    return {"tok_per_s": rate, "roofline_tok_per_s": roofline, "fraction": rate / roofline,
            "active_weight_bytes": active, "llm": llm}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="layer,decode,throughput")
    ap.add_argument("--batches", default="1,8,64,256,1024")
    args = ap.parse_args()
    sections = args.sections.split(",")
    out: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton
    out["triton"] = triton.__version__
    if "layer" in sections:
        out["layer"] = layer_bench([int(b) for b in args.batches.split(",")])
    if "decode" in sections or "throughput" in sections:
        res = decode_bench(128)
        llm = res.pop("llm")
        out["decode"] = res
        if "throughput" in sections:
            from gpu_engine import throughput_bench
            out["throughput"] = {n: throughput_bench(llm, llm.engine.arch.vocab_size, n, 0) for n in (256, 1000)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
