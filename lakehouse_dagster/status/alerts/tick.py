"""One tick of the alerts sensor: find, record, post."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence

import psycopg

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.status import recording
from lakehouse_dagster.status.alerts.cursor import Cursor, Position
from lakehouse_dagster.status.alerts.events import (
    failed_run_event,
    freshness_events,
    native_events,
    parity_events,
    plan_event,
    reverse_events,
    stream_events,
    wedged_events,
)
from lakehouse_dagster.status.alerts.kinds import (
    FRESHNESS,
    NATIVE_UNSAFE,
    REVERSE_BEHIND,
    STREAM_DOWN,
    WEDGED,
    Event,
    FailedRun,
    PlanEvent,
    _line,
)
from lakehouse_dagster.status.alerts.outbox import Delivery, deliver, record
from lakehouse_dagster.status.alerts.webhook import post_message, webhook_problem


@dataclasses.dataclass
class Tick:
    cursor: Cursor
    new: dict[str, int] = dataclasses.field(default_factory=dict)  # events recorded this tick, per kind
    delivery: Delivery | None = None
    unreadable: list[str] = dataclasses.field(default_factory=list)  # a source that could not be read, and why
    disabled: str | None = None  # why nothing was done (no URL)

    @property
    def log_lines(self) -> list[str]:
        lines = [f"could not read {u}" for u in self.unreadable]
        return lines + (self.delivery.dropped if self.delivery else [])

    def summary(self) -> str:
        """The tick's one line (the sensor's skip reason): never the URL."""
        if self.disabled:
            return self.disabled
        d = self.delivery or Delivery()
        new = sum(self.new.values())
        parts = [
            f"{new} new event(s)" + (f" ({', '.join(f'{k} {n}' for k, n in self.new.items() if n)})" if new else ""),
            f"posted {d.posted} event(s) in {d.messages} message(s)",
        ]
        later = f" (next try {d.next_attempt_at:%H:%M:%S} UTC)" if d.next_attempt_at else ""
        if d.failure:
            parts.append(f"a post failed ({d.failure}): {d.pending} event(s) pending, retried with backoff{later}")
        elif d.pending:
            parts.append(
                f"{d.pending} event(s) pending for a later tick" + (" (time budget)" if d.out_of_time else later)
            )
        if d.dropped:
            parts.append(f"{len(d.dropped)} event(s) dropped (see the log)")
        if self.unreadable:
            parts.append(f"could not read: {'; '.join(self.unreadable)}")
        return "; ".join(parts)


def run_tick(
    conn: psycopg.Connection,
    settings: Settings,
    cursor: Cursor,
    failed_runs: Sequence[FailedRun],
    *,
    now: dt.datetime,
    runs_read_to: Position | None = None,
    plan_events: Sequence[PlanEvent] = (),
    plan_events_read_to: recording.Position | None = None,
    post: Callable[[str, dict, float], None] = post_message,
) -> Tick:
    """Find the events since ``cursor`` (``failed_runs``: the failed runs the sensor read from the instance after
    ``cursor.runs_after(now)`` and in its look-back, not recorded yet, up to the position ``runs_read_to``;
    ``plan_events``: the rollout plan events read after ``cursor.rollout``, up to ``plan_events_read_to``), record the
    new ones, post what is due. Nothing at all when the webhook is unset or unusable (the cursor still moves, so
    turning alerts on later does not replay the past)."""
    problem = webhook_problem(settings.alerts.webhook_url)
    if problem:
        return Tick(cursor=cursor.moved(Position(now), Position(now), plan_events_read_to), disabled=problem)
    assert settings.alerts.webhook_url is not None
    events: list[Event] = [failed_run_event(r) for r in failed_runs] + [plan_event(e) for e in plan_events]
    present: dict[str, set[str]] = {}
    tick = Tick(cursor=cursor.moved(runs=runs_read_to or cursor.runs_after(now), rollout=plan_events_read_to))
    try:
        found, reached = parity_events(conn, cursor.parity_after(now))
        events += found
        tick.cursor = tick.cursor.moved(parity=reached)
    except psycopg.Error as exc:
        tick.unreadable.append(f"parity verdicts: {_line(exc, 200)}")
    for kind, find in (
        (WEDGED, lambda: wedged_events(conn, settings.mirror)),
        (FRESHNESS, lambda: freshness_events(conn, settings.mirror)),
        (NATIVE_UNSAFE, lambda: native_events(conn)),
        (STREAM_DOWN, lambda: stream_events(conn, settings.stream)),
        (REVERSE_BEHIND, lambda: reverse_events(conn, settings.reverse)),
    ):
        try:
            found = find()
        except psycopg.Error as exc:  # that source is unreadable: its open conditions stay as they are
            tick.unreadable.append(f"{kind}: {_line(exc, 200)}")
            continue
        events += found
        present[kind] = {e.key for e in found}
    fresh = record(conn, events, present)
    tick.new = dict(collections.Counter(e.kind for e in fresh))
    tick.delivery = deliver(
        conn,
        settings.alerts.webhook_url,
        timeout=settings.alerts.timeout_seconds,
        retry_seconds=settings.alerts.retry_seconds,
        now=now,
        post=post,
    )
    return tick
