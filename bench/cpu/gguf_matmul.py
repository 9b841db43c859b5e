"""CPU kernel benchmark: our GGUF matmuls (gguf_matmul.cpp, VNNI) against torch's int4 matmul
(`_weight_int4pack_mm_for_cpu`, tinygemm's layout, bf16 scales) and plain bf16 `F.linear`, on the
linear shapes of SmolLM2-135M, measured in the same run.

Per activation row count M (1 = a decode step, 16 = a concurrent batch, 512 = a prefill chunk):
  layers   the decoder's 30 x (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536), Q4_1
  lm_head  the tied embedding as Q8_0 (49152x576) for ours, bf16 for the peers

Random codes and scales of the real shapes; ms per pass (median of --reps) and GMAC/s. Threads are
the engine's (spin pool) for ours and torch's intra-op pool for the peers, both at --threads.

    .venv/bin/python -m bench.cpu.gguf_matmul [--reps 15] [--threads 2]
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics

import torch
import torch.nn.functional as F

from bench.harness import cpu_model, git_commit, host_times, result_path, write_result
from inference.loader.gguf_codes import BlockCodes
from inference.models.gguf_cpu_linear import GGUFCpuLinear, gguf_matmul_available

HIDDEN, INTER, KV = 576, 1536, 192
LAYER_SHAPES = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
LAYERS, VOCAB = 30, 49152


def q4_weights(out: int, k: int, gen: torch.Generator):
    groups = k // 32
    codes = torch.randint(0, 16, (out, k), generator=gen)
    d = torch.rand(out, groups, generator=gen) * 0.02 + 0.001
    m = -8 * d + torch.randn(out, groups, generator=gen) * 0.001
    return codes, d, m


def build(gen: torch.Generator):
    """Per shape: ours (GGUFCpuLinear), torch int4pack (packed codes, bf16 scales), bf16 weight."""
    ours, int4, dense = [], [], []
    for _ in range(LAYERS):
        for out, k in LAYER_SHAPES:
            codes, d, m = q4_weights(out, k, gen)
            ours.append(GGUFCpuLinear([BlockCodes("Q4_1", codes, d.half().float(), m.half().float())]))
            packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 2)
            sz = torch.stack((d, m + 8 * d), dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
            int4.append((packed, sz))
            dense.append((codes * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)).to(torch.bfloat16))
    head_codes = torch.randint(-128, 128, (VOCAB, HIDDEN), generator=gen)
    head_d = torch.rand(VOCAB, HIDDEN // 32, generator=gen) * 0.001
    head = GGUFCpuLinear([BlockCodes("Q8_0", head_codes, head_d.half().float(), torch.zeros_like(head_d))])
    head_dense = (head_codes * head_d.repeat_interleave(32, 1)).to(torch.bfloat16)
    return ours, int4, dense, head, head_dense


def median_ms(fn, reps: int) -> float:
    return 1e3 * statistics.median(host_times(fn, reps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,16,512")
    ap.add_argument("--out", default=result_path("gguf_matmul.json"))
    args = ap.parse_args()
    if not gguf_matmul_available():
        raise SystemExit("gguf_matmul: this CPU or build has no AVX-512 VNNI kernel")
    torch.set_num_threads(args.threads)
    ours, int4, dense, head, head_dense = build(torch.Generator().manual_seed(0))
    layer_macs = LAYERS * sum(o * k for o, k in LAYER_SHAPES)
    rows_all = [int(r) for r in args.rows.split(",")]
    table = []
    for rows in rows_all:
        xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in (HIDDEN, INTER)}
        passes = {
            ("layers", "ours q4_1"): lambda: [li(xs[li.in_features]) for li in ours],
            ("layers", "torch int4pack"): lambda: [torch._weight_int4pack_mm_for_cpu(xs[w.shape[1]], p, 32, sz)
                                                   for (p, sz), w in zip(int4, dense)],
            ("layers", "torch bf16"): lambda: [F.linear(xs[w.shape[1]], w) for w in dense],
            ("lm_head", "ours q8_0"): lambda: head(xs[HIDDEN]),
            ("lm_head", "torch bf16"): lambda: F.linear(xs[HIDDEN], head_dense),
        }
        for (part, impl), fn in passes.items():
            ms = median_ms(fn, args.reps)
            macs = rows * (layer_macs if part == "layers" else VOCAB * HIDDEN)
            table.append({"rows": rows, "part": part, "impl": impl, "ms": round(ms, 3),
                          "gmac_s": round(macs / ms / 1e6, 1)})
    print(f"{'M':>4} {'part':<8} {'impl':<15} {'ms':>9} {'GMAC/s':>8} {'vs best peer':>12}")
    for row in table:
        peers = [r["ms"] for r in table if r["rows"] == row["rows"] and r["part"] == row["part"]
                 and not r["impl"].startswith("ours")]
        ratio = f"{min(peers) / row['ms']:.2f}x" if row["impl"].startswith("ours") else ""
        row["speedup_vs_best_peer"] = round(min(peers) / row["ms"], 3) if ratio else None
        print(f"{row['rows']:>4} {row['part']:<8} {row['impl']:<15} {row['ms']:>9.3f} {row['gmac_s']:>8.1f} "
              f"{ratio:>12}")
    result = {"bench": "gguf_matmul", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "commit": git_commit(), "cpu": cpu_model(), "threads": args.threads, "reps": args.reps,
              "torch": torch.__version__, "table": table}
    print(f"wrote {write_result(args.out, result)}")


if __name__ == "__main__":
    main()
