"""Knowledge gaps: what customers ask that the help centre does not answer, grouped by meaning and
ranked by how often it is asked (Intercom Fin's "content gap suggestions").

A gap turn is a customer's question whose bot reply showed the help centre fell short:

    unanswerable   the help centre had nothing on it (the reply offered a human)
    low_support    the model's reply lost sentences the cited articles did not support
    handed_off     the customer then asked for a human (the question before the request)

One question counts once, with every reason it earned. Questions are clustered by embedding (the
MiniLM model the chat retrieves with), greedily: each joins the cluster whose centroid it is
closest to, when the cosine is at least `threshold`, else starts its own. When the embedder is
down, the same clustering runs on bags of words, and the result says so (`method`).
"""
from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import and_, select
from sqlalchemy.orm import aliased

from app.store.db import Database
from app.store.models import Conversation, Handoff, Message
from pipelines.faq_draft import HUMAN_INTENT
from pipelines.knowledge_base import stem, tokenize

REASONS = ("unanswerable", "low_support", "handed_off")
_GROUNDING_REASON = {"unanswerable": "unanswerable", "sentence_dropped": "low_support"}
MAX_TURNS = 2000                      # the newest gap turns a report clusters
EXAMPLES = 5
EMBED_THRESHOLD = 0.5                 # MiniLM: paraphrases 0.65-0.85, other topics below 0.45
WORDS_THRESHOLD = 0.4
_HASH_DIM = 2048


@dataclass
class GapTurn:
    question: str
    asked_at: dt.datetime
    conversation_id: str
    reasons: set[str] = field(default_factory=set)


def gap_turns(db: Database, tenant: str, start: dt.datetime, end: dt.datetime,
              limit: int = MAX_TURNS) -> list[GapTurn]:
    """The tenant's gap turns asked in [start, end), newest first, at most `limit`."""
    turns: dict[tuple[str, int], GapTurn] = {}
    with db.session(readonly=True) as s:
        user, bot = aliased(Message), aliased(Message)
        rows = s.execute(
            select(user.conversation_id, user.seq, user.content, user.created_at, bot.grounding)
            .join(bot, and_(bot.conversation_id == user.conversation_id, bot.seq == user.seq + 1))
            .join(Conversation, Conversation.id == user.conversation_id)
            .where(Conversation.tenant_id == tenant, user.role == "user", bot.role == "assistant",
                   bot.grounding.in_(list(_GROUNDING_REASON)), user.created_at >= start, user.created_at < end)
            .order_by(user.created_at.desc()).limit(limit)).all()
        for cid, seq, content, at, grounding in rows:
            turns.setdefault((cid, seq), GapTurn(content, at, cid)).reasons.add(_GROUNDING_REASON[grounding])
        handoffs = s.execute(
            select(Handoff.conversation_id, Handoff.requested_at).where(
                Handoff.tenant_id == tenant, Handoff.requested_at >= start, Handoff.requested_at < end)
            .order_by(Handoff.requested_at.desc()).limit(limit)).all()
        asked_at = defaultdict(list)
        for cid, at in handoffs:
            asked_at[cid].append(at)
        for batch in _chunks(list(asked_at), 500):
            messages = s.execute(
                select(Message.conversation_id, Message.seq, Message.role, Message.content, Message.intent,
                       Message.created_at)
                .where(Message.conversation_id.in_(batch)).order_by(Message.conversation_id, Message.seq)).all()
            by_conv = defaultdict(list)
            for m in messages:
                by_conv[m.conversation_id].append(m)
            for cid, msgs in by_conv.items():
                for at in asked_at[cid]:
                    seq = _question_before(msgs, at)
                    if seq is not None:
                        m = msgs[seq]
                        turns.setdefault((cid, m.seq), GapTurn(m.content, m.created_at, cid)).reasons.add("handed_off")
    return sorted(turns.values(), key=lambda t: t.asked_at, reverse=True)[:limit]


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _question_before(msgs: list, at: dt.datetime) -> int | None:
    """Index in `msgs` of the customer's last question before a handoff asked at `at`: the last
    customer message before it that was not itself the request for a human."""
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m.role != "user" or m.created_at > at:
            continue
        reply = msgs[i + 1] if i + 1 < len(msgs) else None
        if reply is not None and reply.role == "assistant" and reply.intent == HUMAN_INTENT:
            continue
        return i
    return None


