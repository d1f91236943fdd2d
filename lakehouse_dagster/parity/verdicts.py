"""The canary's verdicts as data: their names, the exit codes they map to, and the SQL that reads the recorded ones
(lakehouse_read_parity) and the wedged syncs.

Apart from parity/canary.py (which computes verdicts, with DuckDB, pyiceberg and the digests behind it), so a reader
of verdicts (`lakehouse status`, the rollout plans) does not import the digest machinery. canary.py re-exports every
name here."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable

import psycopg

OK, LAGGING, NO_SNAPSHOT, MISMATCH, NATIVE, ERROR = "ok", "lagging", "no-snapshot", "MISMATCH", "native", "error"
VERDICTS = (OK, LAGGING, NO_SNAPSHOT, MISMATCH, NATIVE, ERROR)
EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 5
DEFAULT_LIMIT = 20
FULL_EVERY = 8  # the scheduled canary re-digests every row on both sides every Nth run of a dataset


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
             from datasets d
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
