"""What the benchmark scripts share: where results go and how they are written, timers (CUDA
events, CUDA graphs, round-robin), logging, the run's provenance (git commit, CPU / GPU model,
versions), the copy-bandwidth ceiling, the error and percentile helpers, and waiting for / stopping
a server subprocess.

How these are used (warm-up, repeats, medians, peers, rooflines, JSON fields):
bench/journal/METHOD.md. torch is imported inside the functions that need it, so the CPU-only
scripts (filters, support chat) do not pay for it.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


# ---- results ------------------------------------------------------------------------------------

def result_path(name: str) -> str:
    """A script's default --out: bench/results/<name> (only the latest run of each lives there;
    earlier runs are kept under bench/journal/runs/)."""
    return str(RESULTS / name)


def write_result(path: str | Path, result, *, indent: int = 1, default=None, newline: bool = False) -> Path:
    """The result JSON at `path` (its folder created). Scripts that write partial results after
    each section call this again with the same path; indent / newline keep each script's format."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=indent, default=default) + ("\n" if newline else ""))
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for servers a benchmark starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- logging and provenance ---------------------------------------------------------------------

def log(*parts) -> None:
    """print, flushed: device runs are read from a captured stdout that may be cut off."""
    print(*parts, flush=True)


def tagged_log(tag: str):
    """log(msg) that prefixes `[tag HH:MM:SS]` (long multi-process runs, where the time matters)."""
    def _log(msg: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    return _log


def git_commit() -> str:
    """The tree's short commit. GIT_COMMIT overrides it: the GPU device's copy of the tree can
    carry a stale .git, so device runs pass the session's commit in."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def gpu_env(commit: bool = True) -> dict:
    """The card and versions every GPU result names (METHOD.md: name the card)."""
    import torch
    import triton
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}
    if commit:
        env["commit"] = git_commit()
    return env


# ---- timers -------------------------------------------------------------------------------------

def timed(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() over reps, CUDA events around each call, after `warmup` calls."""
    import torch
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def host_times(fn, reps: int) -> list[float]:
    """Seconds of each of reps calls of fn() on host clocks (CPU work), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed_interleaved(fns: dict, rounds: int = 25, calls: int = 5) -> dict:
    """Median seconds per call of each fn, timed round-robin (`calls` back to back between two
    CUDA events, once per fn per round), so clock drift over the run hits every fn alike."""
    import torch
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) / 1e3 / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def graph_time(fn_for, copies: int) -> float:
    """Seconds per call of fn_for(i) (i over the weight copies), from one CUDA graph that runs
    them all: no launch gaps, and each call's weight comes from DRAM, not L2."""
    import torch
    for i in range(copies):
        fn_for(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn_for(i)
    return timed(graph.replay, reps=10, warmup=2) / copies


# ---- ceilings -----------------------------------------------------------------------------------

def copy_bandwidth(numel: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy of `numel` bf16 elements (default 2 GiB), bytes read + written per
    second, median of `reps` (timed): the denominator of every roofline, measured in the same run."""
    import torch
    x = torch.randn(numel, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), reps=reps)
    x = y = None                                  # free before the caller allocates again
    torch.cuda.empty_cache()
    return 2 * numel * 2 / t


# ---- errors and percentiles ---------------------------------------------------------------------

def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp32; inf when out holds a NaN or inf (outputs are poisoned with
    NaN before a kernel runs, so an element it did not write shows here)."""
    import torch
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def percentile(xs: list[float], p: float) -> float | None:
    """Percentile p (0-100) with linear interpolation (numpy's default); None for no values."""
    xs, k = sorted(xs), (len(xs) - 1) * p / 100
    return xs[int(k)] + (xs[min(int(k) + 1, len(xs) - 1)] - xs[int(k)]) * (k - int(k)) if xs else None


def nearest_rank(xs: list[float], q: float) -> float | None:
    """The value at rank int(q * n) of the sorted values (q a fraction: 0.99 for P99), the last
    one at most; None for no values."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---- server subprocesses ------------------------------------------------------------------------
def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    """Poll `url` until it answers 200; RuntimeError if `proc` exits or `timeout` s pass first."""
    import requests
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready within {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, quiet_s: float = 2.0, max_busy: float = 0.05, timeout: float = 300) -> float:
    """Wait until process `pid` keeps under `max_busy` of one core for `quiet_s` (its start-up
    work done: a server can answer /ready while it still builds indexes or warms caches, which a
    measurement taken then would share the cores with); returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = cpu_seconds(pid)
        time.sleep(quiet_s)
        if cpu_seconds(pid) - before < max_busy * quiet_s:
            break
    return time.monotonic() - start


def stop_process(proc: subprocess.Popen | None, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL if it is still running after `timeout` s; reaped either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
