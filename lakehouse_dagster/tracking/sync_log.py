"""The sync log's one definition of "the latest succeeded sync" of a dataset, and what hangs off it.

``lakehouse_latest_succeeded_sync(dataset_id)`` is a SQL function (inlined by the planner, so it uses
the partial index below): SQL callers join it laterally, Python callers go through
``latest_succeeded``. ``datasets.mirrored_version`` is that sync's source version, kept by triggers on
iceberg_sync_log, so "which datasets are behind Postgres" is one partial-index scan over the few that
are (see mirror/poller.py), not a probe of the log per dataset.

The owner of iceberg_sync_log and of lakehouse_pg_reconciled (the log the other way round), issue 45: every
statement on them is here; other modules call these functions or, where their own query must read the log in the
same statement, put one of the SQL expressions below in it (lakehouse_dagster_tests/test_table_owners.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value

# SQL callers: ``left join lateral lakehouse_latest_succeeded_sync(d.id) s on true``
# (schema/functions/lakehouse_latest_succeeded_sync.sql).
from lakehouse_dagster.schema.names import LATEST_SUCCEEDED_FN  # noqa: F401  (its SQL callers name it)
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import fragments


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


# Every write of iceberg_sync_log is below (issue 45: tracking/sync_log.py is the log's owner-to-be; the reads still
# outside are listed in lakehouse_dagster_tests/test_table_owners.py). The transactions are the callers'.


def start_mirror(conn: psycopg.Connection, dataset_id: uuid.UUID, sync_id: uuid.UUID, writer: str, run_id) -> None:
    """A mirror sync starts (or starts again under the same id)."""
    conn.execute(
        """insert into iceberg_sync_log (dataset_id, sync_id, writer, path, status, run_id, started_at)
           values (%s, %s, %s, 'mirror', 'running', %s, now())
           on conflict (sync_id) do update set status = 'running', error = null, started_at = now(),
                                               finished_at = null, run_id = excluded.run_id""",
        (dataset_id, sync_id, writer, run_id),
    )


def start_native(
    conn: psycopg.Connection, dataset_id: uuid.UUID, sync_id: uuid.UUID, writer: str, mode: str | None, run_id
) -> tuple | None:
    """A native write starts at the dataset's rows_version; returns (source_version,), None when the dataset does not
    exist."""
    return conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, writer, path, mode, status, source_version, run_id)"
        " select id, %s, %s, 'native', %s, 'running', rows_version, %s "
        + fragments.FROM_ONE_DATASET
        + " on conflict (sync_id) do update set status = 'running', error = null, finished_at = null,"
        " started_at = now(), run_id = excluded.run_id returning source_version",
        (sync_id, writer, mode, run_id, dataset_id),
    ).fetchone()


def record_refused_native(
    conn: psycopg.Connection, dataset_id: uuid.UUID, sync_id: uuid.UUID, writer: str, mode: str | None, message: str
) -> None:
    """A native write the guard refused, recorded like a failed one (a retry's earlier row is the reaper's)."""
    conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, writer, path, mode, status, source_version, error,"
        " finished_at) select id, %s, %s, 'native', %s, 'failed', rows_version, %s, now() "
        + fragments.FROM_ONE_DATASET
        + " on conflict (sync_id) do nothing",
        (sync_id, writer, mode, message, dataset_id),
    )


def mark_failed(conn: psycopg.Connection, sync_id: uuid.UUID, error: str) -> None:
    conn.execute(
        "update iceberg_sync_log set status = 'failed', error = %s, finished_at = now() where sync_id = %s",
        (error, sync_id),
    )


def mark_mirror_succeeded(
    conn: psycopg.Connection, sync_id, mode, rows, bytes_, snapshot_id, source_version, location
) -> None:
    conn.execute(
        """update iceberg_sync_log
              set status = 'succeeded', mode = %s, rows = %s, bytes = %s, snapshot_id = %s,
                  has_identity = true, source_version = %s, finished_at = now(), error = null,
                  table_location = %s
            where sync_id = %s""",
        (mode, rows, bytes_, snapshot_id, source_version, location, sync_id),
    )


def mark_native_succeeded(conn: psycopg.Connection, sync_id, total, rows, bytes_, snapshot_id, location) -> None:
    """rows = rows in the table after the commit (``total``) when the writer knows it, else the rows written."""
    conn.execute(
        "update iceberg_sync_log set status = 'succeeded', rows = coalesce(%s, %s), bytes = %s,"
        " snapshot_id = %s, has_identity = true, finished_at = now(), table_location = %s where sync_id = %s",
        (total, rows, bytes_, snapshot_id, location, sync_id),
    )


def settle_interrupted_landed(
    conn: psycopg.Connection, sync_id, snapshot_id, rows, source_version, error: str, location
) -> None:
    """An interrupted native write whose commit landed: what the table says."""
    conn.execute(
        "update iceberg_sync_log set status = 'succeeded', snapshot_id = %s, rows = %s,"
        " source_version = coalesce(%s, source_version), has_identity = true, finished_at = now(),"
        " error = %s, table_location = %s where sync_id = %s",
        (snapshot_id, rows, source_version, error, location, sync_id),
    )


def settle_interrupted_unseen(conn: psycopg.Connection, sync_id, error: str) -> None:
    """An interrupted native write whose commit was not seen to land: failed, for the next write to settle."""
    conn.execute(
        "update iceberg_sync_log set status = 'failed', finished_at = now(), error = %s where sync_id = %s",
        (error, sync_id),
    )


_CANDIDATES = """
select sync_id, status from iceberg_sync_log
 where dataset_id = %s and (status = 'running' or (status = 'failed' and error like %s))
