"""Answer spans: sentences and list items of a chunk, with their list's lead, as quoted."""
from __future__ import annotations

from pipelines.answer_spans import chunk_spans, plain, split_sentences
from pipelines.knowledge_base import chunk_article
from tests.pipelines.grounding_kb import ARTICLES


def spans_of(name):
    return [s for c in chunk_article(ARTICLES[name], name) for s in chunk_spans(c)]


def test_list_items_keep_their_lead_and_sentences_split():
    quotes = [s.quote for s in spans_of("tuning-visits.md")]
    assert "Visit prices: Grand piano: 165 EUR per visit." in quotes
    assert "A standard tuning visit lasts about 90 minutes." in quotes
    assert "You can book a tuning visit online up to 8 weeks ahead." in quotes
    assert not any("**" in q for q in quotes)                       # emphasis removed


def test_a_paragraph_after_a_list_has_no_lead():
    spans = spans_of("tuning-visits.md")
    later = next(s for s in spans if s.text.startswith("Reschedule"))
    assert later.lead == "" and later.chunk.section == "Rescheduling"


def test_decimals_and_abbreviations_do_not_end_a_sentence():
    assert split_sentences("It costs $5.99 e.g. for a mug. Then 2. Done") == ["It costs $5.99 e.g. for a mug.",
                                                                               "Then 2.", "Done"]
    assert split_sentences("退款已处理。三天内到账！") == ["退款已处理。", "三天内到账！"]


def test_plain_removes_markdown_links_and_emphasis():
    assert plain("See **My Orders** and [the form](https://x.test/f) *now*") == "See My Orders and the form now"


def test_a_sentence_introducing_a_list_is_also_a_span():
    spans = spans_of("contact.md")
    assert "We visit homes anywhere within 40 km of the Oakridge studio, and in the North Valley district." in \
        [s.quote for s in spans]
    item = next(s for s in spans if s.text.startswith("Weekday visits"))
    assert item.lead.startswith("We visit homes")                      # long lead: matched on, not quoted
    assert item.quote == "Weekday visits in the North Valley district cost an extra 20 EUR."


def test_a_lead_that_is_only_a_condition_is_no_span():
    """"If you spot a mistake afterwards:" states nothing alone; a conditional lead with its main
    clause ("Once we've reviewed your photos, usually within 1 business day, you can choose:") does."""
    article = ("# Orders\n\n## Fixing a mistake\n\nIf you spot a mistake afterwards:\n\n- Within 60 minutes, "
               "edit the order in My Orders.\n\n## Damage\n\nOnce we've reviewed your photos, usually within 1 "
               "business day, you can choose:\n\n- A full refund.\n")
    quotes = [s.quote for c in chunk_article(article, "orders.md") for s in chunk_spans(c)]
    assert "If you spot a mistake afterwards." not in quotes
    assert "If you spot a mistake afterwards: Within 60 minutes, edit the order in My Orders." in quotes
    assert "Once we've reviewed your photos, usually within 1 business day, you can choose." in quotes
