"""Prompt leakage: a reply must never repeat the system instructions or the prompt's scaffolding
("Help-centre passages:", "Customer message:", "[1]" passage markers).

`leaks(sentence)` says whether a sentence of a reply repeats any of it: a scaffolding phrase, or
a run of `run_words` consecutive words of one of the instruction texts. `strip_markers` removes
"[1]"-style passage markers a reply may carry while keeping the sentence.
"""
from __future__ import annotations

import re

SCAFFOLDING = ("help-centre passages", "help-center passages", "help centre passages", "customer message:",
               "passages:", "system prompt", "system message", "my instructions", "as an ai language model")
_HEADING_ECHO = re.compile(r"^[ \t]*\[\d{1,2}\][^\n.!?]{0,120}$\n?", re.M)   # "[1] Refunds - When ..." alone
_MARKER = re.compile(r"[ \t]*\[\d{1,2}\]")
_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


class LeakFilter:
    def __init__(self, instructions: list[str], run_words: int = 6):
        if run_words < 3:
            raise ValueError(f"run_words: must be >= 3, got {run_words}")
        self.run_words = run_words
        self._runs: set[tuple[str, ...]] = set()
        for text in instructions:
            words = _words(text)
            self._runs.update(tuple(words[i:i + run_words]) for i in range(len(words) - run_words + 1))

    def leaks(self, sentence: str) -> bool:
        low = re.sub(r"\s+", " ", sentence.lower())
        if any(s in low for s in SCAFFOLDING):
            return True
        words = _words(low)
        n = self.run_words
        return any(tuple(words[i:i + n]) in self._runs for i in range(len(words) - n + 1))


def strip_markers(text: str) -> str:
    """"Refunds take 5 days [2]." -> "Refunds take 5 days."; "[1] Refunds - When ..." -> "When ..."."""
    return _MARKER.sub("", _HEADING_ECHO.sub("", text)).strip()