"""


def unconcluded(conn: psycopg.Connection, dataset_id: uuid.UUID, error_like: str) -> list[tuple]:
    """(sync_id, status) of the dataset's syncs still running or failed with an error ``like`` the pattern
    (mirror/reaper.py: the unsettled ones)."""
    return conn.execute(_CANDIDATES, (dataset_id, error_like)).fetchall()


def settle_landed(conn: psycopg.Connection, sync_id, snapshot_id, source_version, rows, error: str) -> None:
    """A sync whose commit landed without being recorded: succeeded at that snapshot (the reaper)."""
    conn.execute(
        "update iceberg_sync_log set status = 'succeeded', snapshot_id = %s, source_version = %s,"
        " rows = coalesce(%s, rows), has_identity = true, finished_at = coalesce(finished_at, now()),"
        " error = %s where sync_id = %s",
        (snapshot_id, source_version, rows, error, sync_id),
    )


def settle_landed_expired(conn: psycopg.Connection, sync_id, error: str) -> None:
    """A sync whose snapshot has expired but whose files are the table's: it landed (the reaper)."""
    conn.execute(
        "update iceberg_sync_log set status = 'succeeded', has_identity = true,"
        " finished_at = coalesce(finished_at, now()), error = %s where sync_id = %s",
        (error, sync_id),
    )


def settle_abandoned(conn: psycopg.Connection, sync_id, error: str) -> None:
    """A sync whose commit did not land: failed (the reaper)."""
    conn.execute(
        "update iceberg_sync_log set status = 'failed', finished_at = coalesce(finished_at, now()),"
        " error = %s where sync_id = %s",
        (error, sync_id),
    )


