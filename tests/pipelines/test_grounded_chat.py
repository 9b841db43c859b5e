"""Grounded answers through the support-chat pipeline, on a help centre the code has not seen:
quoted replies, verified generation (an invented figure is dropped), prompt leaks, questions the
help centre cannot answer, follow-ups and two articles that disagree."""
from __future__ import annotations

import pytest

from filters.banned_words import BannedWordFilter
from pipelines.inference_client import InferenceError
from pipelines.intent import IntentDetector, load_intents
from pipelines.knowledge_base import KnowledgeBase
from pipelines.support_chat import SupportChat, Tenant
from tests.pipelines.grounding_kb import write_kb

PROMPT = "You are the assistant of Keys & Strings, a piano-tuning service."
EXTRACTIVE = Tenant("keys", "Keys & Strings", PROMPT)
GROUNDED = Tenant("keys", "Keys & Strings", PROMPT, answer_mode="grounded_generation")


class Core:
    def __init__(self, embedder, pieces=None):
        self.embedder, self.pieces, self.prompts = embedder, pieces, []

    def embed(self, texts):
        return self.embedder.embed(texts)

    def count_tokens(self, text):
        return len(text.split())

    def max_model_len(self):
        return 2048

    def chat_stream(self, messages, **kw):
        if self.pieces is None:
            raise AssertionError("this answer mode must not call the model")
        self.prompts.append(messages)
        yield from self.pieces


class Turns(Core):
    """A model that writes one reply per call, in order."""
    def __init__(self, embedder, replies):
        super().__init__(embedder)
        self.replies = list(replies)

    def chat_stream(self, messages, **kw):
        self.prompts.append(messages)
        yield from self.replies.pop(0)


@pytest.fixture(scope="module")
def parts(embedder, tmp_path_factory):
    root = tmp_path_factory.mktemp("grounded")
    kb = KnowledgeBase(embedder.embed, write_kb(root / "kb"), root / "cache")
    return IntentDetector(load_intents(), embedder.embed), kb, BannedWordFilter.from_file()


def turn(parts, core, text, tenant=EXTRACTIVE, history=()):
    events = list(SupportChat(core, *parts).respond(tenant, list(history), text))
    assert events[-1][0] == "done" and all(k == "token" for k, _ in events[:-1])
    streamed = "".join(v for _, v in events[:-1])
    assert streamed.strip() == events[-1][1].reply
    return events[-1][1]


def test_extractive_quotes_the_answering_sentence_without_the_model(parts, embedder):
    reply = turn(parts, Core(embedder), "How much does it cost to tune a grand piano?")
    assert "165 EUR" in reply.reply and reply.grounding == "quoted"
    assert reply.citations == [{"title": "Tuning Visits", "source": "kb/tuning-visits.md"}]


class Down(Core):
    def chat_stream(self, messages, **kw):
        raise InferenceError("inference service unavailable")
        yield


def test_chinese_questions_get_the_quote_in_chinese_or_in_english_without_the_model(parts, embedder, tmp_path):
    glossary = tmp_path / "g.yaml"
    glossary.write_text("terms:\n  调音: tuning visit\n  三角钢琴: grand piano\n  多少钱: how much cost price\n",
                        encoding="utf-8")
    from pipelines.query_translation import Glossary
    chat = SupportChat(Down(embedder), *parts, glossary=Glossary(glossary))
    reply = list(chat.respond(EXTRACTIVE, [], "三角钢琴调音多少钱？"))[-1][1]
    assert "165 EUR" in reply.reply and reply.reply.startswith("根据帮助中心《Tuning Visits》")
    core = Turns(embedder, [["根据帮助中心《调音服务》：", "三角钢琴每次调音165 EUR。"]])
    reply = list(SupportChat(core, *parts, glossary=Glossary(glossary)).respond(EXTRACTIVE, [], "三角钢琴调音多少钱？"))
    assert reply[-1][1].reply == "根据帮助中心《调音服务》：三角钢琴每次调音165 EUR。"
    assert reply[-1][1].grounding == "quoted" and "165 EUR" in core.prompts[0][-1]["content"]


def test_grounded_generation_drops_a_sentence_with_an_invented_figure(parts, embedder):
    core = Core(embedder, ["Tuning a grand piano costs ", "165 EUR per visit. ", "Today you also get ",
                           "a 20% discount on it."])
    reply = turn(parts, core, "How much does it cost to tune a grand piano?", GROUNDED)
    assert "165 EUR" in reply.reply and "20%" not in reply.reply
    assert reply.grounding == "sentence_dropped"
    facts = core.prompts[0][-1]["content"]
    assert "165 EUR" in facts and "Moving a piano" not in facts         # only the selected spans


