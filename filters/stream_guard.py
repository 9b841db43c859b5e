"""Compliance for text that arrives in pieces (a streamed reply): banned terms masked, PII
replaced by placeholders, and nothing released that a later piece could turn into a match.

The guard holds back a tail window at least as long as the longest banned term and the longest
PII it redacts, and never releases text up to the middle of a match. Each piece scans only the
held window plus a little released context (for word boundaries), and only once every
`release_every` characters, so a reply of n characters costs O(n * window / release_every),
never a rescan of everything so far.

    released ........|  context  |        held window         |<- new piece
                     '-- scanned, not re-released ------------'

With a `sentence_check`, released text is further held until a sentence is complete, and each
sentence goes out only as the check returns it: unchanged, replaced, or dropped (None). The
first sentence waits for its end; the rest stream sentence by sentence.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection

from filters.banned_words import BannedWordFilter, mask_spans
from filters.normalize import fold_char
from filters.pii import MAX_PII_LEN, PLACEHOLDERS, find_pii

_CONTEXT = 16          # released characters kept for boundary checks (word edges, lookbehinds)
_SENTENCE_END = re.compile(r"[.!?](?=\s)|[。！？]|\n")


def sanitize_spans(text: str, banned: BannedWordFilter | None, pii: bool,
                   allowed_pii: Collection[str] = ()) -> list[tuple[int, int, str | None]]:
    """Spans to replace: (start, end, placeholder), placeholder None = mask with '*'. Spans that
    overlap are merged; a merged span that holds PII takes the PII's placeholder. PII whose text
    is in `allowed_pii` (the help centre's own published address) stays."""
    spans = []
    if banned is not None:
        spans += [(m.start, m.end, None) for m in banned.find(text)]
    if pii:
        spans += [(f.start, f.end, PLACEHOLDERS[f.kind]) for f in find_pii(text)
                  if text[f.start:f.end] not in allowed_pii]
    spans.sort()
    merged: list[list] = []
    for start, end, repl in spans:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            last[1] = max(last[1], end)
            last[2] = last[2] or repl
        else:
            merged.append([start, end, repl])
    return [tuple(m) for m in merged]


def apply_spans(text: str, spans, offset: int = 0) -> str:
    parts, at = [], 0
    for start, end, repl in spans:
        start, end = start - offset, end - offset
        parts.append(text[at:start])
        parts.append(repl if repl is not None else mask_spans(text[start:end], [(0, end - start)]))
        at = end
    parts.append(text[at:])
    return "".join(parts)


def sanitize(text: str, banned: BannedWordFilter | None, pii: bool = True) -> str:
    """The whole-text version of what StreamGuard releases piece by piece."""
    return apply_spans(text, sanitize_spans(text, banned, pii))


class StreamGuard:
    def __init__(self, banned: BannedWordFilter | None, pii: bool = True, release_every: int = 32,
                 sentence_check: Callable[[str], str | None] | None = None, allowed_pii: Collection[str] = ()):
        """release_every: scan only once this many characters beyond the window are held (about
        8 tokens), so each character is scanned a few times rather than once per piece.
        sentence_check(sentence) -> the text to show for it, or None to drop it.
        allowed_pii: PII texts shown as written (what the cited help-centre passages publish)."""
        if release_every < 1:
            raise ValueError(f"release_every: must be >= 1, got {release_every}")
        self.banned, self.pii, self.release_every = banned, pii, release_every
        term = banned.max_term_len + 1 if banned is not None else 0
        self.window = max(term, MAX_PII_LEN if pii else 0)
        self._context = ""       # the last released raw characters
        self._held = ""          # raw text not released yet
        self.num_masked = 0      # spans replaced so far
        self.kinds: set[str] = set()
        self.sentence_check = sentence_check
        self.allowed_pii = frozenset(allowed_pii)
        self._sentence = ""      # released text of a sentence not complete yet
        self.num_dropped = 0     # sentences the check dropped or replaced

    def feed(self, piece: str) -> str:
        """Add a piece of the reply; returns the text that is now safe to show (maybe '')."""
        self._held += piece
        return self._sentences(self._release(final=False), final=False)

    def finish(self) -> str:
        """The end of the reply: releases the rest."""
        return self._sentences(self._release(final=True), final=True)

    def _sentences(self, text: str, final: bool) -> str:
        if self.sentence_check is None:
            return text
        self._sentence += text
        out = []
        while True:
            m = _SENTENCE_END.search(self._sentence)
            if m is None:
                break
            end = m.end()
            while end < len(self._sentence) and self._sentence[end] in " \t":
                end += 1                                  # the spaces after it go with it
            sentence, self._sentence = self._sentence[:end], self._sentence[end:]
            out.append(self._check(sentence))
        if final and self._sentence:
            out.append(self._check(self._sentence))
            self._sentence = ""
        return "".join(out)

    def _check(self, sentence: str) -> str:
        if not sentence.strip():
            return sentence
        kept = self.sentence_check(sentence)
        if kept != sentence:
            self.num_dropped += 1
        return kept or ""

    def _release(self, final: bool) -> str:
        held = self._held
        if not final and len(held) < self.window + self.release_every:
            return ""                 # holding more than needed is always safe, and it is cheap
        cut = len(held) if final else _tail_start(held, self.window)
        if cut <= 0 or (not final and cut < self.release_every):
            return ""
        ctx = self._context
        text = ctx + held
        # A span reaching back into the released context is clipped to its held part and still
        # replaced: what is left of a match is never shown, even if its start already was.
        spans = [(max(s, len(ctx)), e, r) for s, e, r in sanitize_spans(text, self.banned, self.pii, self.allowed_pii)
                 if e > len(ctx)]
        cut += len(ctx)
        for start, end, _ in spans:           # never release up to the middle of a match
            if start < cut < end:
                cut = start
        cut = max(cut, len(ctx))
        done = [s for s in spans if s[1] <= cut]
        self.num_masked += len(done)
        self.kinds.update("banned" if repl is None else repl for _, _, repl in done)
        out = apply_spans(text[len(ctx):cut], done, offset=len(ctx))
        self._context = text[max(len(ctx), cut - _CONTEXT):cut] if cut > len(ctx) else ctx
        self._held = text[cut:]
        return out


def _tail_start(held: str, window: int) -> int:
    """Index where the tail of `held` that folds to `window` characters starts (0 if shorter):
    the window counts folded characters, so zero-width characters and whitespace runs, which
    fold to nothing or one space, cannot stretch a term past it."""
    n, i = 0, len(held)
    while i > 0 and n < window:
        i -= 1
        c = held[i]
        if c.isspace():
            n += not (i > 0 and held[i - 1].isspace())
        else:
            n += len(fold_char(c))
    return i if n >= window else 0
