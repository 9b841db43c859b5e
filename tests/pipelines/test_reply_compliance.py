"""Compliance on every reply, quoted text included: a help centre whose article contains a phrase
from the tenant's banned list. Every answer mode (extractive quotes, grounded generation and its
quoted fallbacks, free generation, the keyword-only degraded path) masks it; indexing the
article reports it (a warning naming the file and the term, and a metric)."""
from __future__ import annotations

import logging

import pytest

from app import create_app
from filters.banned_words import BannedWordFilter
from pipelines.inference_client import InferenceError
from pipelines.intent import IntentDetector, load_intents
from pipelines.knowledge_base import KnowledgeBase
from pipelines.support_chat import SupportChat, Tenant
from tests.pipelines.grounding_kb import write_kb
from tests.pipelines.test_grounded_chat import Core as ScriptedCore

BANNED = "best deal in town"
PROMPT = "You are the assistant of Keys & Strings, a piano-tuning service."
QUESTION = "How much does it cost to tune a grand piano?"


class Core(ScriptedCore):
    """test_grounded_chat's scripted model, which can also be down (chat or embeddings)."""

    def __init__(self, embedder, pieces=(), fail_chat=False, fail_embed=False):
        super().__init__(embedder, list(pieces))
        self.fail_chat, self.fail_embed = fail_chat, fail_embed

    def embed(self, texts):
        if self.fail_embed:
            raise InferenceError("embedding service down")
        return super().embed(texts)

    def chat_stream(self, messages, **kw):
        if self.fail_chat:
            raise InferenceError("model down")
        yield from super().chat_stream(messages, **kw)


@pytest.fixture(scope="module")
def kb_dir(tmp_path_factory):
    root = write_kb(tmp_path_factory.mktemp("banned") / "kb")
    article = root / "tuning-visits.md"
    article.write_text(article.read_text().replace("- **Grand piano**: 165 EUR per visit.",
                                                   f"- **Grand piano**: 165 EUR per visit, the {BANNED}."))
    return root


@pytest.fixture(scope="module")
def parts(embedder, kb_dir, tmp_path_factory):
    kb = KnowledgeBase(embedder.embed, kb_dir, tmp_path_factory.mktemp("cache"))
    return IntentDetector(load_intents(), embedder.embed), kb, BannedWordFilter([BANNED])


def reply_of(parts, core, mode, text=QUESTION):
    events = list(SupportChat(core, *parts).respond(Tenant("keys", "Keys & Strings", PROMPT, answer_mode=mode),
                                                    [], text))
    streamed = "".join(v for k, v in events if k == "token")
    done = events[-1][1]
    return streamed, done


@pytest.mark.parametrize("mode, core_args", [
    ("extractive", {}),                                                   # a quote of the article
    ("grounded_generation", {"pieces": ["Tuning a grand piano costs 165 EUR, ", f"the {BANNED}."]}),
    ("grounded_generation", {"pieces": []}),                              # nothing said: the quote
    ("grounded_generation", {"fail_chat": True}),                         # model down: the quote
    ("free", {"pieces": [f"It costs 165 EUR, the {BANNED}."]}),
    ("extractive", {"fail_embed": True}),                                 # keyword-only degraded path
])
def test_every_answer_mode_masks_a_banned_phrase(parts, embedder, mode, core_args):
    text = "grand piano visit price" if core_args.get("fail_embed") else QUESTION      # keywords alone
    streamed, done = reply_of(parts, Core(embedder, **core_args), mode, text)
    for text in (streamed, done.reply):
        assert BANNED not in text.lower() and "165 EUR" in text, text


def test_indexing_reports_the_article_and_the_term(kb_dir, tmp_path, caplog):
    banned = tmp_path / "banned.txt"
    banned.write_text(f"# tenant list\n{BANNED}\n")
    app = create_app({"KB_PATH": str(kb_dir), "KB_CACHE_DIR": str(tmp_path / "kb"), "REDIS_URL": None,
                      "BANNED_WORDS_PATH": str(banned)}, client=Core(None, fail_embed=True))
    services = app.extensions["support_chat"]["services"]
    with caplog.at_level(logging.WARNING, logger="app.services"):
        services.lexical()
    assert any("kb/tuning-visits.md" in r.getMessage() and BANNED in r.getMessage() for r in caplog.records)
    assert services.kb_banned_terms == {"tuning-visits.md": [BANNED]}
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'web_kb_banned_terms{source="kb/tuning-visits.md"} 1.0' in metrics
