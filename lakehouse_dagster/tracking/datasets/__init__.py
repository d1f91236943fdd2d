"""Access to the app tables: workspaces, datasets, dataset_rows, pipelines."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.core.ids import parse_uuid

COLUMN_TYPES = ("string", "int64", "float64", "boolean", "timestamp", "date", "json")
IDENTITY_COLUMNS = ("__row_index", "__row_id", "__created_at")


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclasses.dataclass(frozen=True)
class Dataset:
    id: uuid.UUID
    workspace_id: uuid.UUID | None
    name: str
    kind: str
    columns: tuple[Column, ...]
    row_count: int | None
    status: str
    rows_version: int
    rows_rewrite_version: int
    max_row_index: int | None

    @property
    def table_name(self) -> str:
        return f"ds_{self.id.hex}"


def parse_schema(raw: Any, dataset: str = "dataset") -> tuple[Column, ...]:
    """Validate a datasets.schema value; a bad schema is refused with the offending entry."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, list):
        raise BadInput(f"{dataset}: schema must be a list of {{name, type}} objects, got {type(raw).__name__}")
    cols: list[Column] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry.get("name"):
            raise BadInput(f"{dataset}: schema entry {i} must be an object with a non-empty string 'name'")
        name, typ = entry["name"], entry.get("type")
        if typ not in COLUMN_TYPES:
            raise BadInput(
                f"{dataset}: column {name!r} has type {typ!r}; supported types are {', '.join(COLUMN_TYPES)}"
            )
        if name.startswith("__"):
            raise BadInput(f"{dataset}: column {name!r} uses the reserved '__' prefix (identity columns)")
        if name in seen:
            raise BadInput(f"{dataset}: column {name!r} appears twice in the schema")
        seen.add(name)
        cols.append(Column(name, typ))
    return tuple(cols)


_SELECT_DATASETS = (
    "select id, workspace_id, name, kind, schema, row_count, status, rows_version, rows_rewrite_version,"
    " max_row_index from datasets"
)


def _dataset_from_row(row: Sequence[Any]) -> Dataset:
    return Dataset(
        id=row[0],
        workspace_id=row[1],
        name=row[2],
        kind=row[3],
        columns=parse_schema(row[4], f"dataset {row[0]}") if row[3] == "tabular" else (),
        row_count=row[5],
        status=row[6],
        rows_version=row[7],
        rows_rewrite_version=row[8],
        max_row_index=row[9],
    )


def get_dataset(conn: psycopg.Connection, dataset_id: uuid.UUID | str) -> Dataset:
    ds_id = parse_uuid(dataset_id, "dataset id")
    row = conn.execute(_SELECT_DATASETS + " where id = %s", (ds_id,)).fetchone()
    if row is None:
        raise NotFound(f"dataset {ds_id} does not exist (check the id with: lakehouse datasets)")
    return _dataset_from_row(row)


def create_workspace(conn: psycopg.Connection, name: str, workspace_id: uuid.UUID | None = None) -> uuid.UUID:
    ws_id = workspace_id or uuid.uuid4()
    conn.execute("insert into workspaces (id, name) values (%s, %s)", (ws_id, name))
    return ws_id


def workspace_exists(conn: psycopg.Connection, workspace_id: uuid.UUID | None) -> bool:
    return conn.execute("select 1 from workspaces where id = %s", (workspace_id,)).fetchone() is not None


def workspace_names(conn: psycopg.Connection, ids: Sequence[uuid.UUID | None] | None = None) -> dict:
    """{workspace id: name} of these workspaces (None: of every workspace)."""
    if ids is None:
        return dict(conn.execute("select id, name from workspaces").fetchall())
    return dict(conn.execute("select id, name from workspaces where id = any(%s::uuid[])", (list(ids),)).fetchall())


def dataset_and_workspace_names(conn: psycopg.Connection, ids: Sequence[uuid.UUID | None]) -> dict:
    """{id: name} of the datasets and the workspaces among ``ids``, in one statement."""
    return dict(
        conn.execute(
            "select id, name from datasets where id = any(%s::uuid[])"
            " union all select id, name from workspaces where id = any(%s::uuid[])",
            (ids, ids),
        ).fetchall()
    )


def workspace_ids_named_like(conn: psycopg.Connection, pattern: str) -> list[uuid.UUID]:
    """Ids of the workspaces whose name matches the LIKE ``pattern``."""
    return [r[0] for r in conn.execute("select id from workspaces where name like %s", (pattern,)).fetchall()]


def delete_workspace_row(conn: psycopg.Connection, workspace_id: uuid.UUID) -> None:
    """Delete the workspace row only (its datasets are the caller's to delete first)."""
    conn.execute("delete from workspaces where id = %s", (workspace_id,))


