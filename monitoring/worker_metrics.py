"""Prometheus metrics of the Celery worker, served on WORKER_METRICS_PORT (default 9808):

    celery_tasks_total{task, state}          state: started | succeeded | failed | retried
    celery_task_duration_seconds{task}       run time of finished tasks
    celery_queue_length{queue}               messages waiting in the Redis broker (read at scrape)

Counted from Celery's task signals in the process that runs the tasks: run the worker with
`--pool=solo` or `--pool=threads` (the tasks wait on the inference service, not on the CPU).
"""
from __future__ import annotations

import time

from celery.signals import task_failure, task_postrun, task_prerun, task_retry
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class QueueLength(Collector):
    def __init__(self, redis_url: str, queues: tuple[str, ...]):
        import redis
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=1)
        self.queues = queues

    def collect(self):
        fam = GaugeMetricFamily("celery_queue_length", "Messages waiting in the broker", labels=["queue"])
        for q in self.queues:
            try:
                fam.add_metric([q], self.redis.llen(q))
            except Exception:           # noqa: BLE001 - broker down: report nothing rather than fail the scrape
                pass
        yield fam


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.tasks = Counter("celery_tasks_total", "Celery tasks by state", ["task", "state"], registry=self.registry)
        self.duration = Histogram("celery_task_duration_seconds", "Celery task run time", ["task"],
                                  buckets=DURATION_BUCKETS, registry=self.registry)
        self._started: dict[str, float] = {}      # task id -> perf_counter at prerun

    def connect(self) -> None:
        """Hook the Celery task signals (weak=False: the handlers live as long as the worker)."""
        task_prerun.connect(self._prerun, weak=False)
        task_postrun.connect(self._postrun, weak=False)
        task_failure.connect(self._failure, weak=False)
        task_retry.connect(self._retry, weak=False)

    def _prerun(self, task_id=None, task=None, **_):
        self._started[task_id] = time.perf_counter()
        self.tasks.labels(task.name, "started").inc()

    def _postrun(self, task_id=None, task=None, state=None, **_):
        t0 = self._started.pop(task_id, None)
        if t0 is not None:
            self.duration.labels(task.name).observe(time.perf_counter() - t0)
        if state == "SUCCESS":
            self.tasks.labels(task.name, "succeeded").inc()

    def _failure(self, sender=None, **_):
        self.tasks.labels(sender.name, "failed").inc()

    def _retry(self, sender=None, **_):
        self.tasks.labels(sender.name, "retried").inc()

    def serve(self, port: int, redis_url: str | None, queues: tuple[str, ...] = ("celery",)) -> None:
        if redis_url:
            self.registry.register(QueueLength(redis_url, queues))
        start_http_server(port, addr="0.0.0.0", registry=self.registry)