def word_vectors(texts: list[str]) -> np.ndarray:
    """Unit bags of word stems, hashed: the clustering's vectors when the embedder is down."""
    out = np.zeros((len(texts), _HASH_DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for w in tokenize(text):
            out[i, zlib.crc32(stem(w).encode()) % _HASH_DIM] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1.0, norms)


def cluster(vectors: np.ndarray, weights: list[int], threshold: float) -> list[list[int]]:
    """Greedy centroid clustering of unit vectors, heaviest first: each row joins the cluster
    whose (weighted, renormalised) centroid is nearest, when the cosine reaches `threshold`."""
    order = sorted(range(len(vectors)), key=lambda i: -weights[i])
    members: list[list[int]] = []
    sums: list[np.ndarray] = []
    centroids = np.zeros((0, vectors.shape[1]), dtype=np.float32)
    for i in order:
        v = vectors[i]
        if len(members):
            cos = centroids @ v
            best = int(np.argmax(cos))
            if cos[best] >= threshold:
                members[best].append(i)
                sums[best] = sums[best] + weights[i] * v
                centroids[best] = sums[best] / max(float(np.linalg.norm(sums[best])), 1e-9)
                continue
        members.append([i])
        sums.append(weights[i] * v)
        centroids = np.vstack([centroids, v[None, :]])
    return members


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^\w\s]", "", text.lower())).strip()


def knowledge_gaps(turns: list[GapTurn], embed: Callable[[list[str]], np.ndarray] | None,
                   limit: int = 50) -> dict:
    """The gap turns' clusters, largest first (ties: most recently seen first)."""
    groups: dict[str, list[GapTurn]] = defaultdict(list)
    for t in turns:
        if t.question.strip():
            groups[_key(t.question) or t.question.strip()].append(t)
    keys = list(groups)
    texts = [groups[k][0].question for k in keys]
    method = "embeddings"
    vectors = None
    if embed is not None and texts:
        try:
            vectors = np.asarray(embed(texts), dtype=np.float32)
        except Exception:                       # the embedder is down: words still cluster
            vectors = None
    if vectors is None:
        method = "words"
        vectors = word_vectors(texts)
    weights = [len(groups[k]) for k in keys]
    threshold = EMBED_THRESHOLD if method == "embeddings" else WORDS_THRESHOLD
    clusters = []
    for rows in cluster(vectors, weights, threshold) if texts else []:
        members = [t for r in rows for t in groups[keys[r]]]
        centroid = vectors[rows].T @ np.asarray([weights[r] for r in rows], dtype=np.float32)
        label = texts[rows[int(np.argmax(vectors[rows] @ centroid))]]
        newest = sorted(members, key=lambda t: t.asked_at, reverse=True)
        examples = list(dict.fromkeys(t.question for t in newest))[:EXAMPLES]
        reasons = Counter(r for t in members for r in t.reasons)
        clusters.append({"id": "gap-" + hashlib.sha1(_key(label).encode()).hexdigest()[:12],
                         "label": label, "size": len(members), "examples": examples,
                         "last_seen": newest[0].asked_at.isoformat(),
                         "conversations": len({t.conversation_id for t in members}),
                         "reasons": {r: reasons.get(r, 0) for r in REASONS}})
    clusters.sort(key=lambda c: (c["size"], c["last_seen"]), reverse=True)
    return {"questions": len(turns), "method": method, "clusters": clusters[:limit]}


CSV_FIELDS = ("rank", "id", "size", "conversations", "label", "last_seen", *REASONS, "examples")


def gaps_csv(gaps: dict) -> str:
    """The clusters as CSV, one row each; examples joined with " | "."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for rank, c in enumerate(gaps["clusters"], 1):
        writer.writerow([rank, c["id"], c["size"], c["conversations"], _cell(c["label"]), c["last_seen"],
                         *(c["reasons"][r] for r in REASONS), _cell(" | ".join(c["examples"]))])
    return out.getvalue()


def _cell(text: str) -> str:
    """A cell a spreadsheet shows as text: a leading =, +, - or @ would be read as a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
