"""Code-completion quality: HumanEval single-line infilling through our web app's /v1/completions
(per model) and through llama.cpp's /infill on the same GGUF file, all in one run.

Each task is a HumanEval function with one line removed. The server gets the text before the
line as the prefix and the text after it as the suffix (temperature 0); the first line of its
answer fills the hole. pass@1: the filled program runs its tests in a subprocess with no network
(`unshare -rn`) and a time-out. Exact match: the line equals the removed one, whitespace
stripped. A fixed subset (one task per HumanEval problem, chosen with a seed) keeps a row to
minutes on 2 cores.

The tasks: the single-line file of OpenAI's human-eval-infilling (data/HumanEval-SingleLineInfilling
.jsonl.gz, MIT). The package of that name on the package index (2.15.0) is an empty placeholder
without it, so the file is read from --tasks.

    python -m bench.cpu.completion_eval --tasks HumanEval-SingleLineInfilling.jsonl.gz \\
        [--models smollm2,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b] [--limit 164] [--no-llamacpp]

Prints a table, writes bench/results/completion_eval.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from bench.harness import free_port, result_path, stop_process, wait_ready, write_result

KEY = "demo-api-key"
# Qwen2.5-Coder technical report (arXiv 2409.12186): no single-line HumanEval-infilling figure
# is published for the 0.5B; its FIM table reports the multi-language HumanEval-FIM average.
PUBLISHED = "none published for single-line HumanEval infilling at 0.5B (arXiv 2409.12186 reports HumanEval-FIM)"


def load_tasks(path: str, limit: int, seed: int = 0) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    by_problem: dict[str, list[dict]] = {}
    for row in rows:
        by_problem.setdefault(row["task_id"].rsplit("/", 1)[0], []).append(row)
    rng = random.Random(seed)
    picked = [rng.choice(group) for _, group in sorted(by_problem.items(), key=lambda kv: int(kv[0].split("/")[-1]))]
    return picked[:limit]


def first_line(text: str) -> str:
    return text.lstrip("\n").split("\n", 1)[0]


def passes(task: dict, line: str, timeout_s: float = 10.0) -> bool:
    program = task["prompt"] + line + "\n" + task["suffix"] + "\n" + task["test"] + \
        f"\ncheck({task['entry_point']})\n"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(program)
    try:
        out = subprocess.run(["unshare", "-rn", sys.executable, "-I", f.name], capture_output=True,
                             timeout=timeout_s)
        return out.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        os.unlink(f.name)


def score(tasks: list[dict], complete) -> dict:
    """complete(prefix, suffix) -> text; returns pass@1, exact match and latency."""
    n_pass = n_exact = 0
    lat = []
    for task in tasks:
        t0 = time.perf_counter()
        line = first_line(complete(task["prompt"], task["suffix"]))
        lat.append(time.perf_counter() - t0)
        expected = task["canonical_solution"].strip()
        n_exact += line.strip() == expected
        n_pass += passes(task, line)
    lat.sort()
    return {"tasks": len(tasks), "pass_at_1": n_pass / len(tasks), "exact": n_exact / len(tasks),
            "latency_p50_ms": lat[len(lat) // 2] * 1e3, "latency_p90_ms": lat[int(len(lat) * 0.9)] * 1e3}


def ours(model: str, tasks: list[dict]) -> dict:
    """Our web app (python -m app serve) on `model`, through its /v1/completions (OpenAI shape)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "INFERENCE_URL", "DATABASE_URL")}
    with tempfile.TemporaryDirectory() as tmp:
        env.update(MODEL=model, KB_CACHE_DIR=str(Path(tmp) / "kb"), DATABASE_URL=f"sqlite:///{tmp}/c.db")
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(f"{base}/v1/health", proc, timeout=600)       # 200 once the model is loaded

            def complete(prefix, suffix):
                body = {"prompt": prefix, "suffix": suffix, "max_tokens": 48, "temperature": 0, "language": "python",
                        "filepath": "solution.py"}
                resp = requests.post(f"{base}/v1/completions", json=body, timeout=120,
                                     headers={"Authorization": f"Bearer {KEY}"})
                resp.raise_for_status()
                return resp.json()["choices"][0]["text"]
            return score(tasks, complete)
        finally:
            stop_process(proc, 10)


def llamacpp(model: str, tasks: list[dict]) -> dict:
    """llama.cpp's llama-server on the same GGUF file, through /infill (greedy)."""
    from bench.cpu.llamacpp import LlamaServer
    from inference.loader.model_loader import gguf_source
    with LlamaServer(gguf_source(model), free_port(), parallel=1, ctx=4096, alias=model) as server:
        def complete(prefix, suffix):
            body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 48, "temperature": 0,
                    "top_k": 1, "cache_prompt": True}
            resp = requests.post(f"{server.url}/infill", json=body, timeout=120)
            resp.raise_for_status()
            return resp.json()["content"]
        return score(tasks, complete)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", required=True, help="HumanEval-SingleLineInfilling.jsonl(.gz)")
    ap.add_argument("--models", default="smollm2,qwen2.5-coder-0.5b")
    ap.add_argument("--limit", type=int, default=164)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--llamacpp-model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--out", default=result_path("completion_eval.json"))
    args = ap.parse_args(argv)
    tasks = load_tasks(args.tasks, args.limit)
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        rows.append({"server": "ours /v1/completions", "model": model, **ours(model, tasks)})
        print(rows[-1], flush=True)
    if not args.no_llamacpp:
        peer = llamacpp(args.llamacpp_model, tasks)
        rows.append({"server": "llama.cpp /infill", "model": args.llamacpp_model, **peer})
        print(rows[-1], flush=True)
    print(f"\nHumanEval single-line infilling, {len(tasks)} tasks (one per problem), temperature 0")
    print(f"{'server':24} {'model':22} {'pass@1':>7} {'exact':>7} {'P50 ms':>8} {'P90 ms':>8}")
    for r in rows:
        print(f"{r['server']:24} {r['model']:22} {r['pass_at_1']:7.3f} {r['exact']:7.3f} {r['latency_p50_ms']:8.0f} "
              f"{r['latency_p90_ms']:8.0f}")
    print(f"published: {PUBLISHED}")
    write_result(args.out, {"benchmark": "humaneval-single-line-infilling", "tasks": len(tasks), "rows": rows,
                            "published": PUBLISHED, "machine": os.uname().machine, "cpus": os.cpu_count()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
