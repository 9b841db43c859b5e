"""The Celery worker's entry point: `celery -A app.worker worker --pool=solo` (needs REDIS_URL);
`celery -A app.worker beat` runs the periodic jobs (the conversation retention cleanup).
Its Prometheus metrics are served on WORKER_METRICS_PORT (default 9808; 0 turns them off)."""
from __future__ import annotations

from celery.signals import worker_ready

from app import create_app
from app.jobs.tasks import RETENTION_SCHEDULE_S
from monitoring.worker_metrics import WorkerMetrics

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
celery_app.conf.beat_schedule = {
    "delete-old-conversations": {"task": "app.tasks.delete_old_conversations", "schedule": RETENTION_SCHEDULE_S},
}
metrics = WorkerMetrics()
metrics.connect()


@worker_ready.connect
def _serve_metrics(**_):
    port = flask_app.extensions["settings"].worker_metrics_port
    if port:
        metrics.serve(port, flask_app.config.get("REDIS_URL"))
