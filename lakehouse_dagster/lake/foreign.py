"""Commits the project did not make, recognised from the snapshot chain (issue 42, item 7).

Another Iceberg engine (Spark through Iceberg-Java's JdbcCatalog, a plain pyiceberg client) can commit to the
project's tables: the catalog is shared and its compare-and-swap keeps every commit, but nothing tells the project
what such a commit did. Every snapshot the project commits carries its marks in the summary (lake/writer.py: the
sync id, the source version, the write path; the reaper's empty fence its own key), so the snapshots without them
are another engine's. Walking back from the current snapshot to the project's last written one (the *anchor*; the
reaper's empty fence is walked past, since it may have been committed on top of another engine's snapshots) finds
them:

  * **maintenance** keeps the rows: a ``replace`` (Iceberg's operation for compaction and file rewrites: Spark's
    ``rewrite_data_files``) whose added and deleted record counts are equal and that adds no delete file, or a
    snapshot that changes no file at all. Snapshot expiry writes no snapshot: it only shortens the chain (below).
  * anything else **changes data**: an ``append``, ``overwrite`` or ``delete`` that adds or removes files, and a
    ``replace`` whose counts differ (a compaction that lost or gained rows is no compaction). An overwrite that
    rewrote identical rows cannot be told from an update without reading every row: it counts as a data change.
  * the current snapshot set back behind a newer project snapshot (another engine's ``rollback_to_snapshot``)
    changes data too, with no snapshot of its own: found by a project snapshot newer than the anchor.
  * a chain cut by another engine's expiry before it reaches a project snapshot: what was walked must be
    maintenance AND the table's live row count must still be what the project's last commit recorded
    (``lakehouse.row-count``); else the change cannot be told apart from a data change and counts as one.

What follows from it is the caller's: a mirror commit (Postgres is the truth) refuses a data change
(``ForeignCommit``, lake/writer.py) unless an operator asked to revert it; a native table (Iceberg is the truth)
takes it like a native commit (mirror/native_run.py). Metadata only: no data file is read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

# The marks every project commit carries (lake/writer.py re-exports them; mirror/reaper.py's fence carries FENCE).
SYNC_ID = "lakehouse.sync-id"
FENCE = "lakehouse.fence"  # snapshot summary key of the reaper's fence, an empty snapshot (value: why)
ROW_COUNT = "lakehouse.row-count"
REVERTED = "lakehouse.reverted-foreign"  # a mirror commit that reverted foreign snapshots names them (summary)

_ENGINE_KEYS = ("engine-name", "spark.app.id", "app-id")  # what Iceberg-Java / Spark write into a summary
_DELETE_FILE_KEYS = ("added-delete-files", "added-position-delete-files", "added-equality-delete-files")
_FILE_KEYS = ("added-data-files", "deleted-data-files", "added-delete-files", "removed-delete-files")


def made_here(snap) -> bool:
    """Whether the project committed this snapshot (its summary carries a project mark)."""
    summary = snap.summary.additional_properties if snap.summary is not None else {}
    return SYNC_ID in summary or FENCE in summary


def _int(summary: dict, key: str) -> int:
    try:
        return int(summary.get(key, 0) or 0)
    except ValueError:
        return 0


@dataclasses.dataclass(frozen=True)
class ForeignSnapshot:
    """One snapshot another engine committed, as its summary describes it."""

    snapshot_id: int
    operation: str
    added: int  # added-records
    deleted: int  # deleted-records
    engine: str | None
    committed_at: dt.datetime
    maintenance: bool  # keeps the rows (module docstring)
    deletes: int = 0  # added position/equality delete records (merge-on-read: DuckDB's DELETE/UPDATE write these)

    def describe(self) -> str:
        what = ", ".join(
            part
            for part in (
                f"+{self.added} row(s)" if self.added else "",
                f"-{self.deleted} row(s)" if self.deleted else "",
                f"{self.deletes} delete record(s) in delete files" if self.deletes else "",
            )
            if part
        )
        by = self.engine or "another engine"
        return (
            f"snapshot {self.snapshot_id} ({self.operation} by {by} at {self.committed_at:%Y-%m-%d %H:%M:%S}Z"
            f"{': ' + what if what else ''})"
        )


def classify(snap) -> ForeignSnapshot:
    """What a snapshot the project did not make did (metadata only)."""
    summary = snap.summary.additional_properties if snap.summary is not None else {}
    op = snap.summary.operation.value if snap.summary is not None else "unknown"
    added, deleted = _int(summary, "added-records"), _int(summary, "deleted-records")
    files_changed = any(_int(summary, k) for k in _FILE_KEYS) or added or deleted
    delete_files = any(_int(summary, k) for k in _DELETE_FILE_KEYS)
    maintenance = not files_changed or (op == "replace" and added == deleted and not delete_files)
    engine = next((f"{summary[k]}" for k in _ENGINE_KEYS if summary.get(k)), None)
    at = dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=dt.UTC)
    deletes = _int(summary, "added-position-deletes") + _int(summary, "added-equality-deletes")
    return ForeignSnapshot(snap.snapshot_id, op, added, deleted, engine, at, maintenance, deletes)


@dataclasses.dataclass(frozen=True)
class Chain:
    """The snapshots since the project's last commit on the current lineage (newest first) and what they did."""

    foreign: tuple[ForeignSnapshot, ...] = ()
    anchor: int | None = None  # the project's newest snapshot on the current lineage (None: none found)
    problem: str | None = None  # why the table's rows changed behind the project's back (None: they did not)

    @property
    def changes(self) -> tuple[ForeignSnapshot, ...]:
        """The foreign snapshots that changed data, oldest first."""
        return tuple(reversed([f for f in self.foreign if not f.maintenance]))

    def refusal(self, dataset_id: uuid.UUID) -> str:
        """The mirror's one line: what was found, that nothing was committed, and the operator's way forward."""
        return (
            f"dataset {dataset_id}: {self.problem}; Postgres is this dataset's truth, so the mirror neither keeps "
            "nor drops those rows silently and committed nothing. If they belong in the dataset, write them into "
            f"Postgres first; then `lakehouse sync --dataset {dataset_id} --revert-foreign` re-syncs the table in "
            "full from Postgres, reverting it"
        )


