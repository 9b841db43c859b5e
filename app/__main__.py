"""python -m app serve --host 127.0.0.1 --port 8000

One process serves the product on the embedded default: the widget demo at /, the support-chat
API at /api/chat, the help-centre articles at /kb, and the engine's OpenAI-compatible routes
under /inference (e.g. /inference/v1/chat/completions), all sharing one in-process engine
(unless INFERENCE_URL points at a separate inference service). On the shipped demo tenants it
creates one agent for the agent console at /agent/ on first start and prints its password once.

    python -m app db upgrade [--revision head] | db downgrade REV | db current
    python -m app agents add --tenant demo --email E [--name N] [--password-stdin]
    python -m app agents list [--tenant T] | agents disable --email E
    python -m app hash-key KEY

The db and agents commands use DATABASE_URL (default: the instance folder's SQLite file, as the
app does) without building the app (no model is loaded); errors go to stderr with a non-zero exit.
"""
from __future__ import annotations

import argparse
import getpass
import logging
import sys
import time

from app.agent.accounts import DEMO_EMAIL

log = logging.getLogger("app")


class CliError(Exception):
    """A command that cannot do what was asked: its message goes to stderr, `code` is the exit status."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _ensure_demo_agent(web) -> str | None:
    """The demo agent's new password, on the first start of the shipped demo (else None)."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.agent.accounts import AgentAccounts
    from app.store.db import DatabaseUnavailable
    try:
        return AgentAccounts(web.extensions["db"]).ensure_demo_agent()
    except (DatabaseUnavailable, SQLAlchemyError) as exc:
        log.warning("no demo agent created (the database is unavailable): %s", exc)
        return None


def _start_retention(web) -> None:
    """Delete conversations past CONVERSATION_RETENTION_DAYS now and once a day (the Celery beat
    schedule of app/worker.py does this where a worker runs)."""
    import threading

    from app.jobs.tasks import RETENTION_SCHEDULE_S, delete_old_conversations

    def loop() -> None:
        while True:
            with web.app_context():
                try:
                    delete_old_conversations()
                except Exception:               # the database down: try again tomorrow
                    log.exception("retention run failed")
            time.sleep(RETENTION_SCHEDULE_S)
    threading.Thread(target=loop, daemon=True, name="retention").start()


def serve(args: argparse.Namespace) -> int:
    import waitress
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    from app import create_app
    from app.settings import WebSettings
    from pipelines.inference_client import InProcessClient
    from pipelines.resilience import client_from_env

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = WebSettings()
    client = client_from_env(settings.redis_url)
    own = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    # the demo tenant's actions call the order service this process serves
    web = create_app({"ACTIONS_BASE_URL": settings.actions_base_url or f"http://{own}:{args.port}"},
                     client=client, settings=settings)
    demo_password = _ensure_demo_agent(web) if settings.tenants_path is None else None
    mounts = {}
    primary = client.endpoints[0].client
    if isinstance(primary, InProcessClient):            # the embedded default serves OpenAI routes too
        from inference.server.app import ServerConfig
        from inference.server.app import create_app as create_inference_app
        mounts["/inference"] = create_inference_app(lambda: primary.engine,
                                                    ServerConfig(served_model_name=primary.model))
    from httpkit.shutdown import GracefulShutdown
    app = GracefulShutdown(DispatcherMiddleware(web, mounts), settings.shutdown_drain_s,
                           on_exit=client.close, on_drain=web.extensions["live_events"].close)
    app.install()                                # SIGTERM: refuse new requests, finish streams, exit
    services = web.extensions["support_chat"]["services"]
    services.start()   # /readyz turns 200
    if not settings.redis_url:                  # no Celery beat in the embedded default: run it here
        _start_retention(web)
    base = f"http://{args.host}:{args.port}"
    print(f"Support chat demo:   {base}/\nChat API:            {base}/api/chat  (X-Site-Key: demo-site-key)\n"
          + (f"OpenAI-compatible:   {base}/inference/v1  (model {primary.model})\n" if mounts else
             f"Inference service:   {settings.inference_url}\n")
          + f"Agent console:       {base}/agent/"
          + (f"  ({DEMO_EMAIL}, password: {demo_password}; shown once)\n" if demo_password else "\n"), flush=True)
    waitress.serve(app, host=args.host, port=args.port, threads=args.threads, send_bytes=1,
                   channel_request_lookahead=1, connection_limit=args.connection_limit or settings.web_connection_limit,
                   channel_timeout=300,
                   asyncore_use_poll=True,                 # select() stops at 1024 descriptors
                   ident="support-app")
    return 0


