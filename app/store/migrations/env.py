"""Alembic's environment: run by app/store/db.py (Database.upgrade / downgrade) with an open
connection, or by the `alembic` command with sqlalchemy.url set in its config."""
from alembic import context
from sqlalchemy import create_engine

from app.store.models import Base

config = context.config


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=connection.dialect.name == "sqlite")   # ALTER on SQLite
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as conn:
        run(conn)