def live_rows(snap) -> int | None:
    """The rows a snapshot's table holds, from its summary totals (None: no totals)."""
    summary = snap.summary.additional_properties if snap is not None and snap.summary is not None else {}
    if "total-records" not in summary:
        return None
    return _int(summary, "total-records") - _int(summary, "total-position-deletes")


def table_row_count(table) -> int:
    """The table's rows, what a write adds to: the ``lakehouse.row-count`` property while the current snapshot is
    the project write that recorded it; after another engine's commit (or the reaper's fence) the property is stale
    (found by the lifecycle model: ``datasets.row_count`` stayed short by another engine's rows), so the
    snapshot's totals."""
    raw = table.properties.get(ROW_COUNT)
    snap = table.current_snapshot()
    ours = snap is not None and snap.summary is not None and SYNC_ID in snap.summary.additional_properties
    if raw is not None and (ours or snap is None):
        return int(raw)
    live = live_rows(snap)
    if live is not None:
        return live
    return int(raw) if raw is not None else 0


def foreign_since_project(table) -> Chain:
    """Walk the current lineage back to the project's last snapshot (module docstring): table metadata only, O(1)
    when the current snapshot is the project's and the newest of all (0.5 ms at 300 snapshots otherwise)."""
    current = table.current_snapshot()
    if current is None:
        return Chain()
    walked: list[ForeignSnapshot] = []
    seen: set[int] = set()  # every snapshot walked past, the reaper's fences among them
    snap, oldest, cut = current, current, False
    while snap is not None and not _wrote(snap):
        seen.add(snap.snapshot_id)
        if not made_here(snap):  # else the reaper's fence: empty, and it may sit on another engine's commits
            walked.append(classify(snap))
        oldest = snap
        parent = snap.parent_snapshot_id
        snap = table.snapshot_by_id(parent) if parent is not None else None
        cut = parent is not None and snap is None
    anchor = snap
    if not seen and (current.sequence_number or 0) >= (table.metadata.last_sequence_number or 0):
        return Chain((), _id(anchor), None)  # the common case: the newest snapshot of all is the project's own
    chain = tuple(walked)
    changed = [f for f in reversed(walked) if not f.maintenance]
    if changed:
        first = changed[0]
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        after = f" after the project's snapshot {anchor.snapshot_id}" if anchor is not None else ""
        return Chain(chain, _id(anchor), f"another Iceberg engine changed its table: {first.describe()}{more}{after}")
    reference = anchor if anchor is not None else oldest
    newer = [
        s
        for s in table.snapshots()
        if made_here(s) and s.snapshot_id not in seen and (s.sequence_number or 0) > (reference.sequence_number or 0)
    ]
    if newer:
        newest = max(newer, key=lambda s: s.sequence_number or 0)
        return Chain(
            chain,
            _id(anchor),
            f"another Iceberg engine set its table back to snapshot {current.snapshot_id}, behind the project's "
            f"snapshot {newest.snapshot_id} (a rollback the project did not make)",
        )
    recorded, holds = table.properties.get(ROW_COUNT), live_rows(current)
    if cut and recorded is not None and holds is not None and int(recorded) != holds:
        return Chain(
            chain,
            None,
            f"another Iceberg engine committed {len(walked)} snapshot(s) up to {current.snapshot_id} and expired "
            f"the ones before them: the table holds {holds} row(s) where the project's last commit left {recorded}",
        )
    return Chain(chain, _id(anchor), None)


def _wrote(snap) -> bool:
    """A snapshot a project writer committed (the anchor of the walk); the reaper's fence is walked past."""
    return snap.summary is not None and SYNC_ID in snap.summary.additional_properties


def _id(snap) -> int | None:
    return snap.snapshot_id if snap is not None else None
