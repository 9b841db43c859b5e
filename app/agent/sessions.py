"""Agents' sign-ins, kept on the server. The session cookie (signed by Flask) carries a random
token; the database keeps only its sha256, with when it expires and whether it was revoked. So
logout ends the session for whoever holds a copy of the cookie, and disabling an agent ends all
of theirs (app/agent/auth.py loads the agent through its session on every request).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from sqlalchemy import delete, select, update

from app.agent.accounts import AgentInfo, agent_info
from app.store.db import Database
from app.store.models import Agent, AgentSession, utcnow


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AgentSessions:
    def __init__(self, db: Database, lifetime: dt.timedelta):
        self.db, self.lifetime = db, lifetime

    def open(self, agent_id: int) -> str:
        """A new session for the agent; returns the token for the cookie."""
        token = secrets.token_urlsafe(32)
        with self.db.session() as s:
            s.add(AgentSession(id=_digest(token), agent_id=agent_id, expires_at=utcnow() + self.lifetime))
        return token

    def agent(self, token: str) -> AgentInfo | None:
        """The active agent of a live (not revoked, not expired) session, else None."""
        with self.db.session(readonly=True) as s:
            agent = s.scalar(select(Agent).join(AgentSession, AgentSession.agent_id == Agent.id).where(
                AgentSession.id == _digest(token), AgentSession.revoked_at.is_(None),
                AgentSession.expires_at > utcnow(), Agent.active.is_(True)))
            return agent_info(agent) if agent is not None else None

    def revoke(self, token: str) -> None:
        with self.db.session() as s:
            s.execute(update(AgentSession).where(AgentSession.id == _digest(token), AgentSession.revoked_at.is_(None))
                      .values(revoked_at=utcnow()))

    def delete_ended(self, now: dt.datetime | None = None) -> int:
        """Forget sessions that expired or were revoked more than a day ago (the retention job)."""
        cutoff = (now or utcnow()) - dt.timedelta(days=1)
        with self.db.session() as s:
            done = s.execute(delete(AgentSession).where(
                (AgentSession.expires_at < cutoff) | (AgentSession.revoked_at < cutoff)))
            return done.rowcount
