"""The support team's numbers over a date range, from the conversation database:

    conversations                    conversations started (with at least one message)
    handoff_rate                     share of them that asked for a human
    bot_resolved_share               share the bot handled alone (no handoff)
    median_first_human_response_s    handoff request -> the agent's first reply (median)
    csat_average, csat_count         end-of-conversation ratings (1-5) given in the range
    resolution_rate, outcomes        each conversation's outcome (app/reports/resolution.py): the
                                     bot-resolved share of the decided ones, and the count per
                                     outcome; `undecided` counts those still inside the window

`GET /api/agent/reports` returns them with a per-day breakdown; `ReportCollector` exports the
last 24 hours per tenant as Prometheus gauges (monitoring/grafana/dashboard.json shows them).
"""
from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
from collections import defaultdict

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Date, and_, case, cast, exists, func, select
from sqlalchemy.orm import aliased

from app.reports.resolution import OUTCOMES, outcome_sql, resolution_rate
from app.store.db import Database
from app.store.models import Conversation, Feedback, Handoff, Message, utcnow

DEFAULT_WINDOW = dt.timedelta(hours=24)


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _utc_date(db: Database, column):
    """The UTC calendar date of a UTC timestamp column, computed by the database."""
    if db.engine.dialect.name == "postgresql":
        return cast(func.timezone("UTC", column), Date)
    return func.date(column)                       # SQLite keeps UTC timestamps as naive text


def report(db: Database, tenant: str, start: dt.datetime, end: dt.datetime,
           window: dt.timedelta = DEFAULT_WINDOW, now: dt.datetime | None = None,
           arm: tuple[int, str] | None = None) -> dict:
    """The numbers for conversations started in [start, end) (UTC); outcomes as of `now`. With
    `arm` (experiment id, arm name): only that arm's conversations, ratings and handoffs."""
    now = now or utcnow()
    scope = (Conversation.experiment_id == arm[0], Conversation.arm == arm[1]) if arm else ()
    in_range = (Conversation.tenant_id == tenant, Conversation.num_messages > 0,
                Conversation.created_at >= start, Conversation.created_at < end, *scope)
    with db.session(readonly=True) as s:
        handed = exists().where(Handoff.conversation_id == Conversation.id)
        agent_took_part = exists().where(Handoff.conversation_id == Conversation.id, Handoff.claimed_at.is_not(None))
        thumbs_up = exists().where(Feedback.conversation_id == Conversation.id, Feedback.kind == "message",
                                   Feedback.rating == "up")
        last = aliased(Message)                       # the conversation's last message
        day, result = _utc_date(db, Conversation.created_at), outcome_sql(now, window, agent_took_part, thumbs_up, last)
        groups = s.execute(
            select(day, result, func.count(), func.sum(case((handed, 1), else_=0)))
            .select_from(Conversation)
            .outerjoin(last, and_(last.conversation_id == Conversation.id, last.seq == Conversation.num_messages - 1))
            .where(*in_range).group_by(day, result)).all()
        replies_q = select(Handoff.requested_at, Handoff.first_reply_at).where(
            Handoff.tenant_id == tenant, Handoff.first_reply_at.is_not(None),
            Handoff.requested_at >= start, Handoff.requested_at < end)
        if arm:
            replies_q = replies_q.join(Conversation, Conversation.id == Handoff.conversation_id).where(*scope)
        replies = s.execute(replies_q).all()
        ratings = s.execute(select(Feedback.created_at, Feedback.rating).join(
            Conversation, Conversation.id == Feedback.conversation_id).where(
            Conversation.tenant_id == tenant, Feedback.kind == "csat",
            Feedback.created_at >= start, Feedback.created_at < end, *scope)).all()
    daily: dict[dt.date, dict] = defaultdict(_empty_day)
    outcomes = dict.fromkeys(OUTCOMES, 0)
    undecided = num_handoffs = num_convs = 0
    for date, result, count, had_handoff in groups:
        date = date if isinstance(date, dt.date) else dt.date.fromisoformat(date)
        day = daily[date]
        day["conversations"] += count
        day["handoffs"] += int(had_handoff or 0)
        num_handoffs += int(had_handoff or 0)
        num_convs += count
        if result == "undecided":
            undecided += count
        else:
            outcomes[result] += count
            day["outcomes"][result] += count
    for created, rating in ratings:
        daily[created.date()]["ratings"].append(int(rating))
    waits = [(first - asked).total_seconds() for asked, first in replies]
    scores = [int(r) for _, r in ratings]
    days = []
    day = start.date()
    while day < end.date() or (day == end.date() and end.time() != dt.time(0)):
        d = daily.get(day) or _empty_day()
        days.append({"date": day.isoformat(), "conversations": d["conversations"], "handoffs": d["handoffs"],
                     "csat_average": round(statistics.fmean(d["ratings"]), 2) if d["ratings"] else None,
                     "resolution_rate": resolution_rate(d["outcomes"])})
        day += dt.timedelta(days=1)
    return {"conversations": num_convs, "handoffs": num_handoffs,
            "handoff_rate": _ratio(num_handoffs, num_convs),
            "bot_resolved_share": _ratio(num_convs - num_handoffs, num_convs),
            "median_first_human_response_s": round(statistics.median(waits), 1) if waits else None,
            "csat_average": round(statistics.fmean(scores), 2) if scores else None,
            "csat_count": len(scores), "resolution_rate": resolution_rate(outcomes), "outcomes": outcomes,
            "undecided": undecided, "resolution_window_h": window.total_seconds() / 3600, "daily": days}


