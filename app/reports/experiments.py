"""An A/B experiment's results per arm: the reports' figures for the arm's conversations
(resolution rate under the resolution window, handoff rate, CSAT), the median time to a reply's
first text, and each arm against the first (the control) with a two-proportion test on the
resolution and handoff rates (app/reports/significance.py)."""
from __future__ import annotations

import datetime as dt
import statistics

from sqlalchemy import select

from app.reports.queries import DEFAULT_WINDOW, report
from app.reports.significance import two_proportions, wilson
from app.store.db import Database
from app.store.models import Conversation, Message, utcnow

ALPHA = 0.05


def _rounded(d: dict | None) -> dict | None:
    return {k: round(v, 4) for k, v in d.items()} if d else None


def arm_results(db: Database, tenant: str, experiment: dict, window: dt.timedelta = DEFAULT_WINDOW,
                now: dt.datetime | None = None) -> list[dict]:
    now = now or utcnow()
    start = dt.datetime.fromisoformat(experiment["started_at"])
    end = dt.datetime.fromisoformat(experiment["stopped_at"]) if experiment["stopped_at"] else now
    out = []
    for arm in experiment["arms"]:
        r = report(db, tenant, start, end + dt.timedelta(seconds=1), window, now, arm=(experiment["id"], arm["name"]))
        with db.session(readonly=True) as s:
            waits = s.scalars(select(Message.first_token_ms).join(Conversation).where(
                Conversation.experiment_id == experiment["id"], Conversation.arm == arm["name"],
                Message.first_token_ms.is_not(None))).all()
        decided = sum(r["outcomes"].values())
        resolved = r["outcomes"]["bot_resolved"]
        out.append({"arm": arm["name"], "value": arm["value"], "weight": arm["weight"],
                    "conversations": r["conversations"], "decided": decided, "undecided": r["undecided"],
                    "resolution_rate": r["resolution_rate"], "resolution_ci": _interval(wilson(resolved, decided)),
                    "handoffs": r["handoffs"], "handoff_rate": r["handoff_rate"],
                    "handoff_ci": _interval(wilson(r["handoffs"], r["conversations"])),
                    "csat_average": r["csat_average"], "csat_count": r["csat_count"],
                    "first_text_p50_ms": round(statistics.median(waits), 1) if waits else None,
                    "_resolved": resolved})
    control = out[0] if out else None
    for arm in out[1:]:
        res = two_proportions(control["_resolved"], control["decided"], arm["_resolved"], arm["decided"])
        hand = two_proportions(control["handoffs"], control["conversations"], arm["handoffs"], arm["conversations"])
        arm["vs_control"] = {"resolution": _rounded(res), "handoff": _rounded(hand),
                             "resolution_significant": bool(res and res["p_value"] < ALPHA),
                             "handoff_significant": bool(hand and hand["p_value"] < ALPHA)}
    for arm in out:
        arm.pop("_resolved")
        arm.setdefault("vs_control", None)
    return out


def _interval(ci: tuple[float, float] | None) -> list[float] | None:
    return [round(ci[0], 4), round(ci[1], 4)] if ci else None
