"""The backfill's statements on ``dataset_rows`` and ``datasets`` (issue 45: the tables' owner): the rows only Iceberg
holds copied back, the rows a native overwrite superseded removed, the pg-path rows renumbered above the table's.
Returned composed: runbooks/backfill.py runs them in its one transaction on its ADBC session. ``only_pg`` is a
condition on the dataset's rows as ``r``; ``dataset`` its id as an SQL literal."""

from __future__ import annotations

from psycopg import sql


def delete_superseded_statement(only_pg: sql.Composable, at: sql.Composable) -> sql.Composed:
    """Delete the rows of ``only_pg`` created at or before ``at`` (a timestamptz literal)."""
    return sql.SQL("delete from dataset_rows r where {only_pg} and r.created_at <= {at}::timestamptz").format(
        only_pg=only_pg, at=at
    )


def min_row_index_statement(only_pg: sql.Composable) -> sql.Composed:
    """The lowest row_index of the rows of ``only_pg``."""
    return sql.SQL("select min(r.row_index) from dataset_rows r where {}").format(only_pg)


def park_below_zero_statement(only_pg: sql.Composable) -> sql.Composed:
    """Move the rows of ``only_pg`` below zero (-1 - row_index), keeping their order reversed."""
    return sql.SQL("update dataset_rows r set row_index = -1 - r.row_index where {}").format(only_pg)


def renumber_parked_statement(dataset: sql.Composable, base: sql.Composable) -> sql.Composed:
    """Renumber the dataset's rows parked below zero to ``base`` + 1…, in their original order."""
    return sql.SQL(
        "update dataset_rows r set row_index = {base} + n.rn from (select row_index, row_number() over"
        " (order by row_index desc) as rn from dataset_rows where dataset_id = {ds}::uuid and row_index < 0) n"
        " where r.dataset_id = {ds}::uuid and r.row_index = n.row_index"
    ).format(base=base, ds=dataset)


def insert_missing_statement(dataset: sql.Composable, data: sql.Composable, staged: sql.Composable) -> sql.Composed:
    """Copy the staged rows (``staged`` as ``s``: __row_index, __row_id, __created_at, ``data`` over them) whose
    row_index the dataset does not hold, identity preserved."""
    return sql.SQL(
        "insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)"
        " select {ds}::uuid, s.__row_index, s.__row_id::uuid, s.__created_at, {data} from {t} s"
        " where not exists (select 1 from dataset_rows r where r.dataset_id = {ds}::uuid"
        " and r.row_index = s.__row_index)"
    ).format(ds=dataset, data=data, t=staged)


def recount_ready_statement(dataset: sql.Composable) -> sql.Composed:
    """The dataset ready, its row count recounted from its rows."""
    return sql.SQL(
        "update datasets set row_count = (select count(*) from dataset_rows where dataset_id = {ds}::uuid),"
        " status = 'ready', error = null, updated_at = now() where id = {ds}::uuid"
    ).format(ds=dataset)
