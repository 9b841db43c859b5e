"""The help centre as a searchable knowledge base: a folder of Markdown articles, chunked along
headings, searched by BM25 and by embeddings, the two rankings fused by reciprocal rank fusion.

    article.md ── "# Title" ── "## Section" ... ──> chunks: (title, section, text, source)
    query ──> BM25 ranking ─┐
          └─> cosine ranking ┴─> RRF: sum 1 / (60 + rank) ──> top k above the relevance gate

The relevance gate is the best chunk's cosine similarity: below `min_similarity` nothing counts
as found and the bot says so instead of inventing an answer. Chunk embeddings are cached on disk,
keyed by the folder's fingerprint (names, sizes, mtimes) and the embedding model, and the index
is rebuilt when the folder changes (checked at most every `check_interval` seconds).

Built with `embed=None` the index is lexical only (BM25, `search_lexical`): what the web tier
serves from while no embedding endpoint answers.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi

from configs import resolve, shipped
from pipelines.answer_spans import Span, chunk_spans
from pipelines.embedding_cache import cached_embeddings
from pipelines.kb_chunk import Chunk

log = logging.getLogger(__name__)
DEFAULT_PATH = shipped("kb")
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "kb"
RRF_K = 60
FAQ_PREFIX = "approved-faq/"       # a tenant's approved FAQ drafts: approved-faq/<tenant>.md
MAX_CHUNK_WORDS = 220

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_STOP = frozenset(["a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how", "i",
                   "if", "in", "is", "it", "me", "my", "of", "on", "or", "our", "so", "that", "the", "this", "to",
                   "was", "we", "what", "when", "where", "which", "who", "will", "with", "you", "your"])


def tokenize(text: str) -> list[str]:
    """Lower-case words (no stop words) plus CJK characters and their bigrams."""
    text = text.lower()
    tokens = [w for w in _WORD.findall(text) if w not in _STOP]
    for run in _CJK.findall(text):
        tokens.extend(run)
        tokens.extend(run[i:i + 2] for i in range(len(run) - 1))
    return tokens


def stem(word: str) -> str:
    """A light suffix strip, so "refunds", "refunded" and "refunding" meet "refund"."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word       # "tune" meets "tuning"


@dataclass(frozen=True)
class Passage:
    chunk: Chunk
    score: float        # RRF score
    similarity: float   # cosine to the query


@dataclass(frozen=True)
class _Index:
    chunks: list[Chunk]
    vectors: np.ndarray | None          # [C, dim] chunk embeddings, None when lexical only
    bm25: BM25Okapi
    spans: list[Span]                   # the answer spans of all chunks
    span_vectors: np.ndarray | None     # [S, dim]
    span_ids: dict                      # chunk -> indices into spans
    owners: np.ndarray                  # [C] the tenant a chunk belongs to ("" for the help centre's)
    span_owners: np.ndarray             # [S]

    def visible(self, owners: np.ndarray, tenant: str | None) -> np.ndarray:
        """Which rows a tenant may retrieve: the help centre's, and its own approved FAQs."""
        return (owners == "") | (owners == (tenant or ""))


def article_owner(source: str) -> str:
    """The tenant an article belongs to: an approved FAQ article is its tenant's only
    (`approved-faq/<tenant>.md`); the help centre's articles are every tenant's ("")."""
    return Path(source).stem if source.startswith(FAQ_PREFIX) else ""


def chunk_article(text: str, source: str) -> list[Chunk]:
    """Split one Markdown article along its ## / ### headings; long sections by paragraphs."""
    title, section, body, chunks = Path(source).stem.replace("-", " ").capitalize(), "", [], []

    def flush() -> None:
        paras = [p.strip() for p in "\n".join(body).split("\n\n") if p.strip()]
        piece: list[str] = []
        for p in paras:
            if piece and sum(len(x.split()) for x in piece) + len(p.split()) > MAX_CHUNK_WORDS:
                chunks.append(Chunk(title, section, "\n\n".join(piece), source))
                piece = []
            piece.append(p)
        if piece:
            chunks.append(Chunk(title, section, "\n\n".join(piece), source))
        body.clear()

    for line in text.splitlines():
        if line.startswith("# ") and not chunks and not body:
            title = line[2:].strip()
        elif re.match(r"#{2,3} ", line):
            flush()
            section = line.lstrip("#").strip()
        else:
            body.append(line)
    flush()
    return chunks


