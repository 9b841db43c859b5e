"""The CI-sized soak (bench/soak.py): one minute of steady chat + completion load on loopback
with the tiny model; no errors, every KV block free, no unfinished request at the end, and
memory growth under a bound loose enough for the warm-up of the CPU allocator and oneDNN's
primitive cache (the 10-minute run in bench/results/soak.json checks flatness)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import soak  # noqa: E402


def test_one_minute_soak(tmp_path):
    out = tmp_path / "soak.json"
    code = soak.main(["--model", "random:tiny", "--duration", "45", "--warmup", "15", "--rate", "4",
                      "--rss-growth-mb", "256", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["errors"] == 0, res["first_errors"]
    assert res["requests"] >= 200 and set(res["statuses"]) == {"200"}
    assert res["kv_blocks_used_at_end"] == 0 and res["unfinished_at_end"] == 0
    assert res["rss_growth_mb"] <= 256, res["rss_samples_mb"]
    assert code == 0