def _database(settings, migrate: bool = False):
    """The app's database, found as create_app finds it, without building the app."""
    from flask import Flask

    from app.store.db import Database, default_url
    db = Database(settings.database_url or default_url(Flask("app").instance_path))
    if migrate and settings.db_auto_migrate:            # as an app starting on it would
        db.upgrade()
    return db


def db_command(args: argparse.Namespace) -> int:
    from app.settings import WebSettings
    db = _database(WebSettings())
    where = db.url.render_as_string(hide_password=True)
    if args.db_cmd == "upgrade":
        db.upgrade(args.revision)
    elif args.db_cmd == "downgrade":
        db.downgrade(args.revision)
    print(f"{where}: revision {db.current() or 'none'}")
    return 0


def _read_password(from_stdin: bool) -> str:
    if from_stdin:                                       # one line; scripts: printf '%s\n' "$PW" | ...
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise CliError("no password on stdin", 2)
        return password
    password = getpass.getpass("Password: ")
    if getpass.getpass("Password (again): ") != password:
        raise CliError("the passwords do not match", 2)
    return password


def agents_command(args: argparse.Namespace) -> int:
    from app.agent.accounts import AgentAccounts
    from app.settings import WebSettings
    settings = WebSettings()
    if args.agents_cmd == "add":
        from app.tenants import TenantRegistry
        try:
            known = [t.tenant.tenant_id for t in TenantRegistry(settings.tenants_path).tenants]
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
        if args.tenant not in known:
            raise CliError(f"unknown tenant {args.tenant!r} (the tenants file has: {', '.join(known)})", 2)
        password = _read_password(args.password_stdin)
        info = AgentAccounts(_database(settings, migrate=True)).add(args.tenant, args.email, password, args.name)
        print(f"added agent {info.email} (id {info.id}, tenant {info.tenant_id}, name {info.name!r})")
    elif args.agents_cmd == "disable":
        info = AgentAccounts(_database(settings, migrate=True)).disable(args.email)
        print(f"disabled agent {info.email} (id {info.id}, tenant {info.tenant_id})")
    else:
        agents = AgentAccounts(_database(settings, migrate=True)).list(args.tenant)
        rows = [("ID", "TENANT", "EMAIL", "NAME", "ACTIVE")]
        rows += [(str(a.id), a.tenant_id, a.email, a.name, "yes" if a.active else "no") for a in agents]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if not agents:
            print("(no agents)")
    return 0


def _run(handler, args: argparse.Namespace) -> int:
    """A command's failure as one line on stderr and an exit status, not a traceback."""
    from alembic.util import CommandError
    from sqlalchemy.exc import SQLAlchemyError

    from app.store.db import DatabaseUnavailable
    try:
        return handler(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except (ValueError, CommandError, DatabaseUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:
        print(f"error: database: {getattr(exc, 'orig', None) or exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="serve the web app (and the in-process engine)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--threads", type=int, default=64)
    # connections are cheap in waitress's event loop (a thread is held only while a request runs):
    # accept many, and let CHAT_MAX_TURNS answer 503 past what the threads can serve, instead of
    # leaving connections unaccepted in the kernel's backlog until the client times out
    p.add_argument("--connection-limit", type=int, default=None,
                   help="default: WEB_CONNECTION_LIMIT (2000)")
    h = sub.add_parser("hash-key", help="print the tenants.yaml entry (sha256:...) for an API key")
    h.add_argument("key")
    d = sub.add_parser("db", help="the conversation database's schema (DATABASE_URL)")
    dsub = d.add_subparsers(dest="db_cmd", required=True)
    dsub.add_parser("upgrade", help="apply the migrations").add_argument("--revision", default="head")
    dsub.add_parser("downgrade", help="revert the migrations to REV (base: none)").add_argument("revision")
    dsub.add_parser("current", help="print the applied revision")
    a = sub.add_parser("agents", help="agent console accounts")
    asub = a.add_subparsers(dest="agents_cmd", required=True)
    add = asub.add_parser("add", help="add an agent (asks for the password twice)")
    add.add_argument("--tenant", required=True, help="a tenant of the tenants file (TENANTS_PATH)")
    add.add_argument("--email", required=True)
    add.add_argument("--name", default=None, help="default: the email's local part")
    add.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    asub.add_parser("list", help="print the agents").add_argument("--tenant", default=None)
    asub.add_parser("disable", help="disable an agent (it cannot sign in)").add_argument("--email", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "db":
        return _run(db_command, args)
    if args.cmd == "agents":
        return _run(agents_command, args)
    if args.cmd == "hash-key":
        from app.tenants import hash_api_key
        print(hash_api_key(args.key))
        return 0
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
