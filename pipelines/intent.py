"""Intent detection from few-shot examples and sentence embeddings.

configs/intents.yaml (or INTENTS_PATH) lists examples per intent. A message is embedded once
(the same vector then searches the knowledge base) and scored against every intent as

    score(intent) = 0.5 * max cosine to its examples + 0.5 * cosine to their centroid
                    + lexical_weight * idf-weighted token overlap with its examples

The lexical term (the idf-weighted share of the message's words and CJK bigrams that the
intent's examples use) carries languages the English-trained embedding model reads poorly,
Chinese above all.

The best intent wins when its score clears `threshold` and beats the runner-up by `margin`;
otherwise the message is ambiguous (intent "other", `confident` False) and the pipeline asks
the user to clarify. `confidence` is a softmax over the scores, for display and metrics.

Built with `embed=None` (no embedding endpoint answers: the inference service is down at boot)
the detector is lexical only: the score is the lexical term alone, judged against
`lexical_threshold`. That keeps "talk to a human" and the topic of a question recognisable while
the web tier serves degraded answers.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from configs import resolve, shipped
from pipelines.embedding_cache import cached_embeddings, texts_key
from pipelines.knowledge_base import tokenize

DEFAULT_PATH = shipped("intents.yaml")
FALLBACK_INTENT = "other"


@dataclass(frozen=True)
class IntentResult:
    intent: str                 # the winner, or "other" when not confident
    top: str                    # the best-scoring intent, confident or not
    confidence: float           # softmax probability of the top intent
    confident: bool
    runner_up: str | None
    scores: dict[str, float]


def load_intents(path: str | os.PathLike | None = None) -> dict[str, list[str]]:
    path = resolve("intents.yaml", path, "INTENTS_PATH")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"intents: cannot read {path}: {exc}") from exc
    intents = (data or {}).get("intents") if isinstance(data, dict) else None
    if not isinstance(intents, dict) or len(intents) < 2:
        raise ValueError(f"intents: {path} needs an 'intents' mapping with at least two intents")
    out = {}
    for name, spec in intents.items():
        examples = (spec or {}).get("examples") if isinstance(spec, dict) else None
        if (not isinstance(examples, list) or not examples
                or not all(isinstance(e, str) and e.strip() for e in examples)):
            raise ValueError(f"intents: {name!r} needs a non-empty list of example strings")
        out[str(name)] = [e.strip() for e in examples]
    return out


class IntentDetector:
    def __init__(self, intents: dict[str, list[str]], embed, threshold: float = 0.35, margin: float = 0.01,
                 temperature: float = 0.05, lexical_weight: float = 0.3, lexical_threshold: float = 0.3,
                 lexical_margin: float = 0.1, cache_dir: str | os.PathLike | None = None,
                 model_name: str = "all-MiniLM-L6-v2"):
        """`embed(texts) -> [N, dim]` unit vectors (the inference client's embed), or None for a
        lexical-only detector. With `cache_dir` the examples' embeddings are kept on disk
        (pipelines/embedding_cache.py) and only a probe call is needed to rebuild."""
        self.names = list(intents)
        self.threshold, self.margin, self.temperature = threshold, margin, temperature
        self.lexical_weight = lexical_weight
        self.lexical_threshold, self.lexical_margin = lexical_threshold, lexical_margin
        examples = [e for name in self.names for e in intents[name]]
        # lexical evidence per intent: its examples' tokens, weighted by how few intents use them
        self._intent_tokens = [set().union(*(_lexical_tokens(e) for e in intents[n])) for n in self.names]
        df: dict[str, int] = {}
        for toks in self._intent_tokens:
            for t in toks:
                df[t] = df.get(t, 0) + 1
        self._idf = {t: float(np.log(1 + len(self.names) / d)) for t, d in df.items()}
        self._examples = self._centroids = None
        if embed is not None:
            if cache_dir is None:
                vecs = np.asarray(embed(examples), dtype=np.float32)              # [E, dim]
            else:
                vecs, _ = cached_embeddings(embed, examples, Path(cache_dir),
                                            texts_key("intents", model_name, examples))
            self._owner = np.repeat(np.arange(len(self.names)), [len(intents[n]) for n in self.names])
            self._examples = vecs
            centroids = np.stack([vecs[self._owner == i].mean(axis=0) for i in range(len(self.names))])
            self._centroids = centroids / np.linalg.norm(centroids, axis=1, keepdims=True)   # [I, dim]

    @property
    def lexical_only(self) -> bool:
        return self._examples is None

    def _lexical_scores(self, text: str) -> np.ndarray:
        """[I] idf-weighted share of the query's tokens that each intent's examples use (unknown
        tokens weigh as much as the rarest known ones)."""
        tokens = _lexical_tokens(text)
        if not tokens:
            return np.zeros(len(self.names), dtype=np.float32)
        unknown = float(np.log(1 + len(self.names)))
        weights = {t: self._idf.get(t, unknown) for t in tokens}
        total = sum(weights.values())
        return np.array([sum(w for t, w in weights.items() if t in toks) / total
                         for toks in self._intent_tokens], dtype=np.float32)

    def classify(self, query_vec: np.ndarray | None, text: str = "") -> IntentResult:
        """The intent of `text` (embedded as `query_vec`); with no vector, or on a lexical-only
        detector, from the lexical score alone."""
        if query_vec is None or self.lexical_only:
            scores = self._lexical_scores(text)                                   # [I]
            threshold, margin = self.lexical_threshold, self.lexical_margin
        else:
            sims = self._examples @ query_vec                                      # [E]
            best = np.full(len(self.names), -1.0, dtype=np.float32)
            np.maximum.at(best, self._owner, sims)
            scores = 0.5 * best + 0.5 * (self._centroids @ query_vec)             # [I]
            if self.lexical_weight:
                scores = scores + self.lexical_weight * self._lexical_scores(text)
            threshold, margin = self.threshold, self.margin
        order = np.argsort(-scores)
        top, second = int(order[0]), int(order[1])
        probs = np.exp((scores - scores[top]) / self.temperature)
        probs /= probs.sum()
        confident = bool(scores[top] >= threshold and scores[top] - scores[second] >= margin)
        return IntentResult(self.names[top] if confident else FALLBACK_INTENT, self.names[top],
                            round(float(probs[top]), 4), confident,
                            self.names[second], {n: round(float(s), 4) for n, s in zip(self.names, scores)})


def _lexical_tokens(text: str) -> set[str]:
    """Words and CJK bigrams (single CJK characters such as 的 or 了 match everything)."""
    return {t for t in tokenize(text) if len(t) > 1}
