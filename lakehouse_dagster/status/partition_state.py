"""What a dataset's partition page should say now: its table as the latest succeeded sync left it, each reader's
and writer's effective mode and why, the latest parity verdict, the latest read fallback and the compute readers'
shadow consistency (flags/proof.py: as of the page's write, like the modes).

Read for many datasets in four queries whatever their number (the recorder's tick, a mirror batch), and for one
after a run's own write (the mirror asset, the ingest op), so a run's materialization and the recorder's say the
same things. Plain Python over a connection; the Dagster glue turns it into metadata (dagster/defs/shared/partition_metadata.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import psycopg

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.incidents import newest_fallbacks
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.proof import Proof, proofs, threshold
from lakehouse_dagster.flags.registry import PROVEN_READERS, READ
from lakehouse_dagster.flags.resolver import Resolution, resolve_datasets
from lakehouse_dagster.lake.catalog import table_identifier
from lakehouse_dagster.lifecycle import Facts
from lakehouse_dagster.lifecycle import versions as lifecycle_versions
from lakehouse_dagster.parity.canary import latest_verdicts
from lakehouse_dagster.runbooks.ingest_bench import WORKSPACE_PREFIX
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import Column, fragments, parse_schema
from lakehouse_dagster.tracking.datasets.rows import count_rows

# The dataset, its workspace, its latest succeeded sync (the one definition) and the last location any sync of
# it recorded (a sync from before the location was recorded has none).
_QUERY = fragments.partition_query(sync_log.LAST_TABLE_LOCATION)


@dataclasses.dataclass(frozen=True)
class TableNow:
    """The dataset's Iceberg table as its latest succeeded sync (mirror or native) left it."""

    sync_id: uuid.UUID
    writer: str
    path: str  # mirror | native
    mode: str | None  # full | incremental | partial | noop (mirror); replace | append (native)
    rows: int | None  # rows in the table after that sync
    bytes: int | None  # bytes that sync wrote
    snapshot_id: int | None
    source_version: int | None
    run_id: str | None  # the Dagster run that wrote it, if one did
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    location: str | None  # where the table's files live; None: not recorded (a sync before migration 028)

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, (self.finished_at - self.started_at).total_seconds())


@dataclasses.dataclass(frozen=True)
class PartitionState:
    dataset_id: uuid.UUID
    name: str
    workspace_id: uuid.UUID | None
    workspace: str | None
    kind: str
    columns: tuple[Column, ...]  # the dataset's typed schema (identity columns not included)
    rows_version: int
    row_count: int | None  # datasets.row_count
    table_name: str  # namespace.table in the catalog
    table: TableNow | None  # None: never synced
    flags: list[Resolution]  # every reader and writer, registry order
    verdict: dict | None  # the newest lakehouse_read_parity row (parity.canary.latest_verdicts), or None
    fallback: dict | None = None  # the newest read fallback (any reader, any process): reader, at, error
    lifecycle: Facts | None = None  # the dataset's lifecycle state as stored (lifecycle/)
    lifecycle_version: int | None = None  # bumped by every transition: events are ordered by it
    read_at: dt.datetime = dataclasses.field(default_factory=lambda: dt.datetime.now(dt.UTC))  # the modes' "as of"
    shadow: tuple[Proof, ...] = ()  # the compute readers compared on it, or shadowed now (issue 43)
    shadow_needed: int = 0  # comparisons in a row a flip of one needs (the database's one threshold)

    @property
    def throwaway(self) -> bool:
        """A dataset of the ingest bench's own workspace (dropped by its purge): nothing to show operators."""
        return bool(self.workspace and self.workspace.startswith(WORKSPACE_PREFIX))

    def flag_lines(self) -> list[str]:
        """One line per reader and writer: ``reader export.stream: iceberg (dataset override)``."""
        return [f"{'reader' if r.kind == READ else 'writer'} {r.name}: {r.describe()}" for r in self.flags]

    def verdict_line(self) -> str:
        """The newest verdict in one line, or why there is none."""
        v = self.verdict
        if v is None:
            return "no verdict recorded (no canary or parity check has run on this dataset)"
        at = v["checked_at"].isoformat(timespec="seconds") if v.get("checked_at") else "?"
        snap = f" on snapshot {v['snapshot_id']}" if v.get("snapshot_id") is not None else ""
        line = f"{v['verdict']} ({v['source']}, {at}{snap})"
        now = self.table.snapshot_id if self.table else None
        if v.get("snapshot_id") is not None and now is not None and now != v["snapshot_id"]:
            line += f"; the table has changed since (snapshot {now} now): not a verdict on it yet"
        return line

    def verdict_as_of(self) -> str:
        """When the newest verdict was recorded: a verdict is only known as of its check."""
        v = self.verdict
        return v["checked_at"].isoformat(timespec="seconds") if v and v.get("checked_at") else "never checked"

    def shadow_line(self) -> str:
        """Each compute reader's shadow consistency on this dataset in one line, or why there is none."""
        if not self.shadow:
            return "none (no compute reader's reads of it are compared)"
        return "; ".join(f"{p.reader}: {p.describe(self.shadow_needed)}" for p in self.shadow)

    def fallback_line(self) -> str:
        """The newest read fallback in one line, or none."""
        f = self.fallback
        if f is None:
            return "none (no reader fell back to Postgres)"
        error = (f["error"] or "").split("\n", 1)[0][:160]
        return f"{f['reader']} fell back to Postgres at {f['at'].isoformat(timespec='seconds')}: {error}"


