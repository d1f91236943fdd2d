"""The sync log's one definition of "the latest succeeded sync" of a dataset, and what hangs off it.

``lakehouse_latest_succeeded_sync(dataset_id)`` is a SQL function (inlined by the planner, so it uses
the partial index below): SQL callers join it laterally, Python callers go through
``latest_succeeded``. ``datasets.mirrored_version`` is that sync's source version, kept by triggers on
iceberg_sync_log, so "which datasets are behind Postgres" is one partial-index scan over the few that
are (see mirror/poller.py), not a probe of the log per dataset.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg

# SQL callers: ``left join lateral lakehouse_latest_succeeded_sync(d.id) s on true``
# (schema/functions/lakehouse_latest_succeeded_sync.sql).
from lakehouse_dagster.schema.names import LATEST_SUCCEEDED_FN  # noqa: F401  (its SQL callers name it)


@dataclasses.dataclass(frozen=True)
class SucceededSync:
    sync_id: uuid.UUID
    path: str
    snapshot_id: int | None
    source_version: int | None
    has_identity: bool
    rows: int | None
    finished_at: dt.datetime | None


def latest_succeeded(conn: psycopg.Connection, dataset_id: uuid.UUID) -> SucceededSync | None:
    row = conn.execute(
        "select sync_id, path, snapshot_id, source_version, has_identity, rows, finished_at"
        " from lakehouse_latest_succeeded_sync(%s)",
        (dataset_id,),
    ).fetchone()
    return SucceededSync(*row) if row else None


# The snapshots readers may hold without having loaded them yet (the read router hands out the latest succeeded sync's
# snapshot): the latest; every succeeded sync finished within the window (each was the latest at some moment of it);
# and the last one finished before the window (the latest when it opened).
HANDED_OUT = """
select snapshot_id from lakehouse_latest_succeeded_sync(%(ds)s) where snapshot_id is not null
union
(select snapshot_id from iceberg_sync_log
  where dataset_id = %(ds)s and status = 'succeeded' and snapshot_id is not null
    and finished_at > now() - make_interval(secs => %(secs)s))
union
(select snapshot_id from iceberg_sync_log
  where dataset_id = %(ds)s and status = 'succeeded' and snapshot_id is not null
    and finished_at <= now() - make_interval(secs => %(secs)s)
  order by finished_at desc nulls last limit 1)
"""


def snapshots_handed_out(conn: psycopg.Connection, dataset_id: uuid.UUID, within_seconds: float) -> set[int]:
    """Snapshot ids the read router may have handed a reader within the last ``within_seconds`` (lake/maintenance.py
    never expires them)."""
    rows = conn.execute(HANDED_OUT, {"ds": dataset_id, "secs": float(within_seconds)}).fetchall()
    return {int(r[0]) for r in rows}
