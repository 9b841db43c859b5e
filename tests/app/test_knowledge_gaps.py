"""Knowledge gaps: the questions the help centre fell short on, read from the conversation database
(SQLite and PostgreSQL), clustered by the real MiniLM embedder, ranked and exported as CSV."""
from __future__ import annotations

import csv
import datetime as dt
import io

import pytest

from app.reports.knowledge_gaps import GapTurn, gap_turns, gaps_csv, knowledge_gaps
from app.store.conversations import ConversationStore
from app.store.handoffs import Handoffs
from app.store.models import utcnow
from tests.helpers.databases import BACKENDS, migrated_database

# three topics asked several ways, and two questions asked once; none of it is in the code
STUDENT = ["Is there a student discount?", "do students get money off", "any discount for university students??"]
SUNDAY = ["Do you deliver on Sundays?", "sunday delivery possible?", "can my parcel arrive on a sunday",
          "Do you deliver on Sundays?"]
REFURB = ["Do you sell refurbished laptops?", "can i buy a refurbished notebook from you"]
ONCE = ["What's the wattage of the kettle?", "Can I pay in Bitcoin?"]


def turns(questions: list[str], start: dt.datetime) -> list[GapTurn]:
    return [GapTurn(q, start + dt.timedelta(minutes=i), f"c{i}", {"unanswerable"}) for i, q in enumerate(questions)]


def partition(gaps: dict) -> list[set[str]]:
    return [set(c["examples"]) for c in gaps["clusters"]]


def test_paraphrases_cluster_together_and_the_largest_comes_first(embedder):
    now = utcnow()
    gaps = knowledge_gaps(turns(REFURB + SUNDAY + ONCE + STUDENT, now), embedder.embed)
    assert gaps["method"] == "embeddings" and gaps["questions"] == 11
    assert [c["size"] for c in gaps["clusters"]] == [4, 3, 2, 1, 1]
    assert partition(gaps)[:3] == [set(SUNDAY), set(STUDENT), set(REFURB)]
    sunday = gaps["clusters"][0]
    assert sunday["label"] in SUNDAY and sunday["conversations"] == 4
    assert len({c["id"] for c in gaps["clusters"]}) == 5 and sunday["id"].startswith("gap-")
    assert sunday["examples"][0] == "Do you deliver on Sundays?"              # the newest first, once
    assert sunday["last_seen"] == (now + dt.timedelta(minutes=5)).isoformat()
    assert sunday["reasons"] == {"unanswerable": 4, "low_support": 0, "handed_off": 0}
    assert knowledge_gaps(turns(REFURB + SUNDAY + ONCE + STUDENT, now), embedder.embed, limit=2)["clusters"] == \
        gaps["clusters"][:2]


def test_without_the_embedder_questions_sharing_words_still_cluster():
    def down(_texts):
        raise ConnectionError("inference service unavailable")
    questions = ["Do you deliver on Sundays?", "Sunday deliveries: do you deliver then?", "Can I pay in Bitcoin?"]
    gaps = knowledge_gaps(turns(questions, utcnow()), down)
    assert gaps["method"] == "words"
    assert partition(gaps) == [set(questions[:2]), {questions[2]}]
    assert knowledge_gaps([], None) == {"questions": 0, "method": "words", "clusters": []}


def test_csv_has_one_row_per_cluster_and_no_formulas(embedder):
    questions = ["=HYPERLINK(\"http://evil.test\") do you ship to mars?", *SUNDAY[:2]]
    gaps = knowledge_gaps(turns(questions, utcnow()), embedder.embed)
    rows = list(csv.DictReader(io.StringIO(gaps_csv(gaps))))
    assert [r["rank"] for r in rows] == ["1", "2"] and rows[0]["size"] == "2"
    assert [r["id"] for r in rows] == [c["id"] for c in gaps["clusters"]]
    assert set(rows[0]["examples"].split(" | ")) == set(SUNDAY[:2])
    assert rows[1]["label"].startswith("'=HYPERLINK") and rows[1]["unanswerable"] == "1"


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


def test_gap_turns_come_from_unanswered_low_support_and_handed_off_questions(db):
    store, handoffs = ConversationStore(db), Handoffs(db)

    def chat(tenant, *turns):
        sid = store.create(tenant)
        for question, grounding, intent in turns:
            store.append(tenant, sid, {"role": "user", "content": question})
            store.append(tenant, sid, {"role": "assistant", "content": "a reply", "grounding": grounding,
                                       "intent": intent})
        return sid
    chat("demo", ("How long do refunds take?", "quoted", "refund"))                       # answered: no gap
    chat("demo", ("Do you sell refurbished laptops?", "unanswerable", "other"))
    chat("demo", ("What's the kettle's wattage?", "sentence_dropped", "product_question"))
    asked_human = chat("demo", ("Can I pay in Bitcoin?", "unanswerable", "payment"),
                       ("I want to talk to a person", None, "human_agent"))
    handoffs.request("demo", asked_human)
    button = chat("demo", ("Why was my parcel opened?", "verified_generated", "shipping"))
    handoffs.request("demo", button)                                 # the widget's button: no request message
    only_human = chat("demo", ("get me a human", None, "human_agent"))
    handoffs.request("demo", only_human)                             # no question asked: no gap
    chat("other", ("Do you sell refurbished laptops?", "unanswerable", "other"))          # another tenant

    start, end = utcnow() - dt.timedelta(hours=1), utcnow() + dt.timedelta(minutes=1)
    got = {t.question: t.reasons for t in gap_turns(db, "demo", start, end)}
    assert got == {"Do you sell refurbished laptops?": {"unanswerable"},
                   "What's the kettle's wattage?": {"low_support"},
                   "Can I pay in Bitcoin?": {"unanswerable", "handed_off"},
                   "Why was my parcel opened?": {"handed_off"}}
    newest = gap_turns(db, "demo", start, end, limit=2)
    assert [t.question for t in newest] == ["Why was my parcel opened?", "Can I pay in Bitcoin?"]
    assert gap_turns(db, "demo", end, end + dt.timedelta(days=1)) == []
