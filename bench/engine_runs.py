"""Measurements of a built engine (an `LLM` on CUDA) that several GPU scripts share:

  step_bytes        bytes a batch-1 decode step reads (the decode roofline's numerator)
  decode_rate       tok/s of one request's decode, from its first and last token times
  decode_bench      batch-1 decode against the bandwidth roofline, and the bs1 graph replay alone
  throughput_bench  offline 128/128 and mixed-length output tok/s with the runner's host timings
  profile_replay    torch.profiler over replays of a captured CUDA graph, kernels by name

Used by bench/gpu/gpu_engine.py, quant_gpu.py, moe_gpu.py, decode_profile.py and
throughput_profile.py; the method (warm-up, medians, roofline) is bench/journal/METHOD.md.
"""
from __future__ import annotations

import collections
import random
import statistics
import time

import torch

from bench.harness import log, timed
from bench.workloads import random_prompts
from inference import SamplingParams
from inference.llm import LLM


def step_bytes(model) -> int:
    """Bytes a batch-1 decode step reads: every weight in its stored form (quantized linears:
    codes and group parameters; sparse: values and indices) except the embedding table when the
    LM head is separate (one row of it is read); a tied LM head reads it in full."""
    total, seen = 0, set()
    for mod in model.modules():
        if hasattr(mod, "weight_bytes"):
            total += mod.weight_bytes()
            seen.update(id(t) for t in list(mod.parameters()) + list(mod.buffers()))
    for name, p in model.named_parameters():
        if id(p) not in seen and not (name.startswith("embed_tokens") and model.lm_head is not None):
            total += p.numel() * p.element_size()
    return total


def decode_rate(output) -> float:
    """Decode tok/s of one finished request: (tokens - 1) / (last token time - first token time),
    so its prefill and first token are not counted."""
    m = output.metrics
    return (len(output.outputs[0].token_ids) - 1) / (m.last_token_time - m.first_token_time)


def decode_bench(llm: LLM, copy_bw: float, vocab: int, n_tokens: int) -> dict:
    """Batch-1 decode after a 128-token prompt: median of 3 against the roofline copy_bw / (step
    weight bytes + KV bytes at the mean context); the bs1 graph replay alone when captured."""
    arch = llm.engine.arch
    llm.generate(random_prompts(1, [128], vocab, seed=2), SamplingParams(max_tokens=16, temperature=0,
                                                                         ignore_eos=True), use_tqdm=False)
    rates = []
    for rep in range(3):
        p = random_prompts(1, [128], vocab, seed=10 + rep)
        o = llm.generate(p, SamplingParams(max_tokens=n_tokens, temperature=0, ignore_eos=True), use_tqdm=False)[0]
        rates.append(decode_rate(o))
    rate = statistics.median(rates)
    kv_per_token = arch.kv_bytes_per_token(2)
    mean_ctx = 128 + n_tokens / 2
    bytes_per_step = step_bytes(llm.engine.runner.model) + kv_per_token * mean_ctx
    roofline = copy_bw / bytes_per_step
    out = {"tok_s": rate, "all_reps": rates, "bytes_per_step": bytes_per_step, "roofline_tok_s": roofline,
           "fraction_of_roofline": rate / roofline, "achieved_GBps": rate * bytes_per_step / 1e9}
    graphs = getattr(llm.engine.runner, "graphs", {})
    if 1 in graphs:
        # device time of one decode step alone (graph replay); the rest of 1/rate is host work
        replay = timed(graphs[1][0].replay, reps=50)
        out.update(graph_replay_ms=replay * 1e3, step_ms=1e3 / rate, host_ms=1e3 / rate - replay * 1e3,
                   graph_only_tok_s=1 / replay)
        log(f"  graph replay {replay * 1e3:.3f} ms/step (= {1 / replay:.0f} tok/s), whole step {1e3 / rate:.3f} ms")
    log(f"ours bs1 decode: {rate:.1f} tok/s = {rate / roofline:.1%} of roofline {roofline:.0f} tok/s")
    return out


def profiled(fn, top: int = 30):
    """fn() under cProfile: (its result, the top functions by own time as text)."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return result, text.getvalue()


def throughput_bench(llm: LLM, vocab: int, n128: int, n_mixed: int, profile: bool = False) -> dict:
    """Offline output tok/s: n128 requests of 128 in / 128 out, n_mixed of lengths uniform in
    100..1024, each one generate call after a 64-request warm-up."""
    out = {}
    llm.generate(random_prompts(64, [128] * 64, vocab, seed=3),
                 SamplingParams(max_tokens=32, temperature=0, ignore_eos=True), use_tqdm=False)
    for name, n, seed in (("128_128", n128, 100), ("mixed_100_1024", n_mixed, 200)):
        if n == 0:
            continue
        rng = random.Random(seed)
        if name == "128_128":
            in_lens, out_lens = [128] * n, [128] * n
        else:
            in_lens = [rng.randint(100, 1024) for _ in range(n)]
            out_lens = [rng.randint(100, 1024) for _ in range(n)]
        prompts = random_prompts(n, in_lens, vocab, seed)
        params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in out_lens]
        torch.cuda.synchronize()
        timings = llm.engine.runner.timings
        before = (timings.num_steps, timings.launch_s, timings.wait_s)
        t0 = time.perf_counter()
        if profile and name == "128_128":        # host hot spots (the wall time then includes cProfile's cost)
            outs, out["profile_128_128"] = profiled(lambda: llm.generate(prompts, params, use_tqdm=False))
            log(out["profile_128_128"])
        else:
            outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        steps, launch_s, wait_s = (a - b for a, b in zip((timings.num_steps, timings.launch_s, timings.wait_s),
                                                         before))
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        assert n_out == sum(out_lens), (n_out, sum(out_lens))
        out[name] = {"requests": n, "output_tokens": n_out, "input_tokens": sum(in_lens), "wall_s": wall,
                     "output_tok_s": n_out / wall, "total_tok_s": (n_out + sum(in_lens)) / wall,
                     # launch: host time staging + launching steps; wait: host blocked on the device;
                     # the rest of the wall time is host work outside the runner (scheduler, outputs)
                     "steps": steps, "launch_s": launch_s, "device_wait_s": wait_s,
                     "other_host_s": wall - launch_s - wait_s}
        log(f"ours {name}: {n} requests, {n_out / wall:.0f} output tok/s ({wall:.1f} s; {steps} steps, "
            f"launch {launch_s:.2f} s, device wait {wait_s:.2f} s, other host {wall - launch_s - wait_s:.2f} s)")
    return out


def short_name(name: str) -> str:
    """Kernel names without template arguments (cuBLAS's are long)."""
    name = name.split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


def profile_replay(graph, reps: int) -> tuple[dict, float]:
    """{kernel name: (launches, total us)} over reps replays, and the summed kernel time per replay."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            k = kernels[short_name(ev.name)]
            k[0] += 1
            k[1] += ev.device_time
    total = sum(v[1] for v in kernels.values()) / reps
    return {n: (c / reps, t / reps) for n, (c, t) in kernels.items()}, total
