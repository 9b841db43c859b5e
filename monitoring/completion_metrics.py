"""Prometheus metrics of the IDE completion endpoint: latency, cache hits (exact / forward),
cancellations, wasted tokens, and view/select/dismiss events by language, from which dashboards
take the acceptance rate (select / view)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class CompletionMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.latency = Histogram("completion_latency_seconds", "Completion request latency", ["language"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("completion_requests_total", "Completion requests", ["language", "outcome"],
                                registry=r)
        self.cache_hits = Counter("completion_cache_hits_total", "Completion cache hits", ["kind"], registry=r)
        self.cancellations = Counter("completion_cancellations_total", "Requests superseded by a newer one",
                                     registry=r)
        self.wasted_tokens = Counter("completion_wasted_tokens_total",
                                     "Tokens generated after their request was superseded", registry=r)
        self.events = Counter("completion_events_total", "IDE events", ["language", "type"], registry=r)
