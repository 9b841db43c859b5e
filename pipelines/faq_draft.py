"""A help-centre entry drafted from a conversation an agent resolved after the bot fell short
(Chatwoot Captain's FAQ suggestions), grounded in the agent's answer alone.

    exchange(messages)     the customer's question before the handoff and the agent's answer
    compose(...)           the model writes a general question and a one-to-three-sentence answer;
                           each answer sentence is verified against the agent's answer (the
                           SentenceVerifier), a question that is not one is replaced by the
                           customer's own, and an answer that lost the agent's figures, or all
                           its sentences, is replaced by the agent's words
    faq_article(entries)   the approved entries as one Markdown article of the help centre

Greetings, sign-offs and sentences that name the agent are not part of an answer. Both texts are
PII-redacted before they are stored.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipelines.answer_selection import NUMBER
from pipelines.answer_spans import split_sentences

HUMAN_INTENT = "human_agent"          # the intent of the reply to "let me talk to a person"
FAQ_RULES = ("Turn the support agent's answer into a help-centre FAQ entry. Write one general question a "
             "customer could ask (no names, order numbers or dates) and an answer of one to three sentences "
             "that says only what the agent wrote. Reply exactly as:\nQuestion: ...\nAnswer: ...")
_SMALL_TALK = re.compile(r"^\s*(?:hi|hello|hey|dear|thanks|thank you|cheers|best|regards|you're welcome|"
                         r"happy to help|glad to help|have a (?:nice|great|good))\b", re.IGNORECASE)
_FIELD = re.compile(r"^\s*(question|answer)\s*:\s*(.*)$", re.IGNORECASE)
MAX_QUESTION_WORDS = 25


@dataclass(frozen=True)
class FaqEntry:
    question: str
    answer: str
    how: str              # "model": the model's verified wording; "agent_words": the agent's own


def exchange(messages: list[dict]) -> tuple[str, str] | None:
    """(the customer's question, the agent's answer) of a conversation, or None when an agent
    never answered a question there. The question is the customer's last message before the
    agent's first, not counting the request for a human."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "agent"), None)
    if first is None:
        return None
    question = None
    for i in range(first - 1, -1, -1):
        m = messages[i]
        if m.get("role") != "user" or m.get("blocked") or not (m.get("content") or "").strip():
            continue
        reply = messages[i + 1] if i + 1 < len(messages) else None
        if reply is not None and reply.get("role") == "assistant" and reply.get("intent") == HUMAN_INTENT:
            continue
        question = m["content"].strip()
        break
    names = {(m.get("author") or {}).get("name") for m in messages if m.get("role") == "agent"} - {None, ""}
    said = [m["content"] for m in messages[first:] if m.get("role") == "agent"][:3]
    answer = " ".join(s for text in said for s in split_sentences(text) if _substantive(s, names))
    if not question or not answer:
        return None
    return question, answer


def _substantive(sentence: str, names: set[str]) -> bool:
    """Not a greeting or sign-off, and not about the agent ("This is Dana")."""
    if _SMALL_TALK.match(sentence):
        return False
    return not any(re.search(rf"\b{re.escape(n)}\b", sentence) for n in names)


def draft_messages(question: str, answer: str) -> list[dict]:
    return [{"role": "system", "content": FAQ_RULES},
            {"role": "user", "content": f"Customer asked: {question}\nAgent answered: {answer}"}]


def compose(question: str, answer: str, chat: Callable[[list[dict]], str] | None,
            check: Callable[[str], bool]) -> FaqEntry:
    """The entry for one exchange. `chat(messages) -> text` is the model (None: no model);
    `check(sentence)` is the verifier against the agent's answer."""
    text = ""
    if chat is not None:
        try:
            text = chat(draft_messages(question, answer))
        except Exception:                     # the model is unavailable: the agent's words stand
            text = ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m and m.group(1).lower() not in fields:
            fields[m.group(1).lower()] = m.group(2).strip()
    q = fields.get("question", "")
    if not (q.endswith("?") and 3 <= len(q.split()) <= MAX_QUESTION_WORDS and not _new_figures(q, question + answer)):
        q = question
    kept = [s for s in split_sentences(fields.get("answer", ""))[:3] if check(s)]
    a = " ".join(kept)
    figures = set(NUMBER.findall(answer))
    if not a or (figures and not figures <= set(NUMBER.findall(a))):
        return FaqEntry(q, answer, "agent_words")
    return FaqEntry(q, a, "model")


def _new_figures(text: str, source: str) -> bool:
    return bool(set(NUMBER.findall(text)) - set(NUMBER.findall(source)))


FAQ_TITLE = "Answers from our support team"


def faq_article(entries: list[tuple[str, str]]) -> str:
    """Approved (question, answer) pairs as one help-centre article, a section each."""
    parts = [f"# {FAQ_TITLE}", ""]
    for question, answer in entries:
        parts += [f"## {_one_line(question)}", _one_line(answer), ""]
    return "\n".join(parts)


def _one_line(text: str) -> str:
    """A heading or paragraph that cannot start another heading or section."""
    return re.sub(r"\s+", " ", text).strip().lstrip("#").strip()
