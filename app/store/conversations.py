"""The conversation store: customer chats, their messages and feedback, in the relational
database (app/store/db.py, app/store/models.py). The chat API writes turns here; the agent API reads and
answers them (its handoff lifecycle is in app/store/handoffs.py).

Every lookup carries the tenant id, so a conversation id from one tenant never opens another
tenant's conversation (the query simply finds nothing). Messages are numbered 0, 1, 2 ... per
conversation: the number is taken by incrementing the conversation's counter in the same
transaction that inserts the message, so concurrent writers (a customer turn and an agent reply
at once) never get the same index.
"""
from __future__ import annotations

import datetime as dt
import secrets

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.store.db import Database
from app.store.models import Conversation, Feedback, Handoff, Message, utcnow

LAST_MESSAGE_CHARS = 160            # the inbox's preview of a conversation's last message


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def message_view(m: Message) -> dict:
    """A message as the APIs return it."""
    return {"index": m.seq, "role": m.role, "content": m.content, "created_at": iso(m.created_at),
            "citations": list(m.citations or []), "grounding": m.grounding, "intent": m.intent,
            "degraded": m.degraded, "blocked": m.blocked, "action": m.action,
            "author": {"name": m.agent.name} if m.agent is not None else None}


def feedback_view(f: Feedback) -> dict:
    return {"kind": f.kind, "rating": f.rating, "comment": f.comment, "message_index": f.message_index,
            "created_at": iso(f.created_at)}


