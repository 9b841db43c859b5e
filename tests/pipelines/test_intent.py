"""Intent detection on held-out utterances written for the shipped intents (English and Chinese),
off-topic messages left unconfident, and clear errors for bad intent files."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from pipelines.intent import FALLBACK_INTENT, IntentDetector, load_intents

HELDOUT = Path(__file__).parent / "data" / "intent_heldout.yaml"


@pytest.fixture(scope="module")
def detector(embedder):
    return IntentDetector(load_intents(), embedder.embed)


def test_heldout_accuracy(detector, embedder):
    held = yaml.safe_load(HELDOUT.read_text(encoding="utf-8"))
    intents = load_intents()
    rows = [(k, u) for k, us in held.items() for u in us]
    assert set(held) == set(intents) and len(rows) >= 60
    assert not {u for _, u in rows} & {e for ex in intents.values() for e in ex}, "held-out must not be training data"
    results = [detector.classify(v, u) for (_, u), v in zip(rows, embedder.embed([u for _, u in rows]))]
    right = Counter(k for (k, _), r in zip(rows, results) if r.top == k)
    accuracy = sum(right.values()) / len(rows)
    misses = [(k, u, r.top) for (k, u), r in zip(rows, results) if r.top != k]
    assert accuracy >= 0.85, misses
    assert all(right[k] >= 5 for k in held), right          # no intent is left behind
    # confident answers are mostly right; the rest go to "other" and the bot asks to clarify
    confident = [(k, r) for (k, _), r in zip(rows, results) if r.confident]
    assert len(confident) >= 0.85 * len(rows)
    assert sum(r.intent == k for k, r in confident) >= 0.85 * len(confident)


@pytest.mark.parametrize("text", ["asdf qwerty zxcv", "write me a poem about cats", "I like turtles"])
def test_off_topic_is_not_confident(detector, embedder, text):
    result = detector.classify(embedder.embed([text])[0], text)
    assert not result.confident and result.intent == FALLBACK_INTENT


def test_human_agent_requests_are_recognised(detector, embedder):
    for text in ("Can I talk to a real person please", "转人工客服"):
        assert detector.classify(embedder.embed([text])[0], text).intent == "human_agent", text


def test_bad_intent_files(tmp_path, monkeypatch):
    bad = tmp_path / "i.yaml"
    bad.write_text("intents:\n  only_one:\n    examples: [hi]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="at least two"):
        load_intents(bad)
    bad.write_text("intents:\n  a:\n    examples: [hi]\n  b:\n    examples: []\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'b'"):
        load_intents(bad)
    with pytest.raises(ValueError, match="cannot read"):
        load_intents(tmp_path / "missing.yaml")
    good = tmp_path / "g.yaml"
    good.write_text("intents:\n  a:\n    examples: [hi]\n  b:\n    examples: [bye]\n", encoding="utf-8")
    monkeypatch.setenv("INTENTS_PATH", str(good))
    assert load_intents() == {"a": ["hi"], "b": ["bye"]}
