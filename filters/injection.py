"""Prompt-injection heuristics for user messages (and retrieved text): phrases that try to
override the assistant's instructions, extract its system prompt, or switch it into another
persona, in English and Chinese. A message scores the sum of its distinct signals' weights;
`flagged` at 1.0 or more. Heuristics catch the common attacks cheaply; they are a first line, not
a guarantee, so the pipeline also keeps the system prompt out of what it echoes back.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from filters.normalize import fold

_SIGNALS: list[tuple[str, float, re.Pattern]] = [(name, w, re.compile(p)) for name, w, p in [
    ("override", 1.0, (r"\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(previous|prior|above|earlier|all|"
                       r"your|system|the)\b.{0,20}\b(instructions?|prompts?|rules?|guidelines?|directives?)")),
    ("new_rules", 0.6, r"\b(new|updated|real) (instructions?|rules|system prompt)\b"),
    ("reveal", 1.0, (r"\b(reveal|show|print|repeat|output|tell me|what (is|are))\b.{0,30}\b(system prompt|"
                     r"(initial|hidden|original|your) (instructions?|prompt))")),
    ("persona", 0.6, r"\b(you are now|from now on,? you|act as|pretend (to be|you are)|roleplay as)\b"),
    ("jailbreak", 1.0, r"\b(developer mode|jailbreak|dan mode|do anything now|no restrictions|unfiltered)\b"),
    ("role_tag", 1.0, (r"(?m)(<\|?(system|im_start|im_end|endoftext)\|?>|\[/?inst\]|"
                       r"^\s*system\s*:|###\s*(system|instruction))")),
    ("override_zh", 1.0, (r"(忽略|无视|忘记|跳过).{0,10}(之前|以上|上面|所有|先前|系统)"
                          r".{0,6}(指令|指示|提示|规则|设定)")),
    ("reveal_zh", 1.0, r"(显示|告诉我|输出|重复|泄露).{0,10}(系统提示|系统指令|初始指令|提示词)"),
    ("persona_zh", 0.6, r"(你现在是|从现在开始你|扮演|假装你是)"),
    ("jailbreak_zh", 1.0, r"(开发者模式|越狱|没有任何限制|不受限制)"),
]]


@dataclass
class InjectionVerdict:
    score: float
    signals: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return self.score >= 1.0


def detect_injection(text: str) -> InjectionVerdict:
    folded, _ = fold(text)
    hits = [(name, w) for name, w, pattern in _SIGNALS if pattern.search(folded)]
    return InjectionVerdict(round(sum(w for _, w in hits), 3), [name for name, _ in hits])
