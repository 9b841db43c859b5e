"""Agent accounts (app/agent/accounts.py) on a real SQLite file and a real PostgreSQL schema, and the
`python -m app agents ...` / `db ...` commands run as the shell runs them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from app.agent.accounts import DEMO_EMAIL, AgentAccounts, AgentInfo
from app.store.db import head_revision
from app.store.models import Agent, AuditEvent
from tests.helpers.databases import BACKENDS, migrated_database

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery"


@pytest.fixture(params=BACKENDS)
def db(request, tmp_path):
    with migrated_database(request.param, tmp_path) as database:
        yield database


@pytest.fixture
def accounts(db) -> AgentAccounts:
    return AgentAccounts(db)


def audit(db) -> list[tuple[str, int | None, str, dict]]:
    with db.session() as s:
        events = s.scalars(select(AuditEvent).order_by(AuditEvent.id))
        return [(e.action, e.agent_id, e.tenant_id, e.detail) for e in events]


def test_add_normalises_the_email_hashes_the_password_and_audits(db, accounts):
    info = accounts.add("demo", "  Ana.Silva@Northwind.TEST ", PASSWORD, name="Ana Silva")
    assert info == AgentInfo(info.id, "demo", "ana.silva@northwind.test", "Ana Silva", True)
    with db.session() as s:
        row = s.get(Agent, info.id)
        assert row.password_hash.startswith("scrypt:") and PASSWORD not in row.password_hash
        assert row.last_login_at is None and row.created_at.tzinfo is not None
    assert audit(db) == [("agent_added", info.id, "demo", {"email": "ana.silva@northwind.test", "name": "Ana Silva"})]
    assert accounts.add("demo", "bo@northwind.test", PASSWORD).name == "bo"        # default: the local part
    assert accounts.get(info.id) == info and accounts.get(info.id + 100) is None


def test_invalid_accounts_are_refused_with_what_to_fix(accounts):
    accounts.add("demo", "ana@northwind.test", PASSWORD)
    with pytest.raises(ValueError, match="an agent with email ana@northwind.test exists"):
        accounts.add("other", "ANA@northwind.test", PASSWORD)
    for bad in ("ana", "ana@northwind", "a b@northwind.test", "@northwind.test", "x@y@z.test", "a" * 250 + "@x.io"):
        with pytest.raises(ValueError, match="is not an email address"):
            accounts.add("demo", bad, PASSWORD)
    with pytest.raises(ValueError, match="password: at least 10 characters, got 9"):
        accounts.add("demo", "bo@northwind.test", "123456789")
    with pytest.raises(ValueError, match="name: at most 120"):
        accounts.add("demo", "bo@northwind.test", PASSWORD, name="x" * 121)
    assert [a.email for a in accounts.list()] == ["ana@northwind.test"]


def test_list_by_tenant(accounts):
    accounts.add("other", "zed@other.test", PASSWORD)
    accounts.add("demo", "bo@northwind.test", PASSWORD)
    accounts.add("demo", "ana@northwind.test", PASSWORD)
    assert [(a.tenant_id, a.email) for a in accounts.list()] == [
        ("demo", "ana@northwind.test"), ("demo", "bo@northwind.test"), ("other", "zed@other.test")]
    assert [a.email for a in accounts.list("other")] == ["zed@other.test"]
    assert accounts.list("nobody") == []


def test_authenticate_checks_the_password_and_records_logins(db, accounts):
    ana = accounts.add("demo", "ana@northwind.test", PASSWORD)
    assert accounts.authenticate("ANA@northwind.test ", PASSWORD) == ana
    assert accounts.authenticate("ana@northwind.test", PASSWORD + "x") is None
    assert accounts.authenticate("nobody@northwind.test", PASSWORD) is None
    assert accounts.authenticate("not an email\x00", PASSWORD) is None
    with db.session() as s:
        assert s.get(Agent, ana.id).last_login_at is not None
    events = audit(db)[1:]
    assert events == [("login", ana.id, "demo", {}),
                      ("login_failed", ana.id, "demo", {"reason": "wrong password"}),
                      ("login_failed", None, "", {"reason": "unknown email"}),
                      ("login_failed", None, "", {"reason": "unknown email"})]
    assert PASSWORD not in repr(events) and "nobody" not in repr(events)


def test_a_disabled_agent_cannot_log_in(db, accounts):
    ana = accounts.add("demo", "ana@northwind.test", PASSWORD)
    disabled = accounts.disable("Ana@Northwind.test")
    assert disabled == AgentInfo(ana.id, "demo", "ana@northwind.test", "ana", False)
    assert accounts.disable("ana@northwind.test") == disabled                  # twice: no-op
    assert accounts.authenticate("ana@northwind.test", PASSWORD) is None
    assert [e[0] for e in audit(db)] == ["agent_added", "agent_disabled", "login_failed"]
    assert audit(db)[-1][3] == {"reason": "agent disabled"}
    with pytest.raises(ValueError, match="no agent with email x@northwind.test"):
        accounts.disable("x@northwind.test")


def test_the_demo_agent_is_created_once(accounts):
    password = accounts.ensure_demo_agent()
    assert password and len(password) >= 16
    assert [(a.tenant_id, a.email) for a in accounts.list()] == [("demo", DEMO_EMAIL)]
    assert accounts.authenticate(DEMO_EMAIL, password) is not None
    assert accounts.ensure_demo_agent() is None
    assert accounts.ensure_demo_agent("other") is None                # the email is taken
    assert len(accounts.list()) == 1


# ---- the command line ------------------------------------------------------------------------
def cli(*args: str, url: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url}
    env.pop("TENANTS_PATH", None)
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120,
                          start_new_session=True)      # no controlling terminal: getpass reads stdin


def test_cli_manages_agents(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    added = cli("agents", "add", "--tenant", "demo", "--email", "Ana@Northwind.test", "--name", "Ana Silva",
                "--password-stdin", url=url, stdin=PASSWORD + "\n")
    assert added.returncode == 0, added.stderr
    assert "added agent ana@northwind.test" in added.stdout and PASSWORD not in added.stdout + added.stderr
    again = cli("agents", "add", "--tenant", "demo", "--email", "ana@northwind.test", "--password-stdin",
                url=url, stdin=PASSWORD + "\n")
    assert again.returncode == 1 and again.stderr.strip() == "error: an agent with email ana@northwind.test exists"
    unknown = cli("agents", "add", "--tenant", "nope", "--email", "bo@northwind.test", "--password-stdin",
                  url=url, stdin=PASSWORD + "\n")
    assert unknown.returncode == 2 and "unknown tenant 'nope'" in unknown.stderr and "Traceback" not in unknown.stderr
    short = cli("agents", "add", "--tenant", "demo", "--email", "bo@northwind.test", "--password-stdin",
                url=url, stdin="short\n")
    assert short.returncode == 1 and "password: at least 10 characters" in short.stderr
    listed = cli("agents", "list", "--tenant", "demo", url=url)
    assert listed.returncode == 0
    header, row = listed.stdout.splitlines()
    assert header.split() == ["ID", "TENANT", "EMAIL", "NAME", "ACTIVE"]
    assert row.split() == ["1", "demo", "ana@northwind.test", "Ana", "Silva", "yes"]
    assert cli("agents", "disable", "--email", "ana@northwind.test", url=url).returncode == 0
    assert cli("agents", "list", url=url).stdout.splitlines()[1].split()[-1] == "no"
    missing = cli("agents", "disable", "--email", "x@northwind.test", url=url)
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no agent with email x@northwind.test"
    from app.store.db import Database
    accounts = AgentAccounts(Database(url))
    assert accounts.authenticate("ana@northwind.test", PASSWORD) is None                 # disabled


def test_cli_add_without_stdin_needs_matching_prompts(tmp_path):
    # getpass reads the terminal; without one (start_new_session) it falls back to stdin
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    mismatch = cli("agents", "add", "--tenant", "demo", "--email", "ana@northwind.test", url=url,
                   stdin=f"{PASSWORD}\n{PASSWORD}!\n")
    assert mismatch.returncode == 2 and "the passwords do not match" in mismatch.stderr
    ok = cli("agents", "add", "--tenant", "demo", "--email", "ana@northwind.test", url=url,
             stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert ok.returncode == 0, ok.stderr


def test_cli_migrates_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert cli("db", "current", url=url).stdout.strip().endswith("revision none")
    up = cli("db", "upgrade", url=url)
    head = head_revision()
    assert up.returncode == 0 and up.stdout.strip().endswith(f"revision {head}"), up.stderr
    assert cli("db", "current", url=url).stdout.strip().endswith(f"revision {head}")
    down = cli("db", "downgrade", "base", url=url)
    assert down.returncode == 0 and down.stdout.strip().endswith("revision none"), down.stderr
    bad = cli("db", "downgrade", "zzz", url=url)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    assert cli("db", "upgrade", "--revision", "0001", url=url).stdout.strip().endswith("revision 0001")
