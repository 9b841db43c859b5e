"""CPU benchmark: our engine vs HF transformers on the real SmolLM2-135M, measured in the same run.

(a) batch-1 decode tok/s: ours (LLM("smollm2"), dtype auto) vs HF `generate()` in float32 and bfloat16;
    the peer is HF's faster dtype. Decode rate = (N - 1) / (t(N tokens) - t(1 token)), i.e. the
    prefill + first token is measured by a 1-token run and subtracted; end-to-end tok/s is reported too.
(b) 16 concurrent requests of mixed prompt/output lengths: ours submits all of them to one
    `llm.generate` call (continuous batching); HF runs them as one left-padded static batch with
    max_new_tokens = the longest requested output. Only the requested tokens count as useful output;
    throughput = useful tokens / wall time of the whole call.

Every call uses a prompt no earlier call used (different offsets into the text), so our prefix cache
never hits across repeats. Each figure is the median of --reps repeats after a warm-up of both sides.

    .venv/bin/python -m bench.cpu.cpu_engine [--quick]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from bench.harness import cpu_model, git_commit, result_path, write_result
from bench.workloads import Prompts, real_text_ids
from inference.llm import LLM
from inference.loader.model_loader import resolve_model_dir
from inference.sampling_params import SamplingParams

TARGETS = {"batch1_decode": 2.0, "concurrent16": 1.5}


# ----------------------------------------------------------------------------- ours

def ours_run(llm: LLM, prompts: list[list[int]], out_lens: list[int]) -> tuple[float, int, list[list[int]]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in out_lens]
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt_s = time.perf_counter() - t0
    toks = [o.outputs[0].token_ids for o in outs]
    for got, want in zip(toks, out_lens):
        assert len(got) == want, f"ours produced {len(got)} tokens, asked {want}"
    return dt_s, sum(out_lens), toks


# ----------------------------------------------------------------------------- HF

def hf_run(model, pad_id: int, prompts: list[list[int]], out_lens: list[int]) -> tuple[float, int, list[list[int]]]:
    """One static batch: left padding, max_new_tokens = the longest requested output."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    n = max(out_lens)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=n, min_new_tokens=n, pad_token_id=pad_id)
    dt_s = time.perf_counter() - t0
    gen = out[:, width:]
    assert gen.shape[1] == n, f"HF produced {gen.shape[1]} tokens, asked {n}"
    toks = [gen[i, :k].tolist() for i, k in enumerate(out_lens)]
    return dt_s, sum(out_lens), toks


