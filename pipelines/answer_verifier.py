"""Verification of what the model writes, one sentence at a time, before the customer sees it.

A sentence passes when
  - every number in it (a price, a duration, a date, a percentage) appears in a cited passage;
  - every name in it (a capitalised word past the sentence's start: a brand, a plan, a carrier)
    appears in a cited passage or the tenant's name;
  - it is supported: its embedding's cosine to the best cited span is at least `min_support`, or,
    without embeddings, most of its content words are in the passages;
  - it repeats none of the prompt (filters.leakage).

A sentence that fails is dropped; the chat replaces a reply that lost everything by the quoted
span. Framing with no facts ("Happy to help!") passes: it names nothing and states no number.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from filters.leakage import LeakFilter
from pipelines.knowledge_base import stem, tokenize

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_NAME = re.compile(r"\b[A-Z][a-zA-Z]+(?:\s+[A-Z][a-zA-Z]+)*")
_SMALL_TALK = frozenset("i you we our your hi hello thanks thank please sorry happy help glad welcome sure "
                        "yes no ok okay great".split())
_NUMBER_WORDS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""          # why it failed: "number 7", "name DHL", "unsupported", "leak"


class SentenceVerifier:
    def __init__(self, sources: list[str], leak_filter: LeakFilter, names: tuple[str, ...] = (),
                 embed: Callable[[list[str]], np.ndarray] | None = None, source_vecs: np.ndarray | None = None,
                 min_support: float = 0.5, min_overlap: float = 0.6):
        """sources: the cited passages' texts; source_vecs: [S, dim] embeddings of the cited spans
        (with `embed` for the sentence, the support check is a cosine; without, word overlap)."""
        joined = "\n".join(sources)
        self.text = re.sub(r"\s+", " ", joined).lower()
        self.numbers = {_canon(n) for n in _NUMBER.findall(joined)}
        self.words = {stem(w) for w in tokenize(joined + " " + " ".join(names))}
        self.names_text = (self.text + " " + " ".join(names).lower())
        self.leak_filter, self.embed, self.source_vecs = leak_filter, embed, source_vecs
        self.min_support, self.min_overlap = min_support, min_overlap

    def check(self, sentence: str) -> Verdict:
        s = sentence.strip()
        if not s:
            return Verdict(True)
        if self.leak_filter.leaks(s):
            return Verdict(False, "leak")
        for m in _NUMBER.finditer(s):
            n = _canon(m.group(0))
            if len(n) == 1 and s[m.end():m.end() + 1] in (".", ")") and m.start() == 0:
                continue                                   # a list marker
            if n not in self.numbers:
                return Verdict(False, f"number {m.group(0)}")
        for name in _names(s):
            if name.lower() not in self.names_text:
                return Verdict(False, f"name {name}")
        content = [w for w in tokenize(s) if w not in _SMALL_TALK]
        if not content:
            return Verdict(True)                           # framing: nothing to support
        if not _NUMBER.search(s) and len(content) <= 3:
            return Verdict(True)
        if self.embed is not None and self.source_vecs is not None and len(self.source_vecs):
            vec = np.asarray(self.embed([s]), dtype=np.float32)[0]
            if float(np.max(self.source_vecs @ vec)) >= self.min_support:
                return Verdict(True)
            return Verdict(False, "unsupported")
        overlap = sum(stem(w) in self.words for w in content) / len(content)
        return Verdict(True) if overlap >= self.min_overlap else Verdict(False, "unsupported")


def _names(sentence: str) -> list[str]:
    """Capitalised words and runs of them, but not a word that only opens the sentence (or a
    clause after a colon) and not small talk or weekdays."""
    out = []
    for m in _NAME.finditer(sentence):
        words = m.group(0).split()
        before = sentence[:m.start()].rstrip()
        if not before or before[-1] in ":;-–\"'(":
            words = words[1:]
        words = [w for w in words if w.lower() not in _SMALL_TALK and w.lower() not in _NUMBER_WORDS]
        if words:
            out.append(" ".join(words))
    return out


def _canon(number: str) -> str:
    """"1,000" and "1000" alike; a trailing separator dropped."""
    return number.rstrip(".,:").replace(",", "")
