"""The canary's verdicts as data: their names, the exit codes they map to, and the SQL that reads the recorded ones
and the wedged syncs. The owner of lakehouse_read_parity (issue 45, lakehouse_dagster_tests/test_table_owners.py):
every statement on the recorded verdicts is here; the canary, the gates, the plans, the runbooks, the alerts and
the service call these functions.

Apart from parity/canary.py (which computes verdicts, with DuckDB, pyiceberg and the digests behind it), so a reader
of verdicts (`lakehouse status`, the rollout plans) does not import the digest machinery. canary.py re-exports every
name here."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking.datasets import fragments
from lakehouse_dagster.tracking.sync_log import wedged_syncs as wedged_syncs  # re-exported: its home is the log's

OK, LAGGING, NO_SNAPSHOT, MISMATCH, NATIVE, ERROR = "ok", "lagging", "no-snapshot", "MISMATCH", "native", "error"
VERDICTS = (OK, LAGGING, NO_SNAPSHOT, MISMATCH, NATIVE, ERROR)
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 5
DEFAULT_LIMIT = 20
FULL_EVERY = 8  # the scheduled canary re-digests every row on both sides every Nth run of a dataset


def insert_verdict(conn: psycopg.Connection, values: tuple) -> int:
    """Write one verdict (``values`` in the insert's column order, detail a Jsonb); returns its id."""
    return fetch_value(
        conn.execute(
            """insert into lakehouse_read_parity
             (dataset_id, verdict, source, pg_count, iceberg_count, pg_digest, iceberg_digest, snapshot_id,
              pg_version, iceberg_version, smoke, mismatched_row_indexes, seconds, run_id, detail)
           values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) returning id""",
            values,
        ),
        "the id of the read parity verdict just inserted",
    )


def add_to_detail(conn: psycopg.Connection, verdict_id: int, key: str, value: object) -> None:
    """What was done about a recorded verdict (an auto-rollback's outcome, a reverse repair) added to its detail."""
    conn.execute(
        "update lakehouse_read_parity set detail = detail || jsonb_build_object(%s::text, %s::jsonb) where id = %s",
        (key, Jsonb(value), verdict_id),
    )


def delete_verdicts(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> None:
    """Forget the datasets' verdicts (the ingest bench deleting its workspace)."""
    conn.execute("delete from lakehouse_read_parity where dataset_id = any(%s::uuid[])", (dataset_ids,))


def latest_verdict_id(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int | None:
    """The id of the dataset's newest recorded verdict (the one ``latest_verdicts`` returns), None without one."""
    row = conn.execute(
        "select id from lakehouse_read_parity where dataset_id = %s order by checked_at desc, id desc limit 1",
        (dataset_id,),
    ).fetchone()
    return row[0] if row else None


def latest_with_rows_version(conn: psycopg.Connection, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """{dataset: (verdict, checked_at, pg_version, the dataset's rows_version now)} of each one's newest verdict
    (the write flip's gates)."""
    rows = conn.execute(
        """select distinct on (p.dataset_id) p.dataset_id, p.verdict, p.checked_at, p.pg_version, d.rows_version
             from lakehouse_read_parity p """
        + fragments.join_datasets_on("p.dataset_id")
        + """
            where p.dataset_id = any(%s::uuid[]) order by p.dataset_id, p.checked_at desc, p.id desc""",
        (ids,),
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


# The MISMATCH verdicts as incident rows (dataset_id, at, what, reader, detail), one branch of flags/incidents.py's
# union of what restarts a soak: parameters %(mismatch)s (the incident's name), %(ids)s and %(since)s.
MISMATCH_INCIDENTS = sql.SQL("""
  select dataset_id, checked_at as at, %(mismatch)s as what, null::text as reader, 'source ' || source as detail
    from lakehouse_read_parity
   where verdict = 'MISMATCH' and dataset_id = any(%(ids)s::uuid[]) and checked_at >= %(since)s""")


def last_scheduled(
    conn: psycopg.Connection, dataset_ids: list[uuid.UUID]
) -> list[tuple[uuid.UUID, dt.datetime | None]]:
    """``(dataset, its last scheduled verdict's time or None)``, never-scheduled first, then the oldest verdict.
    One probe of lakehouse_read_parity_schedule_idx per dataset (migration 029)."""
    rows = conn.execute(
        """
select d.id, last.checked_at
  from unnest(%s::uuid[]) as d(id)
  left join lateral (
        select p.checked_at from lakehouse_read_parity p
         where p.dataset_id = d.id and p.source = 'schedule'
         order by p.checked_at desc, p.id desc limit 1) last on true
 order by last.checked_at nulls first, d.id
""",
        (dataset_ids,),
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def counts_by_latest_verdict(conn: psycopg.Connection) -> dict[str, int]:
    """{verdict: datasets whose newest verdict it is} (by checked_at, then id), through the (dataset_id, checked_at
    desc, id desc) index: one probe per dataset, whatever the number of verdicts (the service's metrics)."""
    return dict(
        conn.execute(
            """
select p.verdict, count(*)
  """
            + fragments.FROM_DATASETS
            + """
  cross join lateral (select verdict from lakehouse_read_parity p
                       where p.dataset_id = d.id order by p.checked_at desc, p.id desc limit 1) p
 group by p.verdict
"""
        ).fetchall()
    )


def run_verdicts(conn: psycopg.Connection, run_id: str) -> list[tuple]:
    """(dataset_id, verdict, reason or '', whether a reverse copy's, the reverse lag before in s) of each verdict
    one run recorded (a rollout plan's analysis)."""
    return conn.execute(
        "select dataset_id, verdict, coalesce(detail->>'reason', ''), detail ? 'reverse',"
        " (detail->'reverse'->>'lag_before_s')::float8 from lakehouse_read_parity where run_id = %s",
        (run_id,),
    ).fetchall()


def run_datasets_without_rows(conn: psycopg.Connection, run_id: str, verdicts: list[str]) -> list[uuid.UUID]:
    """The datasets of one run whose verdict is one of ``verdicts`` over no rows (Iceberg's count for a native
    verdict, Postgres's otherwise): an ok that compared nothing."""
    return [
        r[0]
        for r in conn.execute(
            "select dataset_id from lakehouse_read_parity where run_id = %s and verdict = any(%s)"
            " and coalesce(case when verdict = %s then iceberg_count else pg_count end, 0) = 0",
            (run_id, verdicts, NATIVE),
        ).fetchall()
    ]


def mismatches_since(
    conn: psycopg.Connection, since: sql.Composable, scope: sql.Composable, params: dict
) -> list[tuple[uuid.UUID, str, dt.datetime]]:
    """(dataset_id, source, checked_at) of each dataset's newest MISMATCH recorded at or after ``since`` (an SQL
    expression) on a dataset ``scope`` covers (an SQL predicate over ``d``, its datasets row); a reverse copy's
    left out (repaired, it rolls nothing back). One probe of the MISMATCH index from ``since`` (a rollout plan's
    evidence: plans/analysis.py)."""
    query = sql.SQL("""
    select distinct on (p.dataset_id) p.dataset_id, p.source, p.checked_at
      from lakehouse_read_parity p {join}
     where p.verdict = 'MISMATCH'
       and p.checked_at >= {since}
       and not p.detail ? 'reverse'  -- a reverse copy's: repaired, rolls nothing back (verdicts() holds on it)
       and {scope}
     order by p.dataset_id, p.checked_at desc""").format(
        join=sql.SQL(fragments.join_datasets_on("p.dataset_id")), since=since, scope=scope
    )
    return conn.execute(query, params).fetchall()


def latest_verdicts(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID] | None = None) -> dict[uuid.UUID, dict]:
    """The newest recorded verdict per dataset (what the runbook jobs read before a flip)."""
    query = (
        "select distinct on (dataset_id) dataset_id, verdict, checked_at, source, snapshot_id, pg_version,"
        " iceberg_version, mismatched_row_indexes, detail from lakehouse_read_parity"
    )
    params: tuple = ()
    if dataset_ids is not None:
        query += " where dataset_id = any(%s::uuid[])"
        params = (list(dataset_ids),)
    query += " order by dataset_id, checked_at desc, id desc"
    keys = (
        "dataset_id",
        "verdict",
        "checked_at",
        "source",
        "snapshot_id",
        "pg_version",
        "iceberg_version",
        "mismatched_row_indexes",
        "detail",
    )
    return {r[0]: dict(zip(keys, r)) for r in conn.execute(query, params).fetchall()}


def latest_verdict_reasons(conn: psycopg.Connection) -> dict[uuid.UUID, tuple[str, dt.datetime, str, str | None]]:
    """{dataset: (verdict, checked_at, source, reason)} of every tabular dataset's newest recorded verdict (the one
    ``latest_verdicts`` returns: by checked_at, then id). One index probe per dataset, so the cost follows the
    datasets, not the verdicts' history (~60 ms at 10,000 datasets of 20 verdicts each; the migration overview)."""
    rows = conn.execute(
        """select d.id, p.verdict, p.checked_at, p.source, p.detail->>'reason'
             """
        + fragments.FROM_DATASETS
        + """
             cross join lateral (select verdict, checked_at, source, detail from lakehouse_read_parity p
                                  where p.dataset_id = d.id order by p.checked_at desc, p.id desc limit 1) p
            where d.kind = 'tabular'"""
    ).fetchall()
    return {r[0]: r[1:] for r in rows}


def full_due(conn: psycopg.Connection, dataset_id: uuid.UUID, every: int = FULL_EVERY) -> bool:
    """The scheduled canary's cross-check: True when none of the dataset's last ``every - 1`` scheduled
    verdicts digested every row (so every ``every``-th scheduled run does)."""
    rows = conn.execute(
        "select detail->>'digest' from lakehouse_read_parity where dataset_id = %s and source = 'schedule'"
        " order by checked_at desc, id desc limit %s",
        (dataset_id, every - 1),
    ).fetchall()
    return len(rows) >= every - 1 and all(r[0] != "full" for r in rows)
