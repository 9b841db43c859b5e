"""Mixture of experts on the GPU (run on the device), issue 11's figures in one script:

  ceilings    copy bandwidth (the roofline's denominator), measured in the same run
  layer       one Mixtral-8x7B MoE layer (8 experts, top 2, H 4096, I 14336, bf16): the fused path
              (inference/kernels/fused_moe.py, the defaults) against the per-expert loop (experts_reference)
              at several batch sizes, a grouped-GEMM tile sweep and the GEMV path beside it, the
              bytes / FLOP floors, and router + experts replayed as a CUDA graph; outputs compared
              with an fp32 reference first
  decode      random:mixtral-8x7b, batch-1 tok/s against the roofline of the bytes a token reads
              (attention + 2 of 8 experts per layer + lm_head, at the measured copy bandwidth), the
              bs1 graph replay and its per-kernel profile
  threshold   router_weights_threshold 0 / 0.1 / 0.2 / 0.3 on the same model (the router kernel reads
              it from a device tensor: no recapture): bs1 tok/s, expert evaluations skipped, greedy
              agreement and logprob drift against threshold 0
  throughput  128/128 output tok/s with 256 and 1000 requests

    python3 -m bench.gpu.moe_gpu --out $OUT/moe_gpu.json [--sections layer,decode,threshold,throughput]

Each section is written to the JSON as it finishes; a failing section is logged and recorded.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback

import torch

from bench.engine_runs import decode_rate as request_decode_rate
from bench.engine_runs import profile_replay, throughput_bench
from bench.harness import copy_bandwidth, gpu_env, log, rel_err, timed, write_result
from bench.workloads import random_prompts
from inference.kernels.fused_moe import MOE_GEMV_MAX_TOKENS, choose_config, fused_experts
from inference.kernels.moe_routing import fused_route
from inference.models.moe import experts_reference, route

H, INTER, E, K = 4096, 14336, 8, 2
MATMUL_FLOPS = 782e12       # bf16, measured on this machine kind (DESIGN §4, a document not in this repo)
SWEEP = [(16, 64, 32, 4, 3), (16, 64, 128, 4, 4), (16, 128, 128, 4, 4), (32, 64, 128, 4, 4),
         (64, 128, 64, 4, 4), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4),
         (128, 256, 64, 8, 3), (128, 128, 128, 8, 3)]


def layer_bench(batches: list[int], copy_bw: float, device: str = "cuda", dtype=torch.bfloat16) -> dict:
    """(device / dtype: the CPU interpreter at small H / I checks this function's logic)"""
    gen = torch.Generator(device=device).manual_seed(0)
    w13 = (torch.randn(E, 2 * INTER, H, generator=gen, device=device) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, INTER, generator=gen, device=device) * INTER ** -0.5).to(dtype)
    gate = (torch.randn(E, H, generator=gen, device=device) * 0.02).to(dtype)
    rows = []
    for t in batches:
        x = torch.randn(t, H, generator=gen, device=device).to(dtype)
        weights, ids = route(x @ gate.T, K, renormalize=True)
        # fp32 reference on upcast weights, one expert at a time (no full fp32 copy of the layer)
        ref = torch.zeros(t, H, device=device)
        for e in range(E):
            sel = ids == e
            if sel.any():
                tok, slot = sel.nonzero(as_tuple=True)
                hh = x[tok].float() @ w13[e].float().T
                ref.index_add_(0, tok, (torch.nn.functional.silu(hh[:, :INTER]) * hh[:, INTER:]) @ w2[e].float().T
                               * weights[tok, slot, None])
        case = (x, w13, w2, weights, ids)
        fused = fused_experts(*case)
        loop = experts_reference(*case)
        t_fused = timed(lambda case=case: fused_experts(*case), reps=10)
        t_loop = timed(lambda case=case: experts_reference(*case), reps=10)
        used = len(set(ids.flatten().tolist()))
        nbytes = used * 3 * H * INTER * 2
        floor = max(nbytes / copy_bw, 2 * t * K * 3 * H * INTER / MATMUL_FLOPS)
        row = {"batch": t, "experts_used": used,
               "default_path": "gemv" if t <= MOE_GEMV_MAX_TOKENS else str(choose_config(t, K, E)),
               "fused_ms": t_fused * 1e3, "loop_ms": t_loop * 1e3, "speedup_vs_loop": t_loop / t_fused,
               "floor_ms": floor * 1e3, "fused_fraction_of_floor": floor / t_fused,
               "loop_over_floor": t_loop / floor, "fused_TBps": nbytes / t_fused / 1e12,
               "fused_rel_err": rel_err(fused, ref), "loop_rel_err": rel_err(loop, ref), "sweep": {}}
        if t <= 8:
            out = fused_experts(*case, gemv=True)
            row["sweep"]["gemv"] = {"ms": timed(lambda case=case: fused_experts(*case, gemv=True), reps=10) * 1e3,
                                    "rel_err": rel_err(out, ref)}
        rows_per_expert = t * K / E
        for cfg in SWEEP:
            if cfg[0] > max(16, 2 * rows_per_expert):
                continue
            out = fused_experts(*case, config=cfg, gemv=False)
            ms = timed(lambda cfg=cfg, case=case: fused_experts(*case, config=cfg, gemv=False), reps=10) * 1e3
            row["sweep"][str(cfg)] = {"ms": ms, "rel_err": rel_err(out, ref)}
        best = min(row["sweep"].items(), key=lambda kv: kv[1]["ms"])
        row["best"] = {"path": best[0], "ms": best[1]["ms"]}
        log(f"layer bs={t:5d} experts {used}  fused {t_fused * 1e3:7.3f} ms  loop {t_loop * 1e3:7.3f} ms  "
            f"x{t_loop / t_fused:5.2f}  floor {floor * 1e3:6.3f} ms ({floor / t_fused:.0%})  "
            f"{nbytes / t_fused / 1e12:.2f} TB/s  err {row['fused_rel_err']:.1e}  best {best[0]} {best[1]['ms']:.3f}")
        rows.append(row)
    graph = {}
    threshold = torch.zeros(1, device=device)
    for t in (1, 64) if device == "cuda" else ():
        x = torch.randn(t, H, generator=gen, device=device).to(dtype)

        def layer(x=x, w13=w13, w2=w2):
            w, i = fused_route(x @ gate.T, K, True, threshold)
            return fused_experts(x, w13, w2, w, i)
        layer()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            layer()
        graph[t] = {"graph_ms": timed(g.replay, reps=20) * 1e3, "eager_ms": timed(layer, reps=20) * 1e3}
        log(f"layer bs={t} router + experts: graph replay {graph[t]['graph_ms']:.3f} ms, "
            f"eager {graph[t]['eager_ms']:.3f} ms")
    return {"rows": rows, "router_and_experts": graph}


