"""FAQ drafts from resolved conversations: which question and answer are taken, and how the
model's wording is checked against the agent's answer (the real SentenceVerifier)."""
from __future__ import annotations

from filters.leakage import LeakFilter
from pipelines.answer_verifier import SentenceVerifier
from pipelines.faq_draft import FAQ_RULES, compose, exchange, faq_article
from pipelines.knowledge_base import chunk_article

ANSWER = "We can engrave up to 20 characters on any cutting board. Engraving adds 3 business days to delivery."


def msg(role, content, **kw):
    return {"role": role, "content": content, **kw}


def test_the_question_before_the_request_for_a_human_and_the_agents_answer():
    messages = [msg("user", "hi"), msg("assistant", "Hello! How can I help?", intent="greeting"),
                msg("user", "Can you engrave a name on a cutting board?"),
                msg("assistant", "I couldn't find that in our help centre.", grounding="unanswerable"),
                msg("user", "let me talk to a person"), msg("assistant", "Connecting you.", intent="human_agent"),
                msg("agent", "Hi, this is Priya. " + ANSWER, author={"name": "Priya"}),
                msg("user", "great, thanks"),
                msg("agent", "Thanks for waiting! Have a nice day.", author={"name": "Priya"})]
    assert exchange(messages) == ("Can you engrave a name on a cutting board?", ANSWER)
    assert exchange(messages[:6]) is None                                  # no agent answered
    assert exchange([msg("user", "a human please"), msg("assistant", "Connecting.", intent="human_agent"),
                     msg("agent", ANSWER)]) is None                        # no question was asked


def check():
    verifier = SentenceVerifier([ANSWER], LeakFilter([FAQ_RULES]))
    return lambda sentence: verifier.check(sentence).ok


def test_the_models_wording_is_kept_when_the_agents_answer_supports_it():
    def chat(_messages):
        return ("Question: Can you engrave a cutting board?\nAnswer: We can engrave up to 20 characters on any "
                "cutting board. Engraving adds 3 business days to delivery.")
    entry = compose("can u engrave a name on my board", ANSWER, chat, check())
    assert entry.how == "model" and entry.question == "Can you engrave a cutting board?"
    assert "20 characters" in entry.answer and "3 business days" in entry.answer


def test_invented_figures_and_non_questions_fall_back_to_the_conversations_words():
    def invents(_messages):
        return "Question: Engraving\nAnswer: We engrave up to 40 characters for free within 2 days."
    entry = compose("Can you engrave a name on a cutting board?", ANSWER, invents, check())
    assert entry.how == "agent_words" and entry.answer == ANSWER
    assert entry.question == "Can you engrave a name on a cutting board?"

    def down(_messages):
        raise ConnectionError("inference unavailable")
    assert compose("Can you engrave?", ANSWER, down, check()).answer == ANSWER
    assert compose("Can you engrave?", ANSWER, None, check()).how == "agent_words"


def test_approved_entries_make_one_article_with_a_section_each():
    text = faq_article([("Can you engrave a cutting board?", ANSWER), ("## Do you ship\nto Mars?", "No.\n# never")])
    chunks = chunk_article(text, "approved-faq/demo.md")
    assert [c.section for c in chunks] == ["Can you engrave a cutting board?", "Do you ship to Mars?"]
    assert chunks[1].text.strip() == "No. # never"
