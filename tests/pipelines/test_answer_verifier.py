"""The sentence verifier: invented numbers and names, unsupported claims and prompt leaks fail;
sentences stating the cited facts, and plain framing, pass."""
from __future__ import annotations

import pytest

from filters.leakage import LeakFilter
from pipelines.answer_verifier import SentenceVerifier

SOURCE = ("Reschedule or cancel for free up to 48 hours before the visit. Later cancellations cost 30 EUR. "
          "A standard tuning visit lasts about 90 minutes.")
RULES = "Answer the customer in one or two short sentences using only the facts below."


def build(source: str, kind: str, embedder, leak: LeakFilter, names: tuple[str, ...] = ()) -> SentenceVerifier:
    """A verifier over one passage: with its sentences embedded as the spans, or on word overlap."""
    if kind == "words":
        return SentenceVerifier([source], leak, names=names)
    spans = [s if s.endswith(".") else s + "." for s in source.split(". ")]
    return SentenceVerifier([source], leak, names=names, embed=embedder.embed, source_vecs=embedder.embed(spans),
                            span_texts=spans)


@pytest.fixture(params=["embeddings", "words"])
def verifier(request, embedder):
    leak = LeakFilter([RULES, "You are the assistant of Keys & Strings."])
    return build(SOURCE, request.param, embedder, leak, names=("Keys & Strings",))


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


REFUNDS = ("Refunds always go back to the original payment method used for the order. We can't send a refund "
           "to a different card or bank account. Bikes cost €4 per day (€7 per day for e-bikes), and the "
           "theft excess is €50.")


@pytest.fixture(params=["embeddings", "words"])
def refunds(request, embedder):
    return build(REFUNDS, request.param, embedder, LeakFilter([RULES]))


@pytest.mark.parametrize("sentence", [
    "Yes, you can send a refund to a different card.",
    "We can refund your order to a different bank account.",
])
def test_a_yes_where_the_help_centre_says_no_fails(refunds, sentence):
    assert refunds.check(sentence).reason == "polarity"


@pytest.mark.parametrize("sentence", [
    "No, we can't send a refund to a different card.",
    "Your refund always goes back to the original payment method.",
    "An e-bike costs €7 per day.",
    "The theft excess is €50.",
])
def test_restated_facts_keep_their_polarity_and_context(refunds, sentence):
    assert refunds.check(sentence).ok, refunds.check(sentence)


@pytest.mark.parametrize("sentence,reason", [
    ("An e-bike costs €50 per day.", "number 50 in another context"),
    ("The theft excess is £50.", "number 50 in another context"),
    ("E-bikes cost 4 euros an hour.", "number 4 in another context"),
])
def test_a_number_moved_to_another_fact_fails(refunds, sentence, reason):
    assert refunds.check(sentence).reason == reason


def test_a_list_items_polarity_comes_with_its_lead(embedder):
    lead_item = "These items can't be returned: opened socks and underwear, for hygiene reasons."
    v = SentenceVerifier([lead_item], LeakFilter([RULES]), embed=embedder.embed,
                         source_vecs=embedder.embed(["Opened socks and underwear, for hygiene reasons."]),
                         span_texts=[lead_item])
    assert v.check("Yes, you can return opened socks and underwear.").reason == "polarity"
    assert v.check("No, opened socks and underwear can't be returned, for hygiene reasons.").ok


def test_a_range_a_count_in_words_and_a_placeholder_are_checked(embedder):
    text = "The pending charge disappears within 3-5 business days. Each item can be exchanged once."
    v = build(text, "embeddings", embedder, LeakFilter([RULES]))
    assert v.check("The pending charge disappears within 3-5 business days.").ok
    assert v.check("The pending charge will go away within 5 business days.").reason == "number 5 in another context"
    assert v.check("You can exchange an item up to seven times.").reason == "number seven"
    assert v.check("The charge is refunded to [EMAIL] soon.").reason == "placeholder [EMAIL]"


CHARGE = ("A full charge takes about 2 hours and gives up to 30 hours of playback on Aura and 6 hours on "
          "Pulse (24 hours with the case). We don't currently offer phone support.")


