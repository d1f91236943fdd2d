"""Which datasets are completed (``lakehouse write-flags complete``, runbooks/complete.py): their Postgres rows are
deleted, or being deleted, and only Iceberg holds them.

Read here, below the mirror and the flip gates, so that both refuse what would strand a completed dataset whatever
its flags say: the flip gates (flags/gates.py) refuse a writer rollback to pg, and the forward mirror
(mirror/sync.py) refuses to sync the emptied ``dataset_rows`` over the Iceberg table. The way back is a backfill from
Iceberg (``lakehouse write-flags backfill --dataset <id>``), which brings the rows back and lifts the mark
(``restored``). One query for any number of datasets, uncached: a complete must be seen at once.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from datetime import datetime

import psycopg

IN_PROGRESS, COMPLETE, RESTORING, RESTORED = "in_progress", "complete", "restoring", "restored"
HOLDING = (IN_PROGRESS, COMPLETE, RESTORING)  # Postgres lacks the dataset's rows (or may): refuse a rollback


@dataclasses.dataclass(frozen=True)
class Completed:
    dataset_id: uuid.UUID
    status: str  # in_progress | complete | restoring | restored
    started_at: datetime
    finished_at: datetime | None
    rows_deleted: int
    batches: int
    next_row_index: int | None
    export_to: str | None
    exported_at: datetime | None
    snapshot_id: int | None
    actor: str
    note: str | None
    restored_at: datetime | None

    @property
    def holding(self) -> bool:
        """Postgres does not hold the dataset's rows (deleted, being deleted, or not yet restored)."""
        return self.status in HOLDING

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dataset_id"] = str(self.dataset_id)
        for k in ("started_at", "finished_at", "exported_at", "restored_at"):
            d[k] = d[k].isoformat() if d[k] else None
        return d

    def why_not_postgres(self) -> str:
        """Why Postgres cannot serve or receive the dataset's writes again, and the way back (one sentence)."""
        way_back = (
            "to return it to Postgres, backfill it from Iceberg first: "
            f"lakehouse write-flags backfill --dataset {self.dataset_id}"
        )
        if self.status == COMPLETE:
            at = self.finished_at or self.started_at
            return (
                f"dataset {self.dataset_id} was completed on {at:%Y-%m-%d}: its Postgres rows were deleted; {way_back}"
            )
        if self.status == IN_PROGRESS:
            return (
                f"dataset {self.dataset_id} is being completed since {self.started_at:%Y-%m-%d} "
                f"({self.rows_deleted} Postgres row(s) deleted so far); {way_back}"
            )
        return (
            f"dataset {self.dataset_id} was completed and a backfill from Iceberg has not finished yet; finish it "
            f"first: lakehouse write-flags backfill --dataset {self.dataset_id}"
        )


_COLUMNS = (
    "dataset_id, status, started_at, finished_at, rows_deleted, batches, next_row_index, export_to, exported_at,"
    " snapshot_id, actor, note, restored_at"
)


def completed_marks(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Completed]:
    """The mark of each of ``dataset_ids`` that has one (any status)."""
    ids = list(dataset_ids)
    if not ids:
        return {}
    rows = conn.execute(
        f"select {_COLUMNS} from lakehouse_completed where dataset_id = any(%s::uuid[])", (ids,)
    ).fetchall()
    return {r[0]: Completed(*r) for r in rows}


def completed_mark(conn: psycopg.Connection, dataset_id: uuid.UUID, *, for_update: bool = False) -> Completed | None:
    row = conn.execute(
        f"select {_COLUMNS} from lakehouse_completed where dataset_id = %s" + (" for update" if for_update else ""),
        (dataset_id,),
    ).fetchone()
    return None if row is None else Completed(*row)


def holding(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, Completed]:
    """The datasets among ``dataset_ids`` whose Postgres rows are gone or going (in_progress, complete, restoring)."""
    return {d: c for d, c in completed_marks(conn, dataset_ids).items() if c.holding}