class ConversationStore:
    def __init__(self, db: Database):
        self.db = db

    # ---- the customer's side (the chat API and its tasks)

    def create(self, tenant: str) -> str:
        """A new open conversation; returns its id (the widget's session id)."""
        sid = secrets.token_urlsafe(16)
        with self.db.session() as s:
            s.add(Conversation(id=sid, tenant_id=tenant, status="open"))
        return sid

    @staticmethod
    def _get(s: Session, tenant: str, sid: str) -> Conversation | None:
        return s.scalar(select(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant))

    def exists(self, tenant: str, sid: str) -> bool:
        with self.db.session(readonly=True) as s:
            return s.scalar(select(func.count()).select_from(Conversation)
                            .where(Conversation.id == sid, Conversation.tenant_id == tenant)) == 1

    def status(self, tenant: str, sid: str) -> str | None:
        with self.db.session(readonly=True) as s:
            return s.scalar(select(Conversation.status).where(Conversation.id == sid,
                                                              Conversation.tenant_id == tenant))

    def meta(self, tenant: str, sid: str) -> dict | None:
        """Status and handoff summary (what the chat routes and the summary task read)."""
        with self.db.session(readonly=True) as s:
            conv = self._get(s, tenant, sid)
            if conv is None:
                return None
            return {"status": conv.status, "handoff_summary": conv.summary, "created": iso(conv.created_at)}

    def messages(self, tenant: str, sid: str) -> list[dict]:
        """Oldest first, in the shape the chat pipeline reads history in."""
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(Message).join(Conversation).where(
                Conversation.id == sid, Conversation.tenant_id == tenant).order_by(Message.seq)).all()
            return [message_view(m) for m in rows]

    @staticmethod
    def add_message(s: Session, tenant: str, sid: str, role: str, content: str, *,
                    statuses: tuple[str, ...] | None = None, assignee_id: int | None = None,
                    **fields) -> Message | None:
        """Insert one message inside an open transaction `s`; None when the conversation is gone,
        or is not in one of `statuses` / not assigned to `assignee_id` where those are given.
        The counter update comes first and carries those conditions, so the check and the write
        are one statement: on SQLite the transaction holds the write lock before it reads
        anything, and on PostgreSQL the row lock orders concurrent writers."""
        now = utcnow()
        where = [Conversation.id == sid, Conversation.tenant_id == tenant]
        if statuses is not None:
            where.append(Conversation.status.in_(statuses))
        if assignee_id is not None:
            where.append(Conversation.assignee_id == assignee_id)
        seq = s.scalar(update(Conversation).where(*where)
                       .values(num_messages=Conversation.num_messages + 1, updated_at=now)
                       .returning(Conversation.num_messages))
        if seq is None:
            return None
        message = Message(conversation_id=sid, seq=seq - 1, role=role, content=content, created_at=now, **fields)
        s.add(message)
        s.flush()
        return message

    def append(self, tenant: str, sid: str, message: dict) -> int:
        """Store one message dict (role, content, and for a bot reply citations, intent,
        grounding, degraded, blocked); returns its index, or -1 when the conversation is gone."""
        with self.db.session() as s:
            row = self.add_message(s, tenant, sid, message["role"], message["content"], **self._extra(message))
            return row.seq if row is not None else -1

    def append_turn(self, tenant: str, sid: str, user: dict, reply: dict) -> tuple[int, int | None]:
        """Store a bot turn, the customer's message and the bot's reply, in one transaction, the
        reply only while the conversation is still with the bot (status open): an agent who
        claimed it, or a handoff asked for, while the reply was generated keeps the customer's
        message and silences the reply. Returns (user index, reply index or None); (-1, None)
        when the conversation is gone."""
        with self.db.session() as s:
            row = self.add_message(s, tenant, sid, user["role"], user["content"], statuses=("open",),
                                   **self._extra(user))
            if row is None:
                row = self.add_message(s, tenant, sid, user["role"], user["content"], **self._extra(user))
                return (row.seq if row is not None else -1), None
            answer = self.add_message(s, tenant, sid, reply["role"], reply["content"], **self._extra(reply))
            return row.seq, answer.seq

    @staticmethod
    def _extra(message: dict) -> dict:
        extra = {k: message.get(k) for k in ("citations", "intent", "grounding", "degraded", "blocked", "action",
                                             "first_token_ms")}
        return {k: v for k, v in extra.items() if v is not None}

    def set_summary(self, tenant: str, sid: str, summary: str) -> None:
        """The handoff summary (written by the Celery task); a deleted conversation stays deleted."""
        with self.db.session() as s:
            s.execute(update(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant)
                      .values(summary=summary))

    def add_feedback(self, tenant: str, sid: str, record: dict) -> bool:
        """Thumbs on a message (kind "message") or the end-of-chat rating (kind "csat")."""
        with self.db.session() as s:
            if self._get(s, tenant, sid) is None:
                return False
            s.add(Feedback(conversation_id=sid, kind=record.get("kind", "message"),
                           message_index=record.get("message_index"), rating=str(record["rating"]),
                           comment=record.get("comment", "")))
            return True

    def add_csat(self, tenant: str, sid: str, rating: int, comment: str) -> str:
        """The end-of-chat rating, once per resolution: "ok", "not_resolved" (the conversation is
        not resolved now) or "rated" (this resolution already has a rating). The no-op UPDATE
        takes the row's write lock first, so two ratings sent at once cannot both be stored."""
        with self.db.session() as s:
            locked = s.execute(update(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant,
                                                          Conversation.status == "resolved")
                               .values(status=Conversation.status))
            if locked.rowcount != 1:
                return "not_resolved"
            resolved_at = s.scalar(select(Conversation.updated_at).where(Conversation.id == sid))
            rated = s.scalar(select(func.count()).select_from(Feedback).where(
                Feedback.conversation_id == sid, Feedback.kind == "csat", Feedback.created_at >= resolved_at))
            if rated:
                return "rated"
            s.add(Feedback(conversation_id=sid, kind="csat", rating=str(rating), comment=comment))
            return "ok"

    def feedback(self, tenant: str, sid: str) -> list[dict]:
        with self.db.session(readonly=True) as s:
            rows = s.scalars(select(Feedback).join(Conversation).where(
                Conversation.id == sid, Conversation.tenant_id == tenant).order_by(Feedback.id)).all()
            return [feedback_view(f) for f in rows]

    def set_contact(self, tenant: str, sid: str, email: str) -> bool:
        with self.db.session() as s:
            done = s.execute(update(Conversation).where(Conversation.id == sid, Conversation.tenant_id == tenant)
                             .values(contact_email=email, updated_at=utcnow()))
            return done.rowcount == 1

    def contact(self, tenant: str, sid: str) -> str | None:
        """The email address the customer left, if any."""
        with self.db.session(readonly=True) as s:
            return s.scalar(select(Conversation.contact_email).where(Conversation.id == sid,
                                                                     Conversation.tenant_id == tenant))

    def mark_seen(self, tenant: str, sid: str, index: int) -> bool:
        """The customer's widget showed messages up to `index` (it only moves forward, and never
        past the last message)."""
        with self.db.session() as s:
            conv = self._get(s, tenant, sid)
            if conv is None:
                return False
            conv.customer_seen = max(_index(conv.customer_seen), min(index, conv.num_messages - 1))
            return True

    def unmailed_replies(self, tenant: str, sid: str) -> tuple[str | None, list[tuple[int, dict]], list[dict]]:
        """(the address left, the agent replies neither seen in the widget nor mailed yet as
        (index, message), every message): what the email fallback has to send."""
        with self.db.session(readonly=True) as s:
            conv = self._get(s, tenant, sid)
            if conv is None:
                return None, [], []
            after, to = max(_index(conv.customer_seen), _index(conv.emailed_through)), conv.contact_email
        messages = self.messages(tenant, sid)
        return to, [(i, m) for i, m in enumerate(messages) if i > after and m["role"] == "agent"], messages

    def mark_emailed(self, tenant: str, sid: str, index: int) -> None:
        with self.db.session() as s:
            conv = self._get(s, tenant, sid)
            if conv is not None:
                conv.emailed_through = max(_index(conv.emailed_through), index)

    # ---- the agent's side: reads

    def list(self, tenant: str, status: str | None = None, limit: int = 50,
             before: tuple[dt.datetime, str] | None = None) -> tuple[list[dict], tuple[dt.datetime, str] | None]:
        """A page of the tenant's conversations, most recently updated first; `before` is the
        (updated_at, id) of the last row of the previous page. Returns the rows and the next
        page's cursor (None on the last page)."""
        with self.db.session(readonly=True) as s:
            q = select(Conversation).where(Conversation.tenant_id == tenant)
            if status:
                q = q.where(Conversation.status == status)
            if before is not None:
                at, cid = before
                q = q.where((Conversation.updated_at < at)
                            | ((Conversation.updated_at == at) & (Conversation.id < cid)))
            rows = s.scalars(q.order_by(Conversation.updated_at.desc(), Conversation.id.desc()).limit(limit + 1)).all()
            page = rows[:limit]
            last = self._last_messages(s, [c.id for c in page])
            first = self._first_questions(s, [c.id for c in page])
            queue = self._queue_positions(s, tenant)
            out = [self._list_item(c, last.get(c.id), queue.get(c.id), first.get(c.id)) for c in page]
            cursor = (page[-1].updated_at, page[-1].id) if len(rows) > limit else None
            return out, cursor

    def list_item(self, tenant: str, sid: str) -> dict | None:
        with self.db.session(readonly=True) as s:
            conv = self._get(s, tenant, sid)
            if conv is None:
                return None
            return self._list_item(conv, self._last_messages(s, [sid]).get(sid),
                                   self._queue_positions(s, tenant).get(sid), self._first_questions(s, [sid]).get(sid))

    @staticmethod
    def _list_item(c: Conversation, last: str | None, position: int | None, first: str | None = None) -> dict:
        return {"id": c.id, "status": c.status, "summary": c.summary,
                "first_question": (first or "")[:LAST_MESSAGE_CHARS],
                "last_message": (last or "")[:LAST_MESSAGE_CHARS], "updated_at": iso(c.updated_at),
                "assignee": {"id": c.assignee.id, "name": c.assignee.name} if c.assignee is not None else None,
                "queue_position": position}

    @staticmethod
    def _last_messages(s: Session, ids: list[str]) -> dict[str, str]:
        if not ids:
            return {}
        latest = (select(Message.conversation_id, func.max(Message.seq).label("seq"))
                  .where(Message.conversation_id.in_(ids)).group_by(Message.conversation_id).subquery())
        rows = s.execute(select(Message.conversation_id, Message.content).join(
            latest, (Message.conversation_id == latest.c.conversation_id) & (Message.seq == latest.c.seq)))
        return dict(rows.all())

    @staticmethod
    def _first_questions(s: Session, ids: list[str]) -> dict[str, str]:
        """The customer's first message per conversation (the inbox title), blocked ones skipped."""
        if not ids:
            return {}
        first = (select(Message.conversation_id, func.min(Message.seq).label("seq"))
                 .where(Message.conversation_id.in_(ids), Message.role == "user", Message.blocked.is_(False))
                 .group_by(Message.conversation_id).subquery())
        rows = s.execute(select(Message.conversation_id, Message.content).join(
            first, (Message.conversation_id == first.c.conversation_id) & (Message.seq == first.c.seq)))
        return dict(rows.all())

    @staticmethod
    def _queue_positions(s: Session, tenant: str) -> dict[str, int]:
        """1-based places of the tenant's waiting conversations, oldest request first."""
        waiting = s.execute(select(Conversation.id).join(Handoff, Handoff.conversation_id == Conversation.id)
                            .where(Conversation.tenant_id == tenant, Conversation.status == "pending_human",
                                   Handoff.claimed_at.is_(None), Handoff.resolved_at.is_(None))
                            .order_by(Handoff.requested_at, Handoff.id)).scalars().all()
        positions: dict[str, int] = {}
        for cid in waiting:
            positions.setdefault(cid, len(positions) + 1)
        return positions

    def detail(self, tenant: str, sid: str) -> dict | None:
        """The whole conversation for the agent: transcript, summary, feedback, assignee."""
        with self.db.session(readonly=True) as s:
            conv = self._get(s, tenant, sid)
            if conv is None:
                return None
            messages = s.scalars(select(Message).where(Message.conversation_id == sid).order_by(Message.seq)).all()
            feedback = s.scalars(select(Feedback).where(Feedback.conversation_id == sid).order_by(Feedback.id)).all()
            return {"id": conv.id, "status": conv.status, "summary": conv.summary,
                    "assignee": {"id": conv.assignee.id, "name": conv.assignee.name} if conv.assignee else None,
                    "contact_email": conv.contact_email, "created_at": iso(conv.created_at),
                    "updated_at": iso(conv.updated_at),
                    "messages": [message_view(m) for m in messages],
                    "feedback": [feedback_view(f) for f in feedback]}

    # ---- retention

    def delete_older_than(self, days: int, now: dt.datetime | None = None) -> int:
        """Delete conversations not updated for `days` days (their messages, handoffs and
        feedback go with them); returns how many."""
        cutoff = (now or utcnow()) - dt.timedelta(days=days)
        with self.db.session() as s:
            ids = s.scalars(select(Conversation.id).where(Conversation.updated_at < cutoff)).all()
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                for table in (Message, Feedback, Handoff):       # explicit: no reliance on ON DELETE
                    s.execute(delete(table).where(table.conversation_id.in_(chunk)))
                s.execute(delete(Conversation).where(Conversation.id.in_(chunk)))
            return len(ids)


def _index(index: int | None) -> int:
    """A message index kept in a nullable column: -1 for none yet."""
    return -1 if index is None else index
