"""Banned-term matching with Aho-Corasick (pyahocorasick): one pass over the text for all terms.

Terms and text are folded the same way (filters/normalize.py), so matching ignores case and
full/half width. A term that starts or ends with a letter or digit of a space-separated script
only matches on word boundaries ("ass" does not fire inside "class"); CJK terms match anywhere.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import ahocorasick

from configs import resolve, shipped
from filters.normalize import fold, is_word_char

DEFAULT_PATH = shipped("banned_words.txt")


@dataclass(frozen=True)
class BannedWordMatch:
    start: int          # span in the original text: text[start:end]
    end: int
    term: str           # the list entry that matched


class BannedWordFilter:
    def __init__(self, terms):
        self.terms: list[str] = []
        self._automaton = ahocorasick.Automaton()
        seen: set[str] = set()
        for term in terms:
            if not isinstance(term, str) or not term.strip():
                raise ValueError(f"banned words: every term must be a non-empty string, got {term!r}")
            folded, _ = fold(term.strip())
            if not folded.strip():
                raise ValueError(f"banned words: {term!r} is only invisible characters")
            if folded in seen:
                continue
            seen.add(folded)
            self._automaton.add_word(folded, (len(self.terms), len(folded)))
            self.terms.append(term.strip())
        if not self.terms:
            raise ValueError("banned words: the list is empty")
        self._automaton.make_automaton()
        # longest folded term: a stream holds back at least this many characters (+1 for the
        # word-boundary check) so that no term is released before it can be seen whole
        self.max_term_len = max(len(fold(t)[0]) for t in self.terms)

    @classmethod
    def from_file(cls, path: str | os.PathLike | None = None) -> BannedWordFilter:
        """One term per line, '#' starts a comment line. Default: BANNED_WORDS_PATH, else
        configs/banned_words.txt."""
        path = resolve("banned_words.txt", path, "BANNED_WORDS_PATH")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ValueError(f"banned words: cannot read {path}: {exc.strerror}") from exc
        return cls(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))

    def find(self, text: str) -> list[BannedWordMatch]:
        """Every match, left to right; overlapping matches are all reported."""
        folded, origin = fold(text)
        found = []
        for end, (index, length) in self._automaton.iter(folded):
            start = end - length + 1
            if is_word_char(folded[start]) and start > 0 and is_word_char(folded[start - 1]):
                continue
            if is_word_char(folded[end]) and end + 1 < len(folded) and is_word_char(folded[end + 1]):
                continue
            found.append(BannedWordMatch(origin[start], origin[end] + 1, self.terms[index]))
        found.sort(key=lambda m: (m.start, -m.end))
        return found

    def contains(self, text: str) -> bool:
        return bool(self.find(text))

    def mask(self, text: str, char: str = "*") -> tuple[str, list[BannedWordMatch]]:
        """The text with every matched span replaced by `char`s (same length), and the matches."""
        matches = self.find(text)
        if not matches:
            return text, matches
        return mask_spans(text, [(m.start, m.end) for m in matches], char), matches


def mask_spans(text: str, spans: list[tuple[int, int]], char: str = "*") -> str:
    chars = list(text)
    for start, end in spans:
        for i in range(start, end):
            if not chars[i].isspace():
                chars[i] = char
    return "".join(chars)
