"""The owner of ``lakehouse_pg_digest_state`` and ``lakehouse_pg_digest_deltas`` (issue 45): every statement on the
maintained Postgres digest's registrations and per-segment sums.

In tracking/, the lowest layer that writes them: the WAL consumer (tracking/capture/) adds and drops sums, the
maintained digest (parity/maintained.py) registers, fills, folds and reads them, the reverse mirror's re-sync
(mirror/reverse.py) cancels them. The locks and transactions stay with the callers (the datasets row lock of a
registration, the REPEATABLE READ fill under its fill lock, the fold's transaction, the consumer's lock): every
function here runs its statements on the caller's connection, inside what the caller holds. Imports nothing of
tracking/ (capture/ imports it).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking.datasets import fragments

# -- registrations (parity/maintained.py) -------------------------------------------------------------------


def registration(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(schema_hash, contract_version, filled, hash_sql) of the dataset's registration, or None."""
    return conn.execute(
        "select schema_hash, contract_version, filled, hash_sql from lakehouse_pg_digest_state where dataset_id = %s",
        (dataset_id,),
    ).fetchone()


def register(
    conn: psycopg.Connection, dataset_id: uuid.UUID, contract_version: int, schema_hash: str, hash_sql: str
) -> None:
    """(Re-)register the dataset, unfilled, and drop its deltas; the caller holds the datasets row lock."""
    conn.execute("delete from lakehouse_pg_digest_deltas where dataset_id = %s", (dataset_id,))
    conn.execute(
        """insert into lakehouse_pg_digest_state (dataset_id, contract_version, schema_hash, hash_sql, hash_fn)
                   values (%s, %s, %s, %s, lakehouse_digest_fn(%s))
                   on conflict (dataset_id) do update set contract_version = excluded.contract_version,
                     schema_hash = excluded.schema_hash, hash_sql = excluded.hash_sql, hash_fn = excluded.hash_fn,
                     filled = false, registered_at = now(), filled_at = null""",
        (dataset_id, contract_version, schema_hash, hash_sql, hash_sql),
    )


def fill_state(conn: psycopg.Connection, dataset_id: uuid.UUID) -> tuple | None:
    """(schema_hash, filled, hash_sql) as the fill's snapshot sees them, or None."""
    return conn.execute(
        "select schema_hash, filled, hash_sql from lakehouse_pg_digest_state where dataset_id = %s", (dataset_id,)
    ).fetchone()


def fill(conn: psycopg.Connection, dataset_id: uuid.UUID, seg_bits: int, hash_sql: str) -> None:
    """Replace the dataset's deltas by the sums of the rows the caller's snapshot sees (``hash_sql``: the
    registration's row expression) and mark it filled as of the dataset's rows_version."""
    conn.execute("delete from lakehouse_pg_digest_deltas where dataset_id = %s", (dataset_id,))
    conn.execute(
        f"insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)"
        f" select %s, row_index >> {int(seg_bits)}, count(*), sum({hash_sql}) "
        + fragments.FROM_ROWS_OF_DATASET
        + " group by 2",
        (dataset_id, dataset_id),
    )
    conn.execute(
        "update lakehouse_pg_digest_state s set filled = true, filled_at = now(),"
        " fill_version = d.rows_version, applied_version = d.rows_version "
        + fragments.FROM_DATASETS
        + " where s.dataset_id = %s and d.id = s.dataset_id",
        (dataset_id,),
    )


