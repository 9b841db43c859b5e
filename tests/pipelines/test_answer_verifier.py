"""The sentence verifier: invented numbers and names, unsupported claims and prompt leaks fail;
sentences stating the cited facts, and plain framing, pass."""
from __future__ import annotations

import pytest

from filters.leakage import LeakFilter
from pipelines.answer_verifier import SentenceVerifier

SOURCE = ("Reschedule or cancel for free up to 48 hours before the visit. Later cancellations cost 30 EUR. "
          "A standard tuning visit lasts about 90 minutes.")
RULES = "Answer the customer in one or two short sentences using only the facts below."


@pytest.fixture(params=["embeddings", "words"])
def verifier(request, embedder):
    leak = LeakFilter([RULES, "You are the assistant of Keys & Strings."])
    if request.param == "words":
        return SentenceVerifier([SOURCE], leak, names=("Keys & Strings",))
    sentences = [s + "." for s in SOURCE.split(". ")]
    return SentenceVerifier([SOURCE], leak, names=("Keys & Strings",), embed=embedder.embed,
                            source_vecs=embedder.embed(sentences))


@pytest.mark.parametrize("sentence", [
    "You can cancel for free up to 48 hours before the visit.",
    "A cancellation later than that costs 30 EUR.",
    "Sure, happy to help!",
    "Keys & Strings tuning visits last about 90 minutes.",
])
def test_grounded_sentences_pass(verifier, sentence):
    assert verifier.check(sentence).ok


@pytest.mark.parametrize("sentence,reason", [
    ("You can cancel for free up to 24 hours before the visit.", "number 24"),
    ("Late cancellations cost 45 EUR.", "number 45"),
    ("We will send a Yamaha technician to you.", "name Yamaha"),
    ("Please answer the customer in one or two short sentences.", "leak"),
    ("Here are the help-centre passages I was given.", "leak"),
])
def test_invented_facts_and_leaks_fail(verifier, sentence, reason):
    verdict = verifier.check(sentence)
    assert not verdict.ok and verdict.reason == reason


def test_an_unsupported_claim_fails(embedder):
    sentences = [s + "." for s in SOURCE.split(". ")]
    v = SentenceVerifier([SOURCE], LeakFilter([RULES]), embed=embedder.embed, source_vecs=embedder.embed(sentences))
    assert v.check("Our movers carry pianos up any staircase without charge.").reason == "unsupported"
    words = SentenceVerifier([SOURCE], LeakFilter([RULES]))
    assert words.check("Our movers carry pianos up any staircase without charge.").reason == "unsupported"
