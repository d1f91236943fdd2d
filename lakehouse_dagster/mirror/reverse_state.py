"""What the reverse mirror (mirror/reverse.py) knows of each dataset without applying anything: its position, an apply's
result, the state `lakehouse reverse status` shows, and which datasets are due (the sweep's check, a stream's hint
of native commits).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.reverse_setting import reverse_settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.mirror import reverse_lag
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import lookup
from lakehouse_dagster.tracking.datasets import rows as dataset_rows

GUC = "lakehouse.reverse_apply"  # the triggers' no-echo switch (schema/functions/lakehouse_rows_*.sql)
_TMP = "lakehouse_reverse_rows"
APPEND, FULL, NOOP = "append", "full", "noop"
ACTOR = "reverse mirror"


@dataclasses.dataclass(frozen=True)
class ReversePosition:
    dataset_id: uuid.UUID
    snapshot_id: int
    how: str  # append | full (what the last apply did)
    rows_copied: int
    rows_removed: int
    pg_rows: int
    applied_at: dt.datetime
    rows_version: int | None = None  # the dataset's rows_version the apply left (None: written by an older release)

    def as_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "dataset_id": str(self.dataset_id),
            "applied_at": self.applied_at.isoformat(),
        }


def positions(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> dict[uuid.UUID, ReversePosition]:
    return {r[0]: ReversePosition(*r) for r in reverse_lag.position_rows(conn, list(dataset_ids))}


def position(conn: psycopg.Connection, dataset_id: uuid.UUID) -> ReversePosition | None:
    return positions(conn, [dataset_id]).get(dataset_id)


@dataclasses.dataclass(frozen=True)
class ReverseResult:
    dataset_id: uuid.UUID
    how: str  # append | full | noop
    snapshot_id: int | None  # the snapshot dataset_rows now holds (None: the dataset has no table yet)
    copied: int  # rows inserted into dataset_rows
    removed: int  # rows a full re-sync deleted first
    pg_rows: int  # rows in dataset_rows afterwards
    seconds: float
    reason: str

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}

    def summary(self) -> str:
        """What `lakehouse reverse sync` says."""
        if self.how == NOOP:
            return (
                f"dataset {self.dataset_id}: nothing to apply ({self.reason}); dataset_rows holds {self.pg_rows} row(s)"
            )
        what = "appended" if self.how == APPEND else "re-synced in full"
        removed = f", {self.removed} replaced row(s) deleted first" if self.how == FULL else ""
        return (
            f"dataset {self.dataset_id}: snapshot {self.snapshot_id} {what} into {dataset_rows.TABLE} in {self.seconds:.2f}s "
            f"({self.reason}) — {self.copied} row(s) copied (identity preserved){removed}; dataset_rows now holds "
            f"{self.pg_rows}; a rollback to pg needs no backfill while nothing newer is committed"
        )


@dataclasses.dataclass(frozen=True)
class ReverseState:
    """One native dataset as the reverse mirror sees it (``lakehouse reverse status``)."""

    dataset_id: uuid.UUID
    name: str
    native: bool
    enabled: bool
    source: str  # where the setting comes from: dataset | workspace | global | default
    position: ReversePosition | None
    current_snapshot: int | None

    @property
    def caught_up(self) -> bool:
        return self.current_snapshot is None or (
            self.position is not None and self.position.snapshot_id == self.current_snapshot
        )

    @property
    def state(self) -> str:
        if not self.native:
            return "not native"
        if not self.enabled:
            return "off"
        return "caught up" if self.caught_up else "behind"

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "name": self.name,
            "native": self.native,
            "enabled": self.enabled,
            "source": self.source,
            "state": self.state,
            "position": self.position.as_dict() if self.position else None,
            "current_snapshot": self.current_snapshot,
        }


def reverse_states(
    conn: psycopg.Connection, catalog: Catalog, settings: Settings, dataset_ids: list[uuid.UUID] | None = None
) -> list[ReverseState]:
    """The native datasets (or ``dataset_ids``, native or not) with their setting, position and current snapshot
    (one table load each)."""
    native = native_dataset_ids(conn, dataset_ids)
    ids = list(dataset_ids) if dataset_ids is not None else sorted(native)
    rows = lookup.tabular_names_of(conn, ids)
    found = [r[0] for r in rows]
    setting, at = reverse_settings(conn, found), positions(conn, found)
    out = []
    for ds_id, name in rows:
        table = load_table_or_none(catalog, table_identifier(settings, ds_id))
        snap = table.current_snapshot() if table is not None else None
        s = setting[ds_id]
        out.append(
            ReverseState(
                ds_id, name, ds_id in native, s.enabled, s.source, at.get(ds_id), snap.snapshot_id if snap else None
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class ReverseBatch:
    applied: list[ReverseResult]
    failed: list[tuple[uuid.UUID, str]]  # (dataset, what went wrong, one line)

    def as_dict(self) -> dict:
        return {
            "applied": [r.as_dict() for r in self.applied],
            "failed": [{"dataset_id": str(d), "error": e} for d, e in self.failed],
        }


def due_datasets(
    conn: psycopg.Connection,
    dataset_ids: list[uuid.UUID] | None = None,
    *,
    keep: Callable[[uuid.UUID], bool] | None = None,
) -> list[uuid.UUID]:
    """Native datasets (all, or among ``dataset_ids``; only those ``keep`` says yes to: a stream's shard) with the
    reverse on that may be past their position: no position yet but a table (a succeeded commit), or a succeeded commit (a native write, a
    compaction) recorded since the last apply. Postgres only, no table load: what a sensor or a stream's sweep
    asks; ``apply_reverse`` then says no-op for one that is caught up after all. Three queries: the native set
    (the flag resolution over the datasets asked about), their settings, and the position check (by primary key,
    and an index probe of iceberg_sync_log_succeeded_idx per candidate)."""
    native = native_dataset_ids(conn, dataset_ids)
    if keep is not None:
        native = {d for d in native if keep(d)}
    on = [ds for ds, s in reverse_settings(conn, native).items() if s.enabled]
    if not on:
        return []
    return reverse_lag.due_dataset_ids(conn, on)


def latest_snapshots(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> dict[uuid.UUID, int | None]:
    """The snapshot of each dataset's latest succeeded commit in the sync log (no table load): what a sensor's
    run key names (``reverse:<dataset>:<snapshot>``). One query, an index probe per dataset."""
    if not dataset_ids:
        return {}
    rows = conn.execute(
        "select d, (select s.snapshot_id from lakehouse_latest_succeeded_sync(d) s) from unnest(%s::uuid[]) as u(d)",
        (list(dataset_ids),),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


@dataclasses.dataclass(frozen=True)
class CommitCursor:
    """Where a stream's reading of native commits stands: every commit of a transaction below ``xid`` is read;
    ``seen``: sync log ids read at or above it (their transactions ended after the horizon), not reported again."""

    xid: int
    seen: frozenset[int] = frozenset()


def native_commits(
    conn: psycopg.Connection, cursor: CommitCursor, *, limit: int = 1000
) -> tuple[set[uuid.UUID], CommitCursor, bool]:
    """(datasets with a native commit since ``cursor``, the next cursor, whether the read was cut at ``limit``).
    One index scan, O(native commits since the horizon). Only a hint: a cut read (or anything it missed) is found
    by ``due_datasets``, which compares each position with the sync log; the caller then sweeps at once."""
    fetched = sync_log.native_commits_since(conn, cursor.xid, limit)
    xmin = int(fetched[0][0])
    rows = [r[1:] for r in fetched if r[1] is not None]  # (id, xid, dataset_id)
    nxt = max(cursor.xid, xmin)
    found = {ds for row_id, _, ds in rows if row_id not in cursor.seen}
    seen = frozenset(row_id for row_id, xid, _ in rows if xid >= nxt)
    return found, CommitCursor(nxt, seen), len(rows) >= limit
