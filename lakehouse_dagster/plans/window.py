"""Time windows a stage may start in: ``weekdays 09:00-17:00 UTC``, ``daily 22:00-06:00 Europe/Amsterdam``,
``mon,wed 10:00-12:00 UTC``, ``sat-sun 00:00-24:00 UTC``. The days name the day the window opens; an end before
the start runs past midnight. A window only holds back a stage's flag change: a stage already flipped keeps
being analysed outside it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import zoneinfo

from lakehouse_dagster.core.errors import BadInput

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_NAMED = {"daily": tuple(range(7)), "weekdays": tuple(range(5)), "weekends": (5, 6)}
_FORM = re.compile(r"^\s*(\S+)\s+(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s+(\S+)\s*$")
HELP = "write e.g. 'weekdays 09:00-17:00 UTC' (days: daily, weekdays, weekends, mon-fri, sat,sun; a time zone)"


@dataclasses.dataclass(frozen=True)
class Window:
    text: str
    days: tuple[int, ...]  # Monday 0 .. Sunday 6: the days the window opens
    start: int  # minutes after midnight
    end: int  # minutes after midnight (<= start: past midnight)
    zone: str

    def _tz(self) -> dt.tzinfo:
        return dt.UTC if self.zone.upper() == "UTC" else zoneinfo.ZoneInfo(self.zone)

    def _openings(self, now: dt.datetime):
        """(open, close) of the windows around ``now``: yesterday's (it may run past midnight) to a week on."""
        local = now.astimezone(self._tz())
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        length = (self.end - self.start) % (24 * 60) or 24 * 60
        for day in range(-1, 8):
            start_day = midnight + dt.timedelta(days=day)
            if start_day.weekday() not in self.days:
                continue
            opens = start_day + dt.timedelta(minutes=self.start)
            yield opens, opens + dt.timedelta(minutes=length)

    def is_open(self, now: dt.datetime) -> bool:
        return any(o <= now < c for o, c in self._openings(now))

    def next_open(self, now: dt.datetime) -> dt.datetime:
        """When the window next opens (``now`` when it is open)."""
        if self.is_open(now):
            return now
        return min(o for o, _ in self._openings(now) if o > now).astimezone(dt.UTC)


def parse_window(raw: object) -> Window:
    if not isinstance(raw, str):
        raise BadInput(f"{raw!r} is not a window; {HELP}")
    m = _FORM.match(raw)
    if not m:
        raise BadInput(f"{raw!r} is not a window; {HELP}")
    days_text, h1, m1, h2, m2, zone = m.groups()
    days = _days(days_text.lower(), raw)
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if int(h1) > 23 or int(m1) > 59 or int(h2) > 24 or int(m2) > 59 or end > 24 * 60:
        raise BadInput(f"{raw!r}: times are HH:MM from 00:00 to 24:00; {HELP}")
    if start == end:
        raise BadInput(f"{raw!r}: the window opens and closes at the same time; use 00:00-24:00 for all day")
    if zone.upper() != "UTC":
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise BadInput(f"{raw!r}: unknown time zone {zone!r}; use UTC or a name like Europe/Amsterdam") from None
    return Window(raw.strip(), days, start, end, zone)


def _days(text: str, raw: str) -> tuple[int, ...]:
    if text in _NAMED:
        return _NAMED[text]
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first not in _DAYS or (last and last not in _DAYS):
            raise BadInput(f"{raw!r}: unknown days {text!r}; {HELP}")
        a, b = _DAYS.index(first), _DAYS.index(last or first)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return tuple(sorted(out))
