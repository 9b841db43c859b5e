"""The streaming guard releases exactly what the whole-text filter would produce, for any way the
reply is cut into pieces, and never shows a banned term or PII before it is masked."""
from __future__ import annotations

import random
import time

import pytest

from filters.banned_words import BannedWordFilter
from filters.stream_guard import StreamGuard, sanitize

REPLY = ("Thanks Li! I emailed li.wei@example.com. Your card 4111 1111 1111 1111 was refunded; "
         "that seller's 高仿 item was a COUNTERFEIT, a class act it was not. Call +1 (415) 555-2671. "
         "From 203.0.113.7 we saw a login. 这是假货。 Have a nice day.")


@pytest.fixture(scope="module")
def banned() -> BannedWordFilter:
    return BannedWordFilter.from_file()


def pieces(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 4, 7, 12])
        out.append(text[i:i + n])
        i += n
    return out


def run(guard: StreamGuard, parts: list[str]) -> tuple[str, list[str]]:
    released = [guard.feed(p) for p in parts]
    released.append(guard.finish())
    return "".join(released), released


def test_any_chunking_gives_the_whole_text_result(banned):
    want = sanitize(REPLY, banned)
    assert "[EMAIL]" in want and "[CARD]" in want and "[PHONE]" in want and "[IP]" in want
    assert "COUNTERFEIT" not in want and "高仿" not in want and "假货" not in want and "class act" in want
    for seed in range(25):
        got, _ = run(StreamGuard(banned), pieces(REPLY, random.Random(seed)))
        assert got == want, seed


def test_no_prefix_of_the_stream_ever_shows_a_secret(banned):
    secrets = ["li.wei@example.com", "4111 1111 1111 1111", "COUNTERFEIT", "高仿", "555-2671", "203.0.113.7"]
    guard = StreamGuard(banned)
    shown = ""
    for ch in REPLY:                       # one character per piece: the worst split
        shown += guard.feed(ch)
        for s in secrets:
            assert s not in shown
            # nor a visible partial secret at the end of what was released
            assert not any(shown.endswith(s[:k]) for k in range(4, len(s)))
    shown += guard.finish()
    assert shown == sanitize(REPLY, banned) and guard.num_masked == 7


def test_streaming_cost_is_linear_not_quadratic(banned):
    # Scanning work per piece is bounded by the held window, so 8x the text costs ~8x the time.
    def cost(n: int) -> float:
        text = (REPLY + " ") * n
        guard = StreamGuard(banned)
        t0 = time.perf_counter()
        for i in range(0, len(text), 4):
            guard.feed(text[i:i + 4])
        guard.finish()
        return time.perf_counter() - t0
    cost(2)
    small, large = min(cost(4) for _ in range(3)), min(cost(32) for _ in range(3))
    assert large < small * 8 * 2.5, (small, large)


def test_without_pii_only_terms_are_masked(banned):
    guard = StreamGuard(banned, pii=False)
    assert guard.window == banned.max_term_len + 1
    got, _ = run(guard, pieces(REPLY, random.Random(1)))
    assert "li.wei@example.com" in got and "COUNTERFEIT" not in got


FILLER = " We will keep you posted about the delivery." * 4


@pytest.mark.parametrize("text, pii_on, terms", [
    ("xxxx Paid $12.99 11010519491231002X. " + FILLER, True, None),   # a digit run starting in released text
    ("counter" + "\u200b" * 100 + "feit" + FILLER, True, None),       # invisible padding longer than the window
    ("fake" + " " * 100 + "reviews" + FILLER, True, None),            # whitespace padding
    ("b\u200b\u200b\u200b\u200bad ok" + FILLER, False, ["bad"]),
])
def test_streams_that_stretch_matches_past_the_window(banned, text, pii_on, terms):
    flt = BannedWordFilter(terms) if terms else banned
    want = sanitize(text, flt, pii_on)
    for size in (1, 2, 3, 5, 8, 16):
        got, _ = run(StreamGuard(flt, pii=pii_on), [text[i:i + size] for i in range(0, len(text), size)])
        for secret in ("11010519491231002X", "feit", "reviews", "ad ok"):
            if secret not in want:
                assert secret not in got, (size, got)


def test_published_contact_details_stay_and_others_are_redacted(banned):
    from filters.pii import published_pii
    source = "Write to help@shop.example or call +1 (415) 555-0100, Monday to Friday."
    reply = "Email help@shop.example, not li.wei@example.com; our line is +1 (415) 555-0100."
    allowed = published_pii([source])
    assert allowed == {"help@shop.example", "+1 (415) 555-0100"}
    for seed in range(5):
        out, _ = run(StreamGuard(banned, allowed_pii=allowed), pieces(reply, random.Random(seed)))
        assert out == "Email help@shop.example, not [EMAIL]; our line is +1 (415) 555-0100."
    out, _ = run(StreamGuard(banned), [reply])
    assert "help@shop.example" not in out and "555-0100" not in out
