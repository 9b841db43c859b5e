"""Answer selection on a help centre the code has not seen: the span that answers, the question
the help centre cannot answer, a follow-up, and two articles that disagree."""
from __future__ import annotations

import pytest

from pipelines.answer_selection import AnswerSelector, question_kind
from pipelines.knowledge_base import KnowledgeBase
from tests.pipelines.grounding_kb import write_kb


@pytest.fixture(scope="module")
def kb(embedder, tmp_path_factory):
    root = tmp_path_factory.mktemp("grounding")
    return KnowledgeBase(embedder.embed, write_kb(root / "kb"), root / "cache")


def select(kb, embedder, question, **kw):
    vec = embedder.embed([question])[0]
    return AnswerSelector(kb).select(question, vec, kb.search(question, vec, 3), **kw)


@pytest.mark.parametrize("question,fact", [
    ("How much is tuning a grand piano?", "165 EUR"),
    ("how long does a tuning visit take", "90 minutes"),
    ("If I cancel the day before, what does it cost?", "30 EUR"),
    ("How far ahead can I book a tuning?", "8 weeks"),
    ("how long should I wait to tune after moving my piano", "3 weeks"),
    ("is the first lesson free?", "free 30-minute trial"),
])
def test_the_span_stating_the_fact_is_selected(kb, embedder, question, fact):
    sel = select(kb, embedder, question)
    assert sel.answerable and fact in " ".join(s.quote for s in sel.spans), [c.span.quote for c in sel.candidates[:3]]


@pytest.mark.parametrize("question", ["Do you repair violins?", "What is the wifi password at the studio?",
                                      "Can I pay in bitcoin?", "Who is the owner of the Oakridge studio?",
                                      "In which country are the lesson pianos made?",
                                      "At what temperature should the studio be kept?"])
def test_questions_the_help_centre_does_not_answer_select_nothing(kb, embedder, question):
    vec = embedder.embed([question])[0]
    found = kb.search(question, vec, 3)
    assert not found or not AnswerSelector(kb).select(question, vec, found).answerable


def test_a_followup_prefers_its_own_words_and_a_new_fact(kb, embedder):
    first = select(kb, embedder, "How much is a visit for an upright piano?")
    assert "120 EUR" in first.spans[0].quote
    question = "How much is a visit for an upright piano? and for a grand?"
    second = select(kb, embedder, question, focus="and for a grand?", avoid=first.spans[0].quote)
    assert "165 EUR" in second.spans[0].quote


def test_question_kinds():
    assert question_kind("How long does it take?").search("3 business days")
    assert not question_kind("How long does it take?").search("at our studio")
    assert question_kind("How much is it?").search("120 EUR") and question_kind("How much is it?").search("$120")
    assert not question_kind("How much is it?").search("in 3 weeks")
    assert question_kind("what time do you open").search("9:00 am")
    assert question_kind("How many times can I exchange it?").search("Each item can be exchanged once.")
    assert not question_kind("How often should I oil it?").search("Oil it with 3 drops.")
    assert question_kind("how long, how often should I oil it").search("Oil it once a month.")   # frequency first
    assert question_kind("Where is the studio?") is None


def test_min_score_is_checked(kb):
    with pytest.raises(ValueError, match="min_score"):
        AnswerSelector(kb, min_score=2)


def test_a_refusal_is_quoted_with_the_sentence_beside_it(kb, embedder):
    sel = select(kb, embedder, "Can I get a refund for lessons after my block has started?")
    quoted = " ".join(s.quote for s in sel.spans)
    assert "We can't refund lessons" in quoted and "Unused lessons move to your next block." in quoted
    assert quoted.index("Unused") < quoted.index("We can't")            # in the article's order


def test_names_match_their_initials(kb, embedder):
    from pipelines.answer_selection import _stems
    assert {"nv", "north", "valley"} <= _stems("in the North Valley district")
    sel = select(kb, embedder, "Is a weekday visit in NV more expensive?")
    assert "20 EUR" in " ".join(s.quote for s in sel.spans)


def test_a_figure_the_help_centre_never_states_weakens_but_does_not_veto(kb, embedder):
    strong = select(kb, embedder, "Can I book a tuning visit online 12 weeks ahead?")
    assert strong.answerable and "8 weeks" in strong.spans[0].quote          # the real limit, quoted
    plain = select(kb, embedder, "Can I book a tuning visit online 8 weeks ahead?")
    assert plain.score > strong.score
    assert not select(kb, embedder, "Do you sell a 5-year tuning subscription?").answerable


def test_a_sentence_can_bring_in_a_chunk_the_chunk_gate_missed(kb, embedder):
    q = "do your teachers have a diploma"
    found = kb.search_spans(embedder.embed([q])[0], k=3, min_similarity=0.4)
    assert found and found[0].chunk.source == "lessons.md" and found[0].similarity >= 0.4
    lexical = KnowledgeBase(None, kb.path, kb.cache_dir)
    with pytest.raises(ValueError, match="lexical-only"):
        lexical.search_spans(embedder.embed([q])[0])
