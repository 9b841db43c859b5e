"""The CI-sized soak (bench/cpu/soak.py): 35 s of warm-up (the engine, the embedder and the
knowledge-base index load while the first requests wait; 15 s was not enough on a 2-vCPU VM),
then 30 s of steady chat + completion load on loopback with the tiny model; no errors, every KV
block free, no unfinished request at the end, and resident memory flat within 32 MB between the
first and last third of the samples. Before the packed linears padded their row counts
(inference/models/cpu_packing.py) this run grew ~100 MB, one oneDNN primitive per new step size;
with them it grows a few MB (the 10-minute run is in bench/results/soak.json).

It runs in a fresh interpreter, as `python -m bench.cpu.soak` does: inside the test process the
resident set would also carry whatever earlier tests left behind (their servers' threads, their
garbage), and the figure would measure the suite rather than the product."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.alone            # another test's load would stretch the warm-up past its 35 s
def test_one_minute_soak(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "bench.cpu.soak", "--model", "random:tiny", "--duration", "30",
                           "--warmup", "35", "--rate", "4", "--rss-growth-mb", "32", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert out.exists(), proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert res["errors"] == 0, res["first_errors"]
    assert res["requests"] >= 200 and set(res["statuses"]) == {"200"}
    assert res["kv_blocks_used_at_end"] == 0 and res["unfinished_at_end"] == 0
    assert res["rss_growth_mb"] <= 32, res["rss_samples_mb"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
