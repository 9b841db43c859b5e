"""The product's web app: the support-chat API and widget (and, in `python -m app serve`, the
engine's OpenAI-compatible routes beside it).

    create_app(config=None, client=None, settings=None) -> Flask

Config keys default from the environment, parsed once by `app.settings.WebSettings` (each field
is the lower-case name of its variable, with its default and meaning there); `config` overrides
them per app, and adds MAX_MESSAGE_CHARS, ENGINE_ARGS (for the in-process engine) and
RATE_LIMITS (else configs/limits.yaml, app/limits.py). The inference chain (primary, hot standby,
breakers, time-outs) comes from configs/reliability.yaml and its environment overrides
(pipelines/resilience.py).
"""
from __future__ import annotations

import threading
from pathlib import Path

from flask import Flask, Response, abort, jsonify, request, send_from_directory
from prometheus_client import CollectorRegistry
from redis.exceptions import RedisError

import inference  # noqa: F401  (sets OMP_WAIT_POLICY; importing app loads no torch)
from app.agent.api import bp as agent_api_bp
from app.agent.auth import AUTH_SCHEME, init_agent_auth
from app.agent.auth import bp as agent_auth_bp
from app.agent.console import bp as console_bp
from app.agent.experiments_api import bp as agent_experiments_bp
from app.agent.faq_api import bp as agent_faq_bp
from app.agent.webhooks_api import bp as agent_webhooks_bp
from app.chat.demo_orders import init_demo_orders
from app.chat.handoff import bp as chat_handoff_bp
from app.chat.routes import bp as chat_bp
from app.completion.infill import bp as infill_bp
from app.completion.infill import init_infill
from app.completion.routes import beta as beta_bp
from app.completion.routes import bp as completion_bp
from app.completion.routes import init_completion
from app.errors import error_response
from app.jobs.knowledge_base import bp as kb_bp
from app.jobs.routes import bp as jobs_bp
from app.jobs.tasks import BrokerUnavailable, celery_init_app
from app.limits import init_limits
from app.live_events import live_events_for
from app.readiness import Readiness
from app.reports.queries import ReportCollector
from app.schemas import METRICS, Readyz, Status
from app.services import ChatServices
from app.settings import WebSettings
from app.store.action_log import SqlCallLog
from app.store.conversations import ConversationStore
from app.store.db import DatabaseUnavailable, init_db
from app.store.experiments import ExperimentStore
from app.store.faq_drafts import FaqDrafts
from app.store.handoffs import Handoffs
from app.store.webhooks import WebhookStore
from app.tenants import TenantRegistry
from configs import shipped
from httpkit.openapi import build_spec, documented
from monitoring.degradation_metrics import DegradationCollector
from monitoring.reliability_metrics import ReliabilityCollector
from monitoring.web_metrics import WebMetrics

KB_DIR_DEFAULT = shipped("kb")
SECURITY_SCHEMES = {"siteKey": {"type": "apiKey", "in": "header", "name": "X-Site-Key",
                                "description": "the tenant's site key (configs/tenants.yaml)"},
                    "apiKey": {"type": "http", "scheme": "bearer",
                               "description": "a tenant's API key (stored hashed in configs/tenants.yaml)"},
                    **AUTH_SCHEME}


