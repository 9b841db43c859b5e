"""Banned-term matching: case, width, zero-width and whitespace tricks, word boundaries, CJK."""
from __future__ import annotations

import pytest

from filters.banned_words import DEFAULT_PATH, BannedWordFilter


@pytest.fixture(scope="module")
def shipped() -> BannedWordFilter:
    return BannedWordFilter.from_file()


def test_shipped_list_has_200_english_and_chinese_terms(shipped):
    assert len(shipped.terms) == 200
    assert any(all(ord(c) < 128 for c in t) for t in shipped.terms)
    assert sum(any("\u4e00" <= c <= "\u9fff" for c in t) for t in shipped.terms) >= 40


@pytest.mark.parametrize("text, masked", [
    ("Is this a COUNTERFEIT bag?", "Is this a *********** bag?"),
    ("ＣＯＵＮＴＥＲＦＥＩＴ", "***********"),                              # full-width
    ("coun\u200bterfeit goods", "************ goods"),                    # zero-width space inside
    ("no money \t laundering here", "no ***** \t ********** here"),       # whitespace runs
    ("这是高仿的吗", "这是**的吗"),                                          # CJK inside a sentence
    ("ｆｕｃｋ this", "**** this"),
])
def test_masks_terms_however_they_are_written(shipped, text, masked):
    assert shipped.mask(text)[0] == masked


@pytest.mark.parametrize("text", ["A class act", "assess the bassoon", "Scunthorpe", "shiitake",
                                  "The package passed customs", "我们的正品保证"])
def test_no_match_inside_words_or_in_clean_text(shipped, text):
    assert shipped.find(text) == []


def test_match_spans_point_into_the_original_text():
    f = BannedWordFilter(["bad word", "假货"])
    text = "x ＢＡＤ  Word y 卖假货"
    matches = f.find(text)
    assert [text[m.start:m.end] for m in matches] == ["ＢＡＤ  Word", "假货"]
    assert [m.term for m in matches] == ["bad word", "假货"]


def test_bad_lists_are_rejected(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="empty"):
        BannedWordFilter([])
    with pytest.raises(ValueError, match="non-empty string"):
        BannedWordFilter(["ok", "  "])
    with pytest.raises(ValueError, match="cannot read"):
        BannedWordFilter.from_file(tmp_path / "missing.txt")
    own = tmp_path / "words.txt"
    own.write_text("# mine\nzorblax\n\n", encoding="utf-8")
    monkeypatch.setenv("BANNED_WORDS_PATH", str(own))
    assert BannedWordFilter.from_file().terms == ["zorblax"]
    assert DEFAULT_PATH.exists()


def test_a_term_of_only_invisible_characters_is_rejected():
    with pytest.raises(ValueError, match="invisible"):
        BannedWordFilter(["ok", "\u200b"])
