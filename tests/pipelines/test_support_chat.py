"""The support-chat pipeline when the inference core fails: every stage degrades to a useful,
marked reply (never an exception), and what the model says passes the stream filters."""
from __future__ import annotations

import pytest

from filters.banned_words import BannedWordFilter
from pipelines.inference_client import InferenceError
from pipelines.intent import IntentDetector, load_intents
from pipelines.knowledge_base import KnowledgeBase
from pipelines.support_chat import SupportChat, Tenant

# generation paths: the model's text is what streams (answer modes: tests/pipelines/test_grounded_chat.py)
TENANT = Tenant("demo", "Northwind Goods", "You help Northwind customers.", answer_mode="free")
GROUNDED = Tenant("demo", "Northwind Goods", "You help Northwind customers.", answer_mode="grounded_generation")


class Core:
    """The real embedder; generation scripted (its text, or a failure at a chosen point)."""

    def __init__(self, embedder, reply_pieces=(), fail=None):
        self.embedder, self.pieces, self.fail = embedder, list(reply_pieces), fail

    def embed(self, texts):
        if self.fail == "embed":
            raise InferenceError("embedder down")
        return self.embedder.embed(texts)

    def count_tokens(self, text):
        if self.fail == "tokens":
            raise InferenceError("service down")
        return len(text.split())

    def max_model_len(self):
        return 2048

    def chat_stream(self, messages, **kw):
        for i, piece in enumerate(self.pieces):
            if self.fail == "mid-stream" and i == 2:
                raise InferenceError("connection reset")
            yield piece


@pytest.fixture(scope="module")
def parts(embedder, tmp_path_factory):
    return (IntentDetector(load_intents(), embedder.embed),
            KnowledgeBase(embedder.embed, cache_dir=tmp_path_factory.mktemp("kb")), BannedWordFilter.from_file())


def turn(parts, core, text="How long does a refund take?", tenant=TENANT):
    chat = SupportChat(core, *parts)
    events = list(chat.respond(tenant, [], text))
    assert events[-1][0] == "done" and all(k == "token" for k, _ in events[:-1])
    return "".join(v for k, v in events[:-1]), events[-1][1]


def test_reply_is_filtered_while_it_streams(parts, embedder):
    pieces = ["Refunds take 5-10 days. Wr", "ite to jane", ".doe@exa", "mple.com, not the coun", "terfeit shop."]
    streamed, reply = turn(parts, Core(embedder, pieces))
    assert "jane.doe" not in streamed and "counterfeit" not in streamed.lower()
    assert "[EMAIL]" in reply.reply and reply.citations and not reply.degraded


@pytest.mark.parametrize("tenant,fail", [(TENANT, "embed"), (TENANT, "tokens"), (TENANT, "mid-stream"),
                                         (GROUNDED, "embed"), (GROUNDED, "mid-stream")])
def test_failures_degrade_instead_of_raising(parts, embedder, tenant, fail):
    _, reply = turn(parts, Core(embedder, ["Refunds ", "take ", "five ", "days."], fail=fail), tenant=tenant)
    assert reply.degraded and "human" in reply.reply.lower()
    # the best passage is still cited (without embeddings: found by keywords alone)
    assert reply.citations and reply.citations[0]["source"].startswith("kb/")
    assert "refund" in reply.citations[0]["title"].lower() or "refund" in reply.reply.lower()


def test_no_embeddings_and_no_keyword_match_offers_a_human(parts, embedder):
    _, reply = turn(parts, Core(embedder, [], fail="embed"), text="zqxv wibble flarn")
    assert reply.degraded and not reply.citations and "human" in reply.reply.lower()


@pytest.mark.parametrize("question", ["What times are live agents available in UK time?",
                                      "What are your live agent hours?"])
def test_asking_when_agents_work_is_answered_not_handed_off(parts, embedder, question):
    extractive = Tenant("demo", "Northwind Goods", "You help Northwind customers.")
    streamed, reply = turn(parts, Core(embedder), question, extractive)
    assert not reply.handoff and "20:00" in streamed
