"""Our CPU engine against llama.cpp on one shipped GGUF file (--model, default the embedded default
qwen2.5-coder-0.5b), both as OpenAI servers on 2 threads, measured through the same OpenAI client in
one run (the peer built by bench/cpu/llamacpp.py).

Per server (llama.cpp `llama-server -t 2 -np 16`, ours `python -m inference serve --model MODEL`
under each thread policy in --policies; the servers never run at the same time):
  batch-1 decode   one stream of 128 tokens (ignore_eos), tokens after the first / their time
  16 concurrent    16 streams x 64 tokens at once, output tokens / wall time
  prefill          a 512-token prompt (token ids, max_tokens=1), 512 / wall time
  TTFT             a 1,000-token chat prompt, time to the first content chunk
Every prompt is different (no prefix-cache hits). Then the IDE endpoint through the web app as
`make run` serves it (`python -m app serve`, in-process engine): a developer typing down three
files, a single-line completion per line (cursor mid-line, stop at the newline), P50 / P90 end to
end, and the first request of each file (nothing cached) on its own.

    .venv/bin/python -m bench.cpu.vs_llamacpp [--model qwen2.5-coder-0.5b] [--reps 3] [--policies PASSIVE]
                                              [--levels avx512_vnni,avx2] [--ide-lines 15] [--no-ide]

Per ISA level this CPU runs (inference/kernels/cpu_ops.py), ours forced to that level
(INFERENCE_CPU_ISA) against llama.cpp built for the same level (bench/cpu/llamacpp.py).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import requests

from bench.cpu.llamacpp import LlamaServer, build
from bench.harness import (
    ROOT,
    cpu_model,
    free_port,
    git_commit,
    nearest_rank,
    result_path,
    stop_process,
    wait_idle,
    wait_ready,
    write_result,
)
from inference.kernels.cpu_ops import supported_isa_levels
from inference.loader.model_loader import gguf_source, resolve_model_dir

THREADS = 2
# Thread policies for our server. OpenMP (torch's own ops): PASSIVE sleeps between parallel
# regions, ACTIVE spins, "gomp-spin" spins 3M rounds first. The engine's kernel pool
# (inference/kernels/spin_pool.h) spins INFERENCE_CPU_SPIN_US (2000 by default) after a task;
# "pool-no-spin" sleeps at once.
POLICIES = {"PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}, "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
            "gomp-spin": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000000"},
            "pool-no-spin": {"OMP_WAIT_POLICY": "PASSIVE", "INFERENCE_CPU_SPIN_US": "0"}}


def _tokenizer(model: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(resolve_model_dir(model))


def _text_windows(tok, length: int, count: int) -> list[list[int]]:
    """`count` different windows of `length` token ids of real text (stdlib sources)."""
    import email
    import json as json_mod
    import logging
    source = "".join(inspect.getsource(m) for m in (logging, email, json_mod, argparse))
    ids = tok(source)["input_ids"]
    step = max(1, (len(ids) - length) // count)
    return [ids[i * step:i * step + length] for i in range(count)]


def _stream(client: openai.OpenAI, model: str, prompt, max_tokens: int) -> tuple[float, list[float], int]:
    """(sent at, arrival time of each content chunk, completion tokens)."""
    t0 = time.perf_counter()
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    arrivals, tokens = [], 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return t0, arrivals, tokens or len(arrivals)


def measure_server(url: str, model: str, tok, reps: int) -> dict:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    windows = iter(_text_windows(tok, 1100, 8 * reps + 40))
    _stream(client, model, next(windows)[:64], 16)                              # warm-up
    decode = []
    for _ in range(reps):
        _, arrivals, tokens = _stream(client, model, next(windows)[:32], 128)
        decode.append((tokens - 1) / (arrivals[-1] - arrivals[0]))
    concurrent = []
    for _ in range(reps):
        prompts = [next(windows)[:32] for _ in range(16)]
        counts = [0] * 16

        def run(i):
            counts[i] = _stream(client, model, prompts[i], 64)[2]
        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        concurrent.append(sum(counts) / (time.perf_counter() - t0))
    prefill = []
    for _ in range(reps):
        t0 = time.perf_counter()
        client.completions.create(model=model, prompt=next(windows)[:512], max_tokens=1, temperature=0)
        prefill.append(512 / (time.perf_counter() - t0))
    ttft = []
    for _ in range(reps):
        context = tok.decode(next(windows)[:1000])
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model=model, temperature=0, max_tokens=8, stream=True,
            messages=[{"role": "system", "content": f"Answer from this documentation:\n{context}"},
                      {"role": "user", "content": "What does this code do?"}])
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft.append((time.perf_counter() - t0) * 1e3)
                break
        stream.close()
    med = statistics.median
    return {"batch1_decode_tok_s": med(decode), "concurrent16_tok_s": med(concurrent),
            "prefill512_tok_s": med(prefill), "ttft_1000_chat_ms": med(ttft),
            "runs": {"decode": decode, "concurrent": concurrent, "prefill": prefill, "ttft": ttft}}


PIDS: dict[str, int] = {}          # url -> the pid of our server there (for its RSS)


def rss_mb(pid: int) -> float:
    import psutil
    return psutil.Process(pid).memory_info().rss / 2**20


@contextlib.contextmanager
def process(cmd: list[str], env: dict, url: str, ready_path: str):
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    PIDS[url] = proc.pid
    try:
        wait_ready(f"{url}{ready_path}", proc)
        waited = wait_idle(proc.pid)
        print(f"{cmd[2] if len(cmd) > 2 else cmd[0]}: ready, idle {waited:.0f} s later", flush=True)
        yield url
    finally:
        stop_process(proc, 20)


def ours(model: str, policy: str, port: int, level: str):
    cmd = [sys.executable, "-m", "inference", "serve", "--model", model, "--host", "127.0.0.1",
           "--port", str(port)]
    return process(cmd, {**POLICIES[policy], "INFERENCE_CPU_ISA": level}, f"http://127.0.0.1:{port}", "/ready")


def _typing_positions(src: str, first_line: int, count: int) -> list[int]:
    """Cursor offsets mid-line on `count` successive non-trivial lines from `first_line` on."""
    lines = src.splitlines(keepends=True)
    offsets, line = [], first_line
    while len(offsets) < count and line < len(lines):
        if len(lines[line].strip()) >= 12:
            offsets.append(sum(len(x) for x in lines[:line]) + len(lines[line]) // 2)
        line += 1
    return offsets


def ide_latency(model: str, policy: str, lines_per_file: int) -> dict:
    """A developer typing down three files through the web app (`make run`'s process, in-process
    engine): a single-line completion (cursor mid-line, stop at the newline) per line, one at a
    time. The first request of a file has nothing cached; the others share their prompt's start
    with the one before, as typing does."""
    from pipelines import completion, knowledge_base, support_chat
    port = free_port()
    env = {**POLICIES[policy], "MODEL": model, "DATABASE_URL": f"sqlite:///{Path('/tmp') / f'vs_llamacpp_{port}.db'}"}
    sources = [inspect.getsource(m) for m in (completion, knowledge_base, support_chat)]
    warm, cold, tokens = [], [], []
    with process([sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)], env,
                 f"http://127.0.0.1:{port}", "/readyz") as url:
        s = requests.Session()
        s.post(f"{url}/v1/completions", json={"prompt": "def f(x):\n    return", "max_tokens": 4},
               headers={"Authorization": "Bearer demo-api-key"}, timeout=120)          # warm-up
        wait_idle(PIDS[url])
        # batch-1 decode through the web app's own OpenAI mount: the same engine, in the web process
        client = openai.OpenAI(base_url=f"{url}/inference/v1", api_key="none", max_retries=0, timeout=300)
        windows = iter(_text_windows(_tokenizer(model), 64, 8))
        _stream(client, model, next(windows)[:64], 16)              # the same warm-up as measure_server's
        web_decode = []
        for _ in range(3):
            _, arrivals, n = _stream(client, model, next(windows)[:32], 128)
            web_decode.append((n - 1) / (arrivals[-1] - arrivals[0]))
        for f, src in enumerate(sources):
            for i, cut in enumerate(_typing_positions(src, 120, lines_per_file)):
                body = {"language": "python", "prompt": src[:cut], "suffix": src[cut:cut + 300],
                        "filepath": f"file{f}.py", "max_tokens": 32, "stop": ["\n"], "user": "dev"}
                t0 = time.perf_counter()
                r = s.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer demo-api-key"},
                           timeout=120)
                r.raise_for_status()
                (cold if i == 0 else warm).append((time.perf_counter() - t0) * 1e3)
                tokens.append(r.json()["usage"]["completion_tokens"])
    every = warm + cold
    return {"web_batch1_decode_tok_s": statistics.median(web_decode), "web_decode_runs": web_decode,
            "requests": len(every), "p50_ms": statistics.median(every), "p90_ms": nearest_rank(every, 0.90),
            "warm_p50_ms": statistics.median(warm), "warm_p90_ms": nearest_rank(warm, 0.90),
            "cold_ms": cold, "mean_completion_tokens": statistics.mean(tokens)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="a model alias backed by a GGUF file")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policies", default="PASSIVE", help=f"our thread policies, of {','.join(POLICIES)}")
    ap.add_argument("--no-ide", action="store_true", help="skip the web app's IDE latency part")
    ap.add_argument("--ide-lines", type=int, default=15, help="completions per file (3 files)")
    ap.add_argument("--out", default=result_path("vs_llamacpp.json"))
    ap.add_argument("--levels", default=None,
                    help="ISA levels to compare at (default: every level this CPU runs, best first)")
    args = ap.parse_args()
    policies = args.policies.split(",")
    levels = args.levels.split(",") if args.levels else supported_isa_levels()
    for level in levels:
        build(level)
    model = args.model
    tok = _tokenizer(model)
    res = {"machine": cpu_model(), "cores": os.cpu_count(), "threads": THREADS, "commit": git_commit(),
           "model": model, "gguf": gguf_source(model).name, "levels": levels, "servers": {}, "ide": {}}
    for level in levels:
        peer_name = f"llama.cpp {level}"
        with LlamaServer(gguf_source(model), free_port(), threads=THREADS, parallel=16, alias=model,
                         level=level) as peer:
            res["servers"][peer_name] = {**measure_server(peer.url, model, tok, args.reps), "level": level,
                                         "rss_mb_after": rss_mb(peer.proc.pid)}
        for policy in policies:
            with ours(model, policy, free_port(), level) as url:
                res["servers"][f"ours {level} {policy}"] = {
                    **measure_server(url, model, tok, args.reps), "level": level, "peer": peer_name,
                    "rss_mb_after": rss_mb(PIDS[url])}            # after 16 concurrent and more
    for policy in policies if not args.no_ide else ():
        res["ide"][policy] = ide_latency(model, policy, args.ide_lines)
    print(f"{model} on {res['machine']}, {THREADS} threads; each row against llama.cpp built for the same level")
    print("| server | batch-1 decode tok/s | 16 concurrent tok/s | prefill 512 tok/s | TTFT 1000-token chat ms "
          "| RSS MB after |")
    print("|---|---|---|---|---|---|")
    for name, r in res["servers"].items():
        peer = res["servers"][r.get("peer", name)]
        mine = "peer" in r
        ratio = " ({:.2f}x)" if mine else ""
        cells = [(r[k], peer[k]) for k in ("batch1_decode_tok_s", "concurrent16_tok_s", "prefill512_tok_s")]
        print(f"| {name} | " + " | ".join(f"{v:.1f}" + ratio.format(v / p) for v, p in cells)
              + f" | {r['ttft_1000_chat_ms']:.0f}"
              + (f" ({r['ttft_1000_chat_ms'] / peer['ttft_1000_chat_ms']:.2f}x)" if mine else "")
              + f" | {r['rss_mb_after']:.0f} |")
    if res["ide"]:
        print("\n| web app (`make run`) | batch-1 decode tok/s (vs inference serve) | IDE single-line P50 ms "
              "| P90 ms | first of a file ms |")
        print("|---|---|---|---|---|")
    for policy, r in res["ide"].items():
        serve = res["servers"][f"ours {levels[0]} {policy}"]["batch1_decode_tok_s"]
        print(f"| {policy} | {r['web_batch1_decode_tok_s']:.1f} ({r['web_batch1_decode_tok_s'] / serve:.2f}x) "
              f"| {r['p50_ms']:.0f} | {r['p90_ms']:.0f} | " + ", ".join(f"{c:.0f}" for c in r["cold_ms"]) + " |")
    write_result(args.out, res)


if __name__ == "__main__":
    main()
