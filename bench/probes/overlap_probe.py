"""Can a decode step's attention run under its GEMMs? (run on the device)

The offline 128/128 run's decode steps are GEMMs (tensor-bound, reading ~0.4 GB of weights a
layer) plus decode attention (HBM-bound, ~3 MB of KV a sequence a layer at context 192). Run in
sequence they add up; NanoFlow-style overlap splits the batch in two halves and runs one half's
attention while the other half's GEMMs run, which pays only if the two kernels share the chip
better than taking turns. This probe measures that on one 7B-shaped layer stack before any engine
code is written:

    serial      every layer: GEMMs(B) then attention(B)                (today's engine)
    halves      the same work as two half batches, one stream          (the cost of splitting)
    overlap     halves on two streams: attention(half 1) beside GEMMs(half 2) and so on
    overlap+p   the same, the attention stream at high priority
    independent every GEMM on one stream, every attention on the other, no dependencies (the
                most two streams can overlap); the serial / overlap / independent cases also
                run eagerly, in case a graph ran the streams' branches one after the other
    carve N     overlap with cuBLAS told to leave N SMs (torch._C._set_sm_carveout_experimental)
    green N     overlap with the GEMM stream in a green context of 132 - N SMs, attention in N
                (torch carves each context from the whole GPU, so the two SM sets may overlap,
                and Hopper hands out SMs in groups of 8: not a clean partition)

Each layer here runs its four GEMMs, then its attention (a real layer puts attention between qkv
and o): only the streams' ordering is under test.

GEMMs per layer: qkv, o, gate_up, down on random bf16 weights (Llama-2-7B shapes); attention: the
engine's paged decode kernel over a random bf16 cache, context 192. Timed as CUDA-graph replays
(eager for green contexts), medians, round-robin.

    python3 -m bench.probes.overlap_probe --out $OUT/overlap_probe.json [--batches 512,1024]
"""
from __future__ import annotations

import argparse

import torch

from bench.harness import gpu_env, log, result_path, timed_interleaved, write_result
from bench.workloads import paged_cache
from inference.kernels.decode_attention import choose_num_splits, decode_attention

HIDDEN, INTER, HEADS, HEAD_DIM, BLOCK = 4096, 11008, 32, 128, 16


class Layer:
    """Weights of one 7B layer and the activations of a batch (stand-ins: the GEMMs read fixed
    inputs, so only the kernels' shapes and the streams' ordering matter)."""

    def __init__(self, batch: int, ctx: int, gen):
        def w(n, k):
            return torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
        self.wqkv, self.wo, self.wgu, self.wd = w(3 * HIDDEN, HIDDEN), w(HIDDEN, HIDDEN), w(2 * INTER, HIDDEN), \
            w(HIDDEN, INTER)
        self.x = torch.randn(batch, HIDDEN, device="cuda", generator=gen, dtype=torch.bfloat16)
        self.s = torch.randn(batch, INTER, device="cuda", generator=gen, dtype=torch.bfloat16)
        self.k, self.v, self.tables = paged_cache(batch, ctx, HEADS, HEAD_DIM, BLOCK, gen)
        self.q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", generator=gen, dtype=torch.bfloat16)
        self.lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        self.out = torch.empty_like(self.q)
        self.ys = {}

    def gemms(self, rows: slice) -> None:
        x, s = self.x[rows], self.s[rows]
        for name, inp, wt in (("qkv", x, self.wqkv), ("o", x, self.wo), ("gu", x, self.wgu), ("d", s, self.wd)):
            key = (name, rows.start, rows.stop)
            if key not in self.ys:
                self.ys[key] = torch.empty(inp.shape[0], wt.shape[0], device="cuda", dtype=torch.bfloat16)
            torch.matmul(inp, wt.t(), out=self.ys[key])

    def attention(self, rows: slice, sms: int) -> None:
        n = rows.stop - rows.start
        decode_attention(self.q[rows], self.k, self.v, self.tables[rows], self.lens[rows], HEAD_DIM ** -0.5,
                         num_splits=choose_num_splits(n, HEADS, 4096, sms), out=self.out[rows])


def serial(layers, batch, sms):
    for ly in layers:
        ly.gemms(slice(0, batch))
        ly.attention(slice(0, batch), sms)


def halves(layers, batch, sms):
    h = batch // 2
    for ly in layers:
        for rows in (slice(0, h), slice(h, batch)):
            ly.gemms(rows)
            ly.attention(rows, sms)


def overlap(layers, batch, sms, gemm_stream, attn_stream):
    """GEMM stream: G(h1) G(h2) G(h1) ...; attention stream: A(h1) after G(h1), A(h2) after G(h2);
    a half's next GEMMs wait for its attention. A(h1) then runs beside G(h2), A(h2) beside the
    next layer's G(h1)."""
    h = batch // 2
    parts = (slice(0, h), slice(h, batch))
    cur = torch.cuda.current_stream()
    gemm_stream.wait_stream(cur)
    attn_stream.wait_stream(cur)
    attn_done = [None, None]
    for ly in layers:
        for i, rows in enumerate(parts):
            with torch.cuda.stream(gemm_stream):
                if attn_done[i] is not None:
                    gemm_stream.wait_event(attn_done[i])
                ly.gemms(rows)
                ready = torch.cuda.Event()
                ready.record(gemm_stream)
            with torch.cuda.stream(attn_stream):
                attn_stream.wait_event(ready)
                ly.attention(rows, sms)
                attn_done[i] = torch.cuda.Event()
                attn_done[i].record(attn_stream)
    cur.wait_stream(gemm_stream)
    cur.wait_stream(attn_stream)


