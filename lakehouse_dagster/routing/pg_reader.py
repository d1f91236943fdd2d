"""The Postgres read path: a dataset's rows from dataset_rows, typed like its Iceberg table.

Columns are projected in SQL with the mirror's own typed projection (ingest.source.column_expr), so
both read paths return the same Arrow schema and the same values; a value of the wrong JSON type
fails loudly, naming the row and column, exactly as the mirror does.
"""

from __future__ import annotations

import psycopg
import pyarrow as pa
from psycopg import sql

from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.mirror.pinned_read import column_expr
from lakehouse_dagster.routing.projection import Projection
from lakehouse_dagster.tracking.datasets import Dataset
from lakehouse_dagster.tracking.datasets.rows import projected_rows_query

_IDENTITY_SQL = {
    "__row_index": sql.SQL("row_index"),
    "__row_id": sql.SQL("row_id::text"),
    "__created_at": sql.SQL("created_at"),
}


def postgres_query(dataset: Dataset, projection: Projection) -> tuple[sql.Composed, list]:
    """The typed projection as SQL and its parameters (the in-process read and the service's stream share it)."""
    by_name = {c.name: c for c in dataset.columns}
    exprs = [
        sql.SQL("{} as {}").format(
            _IDENTITY_SQL[name] if name in _IDENTITY_SQL else column_expr(by_name[name]), sql.Identifier(name)
        )
        for name in projection.columns
    ]
    return projected_rows_query(
        exprs, dataset.id, order_by_row_index=projection.order_by_row_index, limit=projection.limit
    )


def projected_schema(dataset: Dataset, projection: Projection) -> pa.Schema:
    """The Arrow schema of a projected read: the columns asked for, typed as the dataset's Iceberg table."""
    full = arrow_schema(dataset.columns)
    return pa.schema([full.field(n) for n in projection.columns])


def read_postgres(conn: psycopg.Connection, dataset: Dataset, projection: Projection) -> pa.Table:
    query, params = postgres_query(dataset, projection)
    schema = projected_schema(dataset, projection)
    with conn.cursor() as cur:
        rows = cur.execute(query, params).fetchall()
    return pa.Table.from_pylist([dict(zip(projection.columns, r)) for r in rows], schema=schema)
