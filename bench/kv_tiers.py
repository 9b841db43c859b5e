"""Multi-turn chat with and without the host KV tier (inference/kv_tiers.py).

N concurrent sessions share a system prompt; each turn's prompt is the whole conversation so far
(previous prompt + the assistant's reply + a new user message), so turn k+1 could reuse all of
turn k's KV. Users think between turns: at most `--active` sessions have a turn in flight, and a
session whose reply is done queues behind the others for its next turn (round robin). The device
pool holds the active sessions but not all of them: without the tier, a session's earlier turns
are evicted (LRU) before its next turn and are recomputed; with it they wait in host memory and
are copied back. Reported per configuration: TTFT of turn 1 and of the
later turns (mean / P50), prefill tokens computed, wall time, tier counters; and the ratios.

    python3 bench/kv_tiers.py                                    # CPU, reduced workload
    python3 bench/kv_tiers.py --device cuda --model random:llama-3-8b --sessions 50 --turns 10 \\
        --kv-blocks 900 --out bench/results/kv_tiers_cuda.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cpu_engine import git_commit  # noqa: E402

from inference import SamplingParams  # noqa: E402
from inference.llm import LLM  # noqa: E402
from inference.loader.presets import preset_config  # noqa: E402

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

    ready = list(range(args.sessions))                # sessions whose next turn waits to be sent
    for _ in range(min(args.active, args.sessions)):
        submit(ready.pop(0))
    before = engine.scheduler.stats()
    prefill = steps = 0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        states = engine.step()
        steps += 1
        prefill += engine.last_stats.iteration.num_prompt_tokens
        for st in states:
            if not st.finished or st.request_id not in pending:
                continue
            s = pending.pop(st.request_id)
            ttft.setdefault(turn[s], []).append(st.metrics.first_token_time - st.metrics.arrival_time)
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
    if after.kv_tiers is not None:
        out["tiers"] = {t.tier: {"slots": t.num_slots, "used": t.num_used, "hit_blocks": t.hit_blocks,
                                 "bytes_in": t.bytes_in, "bytes_out": t.bytes_out, "evictions": t.num_evictions}
                        for t in after.kv_tiers.tiers}
    out["_replies"] = replies
    return out


def warm_up(llm: LLM, args) -> None:
    """Kernels, allocator and (CPU) thread pools warm before timing: a few prompts of the
    workload's lengths, on token ids the workload never uses at the start of a prompt."""
    lens = [args.system_tokens + args.user_tokens, 4 * (args.user_tokens + args.reply_tokens)]
    prompts = [{"prompt_token_ids": [3 + (i + j) % 7 for j in range(n)]} for i, n in enumerate(lens * 2)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.engine.block_manager.reset_prefix_cache()


def build(args, swap_space: float) -> LLM:
    return LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
               block_size=args.block_size, kv_cache_memory_bytes=args.kv_blocks * args.block_bytes,
               max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
               swap_space=swap_space)


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
    p.add_argument("--out", default=None)
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
    print(f"{args.model} on {args.device}: {args.sessions} sessions ({args.active} active) x {args.turns} turns, last turn "
          f"~{final_len} tokens; device pool {args.kv_blocks} blocks ({args.kv_blocks * args.block_bytes / 2**30:.2f} "
          f"GiB) vs {args.sessions * blocks_per_session} needed; host tier {swap} GiB", flush=True)

    results = {}
    for name, swap_space in (("without_tier", 0.0), ("host_tier", swap)):
        t = time.perf_counter()
        llm = build(args, swap_space)
        warm_up(llm, args)
        print(f"  {name}: engine ready in {time.perf_counter() - t:.1f} s", flush=True)
        results[name] = run_chat(llm, args, seed=1)
        r = results[name]
        print(f"  {name}: later-turn TTFT mean {r['later_ttft_mean_ms']:.1f} ms, prefill {r['prefill_tokens_computed']} "
              f"tokens, {r['wall_s']:.1f} s", flush=True)
        del llm
        gc.collect()
        if cuda:
            import torch
            torch.cuda.empty_cache()
    same = results["without_tier"].pop("_replies") == results["host_tier"].pop("_replies")
    off, on = results["without_tier"], results["host_tier"]
    ratios = {
        "later_ttft_mean": on["later_ttft_mean_ms"] / off["later_ttft_mean_ms"],
        "later_ttft_p50": on["later_ttft_p50_ms"] / off["later_ttft_p50_ms"],
        "prefill_tokens": on["prefill_tokens_computed"] / off["prefill_tokens_computed"],
        "wall": on["wall_s"] / off["wall_s"],
    }
    print(f"\n{'':14} {'turn-1 TTFT':>12} {'later mean':>11} {'later P50':>10} {'prefill tok':>12} {'wall s':>7}")
    for name, r in results.items():
        print(f"{name:14} {r['turn1_ttft_mean_ms']:10.1f}ms {r['later_ttft_mean_ms']:9.1f}ms "
              f"{r['later_ttft_p50_ms']:8.1f}ms {r['prefill_tokens_computed']:12d} {r['wall_s']:7.1f}")
    print(f"{'ratio on/off':14} {'':>12} {ratios['later_ttft_mean']:11.3f} {ratios['later_ttft_p50']:10.3f} "
          f"{ratios['prefill_tokens']:12.3f} {ratios['wall']:7.3f}")
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
        "target": {"later_ttft_ratio": TARGET_LATER_TTFT_RATIO, "met": met},
    }
    if cuda:
        import torch
        report["gpu"] = torch.cuda.get_device_name()
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"kv_tiers_{args.device.split(':')[0]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
