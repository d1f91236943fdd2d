"""The statements of the reverse mirror's apply (mirror/reverse.py) on ``dataset_rows`` and the dataset's row, as
composed SQL the apply runs in its own transaction with the values as literals (``ds``: the dataset id, ``t``: the
staging table of the snapshot's rows ``s``). Hot path: the same text the apply ran, no round trip added. The
backfill (runbooks/backfill.py) copies the rows only Iceberg holds with the same insert."""

from __future__ import annotations

from typing import Any

from psycopg import sql

# Taken before any query of the apply (a re-sync's REPEATABLE READ snapshot comes after it): the lock every write
# of the apply takes anyway, under which the capture mode read next holds until the commit.
LOCK_ROWS = sql.SQL("lock table dataset_rows in row exclusive mode")


def insert_staged(ds: sql.Composable, data: sql.Composable, t: sql.Composable) -> sql.Composed:
    """The staged rows inserted with their identity (``data``: the jsonb built from ``s``'s columns)."""
    return sql.SQL(
        "insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)"
        " select {ds}::uuid, s.__row_index, s.__row_id::uuid, s.__created_at, {data} from {t} s"
    ).format(ds=ds, data=data, t=t)


def insert_staged_missing(insert: sql.Composable, ds: sql.Composable) -> sql.Composed:
    """``insert`` (``insert_staged``) of the staged rows at a row_index the dataset does not hold yet."""
    return sql.SQL(
        "{insert} where not exists (select 1 from dataset_rows r where r.dataset_id = {ds}::uuid"
        " and r.row_index = s.__row_index)"
    ).format(insert=insert, ds=ds)


def staged_clashes(t: sql.Composable, ds: sql.Composable) -> sql.Composed:
    """How many staged rows the dataset lacks under their own identity (another row at their row_index)."""
    return sql.SQL(
        "select count(*) from {t} s where not exists (select 1 from dataset_rows r where"
        " r.dataset_id = {ds}::uuid and r.row_index = s.__row_index and r.row_id = s.__row_id::uuid)"
    ).format(t=t, ds=ds)


def count_rows(ds: sql.Composable) -> sql.Composed:
    return sql.SQL("select count(*) from dataset_rows where dataset_id = {ds}::uuid").format(ds=ds)


def delete_rows_counting(ds: sql.Composable, extra: sql.Composable) -> sql.Composed:
    """Every row of the dataset deleted; (rows deleted, of them those where ``extra``, a condition on a row)."""
    return sql.SQL(
        "with changed as (delete from dataset_rows where dataset_id = {ds}::uuid returning {extra} as x)"
        " select count(*), count(*) filter (where x) from changed"
    ).format(ds=ds, extra=extra)


def ingest(cur: Any, reader: Any) -> None:
    """The record batches of ``reader`` appended to dataset_rows through an ADBC cursor (COPY)."""
    cur.adbc_ingest("dataset_rows", reader, mode="append")


def set_totals(n: int, ds: sql.Composable) -> sql.Composed:
    """The dataset's row_count (the apply's count) and max_row_index (from its rows) after the apply."""
    return sql.SQL(
        "update datasets set row_count = {n}, max_row_index = (select coalesce(max(row_index), -1)"
        " from dataset_rows where dataset_id = {ds}::uuid), updated_at = now() where id = {ds}::uuid"
    ).format(n=sql.Literal(n), ds=ds)