def create_app(config: dict | None = None, client=None, settings: WebSettings | None = None) -> Flask:
    """`client`: an inference client to use instead of the one from the environment; `settings`:
    the environment, parsed (default: read now)."""
    app = Flask(__name__, static_folder="static")
    settings = settings or WebSettings()
    app.extensions["settings"] = settings
    # SSE_MAX_S: a live-event stream ends after this long and the client reconnects with
    # Last-Event-ID (so a stream never outlives a graceful shutdown's drain)
    app.config.update(MAX_MESSAGE_CHARS=4000, SSE_MAX_S=25.0, MAX_CONTENT_LENGTH=4 << 20,
                      CHAT_MAX_BODY_BYTES=64 * 1024,
                      ENGINE_ARGS={}, **settings.flask_config())
    app.config.update(config or {})
    if app.config["KB_PATH"]:              # one meaning for the index and the /kb/ links
        app.config["KB_PATH"] = str(Path(app.config["KB_PATH"]).resolve())
    # approved FAQ drafts, indexed beside the help centre: the instance folder unless set
    app.config["FAQ_PATH"] = str(Path(app.config.get("FAQ_PATH") or Path(app.instance_path) / "faq").resolve())
    url = app.config["REDIS_URL"]
    # acks_late + reject_on_worker_lost: a task whose worker dies goes back to the queue; the broker
    # redelivers an unacknowledged task after visibility_timeout, so it must exceed the longest
    # task's time limit (app/jobs/tasks.py) or a running task would be handed out twice
    visibility = app.config["CELERY_VISIBILITY_TIMEOUT_S"]
    broker = (app.config["CELERY_BROKER_URL"] or url) if url else None
    app.config.setdefault("CELERY", {"broker_url": broker, "result_backend": url, "task_always_eager": not url,
                                      "task_ignore_result": False, "task_acks_late": True,
                                      "task_reject_on_worker_lost": True, "broker_connection_retry_on_startup": True,
                                      "broker_transport_options": {"visibility_timeout": visibility},
                                      "worker_prefetch_multiplier": 1})
    celery_init_app(app)
    db = init_db(app)
    init_agent_auth(app)
    app.extensions["webhooks"] = WebhookStore(db)                 # app/webhook_events.py
    app.extensions["experiments"] = ExperimentStore(db)           # A/B tests of the chat
    app.extensions["live_events"] = live_events_for(url)      # agent replies, typing, new handoffs
    app.extensions["sse_slots"] = threading.BoundedSemaphore(app.config["SSE_MAX_STREAMS"])
    app.extensions["support_chat"] = {
        "store": ConversationStore(db),
        "handoffs": Handoffs(db),
        "faq_drafts": FaqDrafts(db, app.config["FAQ_PATH"]),
        "tenants": TenantRegistry(app.config["TENANTS_PATH"]),
        "services": ChatServices(app.config, client, SqlCallLog(db)),
        "turn_slots": threading.BoundedSemaphore(app.config["CHAT_MAX_TURNS"]),      # app/chat/routes.py
    }
    registry = CollectorRegistry()
    web_metrics = WebMetrics(registry)
    web_metrics.init_app(app)
    services = app.extensions["support_chat"]["services"]
    registry.register(ReliabilityCollector(lambda: services.built_client))
    registry.register(DegradationCollector(app))
    tenants = app.extensions["support_chat"]["tenants"]
    registry.register(ReportCollector(db, lambda: [t.tenant.tenant_id for t in tenants.tenants],
                                      window_h=app.config["RESOLUTION_WINDOW_H"]))
    init_limits(app, (chat_bp, chat_handoff_bp), completion_bp, beta_bp, infill_bp, jobs_bp, kb_bp)
    app.register_blueprint(chat_bp)
    app.register_blueprint(chat_handoff_bp)
    init_completion(app)
    init_infill(app)
    app.register_blueprint(jobs_bp)
    app.register_blueprint(kb_bp)
    app.register_blueprint(agent_auth_bp)
    app.register_blueprint(agent_api_bp)
    app.register_blueprint(agent_faq_bp)
    app.register_blueprint(agent_experiments_bp)
    app.register_blueprint(agent_webhooks_bp)
    app.register_blueprint(console_bp)
    init_demo_orders(app)

    @app.get("/")
    def demo():
        return send_from_directory(Path(__file__).resolve().parent / "templates", "demo.html")

    @app.get("/kb/<path:name>")
    def kb_article(name: str):
        """The help-centre article a citation points to (Markdown as plain text)."""
        kb_dir = Path(app.config["KB_PATH"] or KB_DIR_DEFAULT)
        if not name.endswith(".md"):
            abort(404)
        if name.startswith("approved-faq/"):                   # approved FAQ drafts (app/store/faq_drafts.py)
            kb_dir, name = Path(app.config["FAQ_PATH"]), name[len("approved-faq/"):]
        return send_from_directory(kb_dir, name, mimetype="text/markdown; charset=utf-8")

    @app.get("/healthz")
    @documented(responses={200: Status}, tags=("operations",))
    def healthz():
        """Liveness."""
        return jsonify({"status": "ok"})

    readiness = Readiness(app)

    @app.get("/readyz")
    @documented(responses={200: Readyz, 503: Readyz}, tags=("operations",))
    def readyz():
        """Readiness: can serve customers, maybe degraded (app/readiness.py). 503 only while the
        first build of the chat pipeline runs, or when it cannot be built at all."""
        body, status = readiness.report()
        return jsonify(body), status, ({"Retry-After": "5"} if status == 503 else {})

    @app.get("/openapi.json")
    def openapi():
        """This document, generated from the routes and their pydantic models (app/schemas.py)."""
        return jsonify(build_spec(app, title="Support chat and code completion", version="1",
                                  security_schemes=SECURITY_SCHEMES,
                                  default_security={"/api/chat/": ("siteKey",), "/v1/": ("apiKey",),
                                                    "/api/agent/": tuple(AUTH_SCHEME)}))

    @app.get("/metrics")
    @documented(responses={200: METRICS}, tags=("operations",))
    def metrics():
        """The web tier's Prometheus metrics: requests, chat, completion, fallback chain."""
        body, content_type = web_metrics.render()
        return Response(body, mimetype=content_type)

    @app.errorhandler(404)
    def _not_found(_exc):
        return error_response(404, "not found")

    @app.errorhandler(405)
    def _not_allowed(_exc):
        return error_response(405, "method not allowed")

    @app.errorhandler(DatabaseUnavailable)
    @app.errorhandler(BrokerUnavailable)
    @app.errorhandler(RedisError)
    def _dependency_down(exc):
        """An outage is neither the client's fault (4xx) nor a bare 500: 503 and when to retry."""
        app.logger.warning("dependency unavailable on %s: %s", request.path, exc)
        what = str(exc) if not isinstance(exc, RedisError) else "a backing store (Redis) is unavailable"
        message = f"{what}; retry after the Retry-After seconds"
        return error_response(503, message, {"Retry-After": "5"}, type_="service_unavailable")

    @app.errorhandler(Exception)
    def _unexpected(exc):
        from werkzeug.exceptions import HTTPException
        if isinstance(exc, HTTPException):
            return error_response(exc.code, exc.description)
        app.logger.exception("unhandled error")
        return error_response(500, "internal error")

    @app.errorhandler(413)
    def _too_large(_exc):
        return error_response(413, f"request body larger than {app.config['MAX_CONTENT_LENGTH']} bytes")

    return app
