"""The relational database behind the conversation store: one SQLAlchemy engine per app.

    DATABASE_URL unset   sqlite:///<instance folder>/conversations.db (the embedded default)
    DATABASE_URL=postgresql+psycopg://user@host:5432/db    production (docker-compose)

`Database.upgrade()` applies the Alembic migrations in app/store/migrations/ (`python -m app db
upgrade`); `create_app` runs it at start unless DB_AUTO_MIGRATE=0. On PostgreSQL an advisory lock
makes web workers that start together apply them once. A database that cannot be reached raises
DatabaseUnavailable, which the app answers with 503 + Retry-After.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# one number for every process that migrates the same PostgreSQL database
_MIGRATION_LOCK_ID = 0x5C0_2901


class DatabaseUnavailable(RuntimeError):
    """The conversation database did not answer."""


def default_url(instance_path: str) -> str:
    Path(instance_path).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(instance_path) / 'conversations.db'}"


def _sqlite_connect(dbapi_conn, _record) -> None:
    dbapi_conn.isolation_level = None            # the driver's own BEGIN off: _sqlite_begin emits ours
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")        # ON DELETE CASCADE of messages, handoffs, feedback
    cur.execute("PRAGMA journal_mode=WAL")       # readers do not wait for the one writer
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_begin(conn) -> None:
    """A writing transaction takes SQLite's write lock when it begins (BEGIN IMMEDIATE): one
    that read first and wrote later would fail with "database is locked" instead of waiting
    for another writer. Read-only sessions begin deferred and never wait for writers (WAL)."""
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get("readonly") else "BEGIN IMMEDIATE")


class Database:
    def __init__(self, url: str):
        self.url = make_url(url)
        kw: dict = {"pool_pre_ping": True}
        if self.is_sqlite:
            if self.url.database in (None, "", ":memory:"):
                raise ValueError("DATABASE_URL: an in-memory SQLite database is not shared between threads; "
                                 "give a file path (sqlite:///path/conversations.db)")
            kw["connect_args"] = {"check_same_thread": False, "timeout": 15}
        else:
            kw.update(pool_size=10, max_overflow=20, pool_timeout=5, connect_args={"connect_timeout": 5})
        self.engine: Engine = create_engine(self.url, **kw)
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(self.engine.execution_options(readonly=True), expire_on_commit=False)
        self.migrate_on_first_use = False           # set when the start-up migration found no database


    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    @contextlib.contextmanager
    def session(self, readonly: bool = False) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back when it raises.
        `readonly`: a transaction that only reads (on SQLite it does not take the write lock)."""
        try:
            if self.migrate_on_first_use:
                self.upgrade()
                self.migrate_on_first_use = False
            with (self._readers if readonly else self._sessions).begin() as session:
                yield session
        except (OperationalError, DBAPIError) as exc:
            if getattr(exc, "connection_invalidated", False) or isinstance(exc, OperationalError):
                raise DatabaseUnavailable(f"the conversation database is unavailable: "
                                          f"{type(exc.orig).__name__}") from exc
            raise

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            return True
        except Exception:
            return False

    def _alembic(self, conn):
        cfg = _alembic_config()
        cfg.attributes["connection"] = conn
        return cfg

    def upgrade(self, revision: str = "head") -> None:
        """Apply the migrations up to `revision`."""
        from alembic import command
        with self.engine.begin() as conn:
            if not self.is_sqlite:
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK_ID})")
            command.upgrade(self._alembic(conn), revision)

    def downgrade(self, revision: str) -> None:
        from alembic import command
        with self.engine.begin() as conn:
            command.downgrade(self._alembic(conn), revision)

    def current(self) -> str | None:
        from alembic.runtime.migration import MigrationContext
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def table_names(self) -> list[str]:
        return inspect(self.engine).get_table_names()

    def dispose(self) -> None:
        self.engine.dispose()


def _alembic_config():
    from alembic.config import Config
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    """The newest migration in app/store/migrations/, the one `upgrade()` reaches."""
    from alembic.script import ScriptDirectory
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def init_db(app) -> Database:
    """The app's database (app.extensions["db"]), migrated unless DB_AUTO_MIGRATE is off."""
    db = Database(app.config.get("DATABASE_URL") or default_url(app.instance_path))
    if app.config.get("DB_AUTO_MIGRATE", True):
        try:
            db.upgrade()
        except OperationalError as exc:
            # the web tier still starts (readiness reports it); the first request that needs the
            # store answers 503, and the next start migrates
            app.logger.warning("database migrations not applied (database unavailable): %s", exc.orig)
            db.migrate_on_first_use = True
    app.extensions["db"] = db
    return db
