"""Case- and width-insensitive matching text, with a map back to the original characters.

Each original character is folded on its own (NFKC, then casefold): full-width "ＢＡＤ" and
"Bad" both become "bad", and "ﬁ" becomes "fi"; invisible format characters (zero-width space,
joiners, soft hyphen) fold to nothing, so "b\u200bad" cannot slip a term past the matcher, and
a run of whitespace folds to one space. Folding per character keeps the map exact and
lets a stream be folded incrementally (a new piece never changes how earlier text folded).

    original:  Ｔ  ﬁ  x
    folded:    t  f i  x
    origin:    0  1 1  2      (folded index -> original index)
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache


@lru_cache(maxsize=65536)
def fold_char(c: str) -> str:
    if unicodedata.category(c) == "Cf":
        return ""
    return unicodedata.normalize("NFKC", c).casefold()


def fold(text: str) -> tuple[str, list[int]]:
    """(folded text, origin) with origin[i] = index in `text` of folded character i."""
    out: list[str] = []
    origin: list[int] = []
    space = False                       # runs of whitespace fold to one space
    for i, c in enumerate(text):
        if c.isspace():
            if not space:
                out.append(" ")
                origin.append(i)
            space = True
            continue
        space = False
        f = fold_char(c) if not c.isascii() or c.isupper() else c
        out.append(f)
        origin.extend([i] * len(f))
    return "".join(out), origin


def is_word_char(c: str) -> bool:
    """Letters and digits of scripts that separate words with spaces (CJK terms match anywhere)."""
    return c.isalnum() and not is_cjk(c)


def is_cjk(c: str) -> bool:
    o = ord(c)
    return (0x3040 <= o <= 0x30FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x2FA1F)
