"""Answer selection: which sentence or list item of the retrieved passages answers the question,
or that none does.

    question ─┬─ embedding ── cosine to each span (span = title + section + lead + text)
              ├─ words ────── IDF-weighted share of the question's words the span's context holds
              └─ kind ─────── "how long" wants a duration, "how much" a price, "what time" an hour ...
    passages ── their spans ── score = weighted sum (+ the passage's own similarity) ── best span(s)

A question whose best span scores under `min_score` is unanswerable from the help centre: the
chat says so and offers a human instead of guessing. When the two best spans come from different
articles, score within `conflict_margin` of each other and state different figures, the help
centre answers two ways and the chat asks which one is meant.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import numpy as np

from pipelines.answer_spans import Span
from pipelines.knowledge_base import KnowledgeBase, Passage, stem, tokenize

NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_DURATION = re.compile(r"\b(\d+|one|two|three|four|five|six|seven|ten|fourteen|thirty)\s*(?:[-–]\s*\d+\s*|to \d+\s*)?"
                       r"[-\s]?(?:business |working |calendar )?(minute|hour|day|week|month|year)s?\b|\bsame day\b|"
                       r"\binstantly\b|\bstraight away\b|\bimmediately\b|\bwithin\b", re.I)
_MONEY = re.compile(r"[$£€¥]\s?\d|\d\s?(?:usd|eur|gbp|cny|dollars?|euros?|pounds?)\b|\bfree\b|%", re.I)
_PERCENT = re.compile(r"\d\s?%|\bpercent\b|\bhalf\b", re.I)
# a sentence that leans on its neighbour: a refusal ("We can't ..."), or one that points back
_NEEDS_CONTEXT = re.compile(r"^(?:this|that|these|those|it|they|or|but|however|after that|then|otherwise)\b|"
                            r"\b(?:can't|cannot|don't|doesn't|won't|isn't|aren't|not)\b", re.I)
_TEMPERATURE = re.compile(r"\d\s?°|\bdegrees\b", re.I)
_CLOCK = re.compile(r"\b\d{1,2}(?::\d\d)?\s*(?:am|pm)\b|\b\d{1,2}:\d\d\b|\b24/7\b", re.I)
_FREQUENCY = re.compile(r"\b(?:once|twice|\d+ times|every|each|per|daily|weekly|monthly|yearly|"
                        r"a (?:day|week|month|year))\b", re.I)
_COUNT = re.compile(r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|twelve|once|twice)\b", re.I)
_IDENTITY = re.compile(r"\b(?:founder|founded|owner|owned|ceo|director|manager|head of|run by|led by)\b", re.I)
_ORIGIN = re.compile(r"\b(?:made in|manufactured|produced in|sourced|designed in|comes? from|origin)\b", re.I)
_QUESTION_KINDS = (     # (what the question asks, what a span answering it holds)
    (re.compile(r"\bhow (?:many times|often)\b", re.I), _FREQUENCY),
    (re.compile(r"\bwho (?:is|are|was|were) (?:the|your)\b|\bwho (?:owns|runs|founded|leads)\b", re.I), _IDENTITY),
    (re.compile(r"\b(?:where|which country|what country)\b.*\b(?:made|manufactured|produced|sourced)\b", re.I),
     _ORIGIN),
    (re.compile(r"\bhow (?:long|soon|quickly|fast)\b|\bhow many (?:business |working )?(?:days|hours|weeks|months|"
                r"years|minutes)\b|\bwhen (?:will|do|does|can|is|are|would)\b|\buntil when\b|\bexpire|\bdeadline\b",
                re.I),
     _DURATION),
    (re.compile(r"\btemperature\b|\bhow hot\b|\bdegrees\b", re.I), _TEMPERATURE),
    (re.compile(r"\bwhat (?:time|hours)\b|\bopening hours\b|\bwhat hours\b", re.I), _CLOCK),
    (re.compile(r"\b(?:percent|discount|% off|how much off)\b", re.I), _PERCENT),
    (re.compile(r"\bhow much\b|\bcost\b|\bprice\b|\bfee\b|\bcharge\b", re.I), _MONEY),
    (re.compile(r"\bhow many\b|\bat least\b|\bat most\b|\bmaximum\b|\bminimum\b|\bup to\b", re.I), _COUNT),
)
# kinds so specific that a span without one cannot be the answer: its support drops by W_STRICT;
# a figure the question states ("a 3-year warranty", "between 9 and 12") that the span's chunk
# never mentions lowers it by W_FIGURE
STRICT_KINDS = (_IDENTITY, _ORIGIN, _TEMPERATURE, _CLOCK)
# score = W_COS * span cosine + W_LEX * word coverage + W_KIND * kind match + W_PASSAGE * passage cosine
#         - W_UNKNOWN * (question words the whole help centre never uses, at most 2)
#         - W_SAID if the previous reply already quoted the span (a follow-up wants something new)
W_COS, W_LEX, W_KIND, W_PASSAGE, W_UNKNOWN, W_SAID = 0.45, 0.35, 0.12, 0.2, 0.1, 0.1
# ranking only (not in the support compared with min_score): the answer's kind counts more
W_KIND_RANK = 0.05
W_STRICT = 0.15
W_FIGURE = 0.1
# words a question may hold that say nothing about its topic: chat shorthand, quantities, fillers.
# Any other word the help centre never uses ("organic", "HomeKit", "CEO") is a sign it cannot answer.
CHAT_WORDS = frozenset("""
much many more most less least maximum minimum max min biggest smallest highest lowest
get got gets getting come came coming take taken took see saw seen hit put want need tell know think
whats what's ur u im i'm i've ive id i'd dont don't doesnt doesn't wont won't cant can't isnt isn't theres there's
gonna gotta wanna yo lol nah em smth thingy thingies b4 wat till n r ya pls plz thx thanks hey hi btw
asap idk tho cuz coz abt bc rn omg ok okay guys guy stupid weird really actually somehow totally basically
nothing here something anything everything still already just even also too very quite pretty far long soon
dollars dollar pounds pound euros euro yuan percent myself yourself ones thing things stuff kind sort way lot lots
bit bits left like happens happen instead option options money talk speak call person someone""".split())


_PROPER = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+")


def _stems(text: str) -> set[str]:
    """The text's word stems, plus the initials of its multi-word names ("European Union" -> "eu")."""
    words = {stem(w) for w in tokenize(text)}
    words.update("".join(w[0] for w in m.group(0).split()).lower() for m in _PROPER.finditer(text))
    return words


