"""Which datasets are completed (``lakehouse complete``, runbooks/complete/): their Postgres rows are
deleted, or being deleted, and only Iceberg holds them.

Read here, below the mirror and the flip gates, so that both refuse what would strand a completed dataset whatever
its flags say: the flip gates (flags/gates.py) refuse a writer rollback to pg, and the forward mirror
(mirror/sync.py) refuses to sync the emptied ``dataset_rows`` over the Iceberg table. The way back is a backfill from
Iceberg (``lakehouse backfill --dataset <id>``), which brings the rows back and lifts the mark
(``restored``). One query for any number of datasets, uncached: a complete must be seen at once.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from datetime import datetime

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value

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
            f"to return it to Postgres, backfill it from Iceberg first: lakehouse backfill --dataset {self.dataset_id}"
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
            f"first: lakehouse backfill --dataset {self.dataset_id}"
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


# Every statement on lakehouse_completed is in this module (its owner: lakehouse_dagster_tests/test_table_owners.py);
# the writes are runbooks/complete/'s, each inside the transaction of its step.


def start_mark(
    conn: psycopg.Connection,
    dataset_id: uuid.UUID,
    next_row_index: int | None,
    export_to: str | None,
    snapshot_id: int | None,
    actor: str,
    note: str | None,
) -> None:
    """A complete starts (or starts again): the mark in progress, its counts from zero."""
    conn.execute(
        "insert into lakehouse_completed (dataset_id, status, started_at, rows_deleted, batches, next_row_index,"
        " export_to, snapshot_id, actor, note) values (%s, %s, now(), 0, 0, %s, %s, %s, %s, %s)"
        " on conflict (dataset_id) do update set status = excluded.status, started_at = now(), finished_at = null,"
        " rows_deleted = 0, batches = 0, next_row_index = excluded.next_row_index, export_to = excluded.export_to,"
        " exported_at = null, snapshot_id = excluded.snapshot_id, actor = excluded.actor, note = excluded.note,"
        " restored_at = null",
        (dataset_id, IN_PROGRESS, next_row_index, export_to, snapshot_id, actor, note),
    )


def mark_exported(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    conn.execute("update lakehouse_completed set exported_at = now() where dataset_id = %s", (dataset_id,))


def count_batch(conn: psycopg.Connection, dataset_id: uuid.UUID, deleted: int, next_row_index: int | None) -> None:
    """One batch of rows deleted; where the next one starts (None: from the start again)."""
    conn.execute(
        "update lakehouse_completed set rows_deleted = rows_deleted + %s, batches = batches + 1,"
        " next_row_index = %s where dataset_id = %s",
        (deleted, next_row_index, dataset_id),
    )


def mark_finished(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    conn.execute(
        "update lakehouse_completed set status = %s, finished_at = now(), next_row_index = null where dataset_id = %s",
        (COMPLETE, dataset_id),
    )


def set_status(conn: psycopg.Connection, dataset_id: uuid.UUID, status: str) -> None:
    conn.execute("update lakehouse_completed set status = %s where dataset_id = %s", (status, dataset_id))


def mark_restored(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    conn.execute(
        "update lakehouse_completed set status = %s, restored_at = now() where dataset_id = %s", (RESTORED, dataset_id)
    )


def rows_deleted(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    return fetch_value(
        conn.execute("select rows_deleted from lakehouse_completed where dataset_id = %s", (dataset_id,)), "the mark"
    )


def export_targets(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, str | None]]:
    """(dataset, the directory its complete exports to or None) of each one marked."""
    return conn.execute(
        "select dataset_id, export_to from lakehouse_completed where dataset_id = any(%s::uuid[])", (dataset_ids,)
    ).fetchall()


def with_status(conn: psycopg.Connection, status: str, dataset_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    return {
        r[0]
        for r in conn.execute(
            "select dataset_id from lakehouse_completed where status = %s and dataset_id = any(%s::uuid[])",
            (status, dataset_ids),
        ).fetchall()
    }


def marked_datasets(conn: psycopg.Connection, dataset_id: uuid.UUID | None = None) -> list[uuid.UUID]:
    """Every dataset with a mark (or just ``dataset_id``, when it has one), the oldest start first."""
    where = sql.SQL("where dataset_id = %s" if dataset_id else "")
    params: tuple = (dataset_id,) if dataset_id else ()
    return [
        r[0]
        for r in conn.execute(
            sql.SQL("select dataset_id from lakehouse_completed {} order by started_at").format(where), params
        )
    ]