class KnowledgeBase:
    def __init__(self, embed, path: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None,
                 min_similarity: float = 0.35, check_interval: float = 2.0, model_name: str = "all-MiniLM-L6-v2",
                 on_index=None, faq_path: str | os.PathLike | None = None):
        """`embed(texts) -> [N, dim]` unit vectors (the inference client's embed), or None for a
        lexical-only index. `on_index(chunks)` is called with every (re)indexed set of chunks
        (the compliance check of the articles). `faq_path`: a second folder of articles, the
        approved FAQ drafts (app/store/faq_drafts.py), indexed as `approved-faq/<file>` when it exists."""
        self.path = resolve("kb", path, "KB_PATH")
        if not self.path.is_dir():
            raise ValueError(f"knowledge base: {self.path} is not a directory")
        self.faq_path = Path(faq_path) if faq_path else None
        self.cache_dir = Path(cache_dir or os.environ.get("KB_CACHE_DIR") or DEFAULT_CACHE)
        self.embed, self.model_name = embed, model_name
        self.min_similarity, self.check_interval = min_similarity, check_interval
        self._lock = threading.Lock()
        self._checked = 0.0
        self.fingerprint = ""
        self._index: _Index | None = None
        self.num_builds = 0
        self.on_index = on_index
        self._reload(self._fingerprint())

    # ---- index ---------------------------------------------------------------------------
    def _files(self) -> list[tuple[str, Path]]:
        """(the article's name, its file), the help centre's first, then the FAQ folder's."""
        found = [(str(p.relative_to(self.path)), p) for p in sorted(self.path.rglob("*.md")) if p.is_file()]
        if self.faq_path is not None and self.faq_path.is_dir():
            found += [(f"{FAQ_PREFIX}{p.relative_to(self.faq_path)}", p) for p in sorted(self.faq_path.rglob("*.md"))
                      if p.is_file()]
        return found

    def _fingerprint(self) -> str:
        h = hashlib.sha256(self.model_name.encode())
        for name, p in self._files():
            try:
                st = p.stat()
            except FileNotFoundError:             # replaced while listed: the next check sees it
                continue
            h.update(f"{name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
        return h.hexdigest()[:24]

    def _reload(self, fingerprint: str) -> None:
        chunks = []
        for name, p in self._files():
            try:
                text = p.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"knowledge base: {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            found = chunk_article(text, name)
            if not found:
                raise ValueError(f"knowledge base: {p} has no text under its headings (an empty or broken article)")
            chunks.extend(found)
        if not chunks:
            raise ValueError(f"knowledge base: no Markdown articles in {self.path}")
        if self.on_index is not None:
            self.on_index(chunks)
        spans = [s for c in chunks for s in chunk_spans(c)]
        vecs = span_vecs = None
        if self.embed is not None:
            old = self._index if self._index is not None and self._index.vectors is not None else None
            known = dict(zip((c.embedding_text for c in old.chunks), old.vectors)) if old else None
            known_spans = dict(zip((sp.context for sp in old.spans), old.span_vectors)) if old else None
            vecs, fresh = cached_embeddings(self.embed, [c.embedding_text for c in chunks], self.cache_dir,
                                            fingerprint, known)
            span_vecs, fresh_spans = cached_embeddings(self.embed, [s.context for s in spans], self.cache_dir,
                                                       f"{fingerprint}-spans", known_spans)
            self.num_builds += fresh or fresh_spans
        bm25 = BM25Okapi([tokenize(f"{c.title} {c.section} {c.text}") for c in chunks])
        by_chunk: dict[Chunk, list[int]] = {}
        for i, s in enumerate(spans):
            by_chunk.setdefault(s.chunk, []).append(i)
        # one swap: searches never mix versions
        owners = np.array([article_owner(c.source) for c in chunks], dtype=object)
        span_owners = np.array([article_owner(sp.chunk.source) for sp in spans], dtype=object)
        self._index = _Index(chunks, vecs, bm25, spans, span_vecs, by_chunk, owners, span_owners)
        self.fingerprint = fingerprint

    @property
    def chunks(self) -> list[Chunk]:
        return self._index.chunks

    @property
    def lexical_only(self) -> bool:
        return self._index.vectors is None

    def spans(self, chunks: list[Chunk]) -> tuple[list[Span], np.ndarray | None]:
        """The answer spans of these chunks, in order, and their [S, dim] embeddings (None when
        the index is lexical only), from the same version of the index."""
        index = self._index
        ids = [i for c in chunks for i in index.span_ids.get(c, ())]
        vecs = index.span_vectors[ids] if index.span_vectors is not None else None
        return [index.spans[i] for i in ids], vecs

    @property
    def max_idf(self) -> float:
        return max(self._index.bm25.idf.values(), default=1.0)

    def knows(self, word: str) -> bool:
        """Whether any chunk uses the word (as tokenize writes it)."""
        return word in self._index.bm25.idf

    def idf(self, word: str) -> float:
        """The word's BM25 inverse document frequency over the chunks (0 for an unseen word)."""
        return max(0.0, float(self._index.bm25.idf.get(word, 0.0)))

    def refresh(self) -> None:
        """Rebuild the index if the folder changed (at most one check per check_interval). A
        rebuild that fails (a file vanishing mid-scan, an embedding error) keeps the old index."""
        now = time.monotonic()
        if now - self._checked < self.check_interval:
            return
        try:
            self.rebuild()
        except Exception:
            log.exception("knowledge base: rebuild of %s failed; keeping the previous index", self.path)

    def rebuild(self) -> bool:
        """Rebuild now if the folder changed; True if it did. Raises what the rebuild raised (the
        previous index stays). The embeddings land in the on-disk cache, keyed by the folder's
        fingerprint, where every other process sharing cache_dir finds them (the reindex task)."""
        with self._lock:
            self._checked = time.monotonic()
            fp = self._fingerprint()
            if fp == self.fingerprint:
                return False
            self._reload(fp)
            return True

    # ---- search --------------------------------------------------------------------------
    def search_lexical(self, query: str, k: int = 3, min_matched: float = 0.5,
                       tenant: str | None = None) -> list[Passage]:
        """BM25 alone, for when no embeddings can be had (the inference service is down): up to k
        passages that contain at least `min_matched` of the query's distinct words, best first.
        Every search sees the help centre and `tenant`'s own approved FAQs, no other tenant's."""
        self.refresh()
        index = self._index
        chunks, bm25 = index.chunks, index.bm25
        words = sorted(set(tokenize(query)))
        if not words:
            return []
        # the index holds words as written: let "refund" also match "refunds" and back
        forms = {w: {w, w + "s", w.removesuffix("s")} for w in words}
        scores = np.where(index.visible(index.owners, tenant),
                          bm25.get_scores(sorted(set().union(*forms.values()))), 0.0)
        out = []
        for i in np.argsort(-scores)[:k * 4]:
            if scores[i] <= 0:
                break
            have = set(tokenize(f"{chunks[i].title} {chunks[i].section} {chunks[i].text}"))
            if sum(bool(f & have) for f in forms.values()) >= min_matched * len(words):
                out.append(Passage(chunks[int(i)], round(float(scores[i]), 5), 0.0))
        return out[:k]

    def search_spans(self, query_vec: np.ndarray, k: int = 5, min_similarity: float = 0.5,
                     tenant: str | None = None) -> list[Passage]:
        """The chunks holding the k answer spans most similar to the query (a short question may
        match one sentence far better than the whole chunk it sits in), best first; the passage's
        similarity is its best span's."""
        self.refresh()
        index = self._index
        if index.span_vectors is None:
            raise ValueError("knowledge base: a lexical-only index has no embeddings; use search_lexical")
        sims = np.where(index.visible(index.span_owners, tenant), index.span_vectors @ query_vec, -np.inf)
        out: dict[Chunk, float] = {}
        for i in np.argsort(-sims)[:k]:
            if sims[i] < min_similarity:
                break
            chunk = index.spans[int(i)].chunk
            out.setdefault(chunk, round(float(sims[i]), 4))
        return [Passage(c, 0.0, sim) for c, sim in out.items()]

    def search(self, query: str, query_vec: np.ndarray, k: int = 3, depth: int = 20,
               tenant: str | None = None) -> list[Passage]:
        """Up to k passages, best first; [] when nothing clears the relevance gate."""
        self.refresh()
        index = self._index
        chunks, vectors, bm25 = index.chunks, index.vectors, index.bm25
        if vectors is None:
            raise ValueError("knowledge base: a lexical-only index has no embeddings; use search_lexical")
        visible = index.visible(index.owners, tenant)
        sims = np.where(visible, vectors @ query_vec, -np.inf)                      # [C]
        dense = np.argsort(-sims)[:depth]
        if sims[dense[0]] < self.min_similarity:
            return []
        fused: dict[int, float] = {}
        for rank, i in enumerate(dense):
            fused[int(i)] = 1.0 / (RRF_K + rank + 1)
        tokens = tokenize(query)
        if tokens:
            lexical = np.where(visible, bm25.get_scores(tokens), 0.0)
            for rank, i in enumerate(np.argsort(-lexical)[:depth]):
                if lexical[i] > 0:
                    fused[int(i)] = fused.get(int(i), 0.0) + 1.0 / (RRF_K + rank + 1)
        best = sorted(fused, key=lambda i: -fused[i])
        gate = self.min_similarity * 0.8          # fused neighbours may sit a little below the best
        return [Passage(chunks[i], round(fused[i], 5), round(float(sims[i]), 4))
                for i in best if sims[i] >= gate][:k]
