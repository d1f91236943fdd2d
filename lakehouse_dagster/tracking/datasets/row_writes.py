"""Writes of ``dataset_rows`` outside the mirror's apply (issue 45: the table's one owner): the pg path's replace
and staged insert, complete's batched delete, the ingest bench's purge, and the backfill's repairs (the rows a
native overwrite superseded removed, the pg-path rows renumbered above the table's, the dataset recounted).
Returned composed where the caller runs them in its own transaction on another session (an ADBC cursor, with
the dataset's id as an SQL literal), run here otherwise. The backfill's copy of the missing rows is the reverse
apply's statement (reverse_apply.py ``insert_staged_missing``)."""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql


def delete_all_statement(dataset: sql.Composable) -> sql.Composed:
    """Delete every row of the dataset (``dataset``: its id as an SQL literal): a replace's first statement."""
    return sql.SQL("delete from dataset_rows where dataset_id = {}::uuid").format(dataset)


def insert_staged_statement(
    dataset: sql.Composable, row_index: sql.Composable, data: sql.Composable, stage: sql.Composable
) -> sql.Composed:
    """Move the staged rows into dataset_rows: ``row_index`` and ``data`` are expressions over the staged table
    ``stage`` (aliased ``s``), ``dataset`` the dataset's id as an SQL literal."""
    return sql.SQL("insert into dataset_rows (dataset_id, row_index, data) select {}::uuid, s.{}, {} from {} s").format(
        dataset, row_index, data, stage
    )


def delete_row_range(conn: psycopg.Connection, dataset_id: uuid.UUID, lo: int, hi: int | None) -> int:
    """Delete the dataset's rows from row_index ``lo`` up to ``hi`` (None: to the end); the rows deleted."""
    cur = conn.execute(
        "delete from dataset_rows where dataset_id = %s and row_index >= %s"
        + ("" if hi is None else " and row_index <= %s"),
        (dataset_id, lo) if hi is None else (dataset_id, lo, hi),
    )
    return cur.rowcount


def delete_workspace_datasets(conn: psycopg.Connection, workspace_id: uuid.UUID, dataset_ids: list[uuid.UUID]) -> None:
    """Delete the rows of ``dataset_ids`` (the workspace's datasets), then the workspace's datasets (their syncs and
    verdicts are the caller's to delete first): the ingest bench's purge."""
    conn.execute("delete from dataset_rows where dataset_id = any(%s::uuid[])", (dataset_ids,))
    conn.execute("delete from datasets where workspace_id = %s", (workspace_id,))


# The backfill's repairs (runbooks/backfill.py runs them in its one transaction on its ADBC session): ``only_pg`` is
# a condition on the dataset's rows as ``r``; ``dataset`` its id as an SQL literal.
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


def recount_ready_statement(dataset: sql.Composable) -> sql.Composed:
    """The dataset ready, its row count recounted from its rows."""
    return sql.SQL(
        "update datasets set row_count = (select count(*) from dataset_rows where dataset_id = {ds}::uuid),"
        " status = 'ready', error = null, updated_at = now() where id = {ds}::uuid"
    ).format(ds=dataset)
