"""Prometheus view of the inference fallback chain (pipelines/resilience.py), read at scrape
time from the client's own counts and its breakers (which read Redis when the state is shared):

    inference_breaker_state{endpoint}              0 closed, 1 half-open, 2 open
    inference_fallbacks_total{endpoint, reason}    calls that skipped ("open") or failed ("error") there
    inference_endpoint_info{endpoint}              1 for the endpoint that answered last
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

STATE_VALUES = {"closed": 0, "half-open": 1, "open": 2}


class ReliabilityCollector(Collector):
    def __init__(self, get_client: Callable[[], object | None]):
        """get_client: the web tier's FallbackClient, or None while none is built yet."""
        self.get_client = get_client

    def collect(self):
        client = self.get_client()
        states = GaugeMetricFamily("inference_breaker_state", "Circuit breaker per inference endpoint "
                                   "(0 closed, 1 half-open, 2 open)", labels=["endpoint"])
        fallbacks = CounterMetricFamily("inference_fallbacks", "Calls that skipped or failed an inference "
                                        "endpoint and fell back to the next", labels=["endpoint", "reason"])
        last = GaugeMetricFamily("inference_endpoint_last", "1 for the endpoint that answered last",
                                 labels=["endpoint"])
        if client is not None and hasattr(client, "breaker_states"):
            for name, state in client.breaker_states().items():
                states.add_metric([name], STATE_VALUES.get(state, 2))
                last.add_metric([name], 1.0 if client.last_endpoint == name else 0.0)
            for (name, reason), count in sorted(client.fallbacks.items()):
                fallbacks.add_metric([name, reason], count)
        yield states
        yield fallbacks
        yield last
