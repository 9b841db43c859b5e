"""The Celery worker's entry point: `celery -A app.worker worker --pool=solo` (needs REDIS_URL).
Its Prometheus metrics are served on WORKER_METRICS_PORT (default 9808; 0 turns them off)."""
from __future__ import annotations

from celery.signals import worker_ready

from app import create_app
from monitoring.worker_metrics import WorkerMetrics

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
metrics = WorkerMetrics()
metrics.connect()


@worker_ready.connect
def _serve_metrics(**_):
    port = flask_app.extensions["settings"].worker_metrics_port
    if port:
        metrics.serve(port, flask_app.config.get("REDIS_URL"))