def test_grounded_generation_that_verifies_streams_as_written(parts, embedder):
    core = Core(embedder, ["A grand piano ", "tuning is 165 EUR per visit."])
    reply = turn(parts, core, "How much does it cost to tune a grand piano?", GROUNDED)
    assert reply.reply == "A grand piano tuning is 165 EUR per visit." and reply.grounding == "verified_generated"


def test_a_reply_repeating_the_instructions_is_replaced_by_the_quote(parts, embedder):
    core = Core(embedder, ["Copy every number, price, duration and name exactly as the facts write it. ",
                           "Facts: [1] Tuning Visits - Booking a visit"])
    reply = turn(parts, core, "How much does it cost to tune a grand piano?", GROUNDED)
    assert "Copy every number" not in reply.reply and "Facts:" not in reply.reply and "[1]" not in reply.reply
    assert "165 EUR" in reply.reply and reply.grounding == "sentence_dropped"


@pytest.fixture
def chinese_chat(parts, embedder, tmp_path):
    glossary = tmp_path / "g.yaml"
    glossary.write_text("terms:\n  调音: tuning visit\n  三角钢琴: grand piano\n  多少钱: how much cost price\n",
                        encoding="utf-8")
    from pipelines.query_translation import Glossary

    def ask(replies):
        core = Turns(embedder, replies)
        chat = SupportChat(core, *parts, glossary=Glossary(glossary))
        events = list(chat.respond(GROUNDED, [], "三角钢琴调音多少钱？"))
        assert "".join(v for k, v in events[:-1]).strip() == events[-1][1].reply
        return events[-1][1], core.prompts
    return ask


def test_a_chinese_question_gets_the_verified_reply_in_chinese(chinese_chat):
    reply, prompts = chinese_chat([["A grand piano tuning is ", "165 EUR per visit."],
                                   ["三角钢琴调音每次", "165 EUR。"]])
    assert reply.reply == "三角钢琴调音每次165 EUR。" and reply.grounding == "verified_generated"
    assert prompts[1][-1]["content"] == "A grand piano tuning is 165 EUR per visit."      # the verified English


def test_a_translation_that_alters_a_figure_keeps_the_english_reply(chinese_chat):
    reply, _ = chinese_chat([["A grand piano tuning is 165 EUR per visit."], ["三角钢琴调音每次150 EUR。"]])
    assert reply.reply == "A grand piano tuning is 165 EUR per visit."
    reply, _ = chinese_chat([["A grand piano tuning is 165 EUR per visit."], ["A grand piano costs 165 EUR."]])
    assert reply.reply == "A grand piano tuning is 165 EUR per visit."                   # not Chinese


@pytest.mark.parametrize("tenant", [EXTRACTIVE, GROUNDED])
@pytest.mark.parametrize("question", ["Do you repair violins?", "Can I pay in bitcoin?"])
def test_unanswerable_questions_say_so_and_offer_a_human(parts, embedder, tenant, question):
    reply = turn(parts, Core(embedder), question, tenant)            # never reaches the model
    assert reply.grounding in ("unanswerable", None) and "human" in reply.reply.lower()
    assert not any(ch.isdigit() for ch in reply.reply)


def test_a_followup_is_answered_with_the_previous_question(parts, embedder):
    history = [{"role": "user", "content": "How much is a visit for an upright piano?"},
               {"role": "assistant", "content": "Visit prices: Upright piano: 120 EUR per visit."}]
    reply = turn(parts, Core(embedder), "and for a grand?", history=history)
    assert "165 EUR" in reply.reply


def test_two_articles_that_disagree_get_one_clarifying_question(embedder, tmp_path):
    folder = write_kb(tmp_path / "kb")
    (folder / "first-visit.md").write_text(
        "# Your First Visit\n\n## How long it takes\n\nA standard tuning visit lasts about 60 minutes.\n",
        encoding="utf-8")
    parts = (IntentDetector(load_intents(), embedder.embed), KnowledgeBase(embedder.embed, folder, tmp_path / "c"),
             BannedWordFilter.from_file())
    reply = turn(parts, Core(embedder), "How long does a standard tuning visit last?")
    assert reply.grounding == "clarified" and reply.reply.count("?") == 1
    assert "Tuning Visits" in reply.reply and "Your First Visit" in reply.reply
    assert {c["source"] for c in reply.citations} == {"kb/tuning-visits.md", "kb/first-visit.md"}


def test_questions_about_reaching_people_are_answered_and_requests_hand_off(parts, embedder):
    reply = turn(parts, Core(embedder), "What hours is your phone line open to talk to a person?")
    assert "9:00 to 17:00" in reply.reply and not reply.handoff
    reply = turn(parts, Core(embedder), "I want to speak to a human agent please")
    assert reply.handoff and reply.grounding is None