def delete_syncs(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> None:
    """Forget the datasets' syncs (the ingest bench deleting its workspace)."""
    conn.execute("delete from iceberg_sync_log where dataset_id = any(%s::uuid[])", (dataset_ids,))


def ever_native(conn: psycopg.Connection, dataset_id: uuid.UUID) -> bool:
    """Whether a native write of the dataset was ever recorded."""
    return (
        conn.execute(
            "select 1 from iceberg_sync_log where dataset_id = %s and path = 'native' limit 1", (dataset_id,)
        ).fetchone()
        is not None
    )


def latest_sync_row(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(sync_id, status, path, snapshot_id, source_version, started_at, finished_at, error) of the newest sync started."""
    return conn.execute(
        "select sync_id, status, path, snapshot_id, source_version, started_at, finished_at, error"
        " from iceberg_sync_log where dataset_id = %s order by started_at desc, id desc limit 1",
        (dataset_id,),
    ).fetchone()


def path_of_snapshot(conn: psycopg.Connection, dataset_id: uuid.UUID, snapshot_id: int) -> str | None:
    """The path (mirror | native) of the newest succeeded sync that committed the snapshot."""
    row = conn.execute(
        "select path from iceberg_sync_log where dataset_id = %s and snapshot_id = %s and status = 'succeeded'"
        " order by started_at desc limit 1",
        (dataset_id, snapshot_id),
    ).fetchone()
    return row[0] if row else None


def ever_synced(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Those of the datasets with a succeeded sync."""
    return {
        r[0]
        for r in conn.execute(
            "select distinct dataset_id from iceberg_sync_log where dataset_id = any(%s::uuid[]) and status = 'succeeded'",
            (dataset_ids,),
        ).fetchall()
    }


def wedged_syncs(conn: psycopg.Connection, after_seconds: int) -> list[dict]:
    """Datasets whose latest sync is not succeeded and started more than ``after_seconds`` ago."""
    # The sync rows not succeeded and old enough that are their dataset's latest (by started_at, then id): the same
    # rows as the latest sync per dataset filtered, without reading the log's whole history (0.05 s against 0.8 s
    # at 200,000 rows; a mirror batch asks once per run, the migration overview every 5 minutes).
    rows = conn.execute(
        """select l.dataset_id, l.sync_id, l.status, l.started_at, l.error,
                  extract(epoch from now() - l.started_at)::bigint
             from iceberg_sync_log l
            where l.status in ('running', 'failed') and l.started_at < now() - make_interval(secs => %s)
              and not exists (select 1 from iceberg_sync_log n
                               where n.dataset_id = l.dataset_id and (n.started_at, n.id) > (l.started_at, l.id))
            order by l.started_at""",
        (after_seconds,),
    ).fetchall()
    keys = ("dataset_id", "sync_id", "status", "started_at", "error", "stuck_seconds")
    return [dict(zip(keys, r)) for r in rows]


# A rollout plan's evidence (plans/analysis.py), each over the datasets ``moved_cte`` selects (``with moved(id) as``).
_WEDGED = sql.SQL("""
    select l.dataset_id, extract(epoch from now() - l.started_at)::bigint
      from iceberg_sync_log l join moved m on m.id = l.dataset_id
     where l.status = 'running' and l.started_at < now() - make_interval(secs => %(after)s)""")
_FAILED_SYNCS = sql.SQL("""
    select l.dataset_id, count(*), max(split_part(coalesce(l.error, ''), E'\\n', 1))
      from iceberg_sync_log l join moved m on m.id = l.dataset_id
     where l.status = 'failed' and l.finished_at >= %(since)s
     group by l.dataset_id""")


def running_since_of(conn: psycopg.Connection, moved_cte: sql.Composable, args: dict) -> list[tuple]:
    """(dataset, seconds running) of each sync still running past %(after)s seconds on the moved datasets."""
    return conn.execute(moved_cte + _WEDGED, args).fetchall()


def failed_since_of(conn: psycopg.Connection, moved_cte: sql.Composable, args: dict) -> list[tuple]:
    """(dataset, failed syncs, an error's first line) of the syncs failed since %(since)s on the moved datasets."""
    return conn.execute(moved_cte + _FAILED_SYNCS, args).fetchall()


def mirror_covered(conn: psycopg.Connection, dataset_id: uuid.UUID, rows_version: int) -> bool:
    """Whether a succeeded forward-mirror sync read the dataset at ``rows_version``: every row Postgres held then is in
    Iceberg, so the reverse's raw-write check takes that move (a pg write mirrored before a re-flip) for no raw write.
    One probe of iceberg_sync_log_succeeded_idx."""
    found = conn.execute(
        "select 1 from iceberg_sync_log where dataset_id = %s and status = 'succeeded' and path = 'mirror'"
        " and source_version = %s limit 1",
        (dataset_id, rows_version),
    ).fetchone()
    return found is not None


def latest_mirror_syncs(conn: psycopg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """{dataset: (status, has_identity, source_version, the dataset's rows_version now)} of each one's newest mirror
    sync (the write flip's gates)."""
    # The runbook's ordering: the newest by finished_at, unfinished (null) last.
    rows = conn.execute(
        """select distinct on (l.dataset_id) l.dataset_id, l.status, l.has_identity, l.source_version, d.rows_version
             from iceberg_sync_log l """
        + fragments.join_datasets_on("l.dataset_id")
        + """
            where l.dataset_id = any(%s::uuid[]) and l.path = 'mirror'
            order by l.dataset_id, l.finished_at desc nulls last, l.id desc""",
        (ids,),
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


# The failed syncs as incident rows (dataset_id, at, what, reader, detail), one branch of flags/incidents.py's union of
# what restarts a soak: parameters %(failed)s (the incident's name), %(ids)s and %(since)s.
FAILED_SYNC_INCIDENTS = sql.SQL("""
  select dataset_id, coalesce(finished_at, started_at), %(failed)s, null,
         writer || ' ' || path || ': ' || coalesce(split_part(error, E'\\n', 1), '')
    from iceberg_sync_log
   where status = 'failed' and dataset_id = any(%(ids)s::uuid[]) and coalesce(finished_at, started_at) >= %(since)s""")


# The newest succeeded row of each (dataset, snapshot) asked about: its order key.
_ORDER = """
select k.ds, k.snap, l.finished_at, l.id
  from unnest(%s::uuid[], %s::bigint[]) as k(ds, snap)
  join lateral (select finished_at, id from iceberg_sync_log
                 where dataset_id = k.ds and snapshot_id = k.snap and status = 'succeeded'
                 order by finished_at desc nulls last, id desc limit 1) l on true
"""


def succeeded_order(conn: psycopg.Connection, dataset_ids: list[uuid.UUID], snapshot_ids: list[int]) -> list[tuple]:
    """(dataset, snapshot, finished_at, id) of the newest succeeded sync of each (dataset, snapshot) pair the log knows
    (status/page_order.py: which was committed later)."""
    return conn.execute(_ORDER, (dataset_ids, snapshot_ids)).fetchall()


def latest_sync_and_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(status, path, rows, snapshot_id of its newest sync by finished_at, the dataset's row_count); None when the
    dataset does not exist (runbooks/flip.py: a write flip's verify)."""
    return conn.execute(
        "select l.status, l.path, l.rows, l.snapshot_id, d.row_count "
        + fragments.FROM_DATASETS
        + """
             left join lateral (select status, path, rows, snapshot_id from iceberg_sync_log
                                 where dataset_id = d.id order by finished_at desc nulls last, id desc limit 1) l on true
            where d.id = %s""",
        (dataset_id,),
    ).fetchone()


def datasets_with_last_sync(conn: psycopg.Connection) -> list[tuple]:
    """Every dataset with its workspace's name and its newest sync started (``lakehouse datasets``): (id, name, kind,
    row_count, status, rows_version, sync status, source_version, finished_at, workspace name, workspace_id)."""
    return conn.execute(
        """
    select d.id, d.name, d.kind, d.row_count, d.status, d.rows_version, l.status, l.source_version, l.finished_at,
           w.name, d.workspace_id
      """
        + fragments.FROM_DATASETS
        + """
      """
        + app_tables.JOIN_WORKSPACE_W
        + """
      left join lateral (select status, source_version, finished_at from iceberg_sync_log s
                          where s.dataset_id = d.id order by s.started_at desc limit 1) l on true
     order by w.name nulls last, d.workspace_id, d.name, d.id
    """
    ).fetchall()


# What other modules' queries need to know of the log, as SQL expressions over their row ``d`` (a datasets row) — or
# ``p`` (a reverse position, mirror/reverse_lag.py; a pipeline input, status/overview.py), ``b`` (a lifecycle move,
# lifecycle/store.py) — so that they read it in the same statement without naming it.
EVER_SUCCEEDED = "exists (select 1 from iceberg_sync_log l where l.dataset_id = d.id and l.status = 'succeeded')"
MIRRORED_ONCE = "exists (select 1 from iceberg_sync_log l where l.dataset_id = d.id and l.path = 'mirror' and l.status = 'succeeded')"
LAST_FINISHED_AT = "(select max(s.finished_at) from iceberg_sync_log s where s.dataset_id = d.id)"
LAST_TABLE_LOCATION = (
    "(select l.table_location from iceberg_sync_log l where l.dataset_id = d.id and l.table_location is not null"
    " order by l.id desc limit 1)"
)
# The newest sync of a pipeline input ``p`` by the runbook's order (finished_at desc nulls last): status, has_identity.
LATEST_BY_FINISHED_OF_P = (
    "(select l.status, l.has_identity from iceberg_sync_log l where l.dataset_id = p.dataset_id"
    " order by l.finished_at desc nulls last limit 1)"
)
# A succeeded commit of another snapshot since the reverse position ``p`` was applied.
SUCCEEDED_SINCE_POSITION = (
    "exists (select 1 from iceberg_sync_log l where l.dataset_id = d.id and l.status = 'succeeded'"
    " and l.finished_at >= p.applied_at and l.snapshot_id is distinct from p.snapshot_id)"
)
# The commits the reverse mirror has not applied since its position ``p`` (or, without one, the native commits since
# the last mirrored sync): how many, since when, the newest snapshot (mirror/reverse_lag.py).
PENDING_SINCE_POSITION = """(
    select count(*) as pending, min(s.finished_at) as since,
           (array_agg(s.snapshot_id order by s.finished_at desc, s.id desc))[1] as latest
      from iceberg_sync_log s
     where s.dataset_id = d.id and s.status = 'succeeded' and s.snapshot_id is not null
       and case when p.dataset_id is not null
                then s.finished_at >= p.applied_at and s.snapshot_id is distinct from p.snapshot_id
                else s.path = 'native' and s.finished_at > coalesce(
                       (select max(m.finished_at) from iceberg_sync_log m
                         where m.dataset_id = d.id and m.path = 'mirror' and m.status = 'succeeded'), '-infinity')
           end)"""
# Whether the lifecycle row ``l`` has a succeeded sync (``ever_synced`` for one row, inside lifecycle/store.py's read).
EVER_SYNCED_OF_ROW = (
    "exists (select 1 from iceberg_sync_log s where s.dataset_id = l.dataset_id and s.status = 'succeeded')"
)
# A succeeded native write of dataset %(d)s since the lifecycle move ``b`` (lifecycle/store.py).
NATIVE_WRITE_SINCE_MOVE = (
    "exists (select 1 from iceberg_sync_log l where l.dataset_id = %(d)s and l.path = 'native'"
    " and l.status = 'succeeded' and l.started_at >= b.at)"
)


# The stream's per-poll question: native commits since its cursor, by their transaction id (migration 028's
# iceberg_sync_log_changed_xid_idx, partial on status 'succeeded'), the horizon from the same snapshot.
_COMMITS = """
select h.xmin, l.id, l.xid, l.dataset_id
  from (select pg_snapshot_xmin(pg_current_snapshot())::text::bigint as xmin) h
  left join lateral (select id, changed_xid::text::bigint as xid, dataset_id from iceberg_sync_log
                      where changed_xid >= %(xid)s::text::xid8 and status = 'succeeded' and path = 'native'
                      order by changed_xid, id limit %(limit)s) l on true
 order by l.xid, l.id
"""


def native_commits_since(conn: psycopg.Connection, xid: int, limit: int) -> list[tuple]:
    """(horizon xmin, log id, xid, dataset) of the native commits from transaction ``xid`` on (mirror/reverse.py)."""
    return conn.execute(_COMMITS, {"xid": str(xid), "limit": limit}).fetchall()


# lakehouse_pg_reconciled, the log the other way round: where Postgres caught up with Iceberg again (a backfill, a
# reverse apply; a pg-path sync.full through the ingest state's trigger). Its owner sits here, below its readers
# (parity/canary.py: whether Postgres holds a snapshot; mirror/native_run.py: where the native marker's walk ends).


def reconciled_rows(conn: psycopg.Connection, dataset_id: uuid.UUID) -> list[tuple]:
    """(how, snapshot_id, seq, at) of every record of the dataset."""
    return conn.execute(
        "select how, snapshot_id, seq, at from lakehouse_pg_reconciled where dataset_id = %s", (dataset_id,)
    ).fetchall()


def pg_holds_snapshot(conn: psycopg.Connection, dataset_id: uuid.UUID, snapshot_id: int) -> bool:
    """Whether a backfill or a reverse apply brought Postgres to that snapshot."""
    return fetch_value(
        conn.execute(
            "select exists(select 1 from lakehouse_pg_reconciled where dataset_id = %s and snapshot_id = %s"
            " and how in ('reverse', 'backfill'))",
            (dataset_id, snapshot_id),
        ),
        "whether Postgres holds the snapshot",
    )


def reconciled_by_reverse(
    ds: sql.Composable, snapshot_id: int, copied: int, removed: int, actor: str
) -> list[sql.Composed]:
    """A reverse apply's record, as statements with literals (run in its transaction, ``ds`` the dataset id): one
    reverse record per dataset, the native marker's walk stops at the newest reconciled snapshot anyway."""
    return [
        sql.SQL("delete from lakehouse_pg_reconciled where dataset_id = {ds}::uuid and how = 'reverse'").format(ds=ds),
        sql.SQL(
            "insert into lakehouse_pg_reconciled (dataset_id, snapshot_id, how, rows_copied, rows_removed, actor)"
            " values ({ds}::uuid, {snap}, 'reverse', {c}, {r}, {actor})"
        ).format(
            ds=ds,
            snap=sql.Literal(snapshot_id),
            c=sql.Literal(copied),
            r=sql.Literal(removed),
            actor=sql.Literal(actor),
        ),
    ]


def reconciled_by_backfill(
    ds: sql.Composable, snapshot_id: int, copied: int, removed: int, moved: int, actor: str
) -> sql.Composed:
    """A backfill's record, as a statement with literals (run in its transaction, ``ds`` the dataset id)."""
    return sql.SQL(
        "insert into lakehouse_pg_reconciled (dataset_id, snapshot_id, how, rows_copied, rows_removed, rows_moved,"
        " actor) values ({ds}::uuid, {snap}, 'backfill', {c}, {r}, {m}, {actor})"
    ).format(
        ds=ds,
        snap=sql.Literal(snapshot_id),
        c=sql.Literal(copied),
        r=sql.Literal(removed),
        m=sql.Literal(moved),
        actor=sql.Literal(actor),
    )
