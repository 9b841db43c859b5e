"""The Celery worker's entry point: `celery -A app.worker worker` (needs REDIS_URL)."""
from __future__ import annotations

from app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