def test_a_quote_never_repeats_a_list_lead_it_already_holds(parts):
    from pipelines.grounded_answer import quoted_reply
    kb = parts[1]
    spans, _ = kb.spans([c for c in kb.chunks if c.section == "Where we work"])
    assert len(spans) == 2
    text = quoted_reply(spans, "where do you work?")
    assert text.count("We visit homes anywhere") == 1 and "20 EUR" in text


def test_a_reply_missing_the_best_spans_new_figure_lacks_the_facts(parts):
    """The best span's figure is what was asked for: a reply stating another span's figure, or only
    the question's own, leaves it out; a figure counts whole."""
    from pipelines.grounded_answer import missing_facts
    kb = parts[1]
    spans, _ = kb.spans([c for c in kb.chunks if c.section == "Booking a visit"])
    grand = next(s for s in spans if "Grand piano" in s.text)
    upright = next(s for s in spans if "Upright piano" in s.text)
    ask = "How much is a grand piano tuning?"
    assert missing_facts("An upright piano tuning is 120 EUR per visit.", [grand, upright], ask)
    assert not missing_facts("A grand piano tuning is 165 EUR per visit.", [grand, upright], ask)
    assert missing_facts("It is 1165 EUR.", [grand], ask)
    assert not missing_facts("Yes, it is 165 EUR per visit.", [grand], "Is a grand piano tuning 165 EUR?")
    lessons = kb.spans([c for c in kb.chunks if c.section == "Trial lesson"])[0]
    no_figure = next(s for s in lessons if "refund" in s.text)
    assert missing_facts("We cannot refund lessons.", [no_figure, upright], "Can I get a refund?")
    assert not missing_facts("We cannot refund lessons.", [no_figure], "Can I get a refund?")


def test_a_reply_missing_the_best_spans_new_name_lacks_the_facts():
    """A name the best span adds (an app, a page of the account) must be in the reply; the
    tenant's own name and names the customer already used do not count."""
    from pipelines.answer_spans import Span
    from pipelines.grounded_answer import missing_facts
    from pipelines.kb_chunk import Chunk
    chunk = Chunk("Smart plug setup", "Pairing", "", "plug.md")
    app = Span(chunk, "You'll need the free Keyhole Home app from Keys & Strings, on your phone's app store.", "", 0)
    ask = "which app do I need for the plug?"
    assert missing_facts("You need the app from your phone's app store.", [app], ask, known=("Keys & Strings",))
    assert not missing_facts("Get the free Keyhole Home app.", [app], ask, known=("Keys & Strings",))
    assert not missing_facts("It is free in the app store.", [app], "is the Keyhole Home app free?",
                             known=("Keys & Strings",))


def test_a_reply_without_the_best_spans_address_lacks_the_facts():
    """An email or web address the best span gives is the answer to "where do I write?": a reply
    without it lacks the facts, unless the customer already wrote it."""
    from pipelines.answer_spans import Span
    from pipelines.grounded_answer import missing_facts
    from pipelines.kb_chunk import Chunk
    chunk = Chunk("Contact", "Email", "", "contact.md")
    mail = Span(chunk, "Write to tuning@keys-strings.example or use the form at https://keys-strings.example/help.",
                "", 0)
    ask = "how do i reach you by mail"
    assert missing_facts("We answer every message within a day.", [mail], ask)
    assert missing_facts("Write to tuning@keys-strings.example.", [mail], ask)           # the form's address
    assert not missing_facts("Write to tuning@keys-strings.example or use https://keys-strings.example/help.",
                             [mail], ask)
    assert not missing_facts("Or use https://keys-strings.example/help.", [mail],
                             "is tuning@keys-strings.example your address?")


def test_a_reply_that_only_restates_the_question_lacks_the_facts():
    """"No, you can't X." to "Can I X?" gives no reason: the help centre's span is added."""
    from pipelines.answer_spans import Span
    from pipelines.grounded_answer import missing_facts, restates
    from pipelines.kb_chunk import Chunk
    care = Span(Chunk("Care", "Cast iron", "", "care.md"),
                "Never put cast iron in the dishwasher: it strips the seasoning and rusts.", "", 0)
    ask = "can my cast iron skillet go in the dishwasher or nah"
    assert restates("No, your cast iron skillet can't go in the dishwasher.", ask)
    assert restates("Yes, you can put a skillet you've used in the dishwasher!",
                    "Can I put a skillet I've used in the dishwasher?")
    assert missing_facts("No, your cast iron skillet cannot go in the dishwasher.", [care], ask)
    assert not restates("No, the dishwasher strips the seasoning.", ask)
    assert not missing_facts("No: the dishwasher strips the seasoning and the pan rusts.", [care], ask)