def duplicate_segments(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    """Delta rows beyond one per segment: what a fold would remove at most."""
    return fetch_value(
        conn.execute(
            "select count(*) - count(distinct seg) from lakehouse_pg_digest_deltas where dataset_id = %s", (dataset_id,)
        ),
        "the count of duplicate digest segments",
    )


def fold(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    """Fold the dataset's delta rows into one per segment (zero sums dropped) in one statement: it deletes and
    re-adds exactly the rows its DELETE saw. Returns the rows removed; the caller holds the fill lock."""
    return fetch_value(
        conn.execute(
            """with gone as (delete from lakehouse_pg_digest_deltas where dataset_id = %(ds)s returning seg, n, s),
                    kept as (insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s)
                             select %(ds)s, seg, sum(n), sum(s) from gone group by seg
                             having sum(n) <> 0 or sum(s) <> 0 returning 1)
               select (select count(*) from gone) - (select count(*) from kept)""",
            {"ds": dataset_id},
        ),
        "the count of digest delta rows folded",
    )


def state_with_applying(conn: psycopg.Connection, dataset_id: uuid.UUID, applying: str) -> tuple | None:
    """(schema_hash, contract_version, filled, applied_version, the dataset's rows_version, ``applying``,
    hash_sql) in one statement; ``applying`` is the WAL consumer's SQL expression (tracking/capture/ APPLYING),
    read at the same snapshot."""
    return conn.execute(
        "select s.schema_hash, s.contract_version, s.filled, s.applied_version, d.rows_version, "
        + applying
        + ", s.hash_sql from lakehouse_pg_digest_state s "
        + fragments.join_datasets_on("s.dataset_id")
        + " where s.dataset_id = %s",
        (dataset_id,),
    ).fetchone()


def segment_sums(conn: psycopg.Connection, dataset_id: uuid.UUID) -> list[tuple]:
    """(seg, count, sum) per segment, the deltas summed."""
    return conn.execute(
        "select seg, sum(n), sum(s) from lakehouse_pg_digest_deltas where dataset_id = %s group by seg", (dataset_id,)
    ).fetchall()


def forget(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    """Drop the dataset's registration and deltas (the caller's transaction)."""
    conn.execute("delete from lakehouse_pg_digest_state where dataset_id = %s", (dataset_id,))
    conn.execute("delete from lakehouse_pg_digest_deltas where dataset_id = %s", (dataset_id,))


# -- the WAL consumer (tracking/capture/consumer.py) --------------------------------------------------------


def exact_up_to_now(conn: psycopg.Connection) -> None:
    """Every registration's sums are exact as of its dataset's rows_version (the triggers summed so far)."""
    conn.execute(
        "update lakehouse_pg_digest_state s set fill_version = d.rows_version,"
        " applied_version = d.rows_version " + fragments.FROM_DATASETS + " where d.id = s.dataset_id"
    )


def drop_all(conn: psycopg.Connection) -> int:
    """Every registration and its deltas; returns how many registrations."""
    conn.execute("delete from lakehouse_pg_digest_deltas")
    return conn.execute("delete from lakehouse_pg_digest_state").rowcount


def registered_hash_fns(conn: psycopg.Connection) -> psycopg.Cursor:
    """(dataset_id, row-hash function, fill_version) of every registration."""
    return conn.execute(
        "select dataset_id, coalesce(hash_fn, lakehouse_digest_fn(hash_sql)), fill_version"
        " from lakehouse_pg_digest_state"
    )


def add_deltas(conn: psycopg.Connection, rows: Sequence[tuple]) -> None:
    """Insert (dataset_id, seg, n, s) delta rows (``s`` a decimal string)."""
    with conn.cursor() as cur:
        cur.executemany(
            "insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) values (%s, %s, %s, %s::numeric)", rows
        )


def advance_applied(conn: psycopg.Connection, dataset_ids: list[uuid.UUID], versions: list[int]) -> None:
    """Raise each dataset's applied_version to the version the consumer drew (never lower it)."""
    conn.execute(
        "update lakehouse_pg_digest_state s set applied_version = greatest(coalesce(s.applied_version, -1), v.v)"
        " from unnest(%s::uuid[], %s::bigint[]) v(ds, v) where s.dataset_id = v.ds",
        (dataset_ids, versions),
    )


# -- the reverse mirror's re-sync (mirror/reverse.py), as statements it runs in its own transaction -------------


def filled_under_fill_lock(fill_lock: int, ds: sql.Composable) -> sql.Composed:
    """How many filled registrations the dataset ``ds`` (a literal) has (0 or 1), after taking its fill lock."""
    return sql.SQL(
        "select count(*) from (select pg_advisory_xact_lock({lock}, hashtext({ds}))) l,"
        " lakehouse_pg_digest_state s where s.dataset_id = {ds}::uuid and s.filled"
    ).format(lock=sql.Literal(fill_lock), ds=ds)


def delete_deltas(ds: sql.Composable) -> sql.Composed:
    """Drop the deltas of the dataset ``ds`` (a literal)."""
    return sql.SQL("delete from lakehouse_pg_digest_deltas where dataset_id = {ds}::uuid").format(ds=ds)