@functools.lru_cache(maxsize=65536)
def _context_stems(span: Span) -> frozenset[str]:
    """A span's context stems, computed once per span (spans are immutable; a rebuilt index
    makes new ones)."""
    return frozenset(_stems(span.context))


def question_kind(question: str) -> re.Pattern | None:
    """What kind of fact answers the question (the pattern a span holding it matches), if any."""
    for asks, holds in _QUESTION_KINDS:
        if asks.search(question):
            return holds
    return None


@dataclass(frozen=True)
class Candidate:
    span: Span
    score: float          # how well it answers: the ranking
    support: float        # the same without the ranking-only terms: compared with min_score
    cosine: float
    coverage: float


@dataclass
class Selection:
    spans: list[Span]                 # what the reply quotes, best first ([] = unanswerable)
    score: float                      # the best support among the candidates
    candidates: list[Candidate] = field(default_factory=list)
    conflict: tuple[Span, Span] | None = None     # two articles answering differently

    @property
    def answerable(self) -> bool:
        return bool(self.spans)


class AnswerSelector:
    def __init__(self, kb: KnowledgeBase, min_score: float = 0.42, second_margin: float = 0.08,
                 conflict_margin: float = 0.1):
        if not 0 <= min_score <= 1:
            raise ValueError(f"min_score: must be in [0, 1], got {min_score}")
        self.kb, self.min_score = kb, min_score
        self.second_margin, self.conflict_margin = second_margin, conflict_margin

    def coverage(self, question_stems: dict[str, float], span: Span) -> float:
        """IDF-weighted share of the question's words found in the span's context."""
        total = sum(question_stems.values())
        if total <= 0:
            return 0.0
        have = _context_stems(span)
        return sum(w for s, w in question_stems.items() if s in have) / total

    def _weights(self, question: str, focus: str) -> dict[str, float]:
        """Each stem of the question with its IDF weight; the focus words (a follow-up's own)
        count double."""
        out: dict[str, float] = {}
        unknown = set(self.unknown_words(question + " " + focus)) if self.weigh_unknown else set()
        for text, boost in ((question, 1.0), (focus, 2.0)):
            for w in tokenize(text):
                if w in CHAT_WORDS:
                    continue
                s = stem(w)
                # a word no article uses weighs as much as the rarest one: it cannot be covered
                idf = self.kb.max_idf if w in unknown else max(self.kb.idf(w), self.kb.idf(s), 0.1)
                out[s] = max(out.get(s, 0.0), idf * boost)
        return out

    def unknown_words(self, question: str) -> list[str]:
        """The question's words that no article uses, chat shorthand and fillers aside."""
        return [w for w in tokenize(question) if len(w) > 2 and w not in CHAT_WORDS and not w.isdigit()
                and not self.kb.knows(w) and not self.kb.knows(stem(w)) and not self.kb.knows(w + "s")]

    def rank(self, question: str, qvec: np.ndarray | None, passages: list[Passage], focus: str = "",
             avoid: str = "", translated: bool = False, focus_vec: np.ndarray | None = None) -> list[Candidate]:
        """The passages' spans, best first. `focus`: words that matter most (a follow-up's own
        message) and `focus_vec` its embedding, which counts half of the cosine; `avoid`: text
        already said (the previous reply), whose spans lose a tie."""
        spans, vecs = self.kb.spans([p.chunk for p in passages])
        if not spans:
            return []
        passage_sim = {p.chunk: max(p.similarity, 0.0) for p in passages}
        cosines = (vecs @ qvec) if (vecs is not None and qvec is not None) else np.zeros(len(spans))
        if vecs is not None and focus_vec is not None:
            cosines = 0.5 * cosines + 0.5 * (vecs @ focus_vec)
        self.weigh_unknown = not translated
        weights = self._weights(question, focus)
        kind = question_kind(question)
        said = avoid.lower()
        # a glossary's keywords often miss the help centre's words: no penalty for a translation
        penalty = 0.0 if translated else W_UNKNOWN * min(2, len(self.unknown_words(question)))
        asked_figures = set(NUMBER.findall(focus or question))
        out = []
        for span, cos in zip(spans, cosines):
            cov = self.coverage(weights, span)
            kind_ok = 1.0 if kind is None or kind.search(span.text) else 0.0
            support = (W_COS * float(cos) + W_LEX * cov + W_KIND * kind_ok + W_PASSAGE * passage_sim[span.chunk]
                       - penalty - (W_STRICT if not kind_ok and kind in STRICT_KINDS else 0.0)
                       - (W_FIGURE if asked_figures - set(NUMBER.findall(span.chunk.text)) else 0.0))
            score = support + W_KIND_RANK * kind_ok
            if said and span.text.lower() in said:
                score -= W_SAID
            out.append(Candidate(span, round(score, 4), round(support, 4), round(float(cos), 4), round(cov, 4)))
        out.sort(key=lambda c: -c.score)
        return out

    def select(self, question: str, qvec: np.ndarray | None, passages: list[Passage], focus: str = "",
               avoid: str = "", translated: bool = False, focus_vec: np.ndarray | None = None) -> Selection:
        ranked = self.rank(question, qvec, passages, focus, avoid, translated, focus_vec)
        support = max((c.support for c in ranked), default=0.0)
        if support < self.min_score:
            return Selection([], support, ranked)
        best = ranked[0]
        chosen = [best.span]
        conflict = None
        for other in ranked[1:4]:
            close = best.score - other.score
            if (other.span.chunk.source != best.span.chunk.source and close <= self.conflict_margin
                    and _figures(other.span.text) and _figures(best.span.text)
                    and _figures(other.span.text) != _figures(best.span.text)
                    and _same_subject(best.span, other.span)):
                conflict = (best.span, other.span)
                break
        second = ranked[1] if len(ranked) > 1 else None
        if (conflict is None and second is not None and second.span.chunk.source == best.span.chunk.source
                and best.score - second.score <= self.second_margin):
            chosen = [best.span, second.span]          # a near tie in one article: quote both
        if conflict is None and _NEEDS_CONTEXT.search(best.span.text):
            # a refusal or a back-reference is quoted with the sentences beside it, in order
            by_pos = {c.span.position: c.span for c in ranked if c.span.chunk == best.span.chunk}
            near = [by_pos[p] for p in (best.span.position - 1, best.span.position + 1) if p in by_pos]
            around = sorted({best.span, *near}, key=lambda s: s.position)
            chosen = around + [s for s in chosen if s not in around]
        return Selection(chosen, support, ranked, conflict)


def _figures(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def _same_subject(a: Span, b: Span) -> bool:
    """Two spans saying the same thing but for their figures: most of their words are shared."""
    wa, wb = {w for w in _stems(a.text) if not w.isdigit()}, {w for w in _stems(b.text) if not w.isdigit()}
    if not wa or not wb:
        return False
    return len(wa & wb) / len(wa | wb) >= 0.6
