"""The way back from complete: the mark ``restoring``, the reverse on, a full reverse re-sync, the mark ``restored``; a
dataset never completed gets the ordinary backfill.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.completed import (
    RESTORING,
    completed_mark,
    mark_restored,
    set_status,
)
from lakehouse_dagster.flags.lifecycle_facts import derive
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.lifecycle import RESTORE, transition
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.runbooks.backfill import backfill
from lakehouse_dagster.runbooks.complete.status import _audit
from lakehouse_dagster.tracking.datasets import get_dataset
from lakehouse_dagster.tracking.datasets.rows import TABLE as ROWS_TABLE


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    dataset_id: uuid.UUID
    snapshot_id: int | None
    copied: int
    pg_rows: int
    seconds: float

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id), "restored": True}

    def summary(self) -> str:
        return (
            f"dataset {self.dataset_id}: was completed; backfilled from Iceberg snapshot {self.snapshot_id} in "
            f"{self.seconds:.2f}s — {self.copied} row(s) copied into {ROWS_TABLE} (identity preserved), the reverse "
            "mirror on again for it, the complete mark lifted (restored); a rollback to pg needs nothing more now "
            f"(lakehouse write-flags set <writer> pg --dataset {self.dataset_id})"
        )


def restore(dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, actor: str) -> RestoreResult | None:
    """The way back from complete: None when the dataset is not completed (the ordinary backfill applies). Otherwise
    the mark ``restoring`` (a complete still deleting stops at its next batch), the reverse on at dataset scope
    (audited), a full reverse re-sync from the table's current snapshot (one transaction, identity preserved, no
    echo), then the mark ``restored``. Resumable: re-running after a crash does what is left."""

    ds_id = parse_uuid(dataset_id, "dataset id")
    started = time.perf_counter()
    with connect(dsn) as conn:
        get_dataset(conn, ds_id)
        mark = completed_mark(conn, ds_id)
        if mark is None or not mark.holding:
            return None
        if not native_dataset_ids(conn, [ds_id]):
            raise BadInput(
                f"dataset {ds_id} was completed, and no writer resolves to iceberg_native for it any more (a flag "
                "changed outside the flip gates): set its writer back (lakehouse write-flags set <writer> "
                f"iceberg_native --dataset {ds_id}), then backfill; nothing was written"
            )
        start_restore(conn, ds_id, actor)
    r = apply_reverse(dsn, catalog, settings, ds_id, actor=actor, full=True)
    with connect(dsn) as conn:
        finish_restore(conn, ds_id, actor, r.copied, r.snapshot_id)
    return RestoreResult(ds_id, r.snapshot_id, r.copied, r.pg_rows, time.perf_counter() - started)


def start_restore(conn: psycopg.Connection, ds_id: uuid.UUID, actor: str) -> None:
    """complete / completing → restoring, the reverse on with it: one transition (a batch in flight finishes first)."""
    from lakehouse_dagster.flags.reverse_setting import set_reverse  # lazy: only where a restore runs

    what = f"lakehouse backfill --dataset {ds_id}"
    with transition(conn, RESTORE, dataset_ids=[ds_id], derive=derive, actor=actor, what=what):
        mark = completed_mark(conn, ds_id, for_update=True)  # waits for a batch in flight
        assert mark is not None
        if mark.status != RESTORING:
            set_status(conn, ds_id, RESTORING)
            _audit(conn, ds_id, "restore", actor, None, {"was": mark.status, "rows_deleted": mark.rows_deleted})
        set_reverse(conn, True, dataset=ds_id, note="backfill after complete", actor=actor)


def finish_restore(conn: psycopg.Connection, ds_id: uuid.UUID, actor: str, copied: int, snapshot_id) -> None:
    """restoring → native, once the full re-sync has landed every row in dataset_rows."""
    what = f"lakehouse backfill --dataset {ds_id}"
    with transition(conn, RESTORE, dataset_ids=[ds_id], derive=derive, actor=actor, what=what):
        mark_restored(conn, ds_id)
        _audit(conn, ds_id, "restored", actor, copied, {"snapshot_id": snapshot_id})


def backfill_or_restore(dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, actor: str):
    """`lakehouse backfill` and the backfill job: a completed dataset is restored (``restore``), any other
    backfilled as after a rollback (runbooks/backfill.py)."""
    restored = restore(dsn, catalog, settings, dataset_id, actor=actor)
    if restored is not None:
        return restored
    return backfill(dsn, catalog, settings, dataset_id, actor=actor)
