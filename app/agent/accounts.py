"""A tenant's support agents: the people who answer handed-off chats in the agent console.

    accounts = AgentAccounts(db)
    info = accounts.add("demo", "Ana@Northwind.test", "a long password", name="Ana")
    accounts.authenticate("ana@northwind.test", "a long password")    # AgentInfo, or None
    accounts.disable("ana@northwind.test")                            # its sessions stop working

Passwords are stored only as werkzeug scrypt hashes ("scrypt:..."); a password is never logged,
audited or kept after the call that hashes or checks it. Every account change and every login
attempt writes an audit event (app/store/models.py AuditEvent). `python -m app agents ...` manages
accounts from the shell (app/__main__.py).
"""
from __future__ import annotations

import functools
import logging
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from werkzeug.security import check_password_hash, generate_password_hash

from app.store.db import Database
from app.store.models import Agent, AuditEvent, utcnow

log = logging.getLogger(__name__)

MIN_PASSWORD_CHARS = 10
MAX_EMAIL_CHARS = 254                       # the agents.email column (and RFC 5321's path limit)
MAX_NAME_CHARS = 120                        # the agents.name column
# one @, no spaces (or NULs), a dot in the domain: enough to catch typos; delivery is not our concern
_EMAIL = re.compile(r"^[^@\s\x00]+@[^@\s\x00]+\.[^@\s.\x00]+$")
DEMO_TENANT, DEMO_EMAIL = "demo", "agent@northwind.test"


@dataclass(frozen=True)
class AgentInfo:
    """An agent as the rest of the app sees it (never the password hash)."""
    id: int
    tenant_id: str
    email: str
    name: str
    active: bool


def normalize_email(email: str) -> str:
    return email.strip().lower()


def is_email(email: str) -> bool:
    return len(email) <= MAX_EMAIL_CHARS and _EMAIL.match(email) is not None


def agent_info(agent: Agent) -> AgentInfo:
    return AgentInfo(agent.id, agent.tenant_id, agent.email, agent.name, agent.active)


def _by_email(s: Session, email: str) -> Agent | None:
    # no agent has a malformed email (and PostgreSQL refuses a NUL in a query): no lookup
    return s.scalar(select(Agent).where(Agent.email == email)) if is_email(email) else None


def _hash(password: str) -> str:
    return generate_password_hash(password, method="scrypt")


@functools.cache
def _dummy_hash() -> str:
    """A hash to check unknown emails against, so that they take as long as a wrong password."""
    return _hash(secrets.token_urlsafe(16))


class AgentAccounts:
    def __init__(self, db: Database):
        self.db = db

    def add(self, tenant_id: str, email: str, password: str, name: str | None = None) -> AgentInfo:
        """Create an active agent. ValueError (with what to fix) for a malformed email, a password
        under MIN_PASSWORD_CHARS characters, an email some agent (of any tenant) already has."""
        email = normalize_email(email)
        if not tenant_id:
            raise ValueError("tenant: required")
        if not is_email(email):
            raise ValueError(f"email: {email!r} is not an email address (like name@example.com, "
                             f"at most {MAX_EMAIL_CHARS} characters)")
        if len(password) < MIN_PASSWORD_CHARS:
            raise ValueError(f"password: at least {MIN_PASSWORD_CHARS} characters, got {len(password)}")
        name = (name or "").strip() or email.split("@", 1)[0]
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"name: at most {MAX_NAME_CHARS} characters, got {len(name)}")
        password_hash = _hash(password)             # before the transaction: scrypt takes a while
        duplicate = f"an agent with email {email} exists"
        try:
            with self.db.session() as s:
                if s.scalar(select(Agent.id).where(Agent.email == email)) is not None:
                    raise ValueError(duplicate)
                agent = Agent(tenant_id=tenant_id, email=email, name=name, password_hash=password_hash,
                              active=True)
                s.add(agent)
                s.flush()
                s.add(AuditEvent(tenant_id=tenant_id, agent_id=agent.id, action="agent_added",
                                 detail={"email": email, "name": name}))
                return agent_info(agent)
        except IntegrityError:                      # another process added it since the check
            raise ValueError(duplicate) from None

    def list(self, tenant_id: str | None = None) -> list[AgentInfo]:
        """Every agent (of one tenant when given), by tenant then email."""
        query = select(Agent).order_by(Agent.tenant_id, Agent.email)
        if tenant_id is not None:
            query = query.where(Agent.tenant_id == tenant_id)
        with self.db.session() as s:
            return [agent_info(a) for a in s.scalars(query)]

    def get(self, agent_id: int) -> AgentInfo | None:
        with self.db.session() as s:
            agent = s.get(Agent, agent_id)
            return agent_info(agent) if agent is not None else None

    def disable(self, email: str) -> AgentInfo:
        """Deactivate an agent: it cannot log in, and its open sessions stop working on their next
        request (app/agent/auth.py loads the agent on each). Disabling twice is a no-op."""
        email = normalize_email(email)
        with self.db.session() as s:
            agent = _by_email(s, email)
            if agent is None:
                raise ValueError(f"no agent with email {email}")
            if agent.active:
                agent.active = False
                s.add(AuditEvent(tenant_id=agent.tenant_id, agent_id=agent.id, action="agent_disabled",
                                 detail={"email": email}))
            return agent_info(agent)

    def authenticate(self, email: str, password: str) -> AgentInfo | None:
        """The agent these credentials belong to, or None (unknown email, disabled agent, wrong
        password: the caller cannot tell which, and each takes one scrypt check). Audited as
        "login" or "login_failed"; the attempted email of an unknown account is not recorded,
        since people do type their password into the email field."""
        email = normalize_email(email)
        with self.db.session() as s:
            agent = _by_email(s, email)
            if agent is None:
                check_password_hash(_dummy_hash(), password)
                s.add(AuditEvent(tenant_id="", action="login_failed", detail={"reason": "unknown email"}))
                log.info("agent login failed: unknown email")
                return None
            ok = check_password_hash(agent.password_hash, password)
            if not ok or not agent.active:
                reason = "wrong password" if not ok else "agent disabled"
                s.add(AuditEvent(tenant_id=agent.tenant_id, agent_id=agent.id, action="login_failed",
                                 detail={"reason": reason}))
                log.info("agent login failed: agent %d, %s", agent.id, reason)
                return None
            agent.last_login_at = utcnow()
            s.add(AuditEvent(tenant_id=agent.tenant_id, agent_id=agent.id, action="login", detail={}))
            return agent_info(agent)

    def ensure_demo_agent(self, tenant_id: str = DEMO_TENANT, email: str = DEMO_EMAIL) -> str | None:
        """First start of the shipped demo: give its tenant one agent, so the console can be tried.
        Returns the generated password (the caller shows it once; only its hash is kept), or None
        when the tenant already has agents or the email is taken."""
        with self.db.session() as s:
            count = s.scalar(select(func.count()).select_from(Agent).where(Agent.tenant_id == tenant_id))
            taken = s.scalar(select(Agent.id).where(Agent.email == normalize_email(email))) is not None
        if count or taken:
            return None
        password = secrets.token_urlsafe(12)
        try:
            self.add(tenant_id, email, password, name="Demo Agent")
        except ValueError:                       # another process created it in the meantime
            return None
        return password
