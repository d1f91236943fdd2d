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
from collections.abc import Callable

import psycopg

from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import fragments

# One statement, so the horizon (the snapshot's xmin) comes from the snapshot the datasets were read in, also when
# none are: from a second statement's newer snapshot, a transaction committing in between would fall below it unread.
_QUERY = (
    """
select h.xmin, r.id, r.rows_version, r.rows_xid, r.mirrored_version
  from (select pg_snapshot_xmin(pg_current_snapshot())::text::bigint as xmin) h
  left join lateral (
    select d.id, d.rows_version, d.rows_xid::text::bigint as rows_xid,
           d.mirrored_version  -- the latest succeeded sync's source version (tracking/sync_log.py)
      """
    + fragments.FROM_DATASETS
    + """
     where d.rows_xid >= %(xid)s::text::xid8
       and (%(after)s::uuid is null or (d.rows_xid, d.id) > (%(xid)s::text::xid8, %(after)s::uuid))
       and d.kind = 'tabular'
     order by d.rows_xid, d.id
     limit %(limit)s) r on true
 order by r.rows_xid, r.id
"""
)


@dataclasses.dataclass(frozen=True)
class Cursor:
    xid: int = 0
    after_id: uuid.UUID | None = None  # set while paging through one xid range past the per-tick cap

    def dumps(self) -> str:
        return json.dumps({"xid": self.xid, "after_id": str(self.after_id) if self.after_id else None})

    @classmethod
    def loads(cls, raw: str | None) -> Cursor:
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
    fetched = conn.execute(_QUERY, {"xid": str(cursor.xid), "after": cursor.after_id, "limit": limit + 1}).fetchall()
    xmin = fetched[0][0]
    rows = [r[1:] for r in fetched if r[1] is not None]  # (id, rows_version, rows_xid, mirrored_version)
    truncated = len(rows) > limit
    rows = rows[:limit]
    pending = [Pending(r[0], r[1]) for r in rows if r[3] is None or r[3] < r[1]]
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
# The sweep: every tabular dataset behind Postgres (no succeeded sync covering its rows_version) is found
# through a partial index that holds only those (datasets.mirrored_version, kept by the sync log's
# triggers), whatever stopped the last attempt: a failed sync, a run that died before it logged anything
# (backpressure retries exhausted, a lock timeout, a catalog that did not load, SIGKILL), or a dataset no
# trigger ever stamped (adopted, empty). lakehouse_mirror_requests remembers what was asked for: a
# version never asked for is requested at once (run key mirror:<ds>:<version>, the same as the cursor
# path's, so the two never double up); a version already asked for is asked again only with no mirror run
# in flight for it, after a backoff that doubles per attempt, at most ``max_retries`` more times, each
# with a new run key (mirror:<ds>:<version>:attempt:<n>).

_BEHIND = (
    """
select d.id, d.rows_version, r.attempts,
       case when r.rows_version = d.rows_version then
         extract(epoch from now() - greatest(r.last_at, """
    + sync_log.LAST_FINISHED_AT
    + """))::float8 end as idle
  """
    + fragments.FROM_DATASETS
    + """
  left join lakehouse_mirror_requests r on r.dataset_id = d.id
 where d.kind = 'tabular' and coalesce(d.mirrored_version, -1) < d.rows_version
 order by d.rows_version, d.id
"""
)


@dataclasses.dataclass(frozen=True)
class Retry(Pending):
    attempt: int = 2  # the attempt this request is (the first request of a version is attempt 1)

    @property
    def run_key(self) -> str:
        return f"mirror:{self.dataset_id}:{self.rows_version}:attempt:{self.attempt}"


def backoff_seconds(after_seconds: int, attempts: int) -> int:
    """The wait after ``attempts`` requests of one version: after_seconds, doubling per attempt."""
    return after_seconds * 2 ** max(0, attempts - 1)


@dataclasses.dataclass(frozen=True)
class Behind:
    fresh: list[Pending]  # versions never requested
    due: list[Retry]  # versions requested before, past their backoff (in-flight runs not yet excluded)
    behind: int  # tabular datasets behind Postgres, native ones included


