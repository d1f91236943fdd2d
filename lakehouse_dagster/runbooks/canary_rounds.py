"""The scheduled canary's rounds (runbook Fase 1 monitoring: "re-run the canary periodically over the flipped
datasets"), sized so the queue drains: a tick checks the flipped datasets whose last scheduled verdict is oldest
(never scheduled first), at most a cap per tick, many datasets per run, and asks for no more runs than the
in-flight limit leaves free; a dataset already in a queued or running canary run is not asked for again.

Ordered by the *scheduled* verdicts, not every verdict: the mirror's own checks run only when a dataset changes, and
the schedule is what catches drift while nothing changes (its every-Nth full cross-check counts scheduled verdicts,
``parity.canary.full_due``). Plain Python; the schedule (dagster/defs/parity/canary_schedule.py) reads the runs in
flight from the Dagster instance and turns the batches into run requests.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Collection, Sequence

import psycopg

from lakehouse_dagster.core.batches import split_near_equal
from lakehouse_dagster.parity.verdicts import last_scheduled


def oldest_first(
    conn: psycopg.Connection, dataset_ids: Collection[uuid.UUID]
) -> list[tuple[uuid.UUID, dt.datetime | None]]:
    """``(dataset, its last scheduled verdict's time or None)``, never-scheduled first, then the oldest verdict."""
    if not dataset_ids:
        return []
    return last_scheduled(conn, list(dataset_ids))


@dataclasses.dataclass(frozen=True)
class Round:
    """What one tick asks for, and why not more."""

    batches: list[list[uuid.UUID]]
    due: int  # flipped datasets that could be checked (partitions, not in a run in flight)
    in_flight_runs: int
    in_flight_datasets: int
    free_runs: int
    cap: int
    max_runs: int

    @property
    def requested(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def left(self) -> int:
        """Due datasets this tick leaves for the next ones (the cap or the run limit)."""
        return self.due - self.requested

    def summary(self) -> str:
        if not self.batches:
            return self.why_nothing()
        return (
            f"{self.requested} of {self.due} due flipped dataset(s) in {len(self.batches)} run(s); "
            f"{self.in_flight_runs} canary run(s) already in flight ({self.in_flight_datasets} dataset(s)), "
            f"{self.free_runs} run(s) free, cap {self.cap} per tick"
            + (f"; {self.left} left for the next ticks (oldest verdicts first)" if self.left else "")
        )

    def why_nothing(self) -> str:
        if self.due == 0:
            return (
                f"nothing requested: every flipped dataset is in one of the {self.in_flight_runs} canary run(s) in "
                f"flight ({self.in_flight_datasets} dataset(s))"
            )
        return (
            f"nothing requested: {self.in_flight_runs} canary run(s) in flight, the limit (LAKEHOUSE_CANARY_MAX_RUNS="
            f"{self.max_runs}); {self.due} due flipped dataset(s) wait for them to finish"
        )


def plan_round(
    ordered: Sequence[uuid.UUID],
    *,
    in_flight_datasets: Collection[uuid.UUID],
    in_flight_runs: int,
    max_runs: int,
    cap: int,
    batch_size: int,
) -> Round:
    """The batches of one tick over ``ordered`` (oldest verdict first): the datasets not in flight, at most ``cap``
    and at most the free runs' worth, in ``ceil(n / batch_size)`` runs of near-equal size (they finish together)."""
    busy = set(in_flight_datasets)
    due = [d for d in ordered if d not in busy]
    free = max(0, max_runs - in_flight_runs)
    take = due[: min(cap, free * batch_size)]
    return Round(
        batches=split_near_equal(take, batch_size),
        due=len(due),
        in_flight_runs=in_flight_runs,
        in_flight_datasets=len(busy),
        free_runs=free,
        cap=cap,
        max_runs=max_runs,
    )
