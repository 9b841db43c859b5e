"""Soak run: the product under a steady load for a while, on loopback. Passes when no request
errors, the process' memory stays flat and every KV block is free at the end.

The web app (chat + completion) and its in-process engine are served by waitress on 127.0.0.1;
a scheduler issues requests at a fixed rate (open loop: a slow answer does not slow the rate)
from a thread pool: 70% chat turns (a new session every 5 turns), 30% IDE completions.
Resident memory is sampled every 2 s (the KV cache pool is made resident first); "flat" means
the median of the last third of the samples is within --rss-growth-mb of the median of the first
third (after a warm-up). Latency percentiles cover the same steady window; requests sent during
the warm-up (the first ones wait for the engine, the embedder and the knowledge-base index to
load) are reported apart as warmup_p99_s.

    python -m bench.cpu.soak                      # 10 minutes at 4 req/s on SmolLM2
    python -m bench.cpu.soak --duration 30 --warmup 35 --model random:tiny --rate 4   # ~1 minute (CI)
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import requests

from bench.harness import nearest_rank, result_path, write_result

CHAT_KEY = {"X-Site-Key": "demo-site-key"}
API_KEY = {"Authorization": "Bearer demo-api-key"}
QUESTIONS = ["How long do refunds take?", "Where is my order?", "Can I change my delivery address?",
             "Do you ship to Canada?", "My kettle arrived broken", "How do gift cards work?"]
SNIPPETS = ["def add(a, b):\n    ", "for i in range(", "class Order:\n    def __init__(self", "import os\n\npath = "]


def serve(model: str, kb_cache: str):
    from waitress.server import create_server

    from app import create_app
    from pipelines.inference_client import InProcessClient
    client = InProcessClient(model, max_model_len=1024)
    # The KV cache is a zero-page mapping that becomes resident block by block as the prefix cache
    # fills it (LRU: the allocator takes never-used blocks first), which is by design and bounded
    # by the pool; it would read as growth here. Written once now, so growth is everything else.
    for k, v in client.engine.engine.runner.kv_caches:
        k.fill_(0)
        v.fill_(0)
    # every simulated user comes from 127.0.0.1: the per-IP limit would measure the limiter
    unlimited = "100000 per second"
    app = create_app({"KB_CACHE_DIR": kb_cache, "REDIS_URL": None, "CHAT_MAX_TOKENS": 32,
                      "RATE_LIMITS": {"per_ip": unlimited, "per_site_key": unlimited, "per_api_key": unlimited}},
                     client=client)
    server = create_server(app, host="127.0.0.1", port=0, threads=16, connection_limit=256)
    threading.Thread(target=server.run, daemon=True).start()
    return f"http://127.0.0.1:{server.effective_port}", client, server


class Load:
    def __init__(self, base: str, seed: int):
        self.base, self.rng = base, random.Random(seed)
        self.lock = threading.Lock()
        self.latencies: dict[str, list[tuple[float, float]]] = {"chat": [], "completion": []}   # (sent, s)
        self.errors: list[str] = []
        self.statuses: dict[int, int] = {}
        self.session, self.turns = None, 0
        self._local = threading.local()

    @property
    def http(self) -> requests.Session:
        """One keep-alive connection per load thread (a new TCP connection per request would
        measure the kernel's TIME_WAIT handling, not the service)."""
        if not hasattr(self._local, "s"):
            self._local.s = requests.Session()
        return self._local.s

    def _record(self, kind: str, t0: float, resp: requests.Response | None, error: str | None) -> None:
        with self.lock:
            if resp is not None:
                self.statuses[resp.status_code] = self.statuses.get(resp.status_code, 0) + 1
            if error or resp is None or resp.status_code >= 400:
                self.errors.append(error or f"{kind}: HTTP {resp.status_code} {resp.text[:200]}")
            else:
                self.latencies[kind].append((t0, time.perf_counter() - t0))

    def chat(self) -> None:
        t0 = time.perf_counter()
        try:
            with self.lock:
                if self.session is None or self.turns >= 5:
                    self.session, self.turns = None, 0
                sid = self.session
                self.turns += 1
                question = self.rng.choice(QUESTIONS)
            if sid is None:
                sid = self.http.post(f"{self.base}/api/chat/sessions", headers=CHAT_KEY,
                                     timeout=60).json()["session_id"]
                with self.lock:
                    self.session = sid
            resp = self.http.post(f"{self.base}/api/chat/sessions/{sid}/messages", headers=CHAT_KEY,
                                 json={"content": question}, timeout=120)
            self._record("chat", t0, resp, None)
        except Exception as exc:                 # noqa: BLE001 - every failure is a soak error
            self._record("chat", t0, None, f"chat: {type(exc).__name__}: {exc}")

    def completion(self) -> None:
        t0 = time.perf_counter()
        with self.lock:
            prefix = self.rng.choice(SNIPPETS)
        try:
            resp = self.http.post(f"{self.base}/v1/completions", headers=API_KEY, timeout=120,
                                 json={"language": "python", "segments": {"prefix": prefix, "suffix": "\n"}})
            self._record("completion", t0, resp, None)
        except Exception as exc:                 # noqa: BLE001
            self._record("completion", t0, None, f"completion: {type(exc).__name__}: {exc}")


def run(args) -> dict:
    import tempfile
    base, client, server = serve(args.model, tempfile.mkdtemp(prefix="soak-kb-"))
    load = Load(base, args.seed)
    proc = psutil.Process()
    rss: list[tuple[float, int]] = []
    stop = threading.Event()
    warmup = args.warmup if args.warmup is not None else min(60.0, args.duration / 4)

    def sample():
        while not stop.is_set():
            if time.perf_counter() - t_start > warmup:     # caches, allocator and KB index settle first
                rss.append((time.perf_counter(), proc.memory_info().rss))
            stop.wait(2.0)
    t_start = time.perf_counter()
    threading.Thread(target=sample, daemon=True).start()
    sent = 0
    with ThreadPoolExecutor(max_workers=32) as pool:
        while (now := time.perf_counter()) - t_start < args.duration + warmup:
            due = t_start + sent / args.rate
            if now < due:
                time.sleep(min(due - now, 0.05))
                continue
            pool.submit(load.chat if load.rng.random() < 0.7 else load.completion)
            sent += 1
    elapsed = time.perf_counter() - t_start
    stop.set()
    engine = client.engine
    deadline = time.time() + 30                  # the last requests drain
    while engine.num_unfinished and time.time() < deadline:
        time.sleep(0.1)
    bm = engine.engine.block_manager
    steady = {kind: [s for t0, s in lat if t0 - t_start > warmup] for kind, lat in load.latencies.items()}
    cold = [s for lat in load.latencies.values() for t0, s in lat if t0 - t_start <= warmup]
    third = max(1, len(rss) // 3)
    first, last = statistics.median(r for _, r in rss[:third]), statistics.median(r for _, r in rss[-third:])
    out = {
        "model": args.model, "duration_s": round(elapsed, 1), "warmup_s": warmup, "rate": args.rate, "requests": sent,
        "statuses": load.statuses, "errors": len(load.errors), "first_errors": load.errors[:5],
        "chat_p50_s": nearest_rank(steady["chat"], 0.5), "chat_p99_s": nearest_rank(steady["chat"], 0.99),
        "completion_p50_s": nearest_rank(steady["completion"], 0.5),
        "completion_p99_s": nearest_rank(steady["completion"], 0.99),
        "warmup_p99_s": nearest_rank(cold, 0.99),
        "rss_first_mb": first / 2**20, "rss_last_mb": last / 2**20, "rss_growth_mb": (last - first) / 2**20,
        "kv_blocks_used_at_end": bm.num_blocks - bm.num_free_blocks, "unfinished_at_end": engine.num_unfinished,
        "rss_samples_mb": [round(r / 2**20, 1) for _, r in rss],
    }
    out["passed"] = (out["errors"] == 0 and out["rss_growth_mb"] <= args.rss_growth_mb
                     and out["kv_blocks_used_at_end"] == 0 and out["unfinished_at_end"] == 0)
    server.close()
    client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of steady load")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    ap.add_argument("--warmup", type=float, default=None, help="seconds of load before memory is sampled "
                                                               "(default: a quarter of --duration, at most 60)")
    ap.add_argument("--rss-growth-mb", type=float, default=64.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=result_path("soak.json"))
    args = ap.parse_args(argv)
    res = run(args)
    write_result(args.out, res)
    print(f"{'requests':<24}{res['requests']} in {res['duration_s']} s at {res['rate']}/s ({res['model']})")
    print(f"{'statuses':<24}{res['statuses']}   errors {res['errors']}")
    for kind in ("chat", "completion"):
        p50, p99 = res[f"{kind}_p50_s"], res[f"{kind}_p99_s"]
        if p50 is not None:
            print(f"{kind + ' p50 / p99':<24}{p50 * 1e3:.0f} / {p99 * 1e3:.0f} ms")
    if res["warmup_p99_s"] is not None:
        print(f"{'warm-up p99':<24}{res['warmup_p99_s'] * 1e3:.0f} ms (not in the figures above)")
    print(f"{'RSS first / last third':<24}{res['rss_first_mb']:.0f} / {res['rss_last_mb']:.0f} MB "
          f"({res['rss_growth_mb']:+.1f} MB, allowed {args.rss_growth_mb})")
    print(f"{'KV blocks in use at end':<24}{res['kv_blocks_used_at_end']}   {'PASS' if res['passed'] else 'FAIL'}")
    for e in res["first_errors"]:
        print("  error:", e)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
