"""Which datasets need a mirror sync, found in O(changed datasets).

Every write to dataset_rows stamps its datasets with the writing transaction's id (rows_xid). The
cursor is a transaction id X with the invariant "every change by a transaction below X has been
seen". After a complete scan the next cursor is the scan snapshot's xmin: every transaction below it
has finished, so nothing below it can still appear; a transaction still open at scan time is at or
above it and is seen by a later tick. The cursor therefore only moves forward and never skips a late
commit, which a plain max(version) high-water mark would (versions are taken before commit order).
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import psycopg

from ..flags.native import native_dataset_ids

_QUERY = """
select d.id, d.rows_version, d.rows_xid::text::bigint, pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
       (select s.source_version from iceberg_sync_log s
         where s.dataset_id = d.id and s.status = 'succeeded' and s.source_version is not null
         order by s.finished_at desc nulls last limit 1) as mirrored
  from datasets d
 where d.rows_xid >= %(xid)s::text::xid8
   and (%(after)s::uuid is null or (d.rows_xid, d.id) > (%(xid)s::text::xid8, %(after)s::uuid))
   and d.kind = 'tabular'
 order by d.rows_xid, d.id
 limit %(limit)s
"""


@dataclasses.dataclass(frozen=True)
class Cursor:
    xid: int = 0
    after_id: uuid.UUID | None = None  # set while paging through one xid range past the per-tick cap

    def dumps(self) -> str:
        return json.dumps({"xid": self.xid, "after_id": str(self.after_id) if self.after_id else None})

    @classmethod
    def loads(cls, raw: str | None) -> "Cursor":
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(int(data.get("xid", 0)), uuid.UUID(data["after_id"]) if data.get("after_id") else None)


@dataclasses.dataclass(frozen=True)
class Pending:
    dataset_id: uuid.UUID
    rows_version: int

    @property
    def run_key(self) -> str:
        # the version is part of the key: a run key deduplicates forever
        return f"mirror:{self.dataset_id}:{self.rows_version}"


def pending_syncs(
    conn: psycopg.Connection, cursor: Cursor, *, limit: int, exclude_native: bool = True
) -> tuple[list[Pending], Cursor, int]:
    """(datasets to sync, next cursor, datasets scanned). Datasets already mirrored at their current
    version are dropped, and so are datasets whose writers are iceberg-native (Postgres is stale
    for them by design)."""
    rows = conn.execute(
        _QUERY, {"xid": str(cursor.xid), "after": cursor.after_id, "limit": limit + 1}
    ).fetchall()
    truncated = len(rows) > limit
    rows = rows[:limit]
    xmin = rows[0][3] if rows else conn.execute(
        "select pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    ).fetchone()[0]
    pending = [Pending(r[0], r[1]) for r in rows if r[4] is None or r[4] < r[1]]
    if exclude_native and pending:
        native = native_dataset_ids(conn, [p.dataset_id for p in pending])
        pending = [p for p in pending if p.dataset_id not in native]
    if not truncated:
        nxt = Cursor(max(cursor.xid, xmin))
    elif rows[-1][2] < xmin:
        # page on: every transaction up to the last row's has finished, so the order there is final
        nxt = Cursor(rows[-1][2], rows[-1][0])
    else:
        # the page ends among transactions that may still be open: stay, and let them finish
        nxt = cursor
    return pending, nxt, len(rows)


# ---------------------------------------------------------------------------------------------------
# Retry sweep: a sync that failed (after its in-run retries) is otherwise requested again only when
# its dataset changes. Datasets whose latest mirror sync failed, still behind, are requested again
# with a run key naming the failed sync (so each failure buys at most one retry), after a backoff
# that doubles per consecutive failure, and not after ``max_retries`` failures in a row: a dataset
# that keeps failing is left to the operator (the canary reports it as wedged/lagging).

_FAILED = """
select f.dataset_id, f.sync_id, extract(epoch from now() - f.finished_at)::float8, d.rows_version,
       (select count(*) from iceberg_sync_log x
         where x.dataset_id = f.dataset_id and x.path = 'mirror' and x.status = 'failed'
           and x.started_at > coalesce((select max(s.started_at) from iceberg_sync_log s
                                         where s.dataset_id = f.dataset_id and s.status = 'succeeded'),
                                       '-infinity'::timestamptz)),
       (select max(s.source_version) from iceberg_sync_log s
         where s.dataset_id = f.dataset_id and s.status = 'succeeded')
  from iceberg_sync_log f join datasets d on d.id = f.dataset_id
 where f.status = 'failed' and f.path = 'mirror' and d.kind = 'tabular'
   and f.finished_at > now() - make_interval(secs => %(window)s)
   and not exists (select 1 from iceberg_sync_log later
                    where later.dataset_id = f.dataset_id and later.id <> f.id
                      and (later.started_at, later.id) > (f.started_at, f.id))
 order by f.finished_at
"""


@dataclasses.dataclass(frozen=True)
class Retry(Pending):
    failed_sync_id: uuid.UUID | None = None
    failures: int = 1

    @property
    def run_key(self) -> str:
        return f"mirror:{self.dataset_id}:{self.rows_version}:retry:{self.failed_sync_id}"


def backoff_seconds(after_seconds: int, failures: int) -> int:
    return after_seconds * 2 ** max(0, failures - 1)


def failed_syncs_to_retry(
    conn: psycopg.Connection, *, after_seconds: int, max_retries: int, limit: int, exclude_native: bool = True
) -> list[Retry]:
    """Datasets whose latest mirror sync failed, still behind Postgres, due for another try."""
    if after_seconds <= 0 or max_retries <= 0:
        return []
    window = backoff_seconds(after_seconds, max_retries) * 2  # older failures are past every backoff
    due = []
    for ds_id, sync_id, age, rows_version, failures, mirrored in conn.execute(_FAILED, {"window": window}).fetchall():
        if mirrored is not None and mirrored >= rows_version:
            continue  # caught up anyway (the failure was a no-op retry of an older version)
        if failures > max_retries or age < backoff_seconds(after_seconds, failures):
            continue
        due.append(Retry(ds_id, rows_version, sync_id, failures))
    if exclude_native and due:
        native = native_dataset_ids(conn, [r.dataset_id for r in due])
        due = [r for r in due if r.dataset_id not in native]
    return due[:limit]
