"""Fault injection: the product's outages, each run with real processes on loopback (the
inference service, the web app, Redis), the table below printed and written as JSON.

    1 inference down at web boot, then started     5 embedding model failing (raises in embed)
    2 inference killed (SIGKILL) mid-stream         6 Celery broker down
    3 inference hung (SIGSTOP)                      7 600 slow clients holding streams open
    4 Redis down at boot, restarted mid-traffic     S schemathesis, both APIs, inference down

Columns: requests sent, 5xx (a 503 with Retry-After is counted apart, as shed), answers marked
degraded, accepted customer messages missing from the transcript afterwards, and seconds from
the dependency's return to the first full answer, against the bound BREAKER_RESET_S + 5 s.
The peer here is the target itself: 0 5xx, 0 lost, recovery within the bound.

    python -m bench.cpu.faults                  # all scenarios (~4 minutes on 2 cores)
    python -m bench.cpu.faults --only 1 4       # some of them
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, result_path, write_result
from tests.e2e.faults import inference_outages, service_outages, slow_clients
from tests.e2e.faults.harness import REDIS_BIN, InferenceService, ScenarioResult

COLUMNS = [("scenario", 44), ("requests", 8), ("5xx", 4), ("shed", 5), ("degraded", 8), ("lost", 4),
           ("recovery_s", 10), ("bound_s", 7), ("checks", 6)]


class Services:
    """The inference services the scenarios share, started on first use."""

    def __init__(self):
        self._started: dict[str, InferenceService] = {}
        self._embedder = None

    def get(self, model: str) -> InferenceService:
        if model not in self._started:
            service = InferenceService(model)
            service.start()
            self._started[model] = service
        return self._started[model]

    @property
    def embedder(self):
        if self._embedder is None:
            from inference.embeddings import SentenceEmbedder
            self._embedder = SentenceEmbedder()
        return self._embedder

    def close(self) -> None:
        for service in self._started.values():
            service.close()


def schemathesis_down(workdir: Path) -> ScenarioResult:
    """S: the pytest module tests/e2e/faults/test_schemathesis_down.py; it appends each API's cases
    and 503s to FAULTS_SCHEMATHESIS_OUT. A 5xx fails it (schemathesis's not_a_server_error)."""
    t0 = time.monotonic()
    out = workdir / "schemathesis.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/e2e/faults/test_schemathesis_down.py"], cwd=ROOT, capture_output=True, text=True,
                          check=False, env={**os.environ, "FAULTS_SCHEMATHESIS_OUT": str(out)})
    result = ScenarioResult("S schemathesis, both APIs, inference down")
    for line in out.read_text().splitlines() if out.exists() else []:
        api = json.loads(line)
        result.requests += sum(api["cases"].values())
        result.shed += api["shed"]
        result.details[f"{api['api']}_operations"] = len(api["cases"])
    result.server_errors = proc.stdout.count("Server error")
    result.checks["pytest passed"] = proc.returncode == 0
    result.details["seconds"] = round(time.monotonic() - t0, 1)
    if proc.returncode:
        result.details["output"] = proc.stdout[-2000:]
    return result


def scenarios(services: Services) -> dict:
    def tiny():
        return services.get("random:tiny")

    def slow():
        return services.get(inference_outages.SLOW_MODEL)
    return {
        "1": lambda w: inference_outages.down_at_boot(w, services.embedder),
        "2": lambda w: inference_outages.killed_mid_stream(w, slow(), services.embedder),
        "3": lambda w: inference_outages.hung(w, slow(), services.embedder),
        "4": lambda w: service_outages.redis_outage(w, tiny(), services.embedder),
        "5": lambda w: inference_outages.embeddings_failing(w, services.embedder),
        "6": lambda w: service_outages.broker_outage(w, tiny(), services.embedder),
        "7": lambda w: slow_clients.slow_clients(w, tiny(), services.embedder),
        "S": schemathesis_down,
    }


def row(r: ScenarioResult) -> dict:
    return {"scenario": r.scenario, "requests": r.requests, "5xx": r.server_errors, "shed": r.shed,
            "degraded": r.degraded, "lost": r.lost, "recovery_s": r.recovery_s, "bound_s": r.recovery_bound_s,
            "checks": f"{sum(r.checks.values())}/{len(r.checks)}"}


def print_table(rows: list[dict]) -> None:
    print("  ".join(name.ljust(width) for name, width in COLUMNS))
    for r in rows:
        print("  ".join(("-" if r[name] is None else str(r[name]))[:width].ljust(width) for name, width in COLUMNS))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="scenario ids (1-7, S)")
    ap.add_argument("--out", default=result_path("faults.json"))
    args = ap.parse_args()
    services = Services()
    chosen = {k: v for k, v in scenarios(services).items() if not args.only or k in args.only}
    results: list[ScenarioResult] = []
    try:
        for key, run in chosen.items():
            if key in ("4", "6") and REDIS_BIN is None:
                print(f"scenario {key} skipped: redis-server is not installed")
                continue
            with tempfile.TemporaryDirectory() as workdir:
                t0 = time.monotonic()
                result = run(Path(workdir))
                result.details["scenario_s"] = round(time.monotonic() - t0, 1)
            results.append(result)
            print(f"{result.scenario}: {row(result)}  failed checks: {result.failed_checks}", flush=True)
    finally:
        services.close()
    rows = [row(r) for r in results]
    print()
    print_table(rows)
    ok = all(r.server_errors == 0 and r.lost == 0 and not r.failed_checks and
             (r.recovery_bound_s is None or (r.recovery_s is not None and r.recovery_s <= r.recovery_bound_s))
             for r in results)
    out = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": "CPU, loopback",
           "targets": {"5xx": 0, "lost": 0, "recovery_s": "<= BREAKER_RESET_S + 5"}, "passed": ok,
           "rows": rows, "results": [dataclasses.asdict(r) for r in results]}
    write_result(args.out, out)
    print(f"\n{'PASS' if ok else 'FAIL'}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
