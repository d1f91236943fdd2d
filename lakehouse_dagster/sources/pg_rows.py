"""The pg path of a source writer: typed batches → ``dataset_rows``, with the ingest state, in ONE transaction.

Each batch is COPYed (ADBC's binary COPY, no Python object per value) into a temporary staging table of
typed columns, then one INSERT … SELECT turns the staged rows into ``dataset_rows`` (row_index as staged,
row_id and created_at by their defaults, data = the typed values as jsonb: Postgres itself writes the
jsonb, so what the mirror projects back out is exactly the typed value — NaN/±Infinity become the strings
the mirror accepts). A replace deletes the dataset's rows first, in the same transaction; the ingest
state (tracking/ingest_state.py) is saved before the commit (``rows_transaction``: copy the rows, then execute
what commits with them). A killed process commits nothing.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Sequence

import psycopg
import pyarrow as pa
from psycopg import sql

from lakehouse_dagster.core.db import adbc_uri
from lakehouse_dagster.core.errors import SyncFailed
from lakehouse_dagster.lake.copy_back import data_expr as _data_expr
from lakehouse_dagster.lifecycle import POSTGRES, check_authority, facts_of_row, write_lock_statements
from lakehouse_dagster.tracking.datasets import Column
from lakehouse_dagster.tracking.datasets.row_writes import delete_all_statement, insert_staged_statement

STAGE = "lakehouse_ingest_stage"
_PG_TYPE = {
    "string": "text",
    "int64": "bigint",
    "float64": "double precision",
    "boolean": "boolean",
    "timestamp": "timestamptz",
    "date": "date",
    "json": "text",
}


class RowsTransaction:
    """One open ADBC transaction writing one dataset's rows (``rows_transaction``): ``copy`` once, then
    ``execute`` what commits with them."""

    def __init__(
        self, cur, render: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column], replace: bool
    ):
        self._cur, self._render = cur, render
        self._dataset_id, self._columns, self._replace = dataset_id, tuple(columns), replace

    def check_authority(self, writer: str) -> None:
        """Under the lifecycle lock taken shared in this transaction (held until it commits, with the rows): refuse
        unless Postgres is the dataset's truth (lifecycle/authority.py)."""
        *locks, read = write_lock_statements(self._dataset_id)
        self.execute(locks)
        self._cur.execute(read.as_string(self._render))
        facts = facts_of_row(self._cur.fetchone())
        if facts is None:  # a verb that would have recorded it rolled back meanwhile (or the dataset is gone)
            err = SyncFailed(
                f"{writer} ds={self._dataset_id}: the dataset's lifecycle state is not recorded (a verb on it was "
                "refused just now, or the dataset was deleted); nothing was written — run the write again"
            )
            err.transient = True
            raise err
        check_authority(facts, self._dataset_id, target=POSTGRES, writer=writer)

    def copy(self, batches: Iterable[pa.RecordBatch], *, start_index: int) -> int:
        """Stage ``batches`` (typed, the dataset's columns) as rows ``start_index``…, then move them into
        ``dataset_rows`` (a replace deletes the dataset's rows first). Returns the rows written."""
        rows = 0
        for batch in batches:
            if not batch.num_rows:
                continue
            index = pa.array(range(start_index + rows, start_index + rows + batch.num_rows), type=pa.int64())
            staged = pa.RecordBatch.from_arrays([index, *batch.columns], names=["__row_index", *batch.schema.names])
            self._cur.adbc_ingest(STAGE, staged, mode="append", temporary=True)
            rows += batch.num_rows
        ds = sql.Literal(str(self._dataset_id))
        statements: list[sql.Composable] = []
        if self._replace:
            statements.append(delete_all_statement(ds))
        statements.append(
            insert_staged_statement(ds, sql.Identifier("__row_index"), _data_expr(self._columns), sql.Identifier(STAGE))
        )
        self.execute(statements)
        return rows

    def execute(self, statements: Iterable[sql.Composable]) -> None:
        """Statements that commit with the rows (the ingest state, the row count)."""
        for stmt in statements:
            self._cur.execute(stmt.as_string(self._render))


@contextlib.contextmanager
def rows_transaction(
    dsn: str, render: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column], *, replace: bool
) -> Iterator[RowsTransaction]:
    """ONE transaction on its own ADBC connection, committed when the block ends, rolled back if it raises (a
    killed process commits nothing). ``render`` only renders SQL literals."""
    import adbc_driver_postgresql.dbapi as adbc  # lazy: the ADBC driver (native) only where the pg path writes

    stage_cols = [sql.SQL("{} bigint").format(sql.Identifier("__row_index"))]
    stage_cols += [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(_PG_TYPE[c.type])) for c in columns]
    create = sql.SQL("create temporary table {} ({}) on commit drop").format(
        sql.Identifier(STAGE), sql.SQL(", ").join(stage_cols)
    )
    with adbc.connect(adbc_uri(dsn)) as conn:  # not autocommit: one transaction
        cur = conn.cursor()
        try:
            cur.execute("set local timezone to 'UTC'")
            cur.execute(create.as_string(render))
            yield RowsTransaction(cur, render, dataset_id, columns, replace)
            conn.commit()
        except BaseException:
            try:
                conn.rollback()
            except Exception:
                pass
            raise
        finally:
            cur.close()
