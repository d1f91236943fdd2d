"""The sensor's cursor: keyset positions on (time, id) that only move forward and past every page they read."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import TypeVar

from lakehouse_dagster.status import recording


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """A keyset position in an order by (time, id): everything at or before it was read."""

    at: dt.datetime
    id: int = 0

    def as_json(self) -> list:
        return [self.at.isoformat(), self.id]

    @classmethod
    def from_json(cls, raw: object) -> Position | None:
        if isinstance(raw, list) and len(raw) == 2:
            return cls(dt.datetime.fromisoformat(raw[0]), int(raw[1]))
        if isinstance(raw, str):  # a cursor from before the keyset positions: a time only
            return cls(dt.datetime.fromisoformat(raw))
        return None


@dataclasses.dataclass(frozen=True)
class Cursor:
    """How far the sensor has read: MISMATCH verdicts up to ``parity`` (checked_at, row id), failed runs up to
    ``runs`` (update time, run storage id), rollout plan events up to ``rollout`` (by transaction id, as the recorder
    reads: status/recording.py). Each tick reads on after the first two and again a look-back behind them; an empty
    position starts at the tick's time (rollout: at the events committed then)."""

    parity: Position | None = None
    runs: Position | None = None
    rollout: recording.Position | None = None

    @classmethod
    def loads(cls, raw: str | None) -> Cursor:
        if not raw:
            return cls()
        data = json.loads(raw)
        rollout = data.get("rollout")
        return cls(
            Position.from_json(data.get("parity") or data.get("parity_at")),
            Position.from_json(data.get("runs") or data.get("runs_at")),
            recording.Position.from_json(rollout) if isinstance(rollout, dict) else None,
        )

    def dumps(self) -> str:
        return json.dumps(
            {
                "parity": self.parity.as_json() if self.parity else None,
                "runs": self.runs.as_json() if self.runs else None,
                "rollout": self.rollout.as_json() if self.rollout else None,
            }
        )

    def runs_after(self, now: dt.datetime) -> Position:
        """Read the failed runs after this (and the look-back behind it)."""
        return self.runs or Position(now)

    def parity_after(self, now: dt.datetime) -> Position:
        return self.parity or Position(now)

    def moved(
        self,
        parity: Position | None = None,
        runs: Position | None = None,
        rollout: recording.Position | None = None,
    ) -> Cursor:
        """Forward only: a position behind the current one is ignored (rollout: the reader never moves back)."""
        return Cursor(_later(self.parity, parity), _later(self.runs, runs), rollout or self.rollout)


def _later(a: Position | None, b: Position | None) -> Position | None:
    return b if a is None else a if b is None else max(a, b)


T = TypeVar("T")
_TICK = dt.timedelta(microseconds=1)


def keyset_page(
    read: Callable[[dt.datetime, int], Sequence[T]],
    key: Callable[[T], Position],
    after: Position,
    page: int,
) -> tuple[list[T], bool]:
    """The items after ``after`` in (time, id) order, about ``page`` of them, and whether more may follow, from a
    source that filters only "time > t" and orders only by time, ties in any order (Dagster's run storage:
    ``read(t, limit)``). A full page ends before its last time (that time may hold more items than the page
    showed) unless the whole page is one time; then the page grows (16x at most). So the position after the page
    always moves past it, and no item is skipped."""
    limit = page
    while True:
        got = list(read(after.at - _TICK, limit))
        new = sorted((r for r in got if key(r) > after), key=key)
        if len(got) < limit:
            return new, False
        last_at = max(key(r).at for r in got)
        whole = [r for r in new if key(r).at < last_at]
        if whole:
            return whole, True
        if limit >= 16 * page:  # more than 16 pages of items in one microsecond: take this page as it is
            return new, True
        limit *= 2
