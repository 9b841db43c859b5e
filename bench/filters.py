"""Compliance-filter throughput on streamed replies (issue 6's filter benchmark).

Streams a synthetic support reply (English and Chinese, with PII and banned terms sprinkled in)
through StreamGuard in 4-character pieces (about one token each), and the whole text through
sanitize() at once. The peer is the naive streaming filter that rescans everything released so
far on every piece: its cost grows with the square of the reply, which is what the held window
avoids. Prints a table, writes bench/results/filters.json.

    python bench/filters.py [--kb 200]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from filters.banned_words import BannedWordFilter
from filters.stream_guard import StreamGuard, sanitize

SENTENCES = [
    "Thanks for reaching out about order #{n}. ", "Your refund of ${n}.00 was issued today. ",
    "You can reach us at help{n}@example.com any time. ", "The card ending 1111 (4111 1111 1111 1111) was charged. ",
    "Please call +1 (415) 555-{n:04d} if the parcel is late. ", "我们已经为您安排了退款，请耐心等待。 ",
    "Beware of counterfeit sellers on other sites. ", "这不是假货，我们只销售正品。 ",
    "Shipping usually takes 3-5 business days. ", "We saw a login from 203.0.113.{m}. ",
]


def reply(num_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts, size = [], 0
    while size < num_bytes:
        s = rng.choice(SENTENCES).format(n=rng.randrange(10000), m=rng.randrange(1, 255))
        parts.append(s)
        size += len(s.encode())
    return "".join(parts)


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
    ap.add_argument("--out", default=str(ROOT / "bench/results/filters.json"))
    args = ap.parse_args()
    banned = BannedWordFilter.from_file()
    big = reply(args.kb * 1024)
    mb = len(big.encode()) / 1e6
    res = {"text_MB": mb, "banned_terms": len(banned.terms), "window_chars": StreamGuard(banned).window}
    res["stream_MBps"] = mb / best(lambda: stream(big, banned))
    t0 = time.perf_counter()
    sanitize(big, banned)
    res["whole_text_MBps"] = mb / (time.perf_counter() - t0)
    # growth: ours vs naive rescans, at 2 KB and 8 KB replies (the naive one is ~16x slower at 4x)
    for kb in (2, 8):
        text = reply(kb * 1024, seed=kb)
        res[f"ours_{kb}KB_ms"] = best(lambda t=text: stream(t, banned)) * 1e3
        res[f"naive_{kb}KB_ms"] = best(lambda t=text: naive_stream(t, banned), reps=1) * 1e3
    print("| case | figure |\n|---|---|")
    print(f"| StreamGuard, 4-char pieces, {mb:.2f} MB | {res['stream_MBps']:.2f} MB/s |")
    print(f"| sanitize() whole text | {res['whole_text_MBps']:.2f} MB/s |")
    for kb in (2, 8):
        print(f"| {kb} KB reply: ours / naive rescan | {res[f'ours_{kb}KB_ms']:.1f} / {res[f'naive_{kb}KB_ms']:.1f} ms |")
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
