"""The one definition of "behind the mirror" and of a dataset's lag, for the overview, the alerts and the metrics.

A tabular dataset is behind when Postgres moved past the version its latest succeeded sync covers
(``datasets.mirrored_version < rows_version``: one partial-index scan over the few that are, the mirror
poller's own test). Datasets written iceberg-native are not behind: the mirror skips them and Iceberg is their
truth. Its lag is how old the Iceberg side's view is: seconds since its latest succeeded sync finished, the
snapshot age ``parity.health.snapshot_freshness`` judges; a dataset never synced has no lag (None) and is
listed as never synced.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg

from lakehouse_dagster.flags.flipped import flipped_dataset_ids
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.tracking.datasets.fragments import behind_rows


@dataclasses.dataclass(frozen=True)
class Behind:
    dataset_id: uuid.UUID
    name: str
    workspace_id: uuid.UUID | None
    rows_version: int
    mirrored_version: int | None  # None: never synced
    last_synced_at: dt.datetime | None
    lag_seconds: float | None  # None: never synced

    @property
    def never_synced(self) -> bool:
        return self.last_synced_at is None


def behind_datasets(conn: psycopg.Connection) -> list[Behind]:
    """Every tabular dataset behind the mirror (native ones left out), never-synced first, then the oldest view
    first; two queries whatever the number of datasets."""
    rows = [Behind(*r) for r in behind_rows(conn)]
    native = native_dataset_ids(conn, [b.dataset_id for b in rows]) if rows else set()
    return [b for b in rows if b.dataset_id not in native]


def lagging_past(behind: list[Behind], threshold_seconds: float) -> list[Behind]:
    """The behind datasets whose lag exceeds ``threshold_seconds`` (never-synced ones are not lagging: they have no
    view to be late; the overview lists them as never synced)."""
    return [b for b in behind if b.lag_seconds is not None and b.lag_seconds > threshold_seconds]


@dataclasses.dataclass(frozen=True)
class FlippedFreshness:
    """The flipped datasets (a flag above its default: readers may be served from Iceberg) by their freshness."""

    lagging: list[Behind]  # behind, lag past the threshold: oldest view first
    settled: set[uuid.UUID]  # caught up, native, or behind within the threshold: the freshness check passes


def flipped_freshness(conn: psycopg.Connection, threshold_seconds: float) -> FlippedFreshness:
    """Where each flipped dataset stands against the lag threshold (never-synced ones are in neither list: their
    check fails for another reason, no snapshot, that no timer changes). Three queries."""
    flipped = flipped_dataset_ids(conn)
    if not flipped:
        return FlippedFreshness([], set())
    behind = [b for b in behind_datasets(conn) if b.dataset_id in flipped]
    lagging = lagging_past(behind, threshold_seconds)
    unsettled = {b.dataset_id for b in lagging} | {b.dataset_id for b in behind if b.never_synced}
    return FlippedFreshness(lagging, flipped - unsettled)
