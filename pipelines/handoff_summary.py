"""The summary an agent reads when a conversation is handed over: one or two sentences that state
what the customer wants and what the assistant already answered, written by the model and kept
only if the transcript supports it; otherwise the customer's own words.

    messages -> prompt (the transcript, oldest first) -> model -> verify -> summary
                                                        \\-> (fails, unsupported) -> customer's words

Verification is lexical and strict, because an agent acts on it: at most two sentences, none a
question; every number or code in it (order numbers, amounts, dates) appears in the transcript;
and it shares content words with what the customer wrote (a summary about something else, or a
line the model made up, is not one).
"""
from __future__ import annotations

import re

from filters.banned_words import BannedWordFilter
from filters.stream_guard import sanitize

PROMPT = ("You write handoff notes for a human support agent. In one or two sentences, state what the "
          "customer asked for and what the assistant already told them. Use only facts from the "
          "conversation; do not add order numbers, amounts or promises. Write in the customer's language.")
MAX_TRANSCRIPT_MESSAGES = 12
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s*")
_CODE = re.compile(r"\b(?=\w*\d)\w[\w./:-]*\b")          # a token with a digit: 12345, A-77, 3.5, 9:00
_WORD = re.compile(r"[^\W\d_]{4,}|[\u4e00-\u9fff]")
_STOP = {"this", "that", "with", "have", "from", "what", "want", "wants", "would", "could", "about", "there",
         "their", "they", "them", "your", "customer", "assistant", "agent", "asked", "asks", "please", "help",
         "human", "talk", "speak", "someone", "person", "thanks", "thank", "already", "told", "said"}


def transcript(messages: list[dict]) -> str:
    lines = [f"{'Customer' if m['role'] == 'user' else 'Assistant'}: {m['content']}"
             for m in messages[-MAX_TRANSCRIPT_MESSAGES:]]
    return "\n".join(lines)


def customer_words(messages: list[dict]) -> str:
    """The fallback: what the customer asked first, and last when that is something else."""
    asks = [m["content"].strip() for m in messages if m["role"] == "user" and m["content"].strip()]
    if not asks:
        return ""
    first, last = asks[0][:300], asks[-1][:300]
    return f"Customer asked: {first}" + (f" Last message: {last}" if last != first else "")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOP


def supported(summary: str, messages: list[dict]) -> bool:
    """The summary is at most two declarative sentences, its numbers and codes are all in the
    transcript, and it shares content words with the customer's messages."""
    sentences = [s for s in _SENTENCE.split(summary.strip()) if s.strip()]
    if not sentences or len(sentences) > 2 or any(s.rstrip().endswith(("?", "？")) for s in sentences):
        return False
    everything = " ".join(m["content"] for m in messages)
    if any(code not in everything for code in _CODE.findall(summary)):
        return False
    asked = _words(" ".join(m["content"] for m in messages if m["role"] == "user"))
    return len(_words(summary) & asked) >= min(2, len(asked))


def summarize(messages: list[dict], chat, banned: BannedWordFilter | None = None) -> tuple[str, str]:
    """(the summary, how it was made: "generated" | "customer_words"). `chat(messages) -> text`
    raises on an outage; its text passes the same compliance filters as a reply."""
    if not messages:
        return "", "customer_words"
    try:
        text = chat([{"role": "system", "content": PROMPT},
                     {"role": "user", "content": transcript(messages)}]).strip()
    except Exception:             # noqa: BLE001 - any failure of the model: the customer's words
        text = ""
    text = " ".join(text.split())
    if text and supported(text, messages):
        return sanitize(text, banned), "generated"
    return sanitize(customer_words(messages), banned), "customer_words"
