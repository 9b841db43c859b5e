"""The FAQ drafts store on SQLite and PostgreSQL: near-duplicates fold into one draft (the real
MiniLM embedder), approval publishes an article the knowledge base indexes, decisions happen once."""
from __future__ import annotations

import pytest

from app.store.conversations import ConversationStore
from app.store.faq_drafts import FaqDrafts
from app.store.handoffs import Conflict, NotFound
from app.store.models import Agent
from pipelines.knowledge_base import KnowledgeBase
from tests.helpers.databases import BACKENDS, migrated_database
from tests.helpers.paths import REPO_ROOT


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


def test_a_new_draft_embeds_only_its_own_question(db, tmp_path, embedder):
    embedded: list[str] = []

    def counting(texts):
        embedded.extend(texts)
        return embedder.embed(texts)
    drafts = FaqDrafts(db, tmp_path / "faq")
    questions = ["Do you ship to Norway?", "Can I pay with PayPal?", "Is the kettle dishwasher safe?",
                 "Do you ship to norway"]
    kept = [drafts.add("demo", None, q, "An answer.", embed=counting)["id"] for q in questions]
    assert kept[3] == kept[0]                                   # still merged on the cached vectors
    assert sorted(embedded) == sorted(questions)               # each question embedded once, not once per add


def test_drafts_merge_near_duplicates_and_publish_once_approved(db, tmp_path, embedder):
    with db.session() as s:
        s.add(agent := Agent(tenant_id="demo", email="a@x.test", name="A", password_hash="scrypt:unused"))
        s.flush()
        agent_id = agent.id
    sid = ConversationStore(db).create("demo")
    drafts = FaqDrafts(db, tmp_path / "faq")
    first = drafts.add("demo", sid, "Can you engrave a name on a cutting board?",
                       "We can engrave up to 20 characters on any cutting board.", embed=embedder.embed)
    again = drafts.add("demo", None, "can you engrave names on cutting boards", "Yes.", embed=embedder.embed)
    other = drafts.add("demo", None, "Do you sell refurbished laptops?", "No, only new ones.", embed=embedder.embed)
    assert again["id"] == first["id"] and again["merged"] == 1 and other["id"] != first["id"]
    assert drafts.add("other", None, "Can you engrave a name on a cutting board?", "x", embed=embedder.embed)["id"] \
        not in (first["id"], other["id"])                         # tenants never merge
    pending = drafts.list("demo", "pending")
    assert [d["id"] for d in pending] == [first["id"], other["id"]]             # the most asked first
    assert pending[0]["conversation_id"] == sid and pending[0]["status"] == "pending"

    with pytest.raises(NotFound):
        drafts.approve("other", first["id"], agent_id)
    done = drafts.approve("demo", first["id"], agent_id, answer="We engrave up to 20 characters on any board, "
                                                                "free of charge.")
    assert done["status"] == "approved" and done["answer"].startswith("We engrave up to 20")
    with pytest.raises(Conflict):
        drafts.reject("demo", first["id"], agent_id)
    assert drafts.reject("demo", other["id"], agent_id)["status"] == "rejected"
    assert [d["id"] for d in drafts.list("demo", "approved")] == [first["id"]]
    # a near-duplicate of an approved entry is counted on it, not drafted again
    assert drafts.add("demo", None, "can you engrave my cutting board", "x", embed=embedder.embed)["id"] == first["id"]

    article = (tmp_path / "faq" / "demo.md").read_text(encoding="utf-8")
    assert "## Can you engrave a name on a cutting board?" in article and "free of charge" in article
    kb = KnowledgeBase(embedder.embed, REPO_ROOT / "configs" / "kb", tmp_path / "cache", faq_path=tmp_path / "faq")
    question = "is engraving a cutting board possible?"
    vec = embedder.embed([question])[0]
    hits = kb.search(question, vec, k=1, tenant="demo")
    assert hits and hits[0].chunk.source == "approved-faq/demo.md"
    # another tenant's customers never get demo's approved answers, by any of the three searches
    for tenant in ("other", None):
        assert all(p.chunk.source.startswith("approved-faq/") is False
                   for p in kb.search(question, vec, k=5, tenant=tenant) + kb.search_spans(vec, k=10, tenant=tenant)
                   + kb.search_lexical("engrave cutting board", k=5, tenant=tenant))
    assert kb.search_lexical("engrave cutting board", k=1, tenant="demo")[0].chunk.source == "approved-faq/demo.md"
    assert kb.search_spans(vec, k=1, min_similarity=0.3, tenant="demo")[0].chunk.source == "approved-faq/demo.md"
    with pytest.raises(ValueError, match="cannot name an article"):
        drafts.article_path("../etc")