def _empty_day() -> dict:
    return {"conversations": 0, "handoffs": 0, "ratings": [], "outcomes": dict.fromkeys(OUTCOMES, 0)}


class ReportCollector:
    """Prometheus gauges of the last 24 hours' report, per tenant (`support_report_*`); the
    database is asked at most once per `cache_s`, however often Prometheus scrapes."""

    def __init__(self, db: Database, tenant_ids, cache_s: float = 30.0, window_h: float = 24.0):
        self.db, self.tenant_ids, self.cache_s = db, tenant_ids, cache_s
        self.window = dt.timedelta(hours=window_h)
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, dict]] | None = None

    def _reports(self) -> dict[str, dict]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > self.cache_s:
                end = utcnow()
                try:
                    reports = {t: report(self.db, t, end - dt.timedelta(days=1), end, self.window, end)
                               for t in self.tenant_ids()}
                except Exception:                   # the database is down: no gauges this scrape
                    reports = {}
                self._cached = (time.monotonic(), reports)
            return self._cached[1]

    def collect(self):
        fields = (("conversations", "conversations", "Conversations started in the last 24 h"),
                  ("handoff_rate", "handoff_ratio", "Share of the last 24 h's conversations that asked for a human"),
                  ("bot_resolved_share", "bot_resolved_ratio",
                   "Share of the last 24 h's conversations the bot handled alone"),
                  ("median_first_human_response_s", "first_human_response_median_seconds",
                   "Median seconds from a handoff request to the first agent reply, last 24 h"),
                  ("csat_average", "csat_average", "Average end-of-conversation rating (1-5), last 24 h"),
                  ("csat_count", "csat_ratings", "End-of-conversation ratings given, last 24 h"),
                  ("resolution_rate", "resolution_ratio",
                   "Share of the last 24 h's decided conversations the bot resolved (Fin's rule)"))
        reports = self._reports()
        for key, name, doc in fields:
            family = GaugeMetricFamily(f"support_report_{name}", doc, labels=["tenant"])
            for tenant, rep in reports.items():
                if rep[key] is not None:
                    family.add_metric([tenant], float(rep[key]))
            yield family
        family = GaugeMetricFamily("support_report_outcomes", "Conversations started in the last 24 h, by outcome "
                                   "(undecided: still inside the resolution window)", labels=["tenant", "outcome"])
        for tenant, rep in reports.items():
            for name, count in [*rep["outcomes"].items(), ("undecided", rep["undecided"])]:
                family.add_metric([tenant, name], float(count))
        yield family
