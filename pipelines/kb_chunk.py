"""A piece of a help-centre article: what the knowledge base indexes and retrieves, and what
answer spans (pipelines/answer_spans.py) are cut from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    title: str          # the article's title
    section: str        # the heading the text sits under ("" for the article's lead)
    text: str
    source: str         # the article's file name, e.g. "returns-policy.md"

    @property
    def embedding_text(self) -> str:
        return f"{self.title}. {self.section}. {self.text}" if self.section else f"{self.title}. {self.text}"
