"""FAQ drafts in the conversation store (table faq_drafts), and the help-centre articles the
approved ones become.

    add       a new draft stays pending; one whose question is a near-duplicate of a pending or
              approved draft of the tenant (MiniLM cosine >= 0.85, or the same words without the
              embedder) is folded into it instead (`merged` counts them)
    approve   pending -> approved, with the agent's edit if any; the tenant's article is rewritten
    reject    pending -> rejected

Approved drafts are written, per tenant, to `<FAQ_PATH>/<tenant>.md` (pipelines/faq_draft.py
faq_article), a folder the knowledge base indexes beside the help centre's own.
"""
from __future__ import annotations

import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sqlalchemy import select, update

from app.store.conversations import iso
from app.store.db import Database
from app.store.handoffs import Conflict, NotFound
from app.store.models import FaqDraft, utcnow
from pipelines.faq_draft import faq_article

DUPLICATE_COSINE = 0.85
EMBED_CACHE_ENTRIES = 4096      # questions whose vectors are kept: a new draft embeds only itself
_SAFE_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def draft_view(d: FaqDraft) -> dict:
    return {"id": d.id, "question": d.question, "answer": d.answer, "conversation_id": d.conversation_id,
            "status": d.status, "merged": d.merged, "created_at": iso(d.created_at), "decided_at": iso(d.decided_at)}


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


class FaqDrafts:
    def __init__(self, db: Database, folder: str | os.PathLike):
        self.db, self.folder = db, Path(folder)
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._vectors_lock = threading.Lock()

    def _embedded(self, texts: list[str], embed) -> np.ndarray:
        """[N, dim] vectors of `texts`, embedding only those not seen before (least recently used
        dropped past EMBED_CACHE_ENTRIES)."""
        with self._vectors_lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
            if missing:
                self._vectors.update(zip(missing, np.asarray(embed(missing), dtype=np.float32)))
            for t in texts:
                self._vectors.move_to_end(t)
            out = np.stack([self._vectors[t] for t in texts])
            while len(self._vectors) > EMBED_CACHE_ENTRIES:
                self._vectors.popitem(last=False)
        return out

    def add(self, tenant: str, conversation_id: str | None, question: str, answer: str,
            embed: Callable[[list[str]], np.ndarray] | None = None) -> dict:
        """Store a pending draft, or fold it into its near-duplicate; returns the draft kept."""
        with self.db.session() as s:
            live = s.scalars(select(FaqDraft).where(FaqDraft.tenant_id == tenant,
                                                    FaqDraft.status.in_(("pending", "approved")))
                             .order_by(FaqDraft.id)).all()
            same = self._duplicate(question, [d.question for d in live], embed)
            if same is not None:
                s.execute(update(FaqDraft).where(FaqDraft.id == live[same].id).values(merged=FaqDraft.merged + 1))
                s.flush()
                s.refresh(live[same])
                return draft_view(live[same])
            draft = FaqDraft(tenant_id=tenant, conversation_id=conversation_id, question=question, answer=answer,
                             status="pending", merged=0)
            s.add(draft)
            s.flush()
            return draft_view(draft)

    def _duplicate(self, question: str, others: list[str], embed) -> int | None:
        if not others:
            return None
        if embed is not None:
            try:
                vecs = self._embedded([question, *others], embed)
                cos = vecs[1:] @ vecs[0]
                best = int(np.argmax(cos))
                return best if cos[best] >= DUPLICATE_COSINE else None
            except Exception:               # the embedder is down: only the same words match
                pass
        key = _words(question)
        return next((i for i, q in enumerate(others) if _words(q) == key), None)

    def list(self, tenant: str, status: str, limit: int = 100) -> list[dict]:
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(FaqDraft).where(FaqDraft.tenant_id == tenant, FaqDraft.status == status)
                             .order_by(FaqDraft.merged.desc(), FaqDraft.id.desc()).limit(limit)).all()
            return [draft_view(d) for d in rows]

    def _decide(self, tenant: str, draft_id: int, agent_id: int, status: str, **edit) -> dict:
        with self.db.session() as s:
            draft = s.scalar(select(FaqDraft).where(FaqDraft.id == draft_id, FaqDraft.tenant_id == tenant))
            if draft is None:
                raise NotFound(str(draft_id))
            moved = s.execute(update(FaqDraft).where(FaqDraft.id == draft_id, FaqDraft.status == "pending")
                              .values(status=status, decided_at=utcnow(), decided_by=agent_id,
                                      **{k: v for k, v in edit.items() if v is not None}))
            if moved.rowcount != 1:
                raise Conflict(f"this draft is already {draft.status}")
            s.flush()
            s.refresh(draft)
            return draft_view(draft)

    def approve(self, tenant: str, draft_id: int, agent_id: int, question: str | None = None,
                answer: str | None = None) -> dict:
        """Approve a pending draft (with the agent's edit) and rewrite the tenant's article."""
        done = self._decide(tenant, draft_id, agent_id, "approved", question=question, answer=answer)
        self.write_article(tenant)
        return done

    def reject(self, tenant: str, draft_id: int, agent_id: int) -> dict:
        return self._decide(tenant, draft_id, agent_id, "rejected")

    def article_path(self, tenant: str) -> Path:
        if not _SAFE_TENANT.match(tenant):
            raise ValueError(f"tenant id {tenant!r} cannot name an article file")
        return self.folder / f"{tenant}.md"

    def write_article(self, tenant: str) -> Path:
        """The tenant's approved drafts, oldest first, as one article, replaced atomically (the
        knowledge base never reads half a file)."""
        with self.db.session(readonly=True) as s:
            rows = s.execute(select(FaqDraft.question, FaqDraft.answer).where(
                FaqDraft.tenant_id == tenant, FaqDraft.status == "approved").order_by(FaqDraft.id)).all()
        path = self.article_path(tenant)
        if not rows:                              # an article with no sections is a broken article
            path.unlink(missing_ok=True)
            return path
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".faq-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(faq_article([(q, a) for q, a in rows]))
        os.replace(tmp, path)
        return path
