"""Compliance-filter throughput on streamed replies (issue 6's filter benchmark).

Streams a synthetic support reply (English and Chinese, with PII and banned terms sprinkled in)
through StreamGuard in 4-character pieces (about one token each), and the whole text through
sanitize() at once. The peer is the naive streaming filter that rescans everything released so
far on every piece: its cost grows with the square of the reply, which is what the held window
avoids. Prints a table, writes bench/results/filters.json.

    python -m bench.cpu.filters [--kb 200]
"""
from __future__ import annotations

import argparse
import time

from bench.harness import result_path, write_result
from bench.workloads import support_reply
from filters.banned_words import BannedWordFilter
from filters.stream_guard import StreamGuard, sanitize


def stream(text: str, banned: BannedWordFilter, piece: int = 4) -> float:
    guard = StreamGuard(banned)
    t0 = time.perf_counter()
    out = [guard.feed(text[i:i + piece]) for i in range(0, len(text), piece)]
    out.append(guard.finish())
    elapsed = time.perf_counter() - t0
    assert "".join(out) == sanitize(text, banned)
    return elapsed


def naive_stream(text: str, banned: BannedWordFilter, piece: int = 4) -> float:
    t0 = time.perf_counter()
    for i in range(piece, len(text) + piece, piece):
        sanitize(text[:i], banned)          # rescans the whole reply so far
    return time.perf_counter() - t0


def best(fn, reps: int = 3) -> float:
    return min(fn() for _ in range(reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", type=int, default=200, help="streamed text size in KB")
    ap.add_argument("--out", default=result_path("filters.json"))
    args = ap.parse_args()
    banned = BannedWordFilter.from_file()
    big = support_reply(args.kb * 1024)
    mb = len(big.encode()) / 1e6
    res = {"text_MB": mb, "banned_terms": len(banned.terms), "window_chars": StreamGuard(banned).window}
    res["stream_MBps"] = mb / best(lambda: stream(big, banned))
    t0 = time.perf_counter()
    sanitize(big, banned)
    res["whole_text_MBps"] = mb / (time.perf_counter() - t0)
    # growth: ours vs naive rescans, at 2 KB and 8 KB replies (the naive one is ~16x slower at 4x)
    for kb in (2, 8):
        text = support_reply(kb * 1024, seed=kb)
        res[f"ours_{kb}KB_ms"] = best(lambda t=text: stream(t, banned)) * 1e3
        res[f"naive_{kb}KB_ms"] = best(lambda t=text: naive_stream(t, banned), reps=1) * 1e3
    print("| case | figure |\n|---|---|")
    print(f"| StreamGuard, 4-char pieces, {mb:.2f} MB | {res['stream_MBps']:.2f} MB/s |")
    print(f"| sanitize() whole text | {res['whole_text_MBps']:.2f} MB/s |")
    for kb in (2, 8):
        print(f"| {kb} KB reply: ours / naive rescan | "
              f"{res[f'ours_{kb}KB_ms']:.1f} / {res[f'naive_{kb}KB_ms']:.1f} ms |")
    write_result(args.out, res)


if __name__ == "__main__":
    main()
