"""Prometheus metrics of the web tier (support chat and completion apps):

    http_requests_total{endpoint, method, status}     endpoint = the route's URL rule (bounded)
    http_request_duration_seconds{endpoint}           until the response (or its first byte)
    chat_first_token_seconds                          message received -> first text streamed
    chat_turns_total{intent, outcome}                 outcome: answered | degraded | handoff | blocked
    chat_feedback_total{rating}                       thumbs up / down
    chat_csat_total{rating}                           end-of-conversation rating 1-5
    chat_handoffs_total{event}                        requested, claimed, resolved, cancelled
    agent_messages_total                              agents' replies to customers
    agent_first_reply_seconds                         handoff request -> first agent reply
    chat_filter_blocks_total{filter}                  banned_words | injection
    chat_experiment_turns_total{experiment, arm}      turns answered inside an A/B experiment's arm
    chat_experiment_first_token_seconds{experiment, arm}   the same turns' first-text latency

Under gunicorn (PROMETHEUS_MULTIPROC_DIR set) every worker writes its values to that directory
and /metrics adds them up (prometheus_client's multiprocess mode); see `render`.
"""
from __future__ import annotations

import os
import time

from flask import Flask, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


def multiprocess_mode() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class WebMetrics:
    def __init__(self, registry: CollectorRegistry):
        """registry: what /metrics renders. In multiprocess mode the metrics below live in the
        shared directory instead and the registry holds only this process's own collectors
        (e.g. the breaker states); `metric_registry` is where other modules put their metrics."""
        self.registry = registry
        self.metric_registry = CollectorRegistry() if multiprocess_mode() else registry
        r = self.metric_registry
        self.requests = Counter("http_requests_total", "HTTP requests", ["endpoint", "method", "status"], registry=r)
        self.latency = Histogram("http_request_duration_seconds", "HTTP request latency to the response",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("chat_first_token_seconds", "Chat message received -> first text out",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.turns = Counter("chat_turns_total", "Chat turns answered", ["intent", "outcome"], registry=r)
        self.grounding = Counter("chat_grounding_total", "Answered chat turns by how the reply is grounded: "
                                 "quoted, verified_generated, sentence_dropped, unanswerable, clarified, free",
                                 ["outcome"], registry=r)
        self.feedback = Counter("chat_feedback_total", "Chat feedback", ["rating"], registry=r)
        self.csat = Counter("chat_csat_total", "End-of-conversation ratings (1-5) after a human resolved it",
                            ["rating"], registry=r)
        self.handoffs = Counter("chat_handoffs_total", "Handoffs to a human, by what happened",
                                ["event"], registry=r)          # requested, claimed, resolved, cancelled
        self.agent_messages = Counter("agent_messages_total", "Messages agents sent to customers", registry=r)
        self.first_human_reply = Histogram(
            "agent_first_reply_seconds", "From the handoff request to the agent's first reply",
            buckets=(5, 15, 30, 60, 120, 300, 600, 1800, 3600), registry=r)
        self.experiment_turns = Counter("chat_experiment_turns_total", "Chat turns answered inside an A/B "
                                        "experiment, by experiment id and arm", ["experiment", "arm"], registry=r)
        self.experiment_first_token = Histogram(
            "chat_experiment_first_token_seconds", "First-text latency of turns inside an A/B experiment",
            ["experiment", "arm"], buckets=LATENCY_BUCKETS, registry=r)
        self.filter_blocks = Counter("chat_filter_blocks_total", "Chat messages blocked by a filter", ["filter"],
                                     registry=r)

    def init_app(self, app: Flask) -> None:
        @app.before_request
        def _start_timer():
            g.metrics_t0 = time.perf_counter()

        @app.after_request
        def _observe(resp):
            rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
            if rule not in ("/metrics", "/v1/metrics"):
                self.requests.labels(rule, request.method, str(resp.status_code)).inc()
                t0 = getattr(g, "metrics_t0", None)
                if t0 is not None:
                    self.latency.labels(rule).observe(time.perf_counter() - t0)
            return resp

        app.extensions["web_metrics"] = self

    def turn(self, intent: str, degraded: bool, handoff: bool, blocked: str | None,
             grounding: str | None = None) -> None:
        outcome = "blocked" if blocked else "handoff" if handoff else "degraded" if degraded else "answered"
        self.turns.labels(intent, outcome).inc()
        if grounding:
            self.grounding.labels(grounding).inc()
        if blocked:
            self.filter_blocks.labels(blocked).inc()

    def render(self) -> tuple[bytes, str]:
        if multiprocess_mode():
            from prometheus_client import multiprocess
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)
            return generate_latest(merged) + generate_latest(self.registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
