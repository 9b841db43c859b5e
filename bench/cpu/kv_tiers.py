"""Multi-turn chat with and without the host KV tier (inference/core/kv_tiers.py).

N concurrent sessions share a system prompt; each turn's prompt is the whole conversation so far
(previous prompt + the assistant's reply + a new user message), so turn k+1 could reuse all of
turn k's KV. Users think between turns: at most `--active` sessions have a turn in flight, and a
session whose reply is done queues behind the others for its next turn (round robin). The device
pool holds the active sessions but not all of them: without the tier, a session's earlier turns
are evicted (LRU) before its next turn and are recomputed; with it they wait in host memory and
are copied back. Reported per configuration: TTFT of turn 1 and of the
later turns (mean / P50), prefill tokens computed, wall time, tier counters; and the ratios.
The host tier writes cached blocks behind (inference/core/kv_tiers.py) unless `--write-behind-mib 0`,
and on CUDA bounds a step's copies up (load budget; `--load-budget-mib 0`: unbounded);
`--compare-write-behind` / `--compare-load-budget` add a run with that one off.

    python3 -m bench.cpu.kv_tiers                                    # CPU, reduced workload
    python3 -m bench.cpu.kv_tiers --device cuda --model random:llama-3-8b --sessions 50 --turns 10 \\
        --kv-blocks 900 --out bench/results/kv_tiers_cuda.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import math
import random
import statistics
import sys
import time

from bench.harness import ROOT, git_commit, result_path, write_result
from inference import SamplingParams
from inference.core.kv_tiers import LOAD_BYTES_PER_STEP, WRITE_BEHIND_BYTES_PER_STEP
from inference.llm import LLM
from inference.loader.presets import preset_config

TARGET_LATER_TTFT_RATIO = 0.3


def bytes_per_block(model: str, dtype_bytes: int, block_size: int) -> int:
    cfg = preset_config(model.removeprefix("random:"))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * dtype_bytes * block_size


def run_chat(llm: LLM, args, seed: int) -> dict:
    """The multi-turn workload on one engine: every session starts at once and sends its next
    turn as soon as its reply is complete."""
    engine = llm.engine
    vocab = engine.arch.vocab_size
    rng = random.Random(seed)

    def words(n):
        return [rng.randrange(10, vocab - 1) for _ in range(n)]

    system = words(args.system_tokens)
    convs = [system + words(args.user_tokens) for _ in range(args.sessions)]
    turn = [0] * args.sessions
    params = SamplingParams(temperature=0, max_tokens=args.reply_tokens, ignore_eos=True)
    pending: dict[str, int] = {}                      # request id -> session
    ttft: dict[int, list[float]] = {}                 # turn -> TTFTs
    replies: dict[tuple[int, int], list[int]] = {}    # (session, turn) -> reply tokens

    def submit(s: int) -> None:
        rid = f"s{s}t{turn[s]}"
        engine.add_request(engine.validate({"prompt_token_ids": list(convs[s])}, params, request_id=rid))
        pending[rid] = s

    queue: dict[int, list[float]] = {}                # turn -> arrival to first scheduled
    # where the time goes: per step, its transfers (blocks) and host seconds in engine.step();
    # host seconds inside the runner's apply_kv_transfers; device seconds of the staged copies
    runner, store = engine.runner, getattr(engine.runner, "kv_tier_store", None)
    step_transfers: list[int] = []                    # per launched step: copies its forward waits for
    counts = {"write_behind": 0, "offloads_on_evict": 0, "loads": 0, "disk": 0}
    apply_host = [0.0]
    if store is not None:
        from inference.core.kv_tiers import TransferOp
        plain_apply = runner.apply_kv_transfers

        def timed_apply(sched):
            step_transfers.append(sum(1 for t in sched.kv_transfers if not t.behind))
            for t in sched.kv_transfers:
                key = ("write_behind" if t.behind else "offloads_on_evict" if t.op is TransferOp.DEVICE_TO_HOST
                       else "loads" if t.op is TransferOp.HOST_TO_DEVICE else "disk")
                counts[key] += 1
            t = time.perf_counter()
            plain_apply(sched)
            apply_host[0] += time.perf_counter() - t
        runner.apply_kv_transfers = timed_apply
        if getattr(store, "on_cuda", False):
            store.copy_timings = []
            store.num_writer_waits = 0
    step_times: list[float] = []
    step_had_transfers: list[bool] = []

    ready = list(range(args.sessions))                # sessions whose next turn waits to be sent
    for _ in range(min(args.active, args.sessions)):
        submit(ready.pop(0))
    before = engine.scheduler.stats()
    prefill = steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        launched = len(step_transfers)
        states = engine.step()
        steps += 1
        step_times.append(engine.last_stats.iteration.step_time)
        step_had_transfers.append(len(step_transfers) > launched and step_transfers[-1] > 0)
        prefill += engine.last_stats.iteration.num_prompt_tokens
        for st in states:
            if not st.finished or st.request_id not in pending:
                continue
            s = pending.pop(st.request_id)
            ttft.setdefault(turn[s], []).append(st.metrics.first_token_time - st.metrics.arrival_time)
            queue.setdefault(turn[s], []).append((st.metrics.first_scheduled_time or st.metrics.arrival_time)
                                                 - st.metrics.arrival_time)
            reply = list(st.samples[0].token_ids)
            replies[(s, turn[s])] = reply
            convs[s] += reply + words(args.user_tokens)
            turn[s] += 1
            if turn[s] < args.turns:
                ready.append(s)
            if ready:
                submit(ready.pop(0))
    wall = time.perf_counter() - t0
    after = engine.scheduler.stats()
    later = [t for k, v in ttft.items() if k >= 1 for t in v]
    out = {
        "turn1_ttft_mean_ms": 1e3 * statistics.mean(ttft[0]),
        "later_ttft_mean_ms": 1e3 * statistics.mean(later) if later else None,
        "later_ttft_p50_ms": 1e3 * statistics.median(later) if later else None,
        "ttft_mean_ms_by_turn": [round(1e3 * statistics.mean(ttft[k]), 2) for k in sorted(ttft)],
        "prefill_tokens_computed": prefill,
        "prompt_tokens": after.prefix_cache_queries - before.prefix_cache_queries,
        "prefix_hit_tokens": after.prefix_cache_hits - before.prefix_cache_hits,
        "preemptions": after.num_preemptions - before.num_preemptions,
        "steps": steps,
        "wall_s": wall,
        "final_context_tokens": max(len(c) for c in convs),
    }
    later_queue = [t for k, v in queue.items() if k >= 1 for t in v]
    with_t = [t for t, x in zip(step_times, step_had_transfers) if x]
    without_t = [t for t, x in zip(step_times, step_had_transfers) if not x]
    out["breakdown"] = {
        "later_queue_mean_ms": 1e3 * statistics.mean(later_queue) if later_queue else None,
        "later_ttft_after_scheduled_mean_ms": (1e3 * (statistics.mean(later) - statistics.mean(later_queue))
                                               if later else None),
        "step_ms_mean": 1e3 * statistics.mean(step_times),
        "steps_with_transfers": len(with_t),
        "step_ms_mean_with_transfers": 1e3 * statistics.mean(with_t) if with_t else None,
        "step_ms_mean_without_transfers": 1e3 * statistics.mean(without_t) if without_t else None,
        "transfers": sum(step_transfers),
        **counts,
        "apply_host_s": apply_host[0],
    }
    if store is not None and getattr(store, "copy_timings", None) is not None:
        import torch
        torch.cuda.synchronize()
        needed = [x for x in store.copy_timings if not x[3]]
        behind = [x for x in store.copy_timings if x[3]]
        dev_s = sum(a.elapsed_time(b) for a, b, _, _ in needed) / 1e3
        moved = sum(n for _, _, n, _ in needed)
        out["breakdown"].update(copy_device_s=dev_s, copy_gb=moved / 1e9,
                                copy_gbps=moved / 1e9 / dev_s if dev_s else None,
                                copy_batches=len(needed), writer_waits=store.num_writer_waits,
                                write_behind_device_s=sum(a.elapsed_time(b) for a, b, _, _ in behind) / 1e3,
                                write_behind_gb=sum(n for _, _, n, _ in behind) / 1e9,
                                write_behind_batches=len(behind),
                                copy_kernels="triton" if store.kernels is not None else "torch")
        store.copy_timings = None
    if after.kv_tiers is not None:
        out["tiers"] = {t.tier: {"slots": t.num_slots, "used": t.num_used, "hit_blocks": t.hit_blocks,
                                 "bytes_in": t.bytes_in, "bytes_out": t.bytes_out,
                                 "bytes_written_behind": t.bytes_written_behind, "evictions": t.num_evictions}
                        for t in after.kv_tiers.tiers}
    out["_replies"] = replies
    return out


def copy_bench(args) -> dict:
    """Micro-timing of KVTierStore's device <-> host copies at the bench model's block shape
    (llama-3-8b bf16, 16-token blocks: 32 layers x (K, V) x 32 KiB = 2 MiB a block): offloads and
    loads of 128 and 1024 scattered device blocks, host slots consecutive or scattered, for the
    store as committed in 108594f (`.kvold/kv_tier_store_old.py`, when carried: one index_select /
    index_copy_ per layer and tensor) and as it is now (one Triton gather / scatter), each with
    the host tier registered in place (cudaHostRegister, what the store does) or from
    pin_memory=True; and the link's ceiling (one 256 MiB copy). Median of 5, after a warm-up."""
    import importlib.util

    import torch

    from inference.core.kv_tiers import KVTransfer, TransferOp
    from inference.core.scheduler import SchedulerOutput
    from inference.worker import kv_tier_store as new_mod
    dev = torch.device("cuda")
    cfg = preset_config(args.model.removeprefix("random:"))
    layers, kvh = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    num = 1100
    caches = [tuple(torch.randn(num, args.block_size, kvh, hd, device=dev, dtype=torch.bfloat16) for _ in range(2))
              for _ in range(layers)]
    bpb = args.block_bytes
    out: dict = {"block_bytes": bpb, "results": []}

    def ceiling(host, label):
        d = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        h = host.view(-1)[:256 << 20]
        for name, fn in (("h2d", lambda: d.copy_(h, non_blocking=True)),
                         ("d2h", lambda: h.copy_(d, non_blocking=True))):
            ts = []
            for _ in range(6):
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            out[f"ceiling_{label}_{name}_gbps"] = (256 << 20) / statistics.median(ts[1:]) / 1e9

    stores = {}
    new = new_mod.KVTierStore(caches, new_mod.TierSizes(num, 0, bpb))
    out["host_is_pinned"] = bool(new.host.is_pinned())
    out["new_kernels"] = "triton" if new.kernels is not None else "torch"
    registered = new.host
    pinned = torch.empty(registered.shape, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(256 << 20, dtype=torch.uint8)
    ceiling(registered, "registered")
    ceiling(pinned, "pin_memory")
    ceiling(pageable, "pageable")
    stores["new"] = new
    old_path = ROOT / ".kvold" / "kv_tier_store_old.py"
    if old_path.exists():
        spec = importlib.util.spec_from_file_location("kv_tier_store_old", old_path)
        old_mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = old_mod                 # its dataclasses look their module up
        spec.loader.exec_module(old_mod)
        old = old_mod.KVTierStore(caches, old_mod.TierSizes(1, 0, bpb))
        stores["old"] = old
    rng = random.Random(0)
    # correctness of the new path: offload scattered blocks, load them into other blocks
    src = rng.sample(range(num), 256)
    dst = rng.sample([b for b in range(num) if b not in src], 256)
    want = [[c[b].clone() for kv in caches for c in kv] for b in src]
    T = TransferOp
    new.host = registered
    new.apply(SchedulerOutput(kv_transfers=[KVTransfer(T.DEVICE_TO_HOST, b, i) for i, b in enumerate(src)]))
    new.apply(SchedulerOutput(kv_transfers=[KVTransfer(T.HOST_TO_DEVICE, i, b) for i, b in enumerate(dst)]))
    torch.cuda.synchronize()
    out["new_round_trip_exact"] = all(torch.equal(g, w) for b, ws in zip(dst, want)
                                      for g, w in zip((c[b] for kv in caches for c in kv), ws))
    for store_name, store in stores.items():
        for host_name, host in (("registered", registered), ("pin_memory", pinned)):
            store.host = host
            for n in (128, 1024):
                for slot_kind in ("consecutive", "scattered"):
                    blocks = rng.sample(range(num), n)
                    slots = list(range(n)) if slot_kind == "consecutive" else sorted(rng.sample(range(num), n))
                    for op in (T.DEVICE_TO_HOST, T.HOST_TO_DEVICE, None):
                        if op is None:     # as the block manager records loads: evict (offload) each
                            # destination block first, so D2H and H2D alternate; n blocks move each way
                            if slot_kind == "scattered" or n > num // 2:
                                continue
                            tr = [x for i, (b, s) in enumerate(zip(blocks, slots))
                                  for x in (KVTransfer(T.DEVICE_TO_HOST, b, s), KVTransfer(T.HOST_TO_DEVICE, s + n, b))]
                        else:
                            tr = ([KVTransfer(op, b, s) for b, s in zip(blocks, slots)] if op is T.DEVICE_TO_HOST
                                  else [KVTransfer(op, s, b) for b, s in zip(blocks, slots)])
                        ts, hs = [], []
                        for _ in range(6):
                            torch.cuda.synchronize()
                            t = time.perf_counter()
                            store.apply(SchedulerOutput(kv_transfers=tr))
                            hs.append(time.perf_counter() - t)
                            torch.cuda.synchronize()
                            ts.append(time.perf_counter() - t)
                        med = statistics.median(ts[1:])
                        row = {"store": store_name, "host": host_name, "blocks": n, "slots": slot_kind,
                               "op": {T.DEVICE_TO_HOST: "offload", T.HOST_TO_DEVICE: "load", None: "evict+load"}[op],
                               "ms": 1e3 * med, "host_ms": 1e3 * statistics.median(hs[1:]),
                               "gbps": len(tr) * bpb / med / 1e9}
                        out["results"].append(row)
                        print(f"  {store_name:4} {host_name:10} {n:5} {slot_kind:11} {row['op']:10} "
                              f"{row['ms']:8.2f} ms (host {row['host_ms']:6.2f}) {row['gbps']:6.1f} GB/s", flush=True)
    # write-behind beside compute: a decode-length chain of matmuls on the compute stream, alone
    # and with one step's write-behind budget of offloads queued on the side stream first
    new.host = registered
    wb_blocks = max(1, WRITE_BEHIND_BYTES_PER_STEP // bpb)
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for label, with_wb in (("alone", False), ("with_write_behind", True), ("alone_again", False)):
        ts = []
        for _ in range(8):
            torch.cuda.synchronize()
            t = time.perf_counter()
            if with_wb:
                tr = [KVTransfer(T.DEVICE_TO_HOST, b, s, behind=True)
                      for s, b in enumerate(rng.sample(range(num), wb_blocks))]
                new.apply(SchedulerOutput(kv_transfers=tr))
            else:
                new.apply(SchedulerOutput())
            for _ in range(4):
                a @ a
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        out[f"write_behind_{wb_blocks}_blocks_compute_{label}_ms"] = 1e3 * statistics.median(ts[1:])
    for k, v in out.items():
        if k != "results":
            print(f"  {k}: {v}")
    return out


def warm_up(llm: LLM, args) -> None:
    """Kernels, allocator and (CPU) thread pools warm before timing: a few prompts of the
    workload's lengths, on token ids the workload never uses at the start of a prompt."""
    lens = [args.system_tokens + args.user_tokens, 4 * (args.user_tokens + args.reply_tokens)]
    prompts = [{"prompt_token_ids": [3 + (i + j) % 7 for j in range(n)]} for i, n in enumerate(lens * 2)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.engine.block_manager.reset_prefix_cache()


def build(args, swap_space: float, write_behind_mib: float | None = None,
          load_budget_mib: float | None = None) -> LLM:
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              block_size=args.block_size, kv_cache_memory_bytes=args.kv_blocks * args.block_bytes,
              max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
              swap_space=swap_space)
    tiers = llm.engine.block_manager.tiers
    if tiers is not None and write_behind_mib is not None:
        tiers.write_behind_bytes = int(write_behind_mib * 2**20)
    if tiers is not None and load_budget_mib is not None:
        tiers.load_budget_bytes = int(load_budget_mib * 2**20) or None
    return llm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None, help="random:<preset> (default: smollm2-135m on cpu, llama-3-8b on cuda)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--sessions", type=int, default=None, help="default 8 on cpu, 50 on cuda")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--active", type=int, default=None, help="sessions with a turn in flight at once "
                   "(the rest are 'thinking'); default a quarter of the sessions")
    p.add_argument("--system-tokens", type=int, default=None, help="default 200 on cuda, 100 on cpu")
    p.add_argument("--user-tokens", type=int, default=None, help="default 60 on cuda, 40 on cpu")
    p.add_argument("--reply-tokens", type=int, default=None, help="default 40 on cuda, 16 on cpu")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="device pool in blocks (default: 1.25x what the active sessions' last turns need, "
                        "at least one max-length sequence)")
    p.add_argument("--swap-space", type=float, default=None, help="host tier GiB (default: every session fits)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="default 512 on cpu, 4096 on cuda")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--write-behind-mib", type=float, default=None,
                   help="write-behind budget per step in MiB (default: the engine's; 0: off)")
    p.add_argument("--compare-write-behind", action="store_true",
                   help="also run the host tier with write-behind off")
    p.add_argument("--load-budget-mib", type=float, default=None,
                   help="copies up per step in MiB (default: the engine's, 256 on CUDA, none on CPU; 0: none)")
    p.add_argument("--compare-load-budget", action="store_true",
                   help="also run the host tier without a load budget")
    p.add_argument("--out", default=None)
    p.add_argument("--copy-bench", action="store_true", help="time the store's device <-> host copies only (CUDA)")
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    args.model = args.model or ("random:llama-3-8b" if cuda else "random:smollm2-135m")
    args.sessions = args.sessions or (50 if cuda else 8)
    args.system_tokens = args.system_tokens or (200 if cuda else 100)
    args.user_tokens = args.user_tokens or (60 if cuda else 40)
    args.reply_tokens = args.reply_tokens or (40 if cuda else 16)
    args.max_num_batched_tokens = args.max_num_batched_tokens or (4096 if cuda else 512)
    dtype_bytes = 4 if args.dtype == "float32" else 2
    args.block_bytes = bytes_per_block(args.model, dtype_bytes, args.block_size)
    final_len = args.system_tokens + args.turns * args.user_tokens + (args.turns - 1) * args.reply_tokens
    blocks_per_session = math.ceil((final_len + args.reply_tokens) / args.block_size)
    min_blocks = math.ceil(args.max_model_len / args.block_size)
    args.active = args.active or max(1, args.sessions // 4)
    args.kv_blocks = args.kv_blocks or max(min_blocks, int(1.25 * args.active * blocks_per_session))
    swap = args.swap_space or round(1.2 * args.sessions * blocks_per_session * args.block_bytes / 2**30, 3)
    print(f"{args.model} on {args.device}: {args.sessions} sessions ({args.active} active) x {args.turns} turns, "
          f"last turn ~{final_len} tokens; device pool {args.kv_blocks} blocks "
          f"({args.kv_blocks * args.block_bytes / 2**30:.2f} GiB) vs {args.sessions * blocks_per_session} needed; "
          f"host tier {swap} GiB", flush=True)

    if args.copy_bench:
        report = {"bench": "kv_tiers_copy", "commit": git_commit(),
                  "date": dt.datetime.now().isoformat(timespec="seconds"), "model": args.model,
                  **copy_bench(args)}
        import torch
        report["gpu"] = torch.cuda.get_device_name()
        out = write_result(args.out or result_path("kv_tiers_copy_cuda.json"), report, indent=2, newline=True)
        print(f"wrote {out}")
        return

    results = {}
    wb, lb = args.write_behind_mib, args.load_budget_mib
    configs = [("without_tier", 0.0, None, None), ("host_tier", swap, wb, lb)]
    if args.compare_write_behind:
        configs.append(("host_tier_no_write_behind", swap, 0.0, lb))
    if args.compare_load_budget:
        configs.append(("host_tier_no_load_budget", swap, wb, 0.0))
    for name, swap_space, write_behind_mib, load_budget_mib in configs:
        t = time.perf_counter()
        llm = build(args, swap_space, write_behind_mib, load_budget_mib)
        tiers = llm.engine.block_manager.tiers
        if tiers is not None:
            print(f"  {name}: write-behind {tiers.write_behind_bytes / 2**20:g} MiB/step, load budget "
                  f"{'none' if tiers.load_budget_bytes is None else f'{tiers.load_budget_bytes / 2**20:g} MiB/step'}",
                  flush=True)
        warm_up(llm, args)
        print(f"  {name}: engine ready in {time.perf_counter() - t:.1f} s", flush=True)
        results[name] = run_chat(llm, args, seed=1)
        r = results[name]
        print(f"  {name}: later-turn TTFT mean {r['later_ttft_mean_ms']:.1f} ms, "
              f"prefill {r['prefill_tokens_computed']} tokens, {r['wall_s']:.1f} s", flush=True)
        del llm
        gc.collect()
        if cuda:
            import torch
            torch.cuda.empty_cache()
    replies = {name: r.pop("_replies") for name, r in results.items()}
    same = replies["without_tier"] == replies["host_tier"]
    off, on = results["without_tier"], results["host_tier"]

    def ratios_of(on):
        return {
            "later_ttft_mean": on["later_ttft_mean_ms"] / off["later_ttft_mean_ms"],
            "later_ttft_p50": on["later_ttft_p50_ms"] / off["later_ttft_p50_ms"],
            "prefill_tokens": on["prefill_tokens_computed"] / off["prefill_tokens_computed"],
            "wall": on["wall_s"] / off["wall_s"],
        }
    ratios = ratios_of(on)
    for name in ("host_tier_no_write_behind", "host_tier_no_load_budget"):
        if name in results:
            ratios[name.removeprefix("host_tier_")] = ratios_of(results[name])
    print(f"\n{'':26} {'turn-1 TTFT':>12} {'later mean':>11} {'later P50':>10} {'prefill tok':>12} {'wall s':>7}")
    for name, r in results.items():
        print(f"{name:26} {r['turn1_ttft_mean_ms']:10.1f}ms {r['later_ttft_mean_ms']:9.1f}ms "
              f"{r['later_ttft_p50_ms']:8.1f}ms {r['prefill_tokens_computed']:12d} {r['wall_s']:7.1f}")
    for label, rs in (("ratio on/off", ratios), ("  without write-behind", ratios.get("no_write_behind")),
                      ("  without load budget", ratios.get("no_load_budget"))):
        if rs is not None:
            print(f"{label:26} {'':>12} {rs['later_ttft_mean']:11.3f} {rs['later_ttft_p50']:10.3f} "
                  f"{rs['prefill_tokens']:12.3f} {rs['wall']:7.3f}")
    for name, r in results.items():
        b = r["breakdown"]
        print(f"{name:26} later queue {b['later_queue_mean_ms'] or 0:.1f} ms; "
              f"steps {r['steps']} ({b['step_ms_mean']:.2f} ms), "
              f"with transfers waited for {b['steps_with_transfers']} "
              f"({b['step_ms_mean_with_transfers'] or 0:.2f} ms); "
              f"apply host {b['apply_host_s']:.2f} s" +
              (f"; loads {b['loads']}, offloads on eviction {b['offloads_on_evict']}, written behind "
               f"{b['write_behind']}" if "loads" in b else "") +
              (f"; copies {b['copy_gb']:.1f} GB in {b['copy_device_s']:.2f} s device = {b['copy_gbps']:.1f} GB/s, "
               f"{b['writer_waits']} writer waits ({b['copy_kernels']}); write-behind {b['write_behind_gb']:.1f} GB "
               f"in {b['write_behind_device_s']:.2f} s device" if "copy_gb" in b else ""))
    met = ratios["later_ttft_mean"] <= TARGET_LATER_TTFT_RATIO
    print(f"target later-turn TTFT <= {TARGET_LATER_TTFT_RATIO}x: {'met' if met else 'NOT met'}; "
          f"replies identical: {same}")
    report = {
        "bench": "kv_tiers", "commit": git_commit(), "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": args.device, "model": args.model, "dtype": args.dtype,
        "workload": {k: getattr(args, k) for k in ("sessions", "active", "turns", "system_tokens", "user_tokens",
                                                   "reply_tokens", "block_size", "kv_blocks",
                                                   "max_num_batched_tokens", "max_num_seqs")},
        "swap_space_gib": swap, "results": results, "ratios": ratios, "replies_identical": same,
        "write_behind_mib_per_step": (args.write_behind_mib if args.write_behind_mib is not None
                                      else WRITE_BEHIND_BYTES_PER_STEP / 2**20),
        "load_budget_mib_per_step": (args.load_budget_mib if args.load_budget_mib is not None
                                     else LOAD_BYTES_PER_STEP / 2**20 if cuda else None),
        "replies_identical_by_config": {name: r == replies["without_tier"] for name, r in replies.items()},
        "target": {"later_ttft_ratio": TARGET_LATER_TTFT_RATIO, "met": met},
    }
    if cuda:
        import torch
        report["gpu"] = torch.cuda.get_device_name()
    out = write_result(args.out or result_path(f"kv_tiers_{args.device.split(':')[0]}.json"), report, indent=2,
                       newline=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