def load_hf(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.eval()
    model.generation_config.temperature = None   # greedy: silence sampling-flag warnings
    model.generation_config.top_p = None
    model.generation_config.top_k = None
    return model


# ----------------------------------------------------------------------------- cases

def batch1(sides: dict, prompts: Prompts, prompt_len: int, n: int, reps: int) -> dict:
    """Per side: decode tok/s = (n-1) / (t(n tokens) - t(1 token)); repeats interleave the sides."""
    for run in sides.values():                        # warm-up
        run([prompts.take(prompt_len)], [n])
        run([prompts.take(prompt_len)], [1])
    raw = {name: {"first_token_s": [], "n_tokens_s": []} for name in sides}
    for _ in range(reps):
        for name, run in sides.items():
            raw[name]["first_token_s"].append(run([prompts.take(prompt_len)], [1])[0])
            raw[name]["n_tokens_s"].append(run([prompts.take(prompt_len)], [n])[0])
    res = {}
    for name, r in raw.items():
        decode = [(n - 1) / (tn - t1) for t1, tn in zip(r["first_token_s"], r["n_tokens_s"])]
        e2e = [n / tn for tn in r["n_tokens_s"]]
        res[name] = {**r, "decode_tok_s_runs": decode, "e2e_tok_s_runs": e2e,
                     "decode_tok_s": statistics.median(decode), "e2e_tok_s": statistics.median(e2e),
                     "first_token_s_median": statistics.median(r["first_token_s"])}
        print(f"  [a] {name:12s} decode {res[name]['decode_tok_s']:7.2f} tok/s   e2e {res[name]['e2e_tok_s']:7.2f} "
              f"tok/s   prefill+1st {res[name]['first_token_s_median'] * 1e3:6.1f} ms   "
              f"runs {[round(x, 1) for x in decode]}", flush=True)
    return res


def concurrent(sides: dict, prompts: Prompts, prompt_lens: list[int], out_lens: list[int], reps: int) -> dict:
    """Per side: useful output tokens / wall time of one call; warm-up run kept as `warmup_out_tok_s`."""
    useful = sum(out_lens)
    res = {}
    for name, run in sides.items():                   # warm-up with the benchmark's shapes
        wall = run([prompts.take(k) for k in prompt_lens], out_lens)[0]
        res[name] = {"warmup_wall_s": wall, "warmup_out_tok_s": useful / wall, "wall_s": [], "out_tok_s_runs": []}
    for _ in range(reps):
        for name, run in sides.items():
            wall = run([prompts.take(k) for k in prompt_lens], out_lens)[0]
            res[name]["wall_s"].append(wall)
            res[name]["out_tok_s_runs"].append(useful / wall)
    for name, r in res.items():
        r["useful_tokens"] = useful
        r["out_tok_s"] = statistics.median(r["out_tok_s_runs"])
        print(f"  [b] {name:12s} {r['out_tok_s']:7.2f} useful out tok/s   wall {statistics.median(r['wall_s']):6.2f} s"
              f"   runs {[round(x, 1) for x in r['out_tok_s_runs']]}   warm-up {r['warmup_out_tok_s']:.1f}",
              flush=True)
    return res


def spread(lo: int, hi: int, k: int) -> list[int]:
    return [round(lo + (hi - lo) * i / (k - 1)) for i in range(k)]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats (smoke test)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=result_path("cpu_engine.json"))
    args = ap.parse_args()
    n_out = 32 if args.quick else 128
    reps = args.reps or (1 if args.quick else 3)
    prompt_len = 20
    num_req = 16
    prompt_lens = spread(16, 128 if args.quick else 256, num_req)
    out_sorted = spread(8 if args.quick else 16, 32 if args.quick else 128, num_req)
    out_lens = [out_sorted[(i * 7) % num_req] for i in range(num_req)]   # uncorrelated with prompt length

    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, {cpu_model()}", flush=True)

    load_start = os.getloadavg()
    t0 = time.perf_counter()
    llm = LLM("smollm2")
    ours_load_s = time.perf_counter() - t0
    ours_dtype = str(llm.engine.runner.model.embed_tokens.weight.dtype)
    model_dir = resolve_model_dir("smollm2")
    hf = {"float32": load_hf(model_dir, torch.float32), "bfloat16": load_hf(model_dir, torch.bfloat16)}
    tok = llm.get_tokenizer()
    hf_tok = getattr(tok, "hf", None) or getattr(tok, "tokenizer", None)
    if hf_tok is None:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(model_dir)
    pad_id = hf_tok.pad_token_id if hf_tok.pad_token_id is not None else hf_tok.eos_token_id
    prompts = Prompts(real_text_ids(hf_tok))

    def ours(p, o):
        return ours_run(llm, p, o)

    def hf_runner(dtype):
        return lambda p, o: hf_run(hf[dtype], pad_id, p, o)

    sides = {"ours": ours, **{f"hf_{d}": hf_runner(d) for d in hf}}
    print(f"(a) batch 1, prompt {prompt_len} tokens, {n_out} output tokens, greedy, median of {reps} "
          "(repeats interleaved across sides)", flush=True)
    a = batch1(sides, prompts, prompt_len, n_out, reps)
    # Greedy agreement on one shared prompt (bf16 rounding may legitimately diverge after a while).
    probe = prompts.take(prompt_len)
    agree = {}
    ref = hf_run(hf["float32"], pad_id, [probe], [n_out])[2][0]
    agree["ours_vs_hf_float32"] = common_prefix(ours_run(llm, [probe], [n_out])[2][0], ref)
    agree["hf_bfloat16_vs_hf_float32"] = common_prefix(hf_run(hf["bfloat16"], pad_id, [probe], [n_out])[2][0], ref)
    print(f"  greedy common prefix with HF fp32 (of {n_out}): {agree}", flush=True)
    a_peer = max(hf, key=lambda d: a[f"hf_{d}"]["decode_tok_s"])

    print(f"(b) {num_req} requests, prompts {prompt_lens[0]}..{prompt_lens[-1]}, outputs "
          f"{min(out_lens)}..{max(out_lens)} ({sum(out_lens)} useful tokens), median of {reps} "
          "(repeats interleaved across sides)", flush=True)
    b = concurrent(sides, prompts, prompt_lens, out_lens, reps)
    b_peer = max(hf, key=lambda d: b[f"hf_{d}"]["out_tok_s"])

    rows = []
    for case, ours_v, peer, metric in (
            ("batch1_decode", a["ours"]["decode_tok_s"], a_peer, a[f"hf_{a_peer}"]["decode_tok_s"]),
            ("batch1_e2e (info)", a["ours"]["e2e_tok_s"], a_peer, a[f"hf_{a_peer}"]["e2e_tok_s"]),
            ("concurrent16", b["ours"]["out_tok_s"], b_peer, b[f"hf_{b_peer}"]["out_tok_s"])):
        ratio = ours_v / metric
        target = TARGETS.get(case)
        rows.append({"case": case, "ours_tok_s": ours_v, "hf_tok_s": metric, "hf_dtype": peer, "ratio": ratio,
                     "target": target, "pass": None if target is None else ratio >= target})

    print()
    print(f"{'case':20s} {'ours tok/s':>11s} {'HF tok/s':>15s} {'ratio':>7s} {'target':>7s} {'pass':>5s}")
    for r in rows:
        tgt = "-" if r["target"] is None else f"{r['target']:.1f}x"
        ok = "-" if r["pass"] is None else ("yes" if r["pass"] else "NO")
        print(f"{r['case']:20s} {r['ours_tok_s']:11.2f} {r['hf_tok_s']:9.2f} ({r['hf_dtype'][:4]}) "
              f"{r['ratio']:6.2f}x {tgt:>7s} {ok:>5s}")
    print("batch1_decode = (N-1)/(t(N)-t(1)); concurrent16 = useful output tokens / wall time of the call")

    result = {
        "bench": "cpu_engine", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "quick": args.quick, "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "cpu_model": cpu_model(), "num_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "model": "smollm2", "model_dir": str(model_dir), "ours_dtype": ours_dtype,
        "ours_load_s": ours_load_s, "reps": reps,
        "batch1": {"prompt_tokens": prompt_len, "output_tokens": n_out, "method":
                   "decode tok/s = (N-1)/(t(N tokens) - t(1 token)); e2e tok/s = N/t(N); median of reps",
                   "peer_dtype": a_peer, "greedy_common_prefix": agree, **a},
        "concurrent": {"num_requests": num_req, "prompt_lens": prompt_lens, "output_lens": out_lens,
                       "method": "ours: one llm.generate call; HF: one left-padded static batch, "
                                 "max_new_tokens = max(output_lens); useful tokens / wall time; median of reps",
                       "peer_dtype": b_peer, **b},
        "table": rows,
        # Other processes share these 2 cores; a 1-min load average well above 2 (while this runs) or
        # process CPU time well below 2x wall time means the figures are contaminated.
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "process_cpu_s": time.process_time(), "wall_s": time.perf_counter() - t0,
    }
    out = write_result(args.out, result, indent=2, newline=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
