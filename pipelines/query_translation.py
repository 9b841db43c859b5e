"""A Chinese question read as English keywords, for an English help centre: each run of Chinese
characters is matched against a bilingual glossary (configs/glossary_zh.yaml), longest term
first; Latin words and digits are kept as written; characters no term covers are skipped.

    "电子礼品卡最多可以提前多久预约发送日期？" -> "e-gift card digital gift card at most maximum up to
                                                 can in advance ahead how long ..."

The English embedding model and BM25 both see the keywords, so retrieval and answer selection
work on a Chinese question; the reply itself quotes the English article with a Chinese framing.
"""
from __future__ import annotations

import os
import re

from configs import read_yaml, shipped

DEFAULT_PATH = shipped("glossary_zh.yaml")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_PIECES = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+|[^\u3400-\u9fff\uf900-\ufaff]+")


def has_cjk(text: str) -> bool:
    return bool(_CJK.search(text))


class Glossary:
    def __init__(self, path: str | os.PathLike | None = None):
        path, data = read_yaml("glossary", "glossary_zh.yaml", path, "GLOSSARY_ZH_PATH")
        terms = data.get("terms")
        if not isinstance(terms, dict) or not terms:
            raise ValueError(f"glossary: {path} needs a non-empty 'terms' mapping (Chinese term: English words)")
        self.terms: dict[str, str] = {}
        for zh, en in terms.items():
            if not isinstance(zh, str) or not has_cjk(zh) or not isinstance(en, str) or not en.strip():
                raise ValueError(f"glossary: {path}: {zh!r} must map Chinese text to English words, got {en!r}")
            self.terms[zh] = en.strip()
        self.longest = max(len(t) for t in self.terms)

    def to_english(self, text: str) -> str:
        """The question as English keywords (the text unchanged if it holds no Chinese)."""
        if not has_cjk(text):
            return text
        out: list[str] = []
        for piece in _PIECES.findall(text):
            if not has_cjk(piece[0]):
                words = re.sub(r"[^\w$£€¥%.\-/]+", " ", piece).strip()
                if words:
                    out.append(words)
                continue
            i = 0
            while i < len(piece):
                for n in range(min(self.longest, len(piece) - i), 0, -1):
                    english = self.terms.get(piece[i:i + n])
                    if english is not None:
                        out.append(english)
                        i += n
                        break
                else:
                    i += 1                   # a character no term covers
        return " ".join(out)