def decode_rate(llm, seed: int, n_tokens: int, reps: int = 3) -> tuple[float, list[float]]:
    from inference import SamplingParams
    vocab = llm.engine.arch.vocab_size
    rates = []
    for rep in range(reps):
        o = llm.generate(random_prompts(1, [128], vocab, seed=seed + rep),
                         SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True), use_tqdm=False)[0]
        rates.append(request_decode_rate(o))
    return statistics.median(rates), rates


def active_weight_bytes(model, arch) -> float:
    """Bytes of the weights one decode token reads, as stored (bf16, or codes + scales when
    quantized): all but the embedding table, and top_k / num_experts of the stacked experts."""
    import itertools
    total = 0.0
    for name, t in itertools.chain(model.named_parameters(), model.named_buffers()):
        if "embed_tokens" in name or "expert_tokens" in name or "rotary" in name:
            continue
        nbytes = t.numel() * t.element_size()
        if ".mlp.w13" in name or ".mlp.w2" in name:
            nbytes *= arch.num_experts_per_tok / arch.num_experts
        total += nbytes
    return total


def decode_bench(llm, copy_bw: float, n_tokens: int) -> dict:
    from inference import SamplingParams
    arch = llm.engine.arch
    llm.generate(random_prompts(1, [128], arch.vocab_size, seed=1),
                 SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    rate, rates = decode_rate(llm, 10, n_tokens)
    # bytes a decode token reads: every weight but the embedding table, only top-k of the experts
    active = active_weight_bytes(llm.engine.runner.model, arch)
    kv = arch.kv_bytes_per_token(2) * (128 + n_tokens / 2)
    roofline = copy_bw / (active + kv)
    out = {"tok_per_s": rate, "all_reps": rates, "roofline_tok_per_s": roofline,
           "fraction_of_roofline": rate / roofline,
           "active_weight_bytes": active, "kv_bytes_per_step": kv, "copy_bw_GBps": copy_bw / 1e9}
    graphs = getattr(llm.engine.runner, "graphs", {})
    if 1 in graphs:
        replay = timed(graphs[1][0].replay, reps=30)
        kernels, kernel_sum_us = profile_replay(graphs[1][0], 10)             # per replay
        top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:14]
        # kernel times overlap under PDL (each starts while the one before drains): their sum can
        # pass the replay time
        out.update(graph_replay_ms=replay * 1e3, graph_only_tok_per_s=1 / replay, step_ms=1e3 / rate,
                   graph_fraction_of_roofline=1 / replay / roofline, kernel_sum_ms=kernel_sum_us / 1e3,
                   kernels={name: {"per_step": n, "us_per_step": us} for name, (n, us) in top})
        log(f"  bs1 graph replay {replay * 1e3:.3f} ms/step (= {1 / replay:.1f} tok/s, "
            f"{1 / replay / roofline:.1%}), kernels {kernel_sum_us / 1e3:.3f} ms")
        for name, (n, us) in top:
            log(f"    {us:9.1f} us  x{n:5.1f}  {name}")
    log(f"decode bs1 {rate:.1f} tok/s = {rate / roofline:.1%} of {roofline:.1f} (active bytes {active / 1e9:.2f} GB)")
    return out


