"""Serving benchmark: the OpenAI-compatible HTTP service vs the in-process OnlineEngine, same workload.

Both sides get identical token-id prompts (windows of real text: stdlib docstrings) with seeded, mixed
prompt/output lengths, greedy and `ignore_eos` so every output has exactly the requested length.
  closed loop: --concurrency streams (default 8) drain --num-closed requests; the acceptance compares
               mean e2e latency, HTTP / in-process <= 1.10.
  open loop:   Poisson arrivals at --rate req/s for --num-requests requests (one thread per request).
Reported per side: throughput (req/s, output tok/s) and P50/P90/P99 of TTFT, ITL (gaps between token-
bearing stream events), TPOT ((e2e - TTFT) / (tokens - 1)) and e2e, timed from just before sending.

The server (`python -m inference serve`) is started on a free port and stopped, unless --url is given.
Engines never overlap: each session (one side, a fresh engine) runs warm-up, closed and open loop, then
shuts down; --reps sessions per side in ABBA order, pooled. No prompt shares a prefix with another.

    .venv/bin/python -m bench.cpu.serve [--quick] [--model random:tiny --dtype float32]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import http.client
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path

from bench.harness import ROOT, cpu_model, free_port, git_commit, percentile, result_path, stop_process, write_result
from bench.workloads import Prompts, real_text_ids
from inference import SamplingParams

LIMIT = 1.10   # HTTP mean e2e / in-process mean e2e, closed loop
CLK = os.sysconf("SC_CLK_TCK")


def prompt_text_ids(model: str) -> list[int]:
    """Token ids of real text for `model`: its HF tokenizer, or the byte tokenizer of a random model."""
    from inference.core.tokenizer import ByteTokenizer, HFTokenizer
    from inference.loader.model_loader import resolve_model_dir
    path = resolve_model_dir(model)
    if path is not None:
        return real_text_ids(HFTokenizer(path).hf)
    from inference.loader.presets import preset_config
    byte_tok = ByteTokenizer(preset_config(model.removeprefix("random:"))["vocab_size"])
    return real_text_ids(lambda text, **_: {"input_ids": byte_tok.encode(text)})


def record(t0: float, events: list[float], n_tokens: int, end: float, want: int) -> dict:
    if not events:
        raise RuntimeError("stream ended without a token")
    ttft, e2e = events[0] - t0, end - t0
    return {"ttft": ttft, "e2e": e2e, "itl": [b - a for a, b in zip(events, events[1:])],
            "tpot": (e2e - ttft) / (n_tokens - 1) if n_tokens > 1 else None,
            "out_tokens": n_tokens, "exact": n_tokens == want, "start": t0, "end": end}


class HTTPSide:
    def __init__(self, url: str):
        self.netloc = urllib.parse.urlsplit(url).netloc
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
            self.model = json.load(r)["data"][0]["id"]

    def __call__(self, ids: list[int], n: int) -> dict:
        body = json.dumps({"model": self.model, "prompt": ids, "max_tokens": n, "temperature": 0,
                           "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}})
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(self.netloc, timeout=600)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
            events, usage = [], None
            for line in resp:
                payload = line[5:].strip() if line.startswith(b"data:") else None
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload) if payload else {}
                if chunk.get("error"):
                    raise RuntimeError(f"stream error: {chunk['error']}")
                usage = chunk.get("usage") or usage
                for c in chunk.get("choices") or []:
                    if c.get("text") or c.get("finish_reason") is None:
                        events.append(time.perf_counter())
            end = time.perf_counter()
        finally:
            conn.close()
        return record(t0, events, usage["completion_tokens"] if usage else len(events), end, n)


class InProcSide:
    def __init__(self, model: str, dtype: str | None):
        from inference import OnlineEngine  # built in a worker thread, as the server does: on this
        with ThreadPoolExecutor(1) as pool:                # box an engine built in the main thread decodes ~30% slower
            self.eng = pool.submit(OnlineEngine, model, **({"dtype": dtype} if dtype else {})).result()

    def __call__(self, ids: list[int], n: int) -> dict:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        stream = self.eng.add_request({"prompt_token_ids": ids}, params)
        events, count = [], 0
        for d in stream:
            if d.error:
                raise RuntimeError(f"engine error: {d.error}")
            if d.token_ids:
                events.append(time.perf_counter())
                count += len(d.token_ids)
        return record(t0, events, count, time.perf_counter(), n)


def run_one(send, req, out: list, i: int) -> None:
    try:
        out[i] = send(*req)
    except Exception as exc:  # noqa: BLE001 - one failed request must not stop the run
        out[i] = {"error": repr(exc)}


def join_all(threads: list[threading.Thread], t0: float, out: list) -> tuple[list, float, float]:
    for t in threads:
        t.join()
    for r in out:                                 # the JSON keeps times relative to the phase's start
        r.update({"start": r["start"] - t0, "end": r["end"] - t0} if "start" in r else {})
    return out, t0, time.perf_counter()


def cpu_now(pid: int | None) -> dict:
    """CPU seconds so far: this process, the server, and the rest of the machine (other work on the cores)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() if pid else [0] * 13
    me, server = os.times().user + os.times().system, (int(st[11]) + int(st[12])) / CLK   # utime + stime
    return {"self_cpu_s": me, "server_cpu_s": server, "other_cpu_s": (sum(f[:8]) - f[3] - f[4]) / CLK - me - server}


