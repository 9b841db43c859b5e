"""Conversation databases for tests: a fresh SQLite file, or a fresh schema in the machine's
PostgreSQL (127.0.0.1:5432, trust auth, database `test`), migrated, and dropped afterwards."""
from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from app.store.db import Database

POSTGRES_ROOT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
BACKENDS = ("sqlite", "postgres")


def postgres_url(schema: str) -> str:
    return f"{POSTGRES_ROOT}?options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def fresh_database_url(backend: str, tmp_path) -> Iterator[str]:
    """A URL of an empty database of `backend` (not migrated)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / f'conv-{secrets.token_hex(4)}.db'}"
        return
    schema = f"t_{secrets.token_hex(6)}"
    root = create_engine(POSTGRES_ROOT)
    try:
        with root.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
    except Exception as exc:                          # noqa: BLE001 - the reason goes in the failure
        root.dispose()
        pytest.fail(f"PostgreSQL on 127.0.0.1:5432 (database test) is needed: {exc}")
    try:
        yield postgres_url(schema)
    finally:
        with root.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        root.dispose()


@contextlib.contextmanager
def migrated_database(backend: str, tmp_path) -> Iterator[Database]:
    with fresh_database_url(backend, tmp_path) as url:
        db = Database(url)
        db.upgrade()
        try:
            yield db
        finally:
            db.dispose()
