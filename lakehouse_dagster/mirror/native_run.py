"""The durable marker of "Iceberg holds rows Postgres lacks", and the mirror's refusal while it stands.

A native write lands in Iceberg only (dataset_rows untouched). Rolling its writer back to pg resumes
Postgres writes, but the rows written natively are in Iceberg alone: mirroring Postgres over the table
would drop them. Nothing new has to be written to know this — the records already say it:

  * the table property ``lakehouse.path`` is set by every commit in the same transaction as its data
    (lake/writer.py), so ``native`` there means the table's current content was last written
    natively (durable across snapshot expiry);
  * each snapshot's summary carries ``lakehouse.path`` too, so walking back from the current snapshot
    to the last mirror snapshot counts the native snapshots and the rows they added (a native
    overwrite rewrote everything: then every row of the table counts);
  * each native commit also carries its run's totals (``RUN_*``: native snapshots, rows added, replaced,
    and the data sequence number above which the run's files lie), summed on the table state it commits
    on; the walk ends at the newest snapshot that carries them, so native commits may expire old snapshots
    like mirror commits (lake/writer.py) and the count stays whole;
  * ``lakehouse_pg_reconciled`` (this area's migration) records when Postgres caught up again: a
    backfill of a snapshot (runbooks/backfill.py), a reverse apply (mirror/reverse.py), or a sync.full on the pg path, which repopulates
    Postgres from the source — a trigger on the ingest state (tracking/ingest_state.py) notes it in the same
    transaction as its rows, with its ``seq``; native snapshots with a lower ingest seq (or, without
    one, committed before it) are superseded. The next mirror commit (path mirror) makes it all moot.

The walk reads only Iceberg metadata (no data file) and is skipped entirely for a dataset that never had
a native sync (one indexed query), so the mirror pays nothing for it in the common case.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import NamedTuple

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import ManifestEntryStatus

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import FENCE, classify, live_rows, made_here
from lakehouse_dagster.lake.writer import WRITE_PATH
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.ingest_state import SEQ_SUMMARY

NATIVE = "native"


@dataclasses.dataclass(frozen=True)
class IcebergOnly:
    """What exists only in Iceberg for one dataset (counts from snapshot metadata)."""

    dataset_id: uuid.UUID
    snapshot_id: int  # the table's current snapshot (what a backfill copies from)
    snapshots: int  # native snapshots since the last mirror (or reconciled) snapshot
    rows: int  # rows those snapshots hold that Postgres lacks
    replaced: bool  # a native overwrite rewrote the table: Postgres' older rows are stale
    last_native_at: dt.datetime  # commit time of the newest native snapshot
    added_files: tuple[str, ...] | None = None  # data files those snapshots appended (None: replaced, or unknown)
    after_sequence: int = 0  # Postgres holds every data file of this data sequence number or lower
    added_records: int = 0  # rows those snapshots added (``rows`` is the table's total after a replace)
    foreign: tuple[int, ...] = ()  # of those snapshots, the ones another Iceberg engine committed (lake/foreign.py)

    def describe(self) -> str:
        how = "a native sync.full replaced the table, so all its rows count; " if self.replaced else ""
        return (
            f"{self.rows} row(s) in {self.snapshots} native snapshot(s) exist only in Iceberg "
            f"({how}up to snapshot {self.snapshot_id}{self.foreign_clause()})"
        )

    def foreign_clause(self) -> str:
        """ ", N of them committed by another Iceberg engine (snapshot …)", or "" when the project made them all."""
        if not self.foreign:
            return ""
        ids = ", ".join(str(s) for s in self.foreign[:3]) + (", …" if len(self.foreign) > 3 else "")
        return f", {len(self.foreign)} of them committed by another Iceberg engine (snapshot {ids})"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dataset_id"] = str(self.dataset_id)
        d["last_native_at"] = self.last_native_at.isoformat()
        return d


def ways_forward(dataset_id: uuid.UUID) -> str:
    return (
        f"either copy them into Postgres (lakehouse backfill --dataset {dataset_id}) or repopulate "
        f"Postgres from the source (lakehouse ingest --dataset {dataset_id} --writer sync.full, on the pg path)"
    )


def _ever_native(conn: psycopg.Connection, dataset_id: uuid.UUID) -> bool:
    return sync_log.ever_native(conn, dataset_id)


def _reconciled(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple[set[int], int | None, dt.datetime | None]:
    """(snapshots backfilled or reverse-applied, the latest pg-path sync.full's ingest seq and time)."""
    rows = sync_log.reconciled_rows(conn, dataset_id)
    full = [(seq, at) for how, _, seq, at in rows if how == "pg-full-sync"]
    return (
        {snap for how, snap, _, _ in rows if how in ("backfill", "reverse")},  # reverse: mirror/reverse.py
        max((s for s, _ in full if s is not None), default=None),
        max((a for _, a in full), default=None),
    )


def iceberg_only(
    conn: psycopg.Connection,
    catalog: Catalog | None,
    settings: Settings,
    dataset_id: uuid.UUID,
    table=None,
    *,
    with_files: bool = True,
    native: bool = False,
) -> IcebergOnly | None:
    """The rows and snapshots only Iceberg holds for the dataset, or None when Postgres has them all.
    ``with_files`` False: ``added_files`` is left None (what only a backfill reads). ``native``: the dataset is
    native now (Iceberg is its truth: the reverse mirror's caller), so another engine's data change counts even on a
    table whose last project commit was the mirror's (no native write since the flip): the shortcuts below (no
    native sync ever, a table last written by the mirror) hold only for the project's own commits."""
    if not native and not _ever_native(conn, dataset_id):
        return None
    if table is None:
        if catalog is None:
            raise ValueError("iceberg_only: give the catalog, or the table (a commit's callback has no catalog)")
        table = load_table_or_none(catalog, table_identifier(settings, dataset_id))
    current = table.current_snapshot() if table is not None else None
    if current is None or (table.properties.get(WRITE_PATH) != NATIVE and (not native or made_here(current))):
        return None  # (the walk stops at the first mirror snapshot: only foreign snapshots on top of it count)
    run = _walk(table, current, *_reconciled(conn, dataset_id), with_files=with_files)
    if run.snapshots == 0:
        return None
    total = live_rows(current) or 0  # less another engine's position deletes
    return IcebergOnly(
        dataset_id,
        current.snapshot_id,
        run.snapshots,
        total if run.replaced else run.added,
        run.replaced,
        dt.datetime.fromtimestamp(current.timestamp_ms / 1000, tz=dt.UTC),
        None if run.replaced or run.files is None else tuple(run.files),
        run.after_sequence,
        run.added,
        tuple(run.foreign),
    )


@dataclasses.dataclass
class _Run:
    snapshots: int = 0
    added: int = 0
    replaced: bool = False
    after_sequence: int = 0  # Postgres holds every data file of this data sequence number or lower
    files: list[str] | None = dataclasses.field(default_factory=list)
    foreign: list[int] = dataclasses.field(default_factory=list)  # another engine's snapshots among them


def _walk(
    table, current, backfilled: set[int], full_seq: int | None, full_at: dt.datetime | None, *, with_files: bool
) -> _Run:
    """From the current snapshot back to the first one Postgres caught up with (a mirror snapshot, a
    backfilled one, one a pg-path sync.full superseded), or to the first whose carried run totals hold the
    rest (``RUN_*``: those survive the expiry of the snapshots they sum). Another Iceberg engine's snapshot (no
    project mark: lake/foreign.py) on a native table is Iceberg's truth like a native one: a data change counts as
    a native snapshot (named in ``foreign``), maintenance that keeps the rows as nothing, like the reaper's fence."""
    newest = dt.datetime.fromtimestamp(current.timestamp_ms / 1000, tz=dt.UTC)
    run, snap = _Run(files=[] if with_files else None), current
    rewritten = False  # a newer foreign rewrite (maintenance) was walked
    while snap is not None and snap.snapshot_id not in backfilled:
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        foreign = None if made_here(snap) else classify(snap)
        if foreign is None and summary.get(WRITE_PATH) != NATIVE:
            break  # a mirror snapshot: Postgres held everything up to here
        seq = summary.get(SEQ_SUMMARY)
        if (full_seq is not None and seq is not None and full_seq > int(seq)) or (
            seq is None and full_at is not None and full_at > newest
        ):
            break  # a later sync.full on the pg path repopulated Postgres from the source
        carried = run_totals(snap)
        if carried is not None:  # this snapshot's commit summed its run: the walk ends here
            snapshots, added, replaced, run.after_sequence = carried
            run.snapshots += snapshots
            run.added += added
            run.replaced = run.replaced or replaced
            run.files = None if run.replaced or not with_files else _files_after(table, current, run.after_sequence)
            return run
        kept = FENCE in summary or (foreign is not None and foreign.maintenance)  # rows as they were
        run.snapshots += 0 if kept else 1  # the reaper's empty snapshot is no native write
        if foreign is not None and not kept:
            run.foreign.insert(0, snap.snapshot_id)
        run.added += 0 if kept else int(summary.get("added-records", 0) or 0)
        if not kept and snap.summary is not None and snap.summary.operation.value in ("overwrite", "delete", "replace"):
            run.replaced = True
        if run.files is not None and not run.replaced and not kept:
            # older than another engine's rewrite, the files this snapshot added may be gone: which are new is unknown
            run.files = None if rewritten else _added_files(table, snap, run.files)
        rewritten = rewritten or (foreign is not None and kept and foreign.operation == "replace")
        parent = snap.parent_snapshot_id
        if parent is None and (snap.sequence_number or 0) > 1:  # not the table's first: its parent was expired
            raise BadInput(
                f"table {'.'.join(table.name())}: the parent of native snapshot {snap.snapshot_id} was "
                "expired and no later native commit carries the run's totals, so which rows exist only in "
                "Iceberg cannot be told; nothing was changed (compare the table with Postgres: "
                "lakehouse canary --full)"
            )
        snap = table.snapshot_by_id(parent) if parent is not None else None
    run.after_sequence = (snap.sequence_number or 0) if snap is not None else 0
    return run


# What each native commit carries in its snapshot summary (set by lake/writer.py through
# ``native_run``): the totals of its run of native snapshots since Postgres last held everything, so that
# native commits may expire old snapshots like mirror commits do without losing what a rollback must copy.
RUN_PARENT = "lakehouse.native-run.parent"  # the parent the totals were summed on (-1: none)
RUN_SNAPSHOTS = "lakehouse.native-run.snapshots"
RUN_ROWS = "lakehouse.native-run.added-records"
RUN_REPLACED = "lakehouse.native-run.replaced"
RUN_AFTER = "lakehouse.native-run.after-sequence"  # data files above this sequence number are the run's
RUN_KEYS = (RUN_SNAPSHOTS, RUN_ROWS, RUN_REPLACED, RUN_AFTER)  # what a fence (mirror/reaper.py) carries on


class RunTotals(NamedTuple):
    snapshots: int
    added: int
    replaced: bool
    after_sequence: int


def run_totals(snap) -> RunTotals | None:
    """(snapshots, added records, replaced, after-sequence) the snapshot's commit summed, when they were
    summed on its actual parent (expiring a snapshot clears its children's parent id: pyiceberg's
    RemoveSnapshotsUpdate)."""
    summary = snap.summary.additional_properties if snap.summary is not None else {}
    if RUN_PARENT not in summary or snap.parent_snapshot_id not in (None, int(summary[RUN_PARENT])):
        return None
    return RunTotals(
        int(summary[RUN_SNAPSHOTS]), int(summary[RUN_ROWS]), summary[RUN_REPLACED] == "true", int(summary[RUN_AFTER])
    )


def native_run(conn: psycopg.Connection, settings: Settings, dataset_id: uuid.UUID):
    """For lake/writer.write_arrow(native_run=...): the run totals a native commit on ``table`` carries, given the
    rows it adds and whether it replaces the table. A callback, not a value: it is computed on the exact table
    state each attempt of the commit's compare-and-swap retry commits on."""

    def entries(table, rows: int, replaces: bool) -> dict:
        current = table.current_snapshot()
        found = iceberg_only(conn, None, settings, dataset_id, table=table, with_files=False)
        if found is None:
            base = _Run(after_sequence=(current.sequence_number or 0) if current is not None else 0)
        else:
            base = _Run(found.snapshots, found.added_records, found.replaced, found.after_sequence)
        return {
            RUN_PARENT: str(current.snapshot_id if current is not None else -1),
            RUN_SNAPSHOTS: str(base.snapshots + 1),
            RUN_ROWS: str(base.added + rows),
            RUN_REPLACED: "true" if base.replaced or replaces else "false",
            RUN_AFTER: str(base.after_sequence),
        }

    return entries


def run_files(table, current, after_sequence: int) -> list:
    """The live DataFiles of ``current`` with a data sequence number above ``after_sequence``: those the run's
    snapshots added (manifest entries keep it through merging and snapshot expiry)."""
    return [
        entry.data_file
        for manifest in current.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if (entry.sequence_number or 0) > after_sequence
    ]


def _files_after(table, current, after_sequence: int) -> list[str] | None:
    """``run_files``' paths; None when the manifests cannot be read (the backfill then copies the whole snapshot)."""
    try:
        return [f.file_path for f in run_files(table, current, after_sequence)]
    except Exception:
        return None


def _added_files(table, snap, files: list[str]) -> list[str] | None:
    """The data files ``snap`` appended (what a backfill of an append-only lineage has to copy); None when
    the manifests cannot be read (the backfill then copies the whole snapshot)."""

    try:
        for manifest in snap.manifests(table.io):
            if manifest.added_snapshot_id != snap.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snap.snapshot_id:
                    files.append(entry.data_file.file_path)
    except Exception:
        return None
    return files


def refuse_mirror_over_iceberg_only(
    conn: psycopg.Connection, catalog: Catalog, settings: Settings, dataset_id: uuid.UUID
) -> None:
    """The mirror's check (mirror/sync.py, under the dataset lock): never overwrite Iceberg-only rows."""
    found = iceberg_only(conn, catalog, settings, dataset_id)
    if found is not None:
        raise BadInput(
            f"dataset {dataset_id}: {found.describe()}, so mirroring Postgres over the table would drop "
            f"them; {ways_forward(dataset_id)}"
        )