@pytest.fixture(params=["embeddings", "words"])
def charge(request, embedder):
    return build(CHARGE, request.param, embedder, LeakFilter([RULES]))


@pytest.mark.parametrize("sentence", [
    "A full charge takes about 2 hours.",
    "Aura gives up to 30 hours of playback.",
    "Pulse plays for 6 hours, or 24 hours with the case.",
])
def test_numbers_kept_with_their_facts_pass(charge, sentence):
    assert charge.check(sentence).ok, charge.check(sentence)


@pytest.mark.parametrize("sentence,reason", [
    ("A full charge of the headphones takes about 6 hours.", "number 6 of another fact"),
    ("Fully charging the headphones takes about 30 hours.", "number 30 of another fact"),
])
def test_a_number_taken_from_the_next_fact_fails(charge, sentence, reason):
    assert charge.check(sentence).reason == reason


@pytest.mark.parametrize("sentence,reason", [("Yes.", "bare yes or no"), ("No!", "bare yes or no"),
                                             ("Yes, you can ring us.", None)])
def test_a_yes_or_no_answer_is_checked_like_a_claim(charge, sentence, reason):
    verdict = charge.check(sentence)
    assert not verdict.ok
    assert reason is None or verdict.reason == reason


WARRANTY = ("Every amplifier comes with a 2-year warranty from delivery. We review repair claims within 3-5 "
            "business days.\nTuning visits can be booked for:\n- Weekdays: 9:00-18:00 in Lyon.\n")


@pytest.mark.parametrize("sentence,ok", [
    ("The warranty on amplifiers is 3-5 business days.", False),      # the review's figure, the warranty's subject
    ("Amplifier repairs are free for 9 years.", False),
    ("It takes 3-5 business days to review a repair claim.", True),
    ("Your amplifier's warranty lasts 2 years.", True),
    ("You can book tuning visits 9:00-18:00.", True),                  # a list item with its lead
])
def test_a_number_keeps_its_subject(embedder, sentence, ok):
    """A figure stated of something the passage sentences stating it do not mention is moved."""
    words = build(WARRANTY, "words", embedder, LeakFilter([RULES])).check(sentence)
    assert words.ok == ok, words
    assert ok or words.reason.startswith("number")
    # the cosine path may drop more, never for the subject of a kept figure
    embedded = build(WARRANTY, "embeddings", embedder, LeakFilter([RULES])).check(sentence)
    assert not embedded.ok if not ok else "subject" not in embedded.reason
    # a sentence with nothing but the figure and its unit has no subject to lose
    assert "subject" not in build(WARRANTY, "words", embedder, LeakFilter([RULES])).check(
        "It usually takes 3-5 business days.").reason


def test_a_yes_or_no_is_held_to_the_chosen_answer_span(embedder):
    """A sentence opening with Yes or No answers the question: its polarity must be the chosen
    answer span's, even where another cited span is closer in words."""
    text = ("Double-check your address at checkout, because it's the easiest time to fix the address. "
            "Once an order has shipped, we can no longer change the address.")
    answer = "Once an order has shipped, we can no longer change the address."
    for kind in ("embeddings", "words"):
        plain = build(text, kind, embedder, LeakFilter([RULES]))
        spans = [s if s.endswith(".") else s + "." for s in text.split(". ")]
        held = SentenceVerifier([text], LeakFilter([RULES]), answer_span=answer,
                                **({} if kind == "words" else {"embed": embedder.embed,
                                                               "source_vecs": embedder.embed(spans),
                                                               "span_texts": spans}))
        claim = "Yes, you can still fix the address at checkout."
        assert held.check(claim).reason == "polarity", kind
        assert plain.check(claim).reason != "polarity", kind     # the closer span says yes
        assert held.check("No, once it has shipped we can no longer change the address.").reason != "polarity", kind
    # and a yes or no still agrees with the closest span: both must
    refund = ("Refunds always go back to the original payment method. We can't send a refund to a different "
              "card or bank account.")
    v = SentenceVerifier([refund], LeakFilter([RULES]), answer_span="Refunds always go back to the original "
                         "payment method.")
    assert v.check("Yes, you can send your refund to a different card or bank account.").reason == "polarity"
