"""How a grounded reply is composed from the selected answer spans, per tenant `answer_mode`:

    extractive           the reply quotes the span(s); no model call. Outcome "quoted".
    grounded_generation  the model writes from the selected spans only; every sentence is verified
                         (pipelines.answer_verifier) before it streams; a failing sentence is
                         dropped, and the quoted span is added when what survived lost the facts.
                         Outcome "verified_generated", or "sentence_dropped" if any was dropped.
                         A Chinese question's verified English reply is then translated by the
                         model, and kept in Chinese only if the translation keeps its numbers.
    free                 the model writes from the retrieved passages, only the prompt-leak check
                         applies. Outcome "free".

Turns the help centre cannot answer get "unanswerable"; a question the help centre answers two
ways gets one clarifying question ("clarified").
"""
from __future__ import annotations

import re

from pipelines.answer_selection import NUMBER, Selection
from pipelines.answer_spans import Span
from pipelines.answer_verifier import names_in
from pipelines.knowledge_base import stem, tokenize
from pipelines.query_translation import has_cjk

_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+|https?://[^\s)>\]]+[^\s)>\].,;:]")

# words a yes-or-no reply adds to the question's own, stemmed
_ANSWER_WORDS = frozenset(stem(w) for w in "yes no not can cannot can't don't doesn't isn't aren't won't "
                          "unfortunately sorry afraid yeah sure ok okay able i'm i've you've you're you'll "
                          "we're we've we'll us yours mine".split())

ANSWER_MODES = ("extractive", "grounded_generation", "free")
OUTCOMES = ("quoted", "verified_generated", "sentence_dropped", "unanswerable", "clarified", "free")

TRANSLATE_RULES = ("Translate the customer-service reply into Simplified Chinese. Keep every number, price, "
                   "code and product name exactly as written. Output only the translation.")
GROUNDED_RULES = ("Answer the customer in one or two short sentences using only the facts below. Copy every "
                  "number, price, duration and name exactly as the facts write it. Do not add anything else.")


def quoted_reply(spans: list[Span], question: str) -> str:
    """The reply that states the spans as the help centre writes them."""
    # a list's introducing sentence and its item repeat each other: keep the longer
    spans = [s for s in spans if not any(o is not s and s.text.rstrip(".") in o.quote for o in spans)]
    body = " ".join(s.quote for s in spans)
    if has_cjk(question):
        return f"根据帮助中心《{spans[0].chunk.title}》：{body}"
    return body


def clarifying_question(a: Span, b: Span, question: str) -> str:
    """One question asking which of two differently answering articles is meant."""
    first, second = _topic(a), _topic(b)
    if has_cjk(question):
        return f"帮助中心对此有两种说明，取决于具体情况：您问的是「{first}」还是「{second}」？"
    return (f"Our help centre answers this two ways, depending on what you mean. Is your question about "
            f"{first}, or about {second}?")


def _topic(span: Span) -> str:
    c = span.chunk
    return f"{c.title} ({c.section})" if c.section else c.title


def grounded_messages(system_prompt: str, selection: Selection, history: list[dict], user_text: str,
                      max_history: int = 4) -> list[dict]:
    """The prompt for grounded generation: the selected spans as the only facts."""
    facts = "\n".join(f"- {s.quote}" for s in selection.spans)
    kept = [{"role": m["role"], "content": m["content"]} for m in history
            if m.get("role") in ("user", "assistant") and m.get("content") and not m.get("blocked")][-max_history:]
    system = f"{system_prompt.strip()}\n\n{GROUNDED_RULES}"
    return [{"role": "system", "content": system}, *kept,
            {"role": "user", "content": f"Facts:\n{facts}\n\nQuestion: {user_text}"}]


def missing_facts(reply: str, spans: list[Span], question: str = "", known: tuple[str, ...] = ()) -> bool:
    """The reply leaves out the figures or names the answer is about: none of what the best span
    adds to the question ("2.4 GHz" to "does it work on 5 GHz?"), or, when the best span states
    no figure, none of the other spans' new figures; or none of the names the best span adds
    ("the Northwind Home app", "My Orders"), `known` names (the tenant's) aside; or any email
    address or web address the best span gives; or it only restates the question ("No, you can't
    put the skillet in the dishwasher."), so the help centre's reason is missing. A figure counts
    whole ("1" is not in "14")."""
    if spans and restates(reply, question):
        return True
    if spans and any(a.lower() not in reply.lower() and a.lower() not in question.lower()
                     for a in _ADDRESS.findall(spans[0].text)):
        return True
    def figures(text: str) -> set[str]:
        return set(NUMBER.findall(text))
    said, asked = figures(reply), figures(question)
    best = figures(spans[0].text) if spans else set()
    new = best - asked if best else {n for s in spans[1:] for n in figures(s.text)} - asked
    if new and not new & said:
        return True
    if not spans:
        return False
    skip = {w.lower() for name in known for w in name.split()} | {w.lower() for w in re.findall(r"\w+", question)}
    names = {n for n in names_in(spans[0].text) if any(w.lower() not in skip for w in n.split())}
    return bool(names) and not any(n.lower() in reply.lower() for n in names)


def restates(reply: str, question: str) -> bool:
    """Every word of the reply is the question's, an answer word (yes, no, can, not) or small
    talk: it answers yes or no and gives no reason or detail."""
    asked = {stem(w) for w in tokenize(question)}
    said = {stem(w) for w in tokenize(reply)} - _ANSWER_WORDS
    return bool(question.strip()) and bool(reply.strip()) and said <= asked


def translation_messages(reply: str) -> list[dict]:
    """The prompt that turns a verified English reply into Chinese."""
    return [{"role": "system", "content": TRANSLATE_RULES}, {"role": "user", "content": reply}]


def translation_keeps_facts(reply: str, translated: str) -> bool:
    """The translation is Chinese and states the reply's numbers, no more and no fewer ("1,800" and
    "1800" alike): a dropped or altered figure keeps the English reply."""
    def figures(text: str) -> list[str]:
        return sorted(n.rstrip(".,:").replace(",", "") for n in NUMBER.findall(text))
    return has_cjk(translated) and figures(reply) == figures(translated)
