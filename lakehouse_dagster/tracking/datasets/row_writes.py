"""Writes and deletes of ``dataset_rows`` (issue 45: the table's owner): the pg path's ingest statements, complete's
batched delete, the ingest bench's purge (of the workspace's datasets too). Statements are returned composed where the caller runs them in its own
transaction on another session (an ADBC cursor), run here otherwise."""

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