def closed_loop(send, reqs: list, concurrency: int) -> tuple[list, float, float]:
    out, it = [None] * len(reqs), iter(range(len(reqs)))   # a shared iterator: each index goes to one thread

    def worker():
        for i in it:
            run_one(send, reqs[i], out, i)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    return join_all(threads, t0, out)


def open_loop(send, reqs: list, arrivals: list[float]) -> tuple[list, float, float]:
    out, threads = [None] * len(reqs), []
    t0 = time.perf_counter()
    for i, (req, at) in enumerate(zip(reqs, arrivals)):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        threads.append(threading.Thread(target=run_one, args=(send, req, out, i)))
        threads[-1].start()
    return join_all(threads, t0, out)


def dist(xs: list[float]) -> dict:
    return {"mean": sum(xs) / len(xs) if xs else None, "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p99": percentile(xs, 99)}


def summarize(runs: list[tuple[list, float, float, float]]) -> dict:
    """Pool the requests of several runs; throughput = sum of outputs / sum of run walls."""
    ok = [r for out, *_ in runs for r in out if r and "error" not in r]
    errors = [r["error"] for out, *_ in runs for r in out if r and "error" in r]
    wall = sum(end - t0 for _, t0, end, _ in runs)
    tokens = sum(r["out_tokens"] for r in ok)
    return {"requests": len(ok), "failed": len(errors), "errors": errors[:5],
            "inexact_lengths": sum(not r["exact"] for r in ok), "wall_s": wall, "output_tokens": tokens,
            **{k: sum(r[3][k] for r in runs) for k in runs[0][3]}, "req_s": len(ok) / wall, "out_tok_s": tokens / wall,
            **{k: dist([x for r in ok for x in (r[k] if k == "itl" else [r[k]]) if x is not None])
               for k in ("ttft", "itl", "tpot", "e2e")}}