def safe_uri(location: str | None) -> str | None:
    """A table location as a URI with any user or password taken out (a location never carries a secret here,
    but a hand-configured warehouse might)."""
    if not location:
        return None
    parts = urlsplit(location)
    if "@" not in parts.netloc:
        return location
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def partition_states(
    conn: psycopg.Connection, settings: Settings, dataset_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, PartitionState]:
    """The state of each dataset that exists (deleted ones are left out), in a fixed number of queries."""
    ids = list(dict.fromkeys(dataset_ids))
    if not ids:
        return {}
    rows = conn.execute(_QUERY, (ids,)).fetchall()
    flags = resolve_datasets(conn, ids)
    verdicts = latest_verdicts(conn, ids)
    fallbacks = latest_fallbacks(conn, ids)
    states = lifecycle_of(conn, ids)
    versions = lifecycle_versions(conn, ids)
    compared = proofs(conn, [r.name for r in PROVEN_READERS], ids)
    needed = threshold(conn, settings).reads if compared else 0
    read_at = dt.datetime.now(dt.UTC)
    out = {}
    for r in rows:
        ds = r[0]
        table = TableNow(*r[8:20]) if r[8] is not None else None
        out[ds] = PartitionState(
            dataset_id=ds,
            name=r[1],
            workspace_id=r[2],
            workspace=r[3],
            kind=r[4],
            columns=_columns(r[5], ds),
            rows_version=r[6],
            row_count=r[7],
            table_name=".".join(table_identifier(settings, ds)),
            table=table,
            flags=flags.get(ds, []),
            verdict=verdicts.get(ds),
            fallback=fallbacks.get(ds),
            lifecycle=states.get(ds),
            lifecycle_version=versions.get(ds),
            read_at=read_at,
            shadow=_shadowed(compared, flags.get(ds, []), ds),
            shadow_needed=needed,
        )
    return out


def _shadowed(compared: dict[tuple[str, uuid.UUID], Proof], flags: list[Resolution], ds: uuid.UUID) -> tuple:
    """The proofs worth a line: a compute reader compared on the dataset, or in shadow mode on it now."""
    shadowing = {r.name for r in flags if r.kind == READ and r.mode == "shadow"}
    return tuple(
        p
        for r in PROVEN_READERS
        if (p := compared.get((r.name, ds))) is not None and (p.matched + p.failed > 0 or r.name in shadowing)
    )


def latest_fallbacks(conn: psycopg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, dict]:
    """The newest read fallback of each dataset (one index probe each: lakehouse_read_fallbacks_dataset_idx)."""
    rows = newest_fallbacks(conn, ids)
    return {r[0]: {"reader": r[1], "at": r[2], "error": r[3]} for r in rows}


def partition_state(conn: psycopg.Connection, settings: Settings, dataset_id: uuid.UUID) -> PartitionState | None:
    return partition_states(conn, settings, [dataset_id]).get(dataset_id)


def pg_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    """The dataset's rows in dataset_rows, exactly (an index-only scan of its primary key range)."""
    return count_rows(conn, dataset_id)


def _columns(raw, ds: uuid.UUID) -> tuple[Column, ...]:
    try:
        return parse_schema(raw, f"dataset {ds}")
    except (BadInput, ValueError):  # a schema the app broke: no column schema, never a failed tick
        return ()