def threshold_bench(llm, thresholds: list[float]) -> dict:
    from inference import SamplingParams
    from inference.models.moe import set_router_threshold
    model, arch = llm.engine.runner.model, llm.engine.arch
    prompts = random_prompts(8, [128] * 8, arch.vocab_size, seed=50)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True, logprobs=1)
    rows, base = [], None
    for th in thresholds:
        set_router_threshold(model, th)
        before = sum(map(sum, llm.engine.expert_load().values()))
        got = llm.generate(prompts, params, use_tqdm=False)
        kept = sum(map(sum, llm.engine.expert_load().values())) - before
        outs = [o.outputs[0] for o in got]
        bs8 = statistics.median(request_decode_rate(o) for o in got) * len(got)
        rate, _ = decode_rate(llm, 20, 128, reps=2)
        row = {"threshold": th, "bs1_tok_per_s": rate, "bs8_decode_tok_per_s": bs8, "assignments_kept": kept}
        if base is None:
            base = (outs, kept)
        else:
            same, prefix, drift = 0, [], []
            for o, b in zip(outs, base[0]):
                n = next((i for i, (x, y) in enumerate(zip(o.token_ids, b.token_ids)) if x != y), len(b.token_ids))
                prefix.append(n)
                same += sum(x == y for x, y in zip(o.token_ids, b.token_ids))
                # the chosen token's logprob where both runs still share the prefix
                drift += [abs(o.logprobs[i][o.token_ids[i]].logprob - b.logprobs[i][b.token_ids[i]].logprob)
                          for i in range(n)]
            total = sum(len(b.token_ids) for b in base[0])
            row.update(skipped_fraction=1 - kept / base[1], token_agreement=same / total,
                       mean_matching_prefix=statistics.mean(prefix) / len(base[0][0].token_ids),
                       mean_abs_logprob_drift=statistics.mean(drift) if drift else None,
                       max_abs_logprob_drift=max(drift) if drift else None)
        log(f"threshold {th:.2f}: bs1 {rate:.1f} tok/s, bs8 {bs8:.0f} tok/s, "
            f"skipped {row.get('skipped_fraction', 0):.1%}, "
            f"greedy agreement {row.get('token_agreement', 1):.1%}, logprob drift {row.get('mean_abs_logprob_drift')}")
        rows.append(row)
    set_router_threshold(model, 0.0)
    return {"rows": rows, "workload": "8 prompts x 128 random tokens, 64 greedy tokens (batch 8; prefix caching off, "
                                      "so every run computes its prompts), then bs1 x 128"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="layer,decode,threshold,throughput")
    ap.add_argument("--batches", default="1,2,4,8,16,64,256,1024,2048")
    ap.add_argument("--thresholds", default="0,0.1,0.2,0.3")
    ap.add_argument("--max-num-seqs", type=int, default=512)
    # every step reads all experts' weights from ~64 tokens up: a larger token budget amortises them
    # (journal run M1)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--quantization", default=None, choices=["int8", "int4"], help="experts and linears, RTN")
    args = ap.parse_args()
    sections = args.sections.split(",")
    out: dict = gpu_env()

    def section(name, fn):
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as exc:                # keep the other sections' figures
            traceback.print_exc()
            out[name] = {"error": repr(exc)}
        log(f"[{name}: {time.perf_counter() - t0:.1f} s]")
        write_result(args.out, out, default=str)

    section("ceilings", lambda: {"copy_bandwidth_GBps": copy_bandwidth() / 1e9})
    copy_bw = out["ceilings"].get("copy_bandwidth_GBps", 4280) * 1e9
    if "layer" in sections:
        section("layer", lambda: layer_bench([int(b) for b in args.batches.split(",")], copy_bw))
        torch.cuda.empty_cache()
    if not {"decode", "threshold", "throughput"} & set(sections):
        return 0
    from inference import LLM
    t0 = time.perf_counter()
    # prefix caching off: the threshold section reruns the same prompts (random prompts share no
    # prefix elsewhere, so nothing else changes)
    llm = LLM("random:mixtral-8x7b", device="cuda", dtype="bfloat16", max_model_len=4096, gpu_memory_utilization=0.92,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False, quantization=args.quantization)
    out["engine"] = {"startup_s": time.perf_counter() - t0, "quantization": args.quantization,
                     "num_kv_blocks": llm.engine.runner.num_blocks,
                     "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                     "enable_prefix_caching": False}
    log(f"random:mixtral-8x7b up in {out['engine']['startup_s']:.1f} s, {llm.engine.runner.num_blocks} KV blocks")
    if "decode" in sections:
        section("decode", lambda: decode_bench(llm, copy_bw, 128))
    if "threshold" in sections:
        section("threshold", lambda: threshold_bench(llm, [float(t) for t in args.thresholds.split(",")]))
    if "throughput" in sections:
        vocab = llm.engine.arch.vocab_size
        section("throughput", lambda: {str(n): throughput_bench(llm, vocab, n, 0)["128_128"] for n in (256, 1000)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
