"""Prompt leakage: the instructions and the prompt scaffolding are recognised in a reply."""
from __future__ import annotations

import pytest

from filters.leakage import LeakFilter, strip_markers
from pipelines.grounded_answer import GROUNDED_RULES
from pipelines.prompt import RULES


@pytest.fixture
def leak():
    return LeakFilter(["You are the support assistant of Acme Tools, a hardware store.", RULES, GROUNDED_RULES])


@pytest.mark.parametrize("text", [
    "No, please let the customer know you are not sure and offer to connect them with a human agent.",
    "Help-centre passages: [1] Returns",
    "Customer message: where is my order",
    "I am the support assistant of Acme Tools, a hardware store, happy to help.",
    "Copy every number, price, duration and name exactly as the facts write it.",
])
def test_instructions_and_scaffolding_are_leaks(leak, text):
    assert leak.leaks(text)


@pytest.mark.parametrize("text", ["Returns are accepted within 30 days of delivery.",
                                  "I'm not sure, would you like me to connect you with a human agent?"])
def test_ordinary_replies_are_not(leak, text):
    assert not leak.leaks(text)


def test_passage_markers_are_stripped():
    assert strip_markers("[2] Refunds - When your refund is issued\nIt takes 5 days [2].") == "It takes 5 days."
    assert strip_markers("See [1] and [3] for details.") == "See and for details."


def test_run_words_is_checked():
    with pytest.raises(ValueError, match="run_words"):
        LeakFilter([], run_words=2)
