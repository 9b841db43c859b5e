"""Prometheus view of what the web process serves degraded (app/services.py, app/store_buffer.py,
app/outbox.py), read at scrape time:

    web_chat_pipeline_full            1 the full chat pipeline (embeddings), 0 the keyword one
    web_store_buffered_writes         session writes waiting for Redis in this process
    web_outbox_pending_tasks          Celery tasks waiting for the broker in this process

Buffered writes and outbox tasks live in the process: they are lost if it dies before the
dependency returns, so an alert pages on them (monitoring/alerts.yml).
"""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class DegradationCollector(Collector):
    def __init__(self, app):
        self.app = app

    def collect(self):
        ext = self.app.extensions
        services, store = ext["support_chat"]["services"], ext["support_chat"]["store"]
        yield GaugeMetricFamily("web_chat_pipeline_full", "1 when chat turns use the full pipeline (embeddings), "
                                "0 while they use the keyword one",
                                value=1.0 if services.pipeline_state == "full" else 0.0)
        yield GaugeMetricFamily("web_store_buffered_writes", "Session writes waiting in this process for Redis",
                                value=float(getattr(store, "num_queued", 0)))
        yield GaugeMetricFamily("web_outbox_pending_tasks", "Celery tasks waiting in this process for the broker",
                                value=float(ext["outbox"].num_pending))
