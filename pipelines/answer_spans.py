"""Answer spans: the units a grounded reply quotes. A knowledge-base chunk is split into its
sentences and list items; a list item keeps the line that introduces its list ("Chest
measurements:") as its lead, so the quoted item still says what it is about.

    "## Shipping costs in the US"            section
    "- Standard shipping costs $5.99, ..."   span (a list item)
    "Gift cards are delivered by email ..."   span (a sentence of a paragraph)

Markdown emphasis is removed from what is quoted; headings stay with the chunk (its section).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.kb_chunk import Chunk

_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,2}[.)])\s+(.*)$")
_EMPHASIS = re.compile(r"\*\*(.+?)\*\*|__(.+?)__|(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
# a sentence ends at . ! ? followed by space and a capital, a digit, a quote or a bold marker;
# "e.g." / "i.e." / "approx." and decimals ("$5.99") never end one
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bapprox)(?<!\bvs)(?<=[.!?])\s+(?=[A-Z0-9\"'“(*])")
_CJK_END = re.compile(r"(?<=[。！？])")
MIN_SPAN_CHARS = 12
MAX_QUOTED_LEAD_WORDS = 8      # a longer lead is matched on but not repeated in the reply
# a lead that is a condition and nothing else ("If you spot a mistake afterwards:") states no fact;
# with a comma it has its main clause ("Once we've reviewed your photos, usually within ...")
_BARE_CLAUSE = re.compile(r"(?:if|when|once|unless|whether)\b[^,;]*$", re.I)


def plain(text: str) -> str:
    """Markdown emphasis and links removed, whitespace collapsed."""
    text = _LINK.sub(r"\1", text)
    text = _EMPHASIS.sub(lambda m: m.group(1) or m.group(2) or m.group(3), text)
    return re.sub(r"\s+", " ", text).strip()


@dataclass(frozen=True)
class Span:
    chunk: Chunk
    text: str           # what is quoted: plain text of one sentence or list item
    lead: str           # the line introducing its list ("" for a sentence of a paragraph)
    position: int       # order within the chunk

    @property
    def quote(self) -> str:
        """The span as a reply states it, ending in a full stop: a list item with its lead
        when the lead is short ("Chest measurements: M: 94-102 cm"), else alone."""
        body = self.text
        if self.lead and len(self.lead.split()) <= MAX_QUOTED_LEAD_WORDS:
            lead = self.lead.rstrip(":").strip()
            body = f"{lead}: {body}" if not body.lower().startswith(lead.lower()) else body
        return body if body[-1:] in ".!?。！？)" else body + "."

    @property
    def context(self) -> str:
        """What the span is matched on: the article, the section, the lead and the span."""
        return " ".join(x for x in (self.chunk.title, self.chunk.section, self.lead, self.text) if x)


def split_sentences(paragraph: str) -> list[str]:
    out = []
    for part in _SENTENCE_END.split(paragraph):
        out.extend(p for p in _CJK_END.split(part) if p.strip())
    return [p.strip() for p in out]


def chunk_spans(chunk: Chunk) -> list[Span]:
    """The chunk's sentences and list items, in order."""
    spans: list[Span] = []
    lead = ""
    paragraph: list[str] = []

    def add(text: str, lead_line: str) -> None:
        text = plain(text)
        if len(text) >= MIN_SPAN_CHARS:
            spans.append(Span(chunk, text, lead_line, len(spans)))

    def flush_paragraph() -> str:
        """Emit the paragraph's sentences; returns its last sentence (a lead when it ends in ':')."""
        text = " ".join(paragraph)
        paragraph.clear()
        sentences = split_sentences(text) if text else []
        last = ""
        for s in sentences:
            if s.rstrip().endswith(":"):
                last = plain(s)           # it introduces the list that follows ...
                if len(last.split()) > 3 and not _BARE_CLAUSE.match(last):
                    add(s.rstrip().rstrip(":") + ".", "")      # ... and may state a fact itself
            else:
                add(s, "")
        return last

    for line in chunk.text.splitlines():
        item = _ITEM.match(line)
        if item:
            if paragraph:
                lead = flush_paragraph()
            add(item.group(1), lead)
        elif not line.strip():
            if paragraph:
                lead = flush_paragraph()
            else:
                pass                      # a blank line inside a list keeps its lead
        else:
            if not paragraph:
                lead = ""                 # a new paragraph ends the previous list
            paragraph.append(line.strip())
    if paragraph:
        flush_paragraph()
    return spans