# A join other modules' queries put after their ``from datasets d`` to read the dataset's workspace as ``w``
# (status/partition_state.py, tracking/sync_log.py) without naming the table.
JOIN_WORKSPACE_W = "left join workspaces w on w.id = d.workspace_id"


def create_dataset(
    conn: psycopg.Connection,
    workspace_id: uuid.UUID | None,
    name: str,
    schema: Iterable[dict] | Iterable[Column],
    *,
    kind: str = "tabular",
    dataset_id: uuid.UUID | None = None,
) -> uuid.UUID:
    entries = [dataclasses.asdict(c) if isinstance(c, Column) else dict(c) for c in schema]
    parse_schema(entries, name)
    ds_id = dataset_id or uuid.uuid4()
    conn.execute(
        "insert into datasets (id, workspace_id, name, kind, schema, row_count) values (%s, %s, %s, %s, %s, 0)",
        (ds_id, workspace_id, name, kind, Jsonb(entries)),
    )
    return ds_id


def set_schema(conn: psycopg.Connection, dataset_id: uuid.UUID, schema: Iterable[dict]) -> None:
    entries = [dict(c) for c in schema]
    parse_schema(entries, str(dataset_id))
    conn.execute("update datasets set schema = %s, updated_at = now() where id = %s", (Jsonb(entries), dataset_id))


def insert_rows(
    conn: psycopg.Connection, dataset_id: uuid.UUID, rows: Iterable[dict], *, start_index: int | None = None
) -> int:
    """Append rows (dicts of column → JSON value) with consecutive row_index values; one statement."""
    if start_index is None:
        start_index = fetch_value(
            conn.execute(
                "select coalesce(max(row_index) + 1, 0) from dataset_rows where dataset_id = %s", (dataset_id,)
            ),
            "the next row index of the dataset",
        )
    payload = [(dataset_id, start_index + i, Jsonb(r)) for i, r in enumerate(rows)]
    if not payload:
        return 0
    with conn.cursor() as cur:
        cur.execute(
            "insert into dataset_rows (dataset_id, row_index, data) "
            "select %s, u.i, u.d from unnest(%s::bigint[], %s::jsonb[]) as u(i, d)",
            (dataset_id, [p[1] for p in payload], [p[2] for p in payload]),
        )
    return len(payload)


def insert_pipeline(conn: psycopg.Connection, pipeline_id: uuid.UUID, workspace_id: uuid.UUID, name: str, spec) -> None:
    """One pipeline of the app (the demo's seed)."""
    conn.execute(
        "insert into pipelines (id, workspace_id, name, spec) values (%s, %s, %s, %s)",
        (pipeline_id, workspace_id, name, Jsonb(spec)),
    )


def workspace_pipelines(conn: psycopg.Connection, workspace_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    """(id, name) of a workspace's pipelines, by name."""
    return conn.execute(
        "select id, name from pipelines where workspace_id = %s order by name", (workspace_id,)
    ).fetchall()


def pipelines_reading(conn: psycopg.Connection, ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, list[str]]]:
    """(dataset, names of the pipelines reading it as INPUT) of each of ``ids`` some pipeline reads (the runbook's
    `dataset` spec nodes), one query."""
    return conn.execute(
        """select (node->'data'->>'datasetId')::uuid, array_agg(distinct p.name order by p.name)
             from pipelines p, jsonb_array_elements(p.spec->'nodes') node
            where node->>'type' = 'dataset'
              and (node->'data'->>'datasetId') ~ '^[0-9a-fA-F-]{36}$'
              and (node->'data'->>'datasetId')::uuid = any(%s::uuid[])
            group by 1""",
        (ids,),
    ).fetchall()


# The `pin` CTE of step 2b of the Fase 4 runbook verbatim: the datasets referenced as a pipeline INPUT (a `dataset`
# spec node), as a query to put in a ``with pin as (...)`` (status/overview.py).
PIN = """select distinct (node->'data'->>'datasetId')::uuid as dataset_id
  from pipelines, jsonb_array_elements(spec->'nodes') node
  where node->>'type' = 'dataset'
    and (node->'data'->>'datasetId') ~ '^[0-9a-fA-F-]{36}$'"""


def pipeline_input_dataset_ids(conn: psycopg.Connection) -> set[uuid.UUID]:
    """Datasets referenced as a pipeline INPUT (a `dataset` node in a spec): the runbook's F3 blockers."""
    rows = conn.execute(
        """
        select distinct (node->'data'->>'datasetId')::uuid
          from pipelines, jsonb_array_elements(spec->'nodes') node
         where node->>'type' = 'dataset'
           and (node->'data'->>'datasetId') ~ '^[0-9a-fA-F-]{36}$'
        """
    ).fetchall()
    return {r[0] for r in rows}