def independent(layers, batch, sms, gemm_stream, attn_stream):
    """No dependencies at all: every GEMM on one stream, every attention on the other. The most
    overlap two streams can show (what the pipeline of `overlap` gets at best)."""
    cur = torch.cuda.current_stream()
    gemm_stream.wait_stream(cur)
    attn_stream.wait_stream(cur)
    with torch.cuda.stream(gemm_stream):
        for ly in layers:
            ly.gemms(slice(0, batch))
    with torch.cuda.stream(attn_stream):
        for ly in layers:
            ly.attention(slice(0, batch), sms)
    cur.wait_stream(gemm_stream)
    cur.wait_stream(attn_stream)


def graph_of(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def time_round_robin(fns: dict, rounds: int = 15) -> dict:
    """Median ms per call of each fn, timed round-robin (harness.timed_interleaved)."""
    return {k: v * 1e3 for k, v in timed_interleaved(fns, rounds=rounds, calls=1).items()}


def probe(batch: int, ctx: int, num_layers: int, carveouts: list[int], greens: list[int], sms: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(batch)
    layers = [Layer(batch, ctx, gen) for _ in range(num_layers)]
    s_gemm, s_attn = torch.cuda.Stream(), torch.cuda.Stream()
    _, hi = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    s_attn_hi = torch.cuda.Stream(priority=hi)
    fns = {
        "gemms only": graph_of(lambda: [ly.gemms(slice(0, batch)) for ly in layers]),
        "attention only": graph_of(lambda: [ly.attention(slice(0, batch), sms) for ly in layers]),
        "serial": graph_of(lambda: serial(layers, batch, sms)),
        "halves": graph_of(lambda: halves(layers, batch, sms)),
        "overlap": graph_of(lambda: overlap(layers, batch, sms, s_gemm, s_attn)),
        "overlap+p": graph_of(lambda: overlap(layers, batch, sms, s_gemm, s_attn_hi)),
        "independent": graph_of(lambda: independent(layers, batch, sms, s_gemm, s_attn)),
        # eager twins: in case a captured graph ran the two streams' branches one after the other
        "serial (eager)": lambda: serial(layers, batch, sms),
        "overlap (eager)": lambda: overlap(layers, batch, sms, s_gemm, s_attn),
        "independent (eager)": lambda: independent(layers, batch, sms, s_gemm, s_attn),
    }
    res = time_round_robin(fns)
    set_carve = getattr(torch._C, "_set_sm_carveout_experimental", None)
    for n in carveouts if set_carve else []:
        try:
            set_carve(n)
            # the carve-out is read when cuBLAS is called: capture under it, replay the graph
            fn = graph_of(lambda: overlap(layers, batch, sms, s_gemm, s_attn))
            g_only = graph_of(lambda: [ly.gemms(slice(0, batch)) for ly in layers])
            set_carve(None)
            r = time_round_robin({"o": fn, "g": g_only}, rounds=10)
            res[f"carve {n}"], res[f"gemms only, carve {n}"] = r["o"], r["g"]
        except Exception as e:                      # noqa: BLE001 - a probe: report and go on
            res[f"carve {n}"] = f"failed: {type(e).__name__}: {e}"[:200]
            set_carve(None)
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError:
        GreenContext = None
    for n in greens if GreenContext else []:
        try:
            g_ctx = GreenContext.create(num_sms=sms - n, device_id=0)
            a_ctx = GreenContext.create(num_sms=n, device_id=0)
            gs, as_ = g_ctx.Stream(), a_ctx.Stream()

            def run(gs=gs, as_=as_):
                overlap(layers, batch, sms, gs, as_)
            r = time_round_robin({"o": run}, rounds=10)
            res[f"green {n}"] = r["o"]
        except Exception as e:                      # noqa: BLE001
            res[f"green {n}"] = f"failed: {type(e).__name__}: {e}"[:200]
    per_layer = {k: (v / num_layers if isinstance(v, float) else v) for k, v in res.items()}
    flops = num_layers * 2 * batch * HIDDEN * (3 * HIDDEN + HIDDEN + 2 * INTER + INTER)
    kv_bytes = num_layers * 2 * batch * ctx * HEADS * HEAD_DIM * 2
    out = {"batch": batch, "ctx": ctx, "layers": num_layers, "ms_per_layer": per_layer,
           "gemm_tflops": flops / (res["gemms only"] / 1e3) / 1e12,
           "attention_tb_s": kv_bytes / (res["attention only"] / 1e3) / 1e12,
           "overlap_vs_serial": res["serial"] / res["overlap"],
           "floor_max_ms_per_layer": max(res["gemms only"], res["attention only"]) / num_layers}
    log(f"\nbatch {batch} x ctx {ctx}: GEMMs {out['gemm_tflops']:.0f} TFLOP/s, attention "
        f"{out['attention_tb_s']:.2f} TB/s")
    for k, v in per_layer.items():
        log(f"  {k:28s} {v if isinstance(v, str) else f'{v:.3f} ms/layer'}")
    layers.clear()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=result_path("overlap_probe.json"))
    ap.add_argument("--batches", default="512,1024")
    ap.add_argument("--ctx", type=int, default=192)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--carveouts", default="16,32,48")
    ap.add_argument("--greens", default="24,40")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {**gpu_env(), "sms": sms, "runs": []}
    ints = lambda s: [int(v) for v in s.split(",") if v]       # noqa: E731
    for b in ints(args.batches):
        res["runs"].append(probe(b, args.ctx, args.layers, ints(args.carveouts), ints(args.greens), sms))
        write_result(args.out, res)


if __name__ == "__main__":
    main()
