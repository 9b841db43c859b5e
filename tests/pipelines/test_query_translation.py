"""The Chinese glossary: a question in Chinese read as English keywords."""
from __future__ import annotations

import pytest

from pipelines.query_translation import Glossary


def test_longest_terms_win_and_latin_words_pass_through():
    g = Glossary()
    out = g.to_english("Pulse 电子礼品卡最多多久过期？")
    assert out.startswith("Pulse e-gift card") and "how long" in out and "expire" in out
    assert "gift card" in g.to_english("礼品卡") and g.to_english("Where is my order?") == "Where is my order?"


def test_a_tenant_glossary_file(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("terms:\n  调音: tuning\n  钢琴: piano\n", encoding="utf-8")
    assert Glossary(path).to_english("钢琴调音多少钱") == "piano tuning"


@pytest.mark.parametrize("text,error", [("terms: {}\n", "non-empty 'terms'"),
                                        ("terms:\n  refund: 退款\n", "must map Chinese text"),
                                        ("terms: [\n", "cannot read")])
def test_bad_glossaries_are_clear_errors(tmp_path, text, error):
    path = tmp_path / "g.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=error):
        Glossary(path)
