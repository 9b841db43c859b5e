"""A tenant's working hours (`business_hours:` in configs/tenants.yaml), in its own time zone:

    business_hours:
      timezone: Europe/London
      mon-fri: "09:00-17:30"
      sat: ["10:00-12:00", "13:00-16:00"]
      sun: closed

Days are mon..sun, alone or as a range ("mon-fri"); a day not named is closed; "24:00" ends a day.
Outside the hours a handoff offers the email fallback at once and says when the team is back
(app/chat/routes.py); a tenant without `business_hours` is always open.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SPAN = re.compile(r"^(\d{2}):(\d{2})-(\d{2}):(\d{2})$")


@dataclass(frozen=True)
class BusinessHours:
    zone: ZoneInfo
    windows: tuple[tuple[tuple[int, int], ...], ...]       # per weekday (Monday first): (start, end) minutes

    def is_open(self, now: dt.datetime) -> bool:
        local = now.astimezone(self.zone)
        minute = local.hour * 60 + local.minute
        return any(start <= minute < end for start, end in self.windows[local.weekday()])

    def next_open(self, now: dt.datetime) -> dt.datetime | None:
        """The next opening after `now` (UTC), or None when no day has hours."""
        local = now.astimezone(self.zone)
        for ahead in range(8):
            day = local.date() + dt.timedelta(days=ahead)
            for start, _end in self.windows[day.weekday()]:
                opens = dt.datetime.combine(day, dt.time(start // 60, start % 60), self.zone)
                if opens > local:
                    return opens.astimezone(dt.UTC)
        return None


def parse_hours(spec: object, where: str) -> BusinessHours | None:
    """`spec` as the YAML gives it; ValueError naming `where` and the bad field."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("timezone"), str):
        raise ValueError(f"{where}: business_hours needs a timezone (an IANA name such as Europe/London)")
    try:
        zone = ZoneInfo(spec["timezone"])
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{where}: business_hours timezone {spec['timezone']!r} is not an IANA time zone") from None
    windows: list[list[tuple[int, int]]] = [[] for _ in DAYS]
    for key, value in spec.items():
        if key == "timezone":
            continue
        days = _days(str(key), where)
        for start, end in _spans(value, f"{where}: business_hours {key}"):
            for d in days:
                windows[d].append((start, end))
    return BusinessHours(zone, tuple(tuple(sorted(w)) for w in windows))


def _days(key: str, where: str) -> list[int]:
    first, _, last = key.lower().partition("-")
    if first not in DAYS or (last and last not in DAYS):
        raise ValueError(f"{where}: business_hours day {key!r} must be mon..sun or a range such as mon-fri")
    a, b = DAYS.index(first), DAYS.index(last or first)
    return list(range(a, b + 1)) if a <= b else [*range(a, 7), *range(0, b + 1)]


def _spans(value: object, where: str) -> list[tuple[int, int]]:
    if value in ("closed", None):
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        m = _SPAN.match(str(item).strip())
        if not m:
            raise ValueError(f"{where}: {item!r} must be HH:MM-HH:MM or closed")
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if m1 > 59 or m2 > 59 or start >= end or end > 24 * 60:
            raise ValueError(f"{where}: {item!r} must start before it ends, within one day (at most 24:00)")
        out.append((start, end))
    return out
