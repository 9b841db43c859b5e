"""Completion latency while typing: one replayed trace through our web app's /infill and through
llama.cpp's llama-server /infill on the same GGUF file, the same requests, in one run.

The trace: a developer writes lines into three real files (this project's own modules) top to
bottom; on every line of 12+ characters, with half of the line typed, the editor asks for a
single-line completion (the rest of the line) and waits for it. The body is llama.vscode's
(src/llama-server.ts: input_prefix = up to 256 lines before the cursor's line, prompt = the line
up to the cursor, input_suffix = the 64 lines after (the rest of the line is not typed yet),
n_predict 128, top_k 40, top_p 0.99, samplers
[top_k, top_p, infill], cache_prompt, t_max_prompt_ms 500, t_max_predict_ms 1000) with
"stop": ["\\n"] for a single line. Consecutive requests share their start, as typing does, so
both servers' prompt caches matter. The first request of each server is a warm-up, not counted.

    python -m bench.cpu.typing_trace [--model qwen2.5-coder-0.5b] [--lines 40] [--no-llamacpp] [--no-exact]

Our server runs twice: as shipped (shifted KV reuse on, inference/core/kv_reuse.py) and with
COMPLETION_CACHE_REUSE=0 (every prompt token past the exact prefix cache computed), so that the
speed and the exact-match rate of both show in one run.

Prints a table, writes bench/results/typing_trace.json. Targets (issue 48): ours P50 <= 250 ms,
P90 <= 500 ms, and >= 1.2x faster than llama.cpp at P50.
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time

import requests

from bench.harness import free_port, nearest_rank, result_path, stop_process, wait_ready, write_result

AUTH = {"Authorization": "Bearer demo-api-key"}
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
N_PREFIX, N_SUFFIX = 256, 64
SETTINGS = {"n_predict": 128, "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "stop": ["\n"]}


def trace(lines_per_file: int) -> list[tuple[dict, str]]:
    """(the request, the rest of the line: what a perfect completion inserts)."""
    from pipelines import completion, knowledge_base, support_chat
    bodies = []
    for module in (completion, knowledge_base, support_chat):
        lines = inspect.getsource(module).split("\n")
        picked = [i for i, line in enumerate(lines) if len(line.strip()) >= 12][:lines_per_file]
        for i in picked:
            cut = len(lines[i]) // 2
            body = {"input_prefix": "\n".join(lines[max(0, i - N_PREFIX):i]) + "\n", "prompt": lines[i][:cut],
                    "input_suffix": "\n" + "\n".join(lines[i + 1:i + 1 + N_SUFFIX]), "input_extra": [], **SETTINGS}
            bodies.append((body, lines[i][cut:]))
    return bodies


def replay(url: str, bodies: list[tuple[dict, str]], headers: dict | None = None) -> dict:
    s = requests.Session()
    s.post(f"{url}/infill", json={**bodies[0][0], "prompt": ""}, headers=headers, timeout=300).raise_for_status()
    lat, chars, empty, exact, per_request = [], [], 0, 0, []
    for body, rest in bodies:
        t0 = time.perf_counter()
        r = s.post(f"{url}/infill", json=body, headers=headers, timeout=300)
        r.raise_for_status()
        lat.append((time.perf_counter() - t0) * 1e3)
        text = r.json()["content"]
        # where the time went: both servers answer llama.cpp's timings
        t = r.json().get("timings", {})
        per_request.append({"ms": round(lat[-1], 1), **{k: t.get(k) for k in TIMINGS}})
        chars.append(len(text))
        empty += not text.strip()
        exact += text.strip() == rest.strip()
    return {"requests": len(lat), "p50_ms": statistics.median(lat), "p90_ms": nearest_rank(lat, 0.90),
            "mean_ms": statistics.mean(lat), "empty": empty, "exact": exact / len(lat),
            "mean_chars": statistics.mean(chars), "split_over_p90": split(per_request, nearest_rank(lat, 0.90)),
            "per_request": per_request}


def split(per_request: list[dict], p90: float) -> dict:
    """Mean prompt tokens, prompt ms, predicted tokens and predicted ms, over the requests at or
    above P90 and below it: whether the tail is prompt processing or decoding."""
    out = {}
    for name, rows in (("tail", [r for r in per_request if r["ms"] >= p90]),
                       ("rest", [r for r in per_request if r["ms"] < p90])):
        out[name] = {k: round(statistics.mean(r[k] or 0 for r in rows), 1) for k in ("ms", *TIMINGS)} if rows else {}
    return out


def ours(model: str, bodies: list[dict], **settings: str) -> dict:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "INFERENCE_URL", "DATABASE_URL")}
    env.update(settings)
    with tempfile.TemporaryDirectory() as tmp:
        env.update(MODEL=model, KB_CACHE_DIR=f"{tmp}/kb", DATABASE_URL=f"sqlite:///{tmp}/c.db")
        proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(f"{url}/v1/health", proc, timeout=600)
            # and the chat pipeline's start-up indexing, which would share the two cores
            wait_ready(f"{url}/readyz", proc, timeout=600)
            return replay(url, bodies, AUTH)
        finally:
            stop_process(proc, 10)


def llamacpp(model: str, bodies: list[dict]) -> dict:
    from bench.cpu.llamacpp import LlamaServer
    from inference.loader.model_loader import gguf_source
    # --cache-reuse 256: what llama.vscode's README starts llama-server with (its FIM presets)
    with LlamaServer(gguf_source(model), free_port(), parallel=1, ctx=8192, alias=model,
                     extra=("--cache-reuse", "256")) as server:
        return replay(server.url, bodies)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--lines", type=int, default=40, help="completions per file (three files)")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--no-exact", action="store_true", help="skip the row without shifted KV reuse")
    ap.add_argument("--set", action="append", default=[], metavar="VAR=VALUE",
                    help="a setting for our server's environment (both rows), e.g. COMPLETION_SUFFIX_TOKENS=256")
    ap.add_argument("--label", default="", help="a note on the variant measured (kept in the JSON)")
    ap.add_argument("--out", default=result_path("typing_trace.json"))
    args = ap.parse_args(argv)
    bodies = trace(args.lines)
    settings = dict(kv.split("=", 1) for kv in args.set)
    rows = {"ours /infill (web app)": ours(args.model, bodies, **settings)}
    if not args.no_exact:           # the same server computing every prompt exactly (no shifted reuse)
        rows["ours, cache_reuse off"] = ours(args.model, bodies, **{**settings, "COMPLETION_CACHE_REUSE": "0"})
    if not args.no_llamacpp:
        rows["llama.cpp /infill"] = llamacpp(args.model, bodies)
    print(f"\nTyping trace: {len(bodies)} single-line completions over 3 files, {args.model}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'server':26} {'P50 ms':>8} {'P90 ms':>8} {'mean ms':>8} {'empty':>6} {'exact':>6} {'chars':>6}")
    for name, r in rows.items():
        print(f"{name:26} {r['p50_ms']:8.0f} {r['p90_ms']:8.0f} {r['mean_ms']:8.0f} {r['empty']:6d} "
              f"{r['exact']:6.2f} {r['mean_chars']:6.1f}")
    result = {"model": args.model, "requests": len(bodies), "settings": SETTINGS, "rows": rows, "label": args.label,
              "env": {**{k: v for k, v in os.environ.items() if k.startswith("COMPLETION_")}, **settings}}
    if "llama.cpp /infill" in rows:
        ratio = rows["llama.cpp /infill"]["p50_ms"] / rows["ours /infill (web app)"]["p50_ms"]
        result["p50_speedup_vs_llamacpp"] = ratio
        print(f"ours vs llama.cpp at P50: {result['p50_speedup_vs_llamacpp']:.2f}x")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