def start_server(args, log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "inference", "serve", "--model", args.model, "--host", "127.0.0.1",
           "--port", str(port), *(["--dtype", args.dtype] if args.dtype else []), *shlex.split(args.server_args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/ready", timeout=2):
            return proc, url                      # non-2xx raises HTTPError, an OSError
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError("server not ready after 300 s")


def session(side_name: str, args, work: dict, log) -> dict:
    """One fresh engine of one side: warm-up, closed loop, open loop."""
    proc, url = start_server(args, log) if side_name == "http" and not args.url else (None, args.url)
    side = None
    try:
        side = HTTPSide(url.rstrip("/")) if side_name == "http" else InProcSide(args.model, args.dtype)
        closed_loop(side, work["warmup"], args.concurrency)

        def measured(fn, *fn_args):
            cpu0 = cpu_now(proc and proc.pid)
            return (*fn(*fn_args), {k: v - cpu0[k] for k, v in cpu_now(proc and proc.pid).items()})
        res = {"closed": measured(closed_loop, side, work["closed"], args.concurrency),
               "open": measured(open_loop, side, work["open"], work["arrivals"])}
    finally:
        stop_process(proc)
        if isinstance(side, InProcSide):
            side.eng.shutdown()                   # main() collects it before the next engine loads
    for phase, r in res.items():
        s = summarize([r])
        print(f"    {side_name:6s} {phase:6s} {s['requests']} ok {s['failed']} failed, {s['wall_s']:6.1f} s, "
              f"mean e2e {s['e2e']['mean']:.3f} s, {s['out_tok_s']:.1f} out tok/s; CPU-s: this process "
              f"{s['self_cpu_s']:.1f}, server {s['server_cpu_s']:.1f}, others {s['other_cpu_s']:.1f}", flush=True)
    return res


def fmt(d: dict, scale: float = 1e3) -> str:
    return "/".join("-" if d[k] is None else f"{d[k] * scale:.0f}" for k in ("p50", "p90", "p99"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default=None, help="passed to the server and the in-process engine")
    ap.add_argument("--url", default=None, help="use a running server instead of starting one")
    ap.add_argument("--server-args", default="", help="extra arguments for `python -m inference serve`")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-closed", type=int, default=None, help="closed-loop requests (default 32)")
    ap.add_argument("--rate", type=float, default=None, help="open-loop Poisson arrivals, req/s (default 1.0)")
    ap.add_argument("--num-requests", type=int, default=None, help="open-loop requests (default 32)")
    ap.add_argument("--prompt-len", type=int, nargs=2, default=None, help="min max (default 16 320)")
    ap.add_argument("--output-len", type=int, nargs=2, default=None, help="min max (default 16 128)")
    ap.add_argument("--reps", type=int, default=None, help="sessions per side (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    ap.add_argument("--out", default=result_path("serve.json"))
    args = ap.parse_args()
    for key, full, quick in (("num_closed", 32, 8), ("rate", 1.0, 4.0), ("num_requests", 32, 8),
                             ("prompt_len", [16, 320], [8, 64]), ("output_len", [16, 128], [4, 16]),
                             ("reps", 4, 1)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)

    import torch
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_model()}, {args.model}", flush=True)
    rng = random.Random(args.seed)
    closed_lens, open_lens = ([(rng.randint(*args.prompt_len), rng.randint(*args.output_len)) for _ in range(k)]
                              for k in (args.num_closed, args.num_requests))
    arrivals = list(accumulate((rng.expovariate(args.rate) for _ in range(args.num_requests - 1)), initial=0.0))
    prompts = Prompts(prompt_text_ids(args.model))     # each take() is a prompt no earlier one shares a prefix with

    def take(ls):
        return [(prompts.take(p), o) for p, o in ls]
    works = [{"warmup": take([(32, 8)] * args.concurrency), "closed": take(closed_lens), "open": take(open_lens),
              "arrivals": arrivals} for _ in range(args.reps)]
    print(f"closed loop: {args.num_closed} requests, {args.concurrency} streams; open loop: {args.num_requests} "
          f"requests, Poisson {args.rate} req/s; prompts {args.prompt_len[0]}..{args.prompt_len[1]}, outputs "
          f"{args.output_len[0]}..{args.output_len[1]} tokens; {args.reps} session(s) per side", flush=True)

    load_start, t_start = os.getloadavg(), time.perf_counter()
    runs = {"http": {"closed": [], "open": []}, "inproc": {"closed": [], "open": []}}
    with tempfile.NamedTemporaryFile("w+", prefix="serve-", suffix=".log", delete=False) as log:
        try:
            for rep in range(args.reps):
                for side_name in (("inproc", "http") if rep % 2 == 0 else ("http", "inproc")):
                    print(f"  rep {rep} {side_name}", flush=True)
                    for phase, r in session(side_name, args, works[rep], log).items():
                        runs[side_name][phase].append(r)
                    gc.collect()
        except BaseException:
            log.flush()
            print(f"--- server log {log.name} (tail) ---\n{Path(log.name).read_text()[-3000:]}", file=sys.stderr)
            raise
    os.unlink(log.name)
    summary = {side: {phase: summarize(r) for phase, r in ph.items()} for side, ph in runs.items()}
    http_e2e, in_e2e = summary["http"]["closed"]["e2e"]["mean"], summary["inproc"]["closed"]["e2e"]["mean"]
    ratio = http_e2e / in_e2e
    per_rep = [summarize([runs["http"]["closed"][i]])["e2e"]["mean"] / summarize([runs["inproc"]["closed"][i]])
               ["e2e"]["mean"] for i in range(args.reps)]

    print(f"\n{'phase':7s} {'side':7s} {'req/s':>6s} {'tok/s':>7s} {'TTFT p50/90/99 ms':>18s} "
          f"{'ITL p50/90/99 ms':>17s} {'TPOT p50/90/99 ms':>18s} {'e2e p50/90/99 ms':>18s} {'mean e2e':>9s}")
    for phase in ("closed", "open"):
        for side in ("inproc", "http"):
            s = summary[side][phase]
            print(f"{phase:7s} {side:7s} {s['req_s']:6.2f} {s['out_tok_s']:7.1f} {fmt(s['ttft']):>18s} "
                  f"{fmt(s['itl']):>17s} {fmt(s['tpot']):>18s} {fmt(s['e2e']):>18s} {s['e2e']['mean']:8.3f}s")
    print(f"closed loop, {args.concurrency} streams: mean e2e HTTP {http_e2e:.3f} s / in-process {in_e2e:.3f} s = "
          f"{ratio:.3f}x (limit {LIMIT:.2f}x) {'PASS' if ratio <= LIMIT else 'FAIL'}; per rep "
          f"{[round(x, 3) for x in per_rep]}")
    if bad := sum(s["failed"] + s["inexact_lengths"] for ph in summary.values() for s in ph.values()):
        print(f"WARNING: {bad} failed requests or outputs of the wrong length")

    result = {
        "bench": "serve", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "quick": args.quick, "torch": torch.__version__, "python": sys.version.split()[0],
        "cpu_model": cpu_model(), "num_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "workload": {"closed_lens": closed_lens, "open_lens": open_lens, "arrivals_s": arrivals,
                     "warmup": f"{args.concurrency} x (32 prompt, 8 output) per session, not measured"},
        "method": "ITL = gaps between consecutive token-bearing stream events; TPOT = (e2e - TTFT) / (tokens - 1); "
                  "throughput = output tokens (or requests) / wall time of the phase; percentiles pool all reps",
        "closed_loop_e2e": {"http_mean_s": http_e2e, "inproc_mean_s": in_e2e, "ratio": ratio, "limit": LIMIT,
                            "pass": ratio <= LIMIT, "ratio_per_rep": per_rep},
        "summary": summary,
        "per_request": {side: {phase: [[{k: v for k, v in r.items() if k != "itl"} for r in out] for out, *_ in rs]
                               for phase, rs in ph.items()} for side, ph in runs.items()},
        # Shared cores: other processes' CPU time in a phase (summary *.other_cpu_s, approximate) contaminates it.
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
    }
    out = write_result(args.out, result, newline=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
