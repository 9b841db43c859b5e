"""gunicorn settings for the web app in production (docker-compose.yml's `web` service):

    gunicorn -c app/gunicorn_conf.py "app:create_app()"

Threaded workers, since chat replies stream (SSE) for seconds; each worker is stateless (sessions,
rate-limit counters and breaker state live in Redis), so replicas scale behind a load balancer.
Prometheus multiprocess mode: every worker writes its metrics under PROMETHEUS_MULTIPROC_DIR and
/metrics adds them up; a dead worker's files are marked so its gauges drop out.
"""
from __future__ import annotations

import os

from app.settings import WebSettings

_settings = WebSettings()
bind = _settings.web_bind
workers = _settings.web_workers
worker_class = "gthread"
threads = _settings.web_threads
timeout = _settings.web_timeout_s                 # a long reply must not kill its worker
graceful_timeout = _settings.web_graceful_s       # SIGTERM: in-flight streams get this long
keepalive = 5
accesslog = "-"


def on_starting(server):
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:                                   # stale files from an earlier run would add up
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            os.remove(os.path.join(path, name))


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess
        multiprocess.mark_process_dead(worker.pid)


def post_worker_init(worker):
    """Each worker starts building its chat pipeline (app/services.py); /readyz is 503 until the
    first attempt ended, then 200, degraded or not."""
    services = worker.wsgi.extensions["support_chat"]["services"]
    services.start()
