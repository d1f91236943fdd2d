"""The pg path of a source writer: typed batches → ``dataset_rows``, with the ingest state, in ONE transaction.

Each batch is COPYed (ADBC's binary COPY, no Python object per value) into a temporary staging table of
typed columns, then one INSERT … SELECT turns the staged rows into ``dataset_rows`` (row_index as staged,
row_id and created_at by their defaults, data = the typed values as jsonb: Postgres itself writes the
jsonb, so what the mirror projects back out is exactly the typed value — NaN/±Infinity become the strings
the mirror accepts). A replace deletes the dataset's rows first, in the same transaction; the ingest
state (tracking/ingest_state.py) is saved before the commit. A killed process commits nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence

import psycopg
import pyarrow as pa
from psycopg import sql

from lakehouse_dagster.mirror.pinned_read import _adbc_uri
from lakehouse_dagster.tracking.datasets import Column

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


def _data_expr(columns: Sequence[Column]) -> sql.Composable:
    """jsonb of the staged typed columns; jsonb_build_object takes at most 100 arguments, so groups of 50."""
    groups = []
    for i in range(0, len(columns), 50):
        pairs = []
        for c in columns[i : i + 50]:
            value = sql.SQL("s.{}::jsonb" if c.type == "json" else "s.{}").format(sql.Identifier(c.name))
            pairs.append(sql.SQL("{}, {}").format(sql.Literal(c.name), value))
        groups.append(sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs)))
    return sql.SQL(" || ").join(groups) if groups else sql.SQL("'{}'::jsonb")


def copy_rows(
    dsn: str,
    render: psycopg.Connection,
    dataset_id: uuid.UUID,
    columns: Sequence[Column],
    batches: Iterable[pa.RecordBatch],
    *,
    replace: bool,
    start_index: int,
    finish: Callable[[int], Iterable[sql.Composable]],
) -> int:
    """Write ``batches`` (typed, the dataset's columns) as rows ``start_index``…; ``finish(rows)`` returns the
    statements (ingest state, row count) that commit with them. ``render`` only renders SQL literals."""
    import adbc_driver_postgresql.dbapi as adbc

    stage_cols = [sql.SQL("{} bigint").format(sql.Identifier("__row_index"))]
    stage_cols += [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(_PG_TYPE[c.type])) for c in columns]
    create = sql.SQL("create temporary table {} ({}) on commit drop").format(
        sql.Identifier(STAGE), sql.SQL(", ").join(stage_cols)
    )
    ds = sql.Literal(str(dataset_id))
    statements: list[sql.Composable] = []
    if replace:
        statements.append(sql.SQL("delete from dataset_rows where dataset_id = {}::uuid").format(ds))
    statements.append(
        sql.SQL("insert into dataset_rows (dataset_id, row_index, data) select {}::uuid, s.{}, {} from {} s").format(
            ds, sql.Identifier("__row_index"), _data_expr(columns), sql.Identifier(STAGE)
        )
    )
    rows = 0
    with adbc.connect(_adbc_uri(dsn)) as conn:  # not autocommit: one transaction
        cur = conn.cursor()
        try:
            cur.execute("set local timezone to 'UTC'")
            cur.execute(create.as_string(render))
            for batch in batches:
                if not batch.num_rows:
                    continue
                index = pa.array(range(start_index + rows, start_index + rows + batch.num_rows), type=pa.int64())
                staged = pa.RecordBatch.from_arrays([index, *batch.columns], names=["__row_index", *batch.schema.names])
                cur.adbc_ingest(STAGE, staged, mode="append", temporary=True)
                rows += batch.num_rows
            for stmt in statements:
                cur.execute(stmt.as_string(render))
            for stmt in finish(rows):
                cur.execute(stmt.as_string(render))
            conn.commit()
        except BaseException:
            try:
                conn.rollback()
            except Exception:
                pass
            raise
        finally:
            cur.close()
    return rows
