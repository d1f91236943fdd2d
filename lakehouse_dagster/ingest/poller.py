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
