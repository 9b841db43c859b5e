"""Prometheus view of what the web process serves degraded (app/services.py, app/store/db.py,
app/live_events.py, app/jobs/outbox.py), read at scrape time:

    web_chat_pipeline_full                   1 the full chat pipeline (embeddings), 0 the keyword one
    web_database_up                          1 when the conversation database answers
    web_live_event_publish_failures_total    live events (agent replies, new handoffs) not sent
    web_outbox_pending_tasks                 Celery tasks waiting for the broker in this process
    web_kb_banned_terms{source}              banned terms an article contains (its quotes are masked)

Outbox tasks live in the process: they are lost if it dies before the broker returns, so an
alert pages on them (monitoring/alerts.yml); so does a conversation database that is down.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class DegradationCollector(Collector):
    def __init__(self, app):
        self.app = app

    def collect(self):
        ext = self.app.extensions
        services = ext["support_chat"]["services"]
        yield GaugeMetricFamily("web_chat_pipeline_full", "1 when chat turns use the full pipeline (embeddings), "
                                "0 while they use the keyword one",
                                value=1.0 if services.pipeline_state == "full" else 0.0)
        banned = GaugeMetricFamily("web_kb_banned_terms", "Banned terms a knowledge-base article contains, at the "
                                   "last index (replies quoting it are masked)", labels=["source"])
        for source, terms in sorted(services.kb_banned_terms.items()):
            banned.add_metric([f"kb/{source}"], float(len(terms)))
        yield banned
        yield GaugeMetricFamily("web_database_up", "1 when the conversation database answers a query",
                                value=1.0 if ext["db"].ping() else 0.0)
        yield CounterMetricFamily("web_live_event_publish_failures", "Live events this process could not send "
                                  "(the customer or agent sees the change when their stream reconnects)",
                                  value=float(ext["live_events"].num_publish_failures))
        yield GaugeMetricFamily("web_outbox_pending_tasks", "Celery tasks waiting in this process for the broker",
                                value=float(ext["outbox"].num_pending))
