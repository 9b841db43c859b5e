"""Verification of what the model writes, one sentence at a time, before the customer sees it.

A sentence passes when
  - every number in it (a price, a duration, a date, a percentage) appears in a cited passage, with
    the same currency sign or range start before it and the word after it among the two that follow
    it there ("€50 per day" fails against "€7 per day ... excess to €50", "5 days" against
    "3-5 days"); a count in words ("five times") counts as its number;
  - each number stays with its fact: the words around it in the sentence do not fit another
    number of the passages clearly better ("a full charge takes 6 hours" fails against "a full
    charge takes 2 hours and gives ... 6 hours on Pulse");
  - each number keeps its subject: what the sentence says besides the number and its unit shares
    a word with a passage sentence that states the number (a list item with its lead), so "the
    warranty is 3-5 business days" fails against "we review claims within 3-5 business days";
  - every placeholder in it ("[EMAIL]") is in a cited passage;
  - every name in it (a capitalised word past the sentence's start: a brand, a plan, a carrier)
    appears in a cited passage or the tenant's name;
  - a bare "Yes." or "No." fails: it states an answer with nothing to check it by;
  - it says yes where the help centre says yes: negated ("not", "never", "can't", a leading "No")
    exactly when the cited span that supports it best is; a sentence opening with "Yes" or "No"
    answers the question, so it is held to the span chosen as the answer (`answer_span`) too;
  - it is supported: its embedding's cosine to the best cited span is at least `min_support`, or,
    without embeddings, most of its content words are in the passages;
  - it repeats none of the prompt (filters.leakage).

A sentence that fails is dropped; the chat replaces a reply that lost everything by the quoted
span. Framing with no facts ("Happy to help!") passes: it names nothing and states no number.
Each check errs towards dropping: a dropped sentence costs a quote, a wrong one costs the customer.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from filters.leakage import LeakFilter
from pipelines.answer_spans import chunk_spans, split_sentences
from pipelines.kb_chunk import Chunk
from pipelines.knowledge_base import stem, tokenize
from pipelines.query_translation import has_cjk

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_NAME = re.compile(r"\b[A-Z][a-zA-Z]+(?:\s+[A-Z][a-zA-Z]+)*")
_SMALL_TALK = frozenset("i you we our your hi hello thanks thank please sorry happy help glad welcome sure "
                        "yes no ok okay great".split())
# words that tell nothing about what a number is of ("it takes about 3 days")
_GENERIC = frozenset("take takes taking took get gets getting usually normally typically about around up "
                     "within just only also it's there's there usual".split())
_NUMBER_WORDS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_NEGATION = re.compile(r"\b(?:not|never|no|cannot|none|nothing|neither|nor)\b|n[’']t\b", re.IGNORECASE)
_CURRENCY = "$€£¥"
_RANGE_START = re.compile(r"(\d+)\s?[-–]\s?$")
_COUNT_WORDS = {w: str(i) for i, w in
                enumerate("two three four five six seven eight nine ten eleven twelve".split(), 2)}
_COUNT_WORDS.update(twice="2", thrice="3")
_COUNT = re.compile(r"\b(?:" + "|".join(_COUNT_WORDS) + r")\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\[[A-Z_]+\]")
_AFTER = re.compile(r"[\s-]*([^\W\d_]+)(?:\s+([^\W\d_]+))?")
_YES_NO = re.compile(r"\s*(?:yes|no)\b", re.IGNORECASE)
# where a number's surroundings end: the sentence, another number, and in a reply also a comma
_SOURCE_CUT = re.compile(r"[.!?](?:\s|$)|\n|\d")
_REPLY_CUT = re.compile(r"[.!?,;](?:\s|$)|\n|\d")
_NEAR_WORDS = 8
_CLEARLY_BETTER = 2           # words more in common with another number's surroundings than its own


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""          # why it failed: "number 7", "name DHL", "unsupported", "leak"


class SentenceVerifier:
    def __init__(self, sources: list[str], leak_filter: LeakFilter, names: tuple[str, ...] = (),
                 embed: Callable[[list[str]], np.ndarray] | None = None, source_vecs: np.ndarray | None = None,
                 span_texts: list[str] | None = None, min_support: float = 0.5, min_overlap: float = 0.6,
                 answer_span: str | None = None):
        """sources: the cited passages' texts; source_vecs: [S, dim] embeddings of the cited spans
        and span_texts their texts, a list item's lead included (with `embed` for the sentence, the
        support check is a cosine to the best span; without, word overlap with the best sentence of
        the passages). answer_span: the span chosen as the answer (a list item with its lead)."""
        self.answer_span = answer_span
        joined = "\n".join(sources)
        self.text = re.sub(r"\s+", " ", joined).lower()
        self.numbers: dict[str, list[tuple[str, set[str]]]] = {}
        self.near: dict[str, list[set[str]]] = {}
        for m in _NUMBER.finditer(joined):
            self.numbers.setdefault(_canon(m.group(0)), []).append(_context(joined, m))
            self.near.setdefault(_canon(m.group(0)), []).append(_near(joined, m, _SOURCE_CUT))
        self.subjects = _number_subjects(sources)
        self.counts = set(self.numbers) | {_COUNT_WORDS[w.lower()] for w in _COUNT.findall(joined)}
        self.spans = span_texts or [t for src in sources for line in src.splitlines() for t in split_sentences(line)]
        self._span_stems: list[set[str]] | None = None     # the word path's, built on first use
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
        for token in _PLACEHOLDER.findall(s):
            if token.lower() not in self.text:
                return Verdict(False, f"placeholder {token}")
        for word in _COUNT.findall(s):
            if _COUNT_WORDS[word.lower()] not in self.counts:
                return Verdict(False, f"number {word}")
        said: set[str] | None = None          # the sentence's words but its figures' (on first use)
        for m in _NUMBER.finditer(s):
            n = _canon(m.group(0))
            if len(n) == 1 and s[m.end():m.end() + 1] in (".", ")") and m.start() == 0:
                continue                                   # a list marker
            if n not in self.numbers:
                return Verdict(False, f"number {m.group(0)}")
            sign, after = _context(s, m)
            # no sign in the sentence matches a currency sign in the passage, never a range's end
            if not any((sign == s2 or not sign and not s2.endswith("-")) and (not after or after & a2)
                       for s2, a2 in self.numbers[n]):
                return Verdict(False, f"number {m.group(0)} in another context")
            if self._fits_another_number(n, _near(s, m, _REPLY_CUT)):
                return Verdict(False, f"number {m.group(0)} of another fact")
            if not has_cjk(s):
                said = _subject_words(s) if said is None else said
                if not self._keeps_subject(n, said):
                    return Verdict(False, f"number {m.group(0)} without its subject")
        for name in names_in(s):
            if name.lower() not in self.names_text:
                return Verdict(False, f"name {name}")
        content = [w for w in tokenize(s) if w not in _SMALL_TALK]
        answers = bool(_YES_NO.match(s))
        if not content:
            # framing: nothing to support; but a bare yes or no is an answer nothing supports
            return Verdict(False, "bare yes or no") if answers else Verdict(True)
        if not _NUMBER.search(s) and len(content) <= 3 and not answers:
            return Verdict(True)
        if self.embed is not None and self.source_vecs is not None and len(self.source_vecs):
            vec = np.asarray(self.embed([s]), dtype=np.float32)[0]
            cosines = self.source_vecs @ vec
            if float(np.max(cosines)) < self.min_support:
                return Verdict(False, "unsupported")
            best = self.spans[int(np.argmax(cosines))] if len(self.spans) == len(cosines) else None
        else:
            stems = [stem(w) for w in content]
            if sum(w in self.words for w in stems) / len(content) < self.min_overlap:
                return Verdict(False, "unsupported")
            if self._span_stems is None:
                self._span_stems = [{stem(w) for w in tokenize(t)} for t in self.spans]
            ranked = [len(set(stems) & span) for span in self._span_stems]
            best = self.spans[ranked.index(max(ranked))] if ranked else None
        held = [best] + ([self.answer_span] if answers and self.answer_span else [])
        if not has_cjk(s) and any(b is not None and _negated(s) != _negated(b) for b in held):
            return Verdict(False, "polarity")
        return Verdict(True)

    def _keeps_subject(self, n: str, said: set[str]) -> bool:
        """The sentence's words (`_subject_words`) share one with a passage span stating `n`; a
        sentence that says nothing else ("It takes 3-5 business days.") keeps it, and so does a
        number no span states (in a fragment too short to be one)."""
        places = self.subjects.get(n)
        return not said or not places or any(said & words for words in places)

    def _fits_another_number(self, n: str, near: set[str]) -> bool:
        """The sentence's words around `n` share clearly more with where another number of the
        passages stands than with anywhere `n` stands."""
        own = max(len(near & words) for words in self.near[n])
        other = max((len(near & words) for k, places in self.near.items() if k != n for words in places), default=0)
        return other >= own + _CLEARLY_BETTER


def _near(text: str, m: re.Match, cut: re.Pattern) -> set[str]:
    """The stems of the words around a number, up to the next sentence end or number either side
    (and `cut`'s other stops), at most _NEAR_WORDS each side."""
    left = cut.split(text[:m.start()])[-1]
    right = cut.split(text[m.end():])[0]
    words = tokenize(left)[-_NEAR_WORDS:] + tokenize(right)[:_NEAR_WORDS]
    return {stem(w) for w in words if w not in _SMALL_TALK}


def _subject_words(sentence: str) -> set[str]:
    """What a sentence says besides its numbers, their units and generic words, as stems."""
    units = {w for m in _NUMBER.finditer(sentence) for w in _context(sentence, m)[1]}
    return {stem(w) for w in tokenize(sentence)
            if w not in _SMALL_TALK and w not in _GENERIC and not w.isdigit()} - units


def _number_subjects(sources: list[str]) -> dict[str, list[set[str]]]:
    """For each number of the passages, the word stems of each span stating it (pipelines.
    answer_spans: a list item comes with its list's lead, "Refunds reach your card within:")."""
    out: dict[str, list[set[str]]] = {}
    for src in sources:
        for span in chunk_spans(Chunk("", "", src, "")):
            text = f"{span.lead} {span.text}"
            words = {stem(w) for w in tokenize(text) if not w.isdigit()}
            for m in _NUMBER.finditer(span.text):
                out.setdefault(_canon(m.group(0)), []).append(words)
    return out


def names_in(sentence: str) -> list[str]:
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


def _negated(text: str) -> bool:
    return bool(_NEGATION.search(text))


def _context(text: str, m: re.Match) -> tuple[str, set[str]]:
    """What stands right before a number (a currency sign, or the start of a range: "3-" of "3-5")
    and the stems of the (up to) two words after it."""
    sign = text[m.start() - 1] if m.start() and text[m.start() - 1] in _CURRENCY else ""
    start = _RANGE_START.search(text, max(0, m.start() - 8), m.start())
    sign = f"{start.group(1)}-" if start else sign
    after = _AFTER.match(text, m.end())
    # a CJK run has no spaces: its first character stands for the word
    words = {w[0] if has_cjk(w[0]) else stem(w.lower()) for w in after.groups() if w} if after else set()
    return sign, words


def _canon(number: str) -> str:
    """"1,000" and "1000" alike; a trailing separator dropped."""
    return number.rstrip(".,:").replace(",", "")