def datasets_behind(
    conn: psycopg.Connection,
    *,
    after_seconds: int,
    max_retries: int,
    limit: int,
    exclude_native: bool = True,
    keep: Callable[[uuid.UUID], bool] | None = None,
) -> Behind:
    """Behind datasets to request now: up to ``limit`` fresh ones, and up to 4×``limit`` due retries (the
    caller drops those with a run in flight, so it gets more than it may request). ``keep``: only the datasets
    it says yes to (a stream's shard, or the shards no stream covers), before the limit is applied."""
    fresh: list[Pending] = []
    due: list[Retry] = []
    rows = conn.execute(_BEHIND).fetchall()
    retries_on = after_seconds > 0 and max_retries > 0
    for ds_id, version, attempts, idle in rows:
        if keep is not None and not keep(ds_id):
            continue
        if idle is None:  # never asked for at this version
            fresh.append(Pending(ds_id, version))
        elif retries_on and attempts <= max_retries and idle >= backoff_seconds(after_seconds, attempts):
            due.append(Retry(ds_id, version, attempts + 1))
    if exclude_native:
        return Behind(_without_native(conn, fresh, limit), _without_native(conn, due, 4 * limit), len(rows))
    return Behind(fresh[:limit], due[: 4 * limit], len(rows))


def _without_native(conn: psycopg.Connection, items: list, want: int) -> list:
    """The first ``want`` items whose dataset is not written iceberg-native, asking in chunks so that a
    tick with thousands behind (an adoption) checks about as many datasets as it requests."""
    out: list = []
    step = max(4 * want, 1)
    for i in range(0, len(items), step):
        chunk = items[i : i + step]
        native = native_dataset_ids(conn, [p.dataset_id for p in chunk])
        out += [p for p in chunk if p.dataset_id not in native]
        if len(out) >= want:
            break
    return out[:want]


def record_requests(conn: psycopg.Connection, requests: list[Pending]) -> None:
    """Remember what was asked for (one statement): the backoff and the attempt count start here."""
    if not requests:
        return
    conn.execute(
        """insert into lakehouse_mirror_requests (dataset_id, rows_version, attempts, last_at)
           select * , now() from unnest(%s::uuid[], %s::bigint[], %s::int[])
           on conflict (dataset_id) do update
              set rows_version = excluded.rows_version, attempts = excluded.attempts, last_at = now()""",
        (
            [p.dataset_id for p in requests],
            [p.rows_version for p in requests],
            [p.attempt if isinstance(p, Retry) else 1 for p in requests],
        ),
    )


def record_in_flight(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> None:
    """A run is still in flight for these: the backoff restarts when it ends (seen at a later tick)."""
    if dataset_ids:
        conn.execute(
            "update lakehouse_mirror_requests set last_at = now() where dataset_id = any(%s::uuid[])",
            (list(dataset_ids),),
        )


@dataclasses.dataclass(frozen=True)
class Tick:
    requests: list[Pending]  # fresh versions first, then retries (Retry)
    cursor: Cursor
    scanned: int  # changed datasets the cursor query read
    behind: int  # tabular datasets behind Postgres
    in_flight: int  # due retries skipped because a run for them is in flight


def plan_tick(
    conn: psycopg.Connection,
    cursor: Cursor,
    *,
    limit: int,
    retry_after_seconds: int,
    retry_max: int,
    in_flight: Callable[[list[uuid.UUID]], set[uuid.UUID]],
    keep: Callable[[uuid.UUID], bool] | None = None,
) -> Tick:
    """One poller tick: the datasets changed since the cursor, then the sweep of every dataset behind.
    At most ``limit`` fresh requests and ``limit`` retries. ``in_flight`` answers, in one call, which of
    the given datasets have a mirror run queued or running (the sensor asks the Dagster instance).
    ``keep``: the datasets this tick may request (those of shards no live stream run covers); the others are
    neither requested nor recorded as requested (the stream syncs them; the sweep finds them if it stops)."""
    pending, nxt, scanned = pending_syncs(conn, cursor, limit=limit)
    if keep is not None:
        pending = [p for p in pending if keep(p.dataset_id)]
    asked = _requested_versions(conn, [p.dataset_id for p in pending])
    fresh = [p for p in pending if asked.get(p.dataset_id) != p.rows_version]
    behind = datasets_behind(conn, after_seconds=retry_after_seconds, max_retries=retry_max, limit=limit, keep=keep)
    seen = {p.dataset_id for p in fresh}
    fresh += [p for p in behind.fresh if p.dataset_id not in seen][: max(0, limit - len(fresh))]
    seen |= {p.dataset_id for p in fresh}
    due = [r for r in behind.due if r.dataset_id not in seen]
    busy = in_flight([r.dataset_id for r in due]) if due else set()
    retries = [r for r in due if r.dataset_id not in busy][:limit]
    record_requests(conn, [*fresh, *retries])
    record_in_flight(conn, [r.dataset_id for r in due if r.dataset_id in busy])
    return Tick([*fresh, *retries], nxt, scanned, behind.behind, len(busy))


def _requested_versions(conn: psycopg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    if not ids:
        return {}
    return dict(
        conn.execute(
            "select dataset_id, rows_version from lakehouse_mirror_requests where dataset_id = any(%s::uuid[])", (ids,)
        ).fetchall()
    )
