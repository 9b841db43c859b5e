"""Follow-up questions read with the conversation: "and to the UK?" after "How much is shipping
to Canada?" is searched as both together, with the follow-up's own words counting most.

A message is a follow-up when the conversation has an earlier question and the message opens
like one ("and ...", "what about ...", "那 ..."), or is short with little of its own to search
on (three content words or fewer, or a pronoun and six or fewer).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.knowledge_base import tokenize

_OPENS = re.compile(r"^\s*(?:and|or|also|but|so|then|plus|what about|how about|same (?:for|with)|ok(?:ay)?[,.]?\s+"
                    r"(?:and|what about|how about))\b|^\s*(?:那|那么|还有|另外|如果是|如果)", re.I)
_CJK = re.compile(r"[\u3400-\u9fff]")
_PRONOUN = re.compile(r"\b(?:it|its|that|this|those|these|them|they|one|ones|there)\b", re.I)


@dataclass(frozen=True)
class Resolved:
    query: str              # what retrieval and answer selection search on
    focus: str              # the words that matter most ("" when not a follow-up)
    previous_reply: str     # the assistant's last reply ("" when none)

    @property
    def is_followup(self) -> bool:
        return bool(self.focus)


def _last(history: list[dict], role: str) -> str:
    for msg in reversed(history):
        if msg.get("role") == role and msg.get("content") and not msg.get("blocked"):
            return msg["content"]
    return ""


def is_followup(text: str) -> bool:
    words = tokenize(text)
    cjk = _CJK.findall(text)
    if _OPENS.search(text):
        return True
    if cjk:
        return len(cjk) <= 4
    return len(words) <= 3 or (len(words) <= 6 and bool(_PRONOUN.search(text)))


def resolve(history: list[dict], text: str) -> Resolved:
    """The message as searched: joined to the previous question when it is a follow-up."""
    previous = _last(history, "user")
    reply = _last(history, "assistant")
    # "hi" or "thanks" is nothing to follow up on
    if previous and (len(tokenize(previous)) >= 2 or _CJK.search(previous)) and is_followup(text):
        return Resolved(f"{previous} {text}", text, reply)
    return Resolved(text, "", reply)
