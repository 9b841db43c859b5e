"""Handoff summaries: the model's one or two sentences when the transcript supports them, else the
customer's own words (never a line nobody wrote, never an invented order number)."""
from __future__ import annotations

import pytest

from filters.banned_words import BannedWordFilter
from pipelines.handoff_summary import customer_words, summarize, supported

CONVERSATION = [
    {"role": "user", "content": "Can I change the delivery address of my order?"},
    {"role": "assistant", "content": "You can change the delivery address until the order ships, under "
                                     "Orders > Edit address."},
    {"role": "user", "content": "It already shipped. You're on it, right? I want a human."},
]


@pytest.mark.parametrize("summary, ok", [
    ("The customer wants to change the delivery address of an order that already shipped; the assistant "
     "explained addresses can be changed until the order ships.", True),
    ("The customer wants to change the delivery address of order 48213.", False),        # an invented number
    ("You're on it, right?", False),                                                      # a question
    ("The customer asks about a refund for a damaged blender.", False),                   # not what was asked
    ("Customer wants a new delivery address. The order shipped. An agent should call.", False),  # 3 sentences
])
def test_supported(summary, ok):
    assert supported(summary, CONVERSATION) is ok


def test_a_supported_summary_is_kept():
    text = "The customer wants to change the delivery address of a shipped order; the assistant said it is possible " \
           "until the order ships."
    assert summarize(CONVERSATION, lambda prompt: text) == (text, "generated")


@pytest.mark.parametrize("chat", [
    lambda prompt: "You're on it, right?",
    lambda prompt: "The customer wants order 99120 sent to a new delivery address.",
    lambda prompt: "",
])
def test_otherwise_the_customer_s_own_words(chat):
    summary, how = summarize(CONVERSATION, chat)
    assert how == "customer_words"
    assert summary == ("Customer asked: Can I change the delivery address of my order? "
                       "Last message: It already shipped. You're on it, right? I want a human.")


def test_an_outage_falls_back_and_the_prompt_holds_the_transcript():
    seen = []

    def down(prompt):
        seen.append(prompt)
        raise ConnectionError("model down")
    assert summarize(CONVERSATION, down)[1] == "customer_words"
    assert "Customer: Can I change the delivery address" in seen[0][-1]["content"]


def test_filters_apply_and_an_empty_conversation_has_no_summary():
    banned = BannedWordFilter(["delivery address"])
    assert "delivery address" not in summarize(CONVERSATION, lambda p: "", banned)[0]
    assert summarize([], lambda p: "x") == ("", "customer_words")
    assert customer_words([{"role": "assistant", "content": "Hi"}]) == ""


@pytest.mark.slow
def test_the_default_model_writes_a_supported_summary(qwen_client):
    def chat(prompt):
        return "".join(qwen_client.chat_stream(prompt, temperature=0.0, max_tokens=96))
    summary, how = summarize(CONVERSATION, chat)
    assert how == "generated", summary
    assert "address" in summary.lower() and "?" not in summary
