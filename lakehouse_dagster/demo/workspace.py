"""The demo workspace: datasets of several sizes and shapes, seeded into the app tables once.

``seed_demo`` is idempotent: every demo object has a fixed id, and when the demo workspace already exists
nothing is written. Seeding runs in one transaction, so an interrupted seed leaves nothing behind.

What the demo covers (the mirror, parity and the runbook queries all have something real to chew on):

* ``events`` — the big one (``big_rows``, default 1,000,000), generated inside Postgres with
  ``generate_series``: every column type; nulls both as JSON ``null`` and as a missing key; unicode
  (CJK, RTL, emoji, combining marks, quotes, backslashes, control characters, the empty string);
  timestamps as ISO text with offsets (``Z``, ``+05:30``, ``-08:00``, ``+12:45``, ``-03:30``, pre-1970);
  floats such as 0.1, 1e-300, 5e-324, 1.7976931348623157e308 and the strings "NaN"/"Infinity"/"-Infinity";
  int64 extremes; nested json (objects, arrays, scalars, ``{}``, ``[]``).
* ``customers`` (1,000 rows) and ``orders`` (20,000 rows) — inputs of the pipeline
  ``customer_orders_rollup`` (``dataset`` nodes): the runbook's step 2b classifies them BLOCKED.
* ``customer_rollup`` — that pipeline's output (an ``output`` node, not an input: SAFE); a dashboard reads it
  from ``dataset_rows`` (``dashboards.aggregate``, declared: ``lakehouse pg-readers list``), so the flip
  gates refuse to write it iceberg-native.
* ``edge_cases`` — a handful of hand-written rows, one edge per row, and column names with a space and
  non-ASCII letters.
* ``empty`` — a tabular dataset with no rows.
* ``product_images`` — a ``manifest`` dataset (file pointers; the mirror skips it).
* ``draft_pipeline`` — a pipeline whose ``dataset`` nodes carry malformed ids (the runbook's regex skips them).

Datasets fed by a source (sources/), for the writer runbook end to end; they start empty and the
``source_poller`` sensor ingests them on the pg path within a tick (or ``lakehouse ingest``):

* ``web_clicks`` — a ``files`` source: ``$LAKEHOUSE_HOME/demo/web_clicks/*.parquet``, two Parquet files
  generated at seed time (default writer sync.append: a file dropped there later is ingested once).
* ``web_clicks_csv`` — the CSV files of the same directory (``*.csv``), same columns.
* ``crm_accounts`` — a ``postgres`` source: the table ``lakehouse_demo.crm_accounts`` in the project's own
  Postgres, no cursor column (default writer sync.full: the runbook's first writer to flip).
* ``inventory_changes`` — a ``cdc`` source: the change table ``lakehouse_demo.inventory_cdc`` (position
  ``lsn``, operation ``op``; default writer cdc.append).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.demo.source_datasets import (
    ACCOUNTS_ROWS,
    ACCOUNTS_SCHEMA,
    CLICKS_FILES,
    CLICKS_ROWS_PER_FILE,
    CLICKS_SCHEMA,
    INVENTORY_ROWS,
    INVENTORY_SCHEMA,
    SOURCE_SCHEMA,
    _seed_sources,
    write_click_files,
)
from lakehouse_dagster.flags.reader_datasets import declare_if_absent
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster.tracking.datasets import demo_rows, scopes, stamps
from lakehouse_dagster.tracking.datasets.rows import count_rows

# The demo's face: every name callers import from demo.workspace, wherever it lives now.
__all__ = [
    "ACCOUNTS_ROWS",
    "ACCOUNTS_SCHEMA",
    "CLICKS_FILES",
    "CLICKS_ROWS_PER_FILE",
    "CLICKS_SCHEMA",
    "CUSTOMERS_ROWS",
    "CUSTOMERS_SCHEMA",
    "DEMO_NAMESPACE",
    "DEMO_WORKSPACE_ID",
    "DEMO_WORKSPACE_NAME",
    "EDGE_ROWS",
    "EDGE_SCHEMA",
    "EMPTY_SCHEMA",
    "EVENTS_SCHEMA",
    "INVENTORY_ROWS",
    "INVENTORY_SCHEMA",
    "MANIFEST_ROWS",
    "MANIFEST_SCHEMA",
    "ORDERS_ROWS",
    "ORDERS_SCHEMA",
    "ROLLUP_SCHEMA",
    "SOURCE_SCHEMA",
    "demo_id",
    "demo_summary",
    "seed_demo",
    "write_click_files",
]

DEMO_NAMESPACE = uuid.UUID("6f1c5d0e-2b7a-4c1e-9a53-1a4e0de30000")
DEMO_WORKSPACE_ID = uuid.uuid5(DEMO_NAMESPACE, "workspace")
DEMO_WORKSPACE_NAME = "demo"
_LOCK_KEY = locks.DEMO_SEED


def demo_id(name: str) -> uuid.UUID:
    """The fixed id of a demo dataset or pipeline (stable across machines and re-seeds)."""
    return uuid.uuid5(DEMO_NAMESPACE, name)


EVENTS_SCHEMA = [
    {"name": "event_id", "type": "int64"},
    {"name": "user_name", "type": "string"},
    {"name": "amount", "type": "float64"},
    {"name": "is_active", "type": "boolean"},
    {"name": "occurred_at", "type": "timestamp"},
    {"name": "event_date", "type": "date"},
    {"name": "payload", "type": "json"},
]
CUSTOMERS_SCHEMA = [
    {"name": "customer_id", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": "string"},
    {"name": "country", "type": "string"},
    {"name": "signup_date", "type": "date"},
    {"name": "vip", "type": "boolean"},
    {"name": "lifetime_value", "type": "float64"},
]
ORDERS_SCHEMA = [
    {"name": "order_id", "type": "int64"},
    {"name": "customer_id", "type": "int64"},
    {"name": "amount", "type": "float64"},
    {"name": "status", "type": "string"},
    {"name": "ordered_at", "type": "timestamp"},
    {"name": "items", "type": "json"},
]
ROLLUP_SCHEMA = [
    {"name": "country", "type": "string"},
    {"name": "customers", "type": "int64"},
    {"name": "revenue", "type": "float64"},
    {"name": "computed_at", "type": "timestamp"},
]
EDGE_SCHEMA = [
    {"name": "n", "type": "int64"},
    {"name": "label ünïcode", "type": "string"},
    {"name": "x", "type": "float64"},
    {"name": "flag", "type": "boolean"},
    {"name": "at", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "doc", "type": "json"},
]
EMPTY_SCHEMA = [{"name": "id", "type": "int64"}, {"name": "note", "type": "string"}]
MANIFEST_SCHEMA = [
    {"name": "uri", "type": "string"},
    {"name": "bytes", "type": "int64"},
    {"name": "mime", "type": "string"},
]

CUSTOMERS_ROWS = 1_000
ORDERS_ROWS = 20_000

# One edge per row; a missing key and a JSON null are both nulls.
EDGE_ROWS: list[dict[str, Any]] = [
    {
        "n": 0,
        "label ünïcode": "plain",
        "x": 0.1,
        "flag": True,
        "at": "2024-01-01T00:00:00Z",
        "day": "2024-01-01",
        "doc": {"a": 1},
    },
    {"n": None, "label ünïcode": None, "x": None, "flag": None, "at": None, "day": None, "doc": None},
    {},
    {
        "n": 9223372036854775807,
        "label ünïcode": "日本語 🙂 שלום e\u0301",
        "x": 1e-300,
        "flag": False,
        "at": "1969-12-31T23:59:59.999999-01:00",
        "day": "1969-12-31",
        "doc": [1, 2.5, None, "x", {"k": []}],
    },
    {
        "n": -9223372036854775808,
        "label ünïcode": "",
        "x": "NaN",
        "at": "2024-02-29T12:30:00.5+05:30",
        "day": "2024-02-29",
        "doc": {},
    },
    {
        "n": 1,
        "label ünïcode": 'quote " backslash \\ tab \t newline \n end',
        "x": "Infinity",
        "at": "2038-01-19T03:14:08-08:00",
        "day": "2038-01-19",
        "doc": [],
    },
    {
        "n": 2,
        "label ünïcode": "\u00a0nbsp and \u200bzero-width",
        "x": "-Infinity",
        "at": "2000-02-29T23:59:59.000001+12:45",
        "day": "1900-01-01",
        "doc": "just a string",
    },
    {"n": 3, "x": 5e-324, "at": "1970-01-01T00:00:00+00:00", "doc": 42},
    {"n": 4, "x": 1.7976931348623157e308, "doc": {"deep": {"deeper": {"deepest": [{"ü": None}]}}}},
    {"n": 5, "x": -0.0, "doc": True},
    {"n": 6, "x": 123456789.123456789, "doc": {"z": 1, "a": 2, "m": [3, 2, 1]}},
]

MANIFEST_ROWS = [
    {"uri": f"s3://demo-bucket/images/{i:04d}.jpg", "bytes": 10_000 + i * 37, "mime": "image/jpeg"} for i in range(5)
]


def _pipelines(customers: uuid.UUID, orders: uuid.UUID, rollup: uuid.UUID) -> list[tuple[str, dict]]:
    return [
        (
            "customer_orders_rollup",
            {
                "nodes": [
                    {"id": "in_customers", "type": "dataset", "data": {"datasetId": str(customers)}},
                    {"id": "in_orders", "type": "dataset", "data": {"datasetId": str(orders)}},
                    {"id": "join", "type": "sql", "data": {"sql": "select country, count(*) ... group by country"}},
                    {"id": "out", "type": "output", "data": {"datasetId": str(rollup)}},
                ],
                "edges": [
                    {"source": "in_customers", "target": "join"},
                    {"source": "in_orders", "target": "join"},
                    {"source": "join", "target": "out"},
                ],
            },
        ),
        (
            "draft_pipeline",
            {
                "nodes": [
                    {"id": "bad", "type": "dataset", "data": {"datasetId": "not-a-uuid"}},
                    {"id": "unset", "type": "dataset", "data": {}},
                ],
                "edges": [],
            },
        ),
    ]


def _set_row_count(conn: psycopg.Connection, dataset_id: uuid.UUID) -> int:
    n = count_rows(conn, dataset_id)
    stamps.set_row_count(conn, dataset_id, n)
    return n


def seed_demo(conn: psycopg.Connection, *, big_rows: int = 1_000_000, home: Path | None = None) -> dict[str, Any]:
    """Create the demo workspace once; a second call (or one racing it) writes nothing.

    Returns a summary: ``created`` (False when the demo was already there), the workspace id, each dataset
    (id, name, kind, rows) and the pipelines, and the seconds spent.
    """
    if isinstance(big_rows, bool) or not isinstance(big_rows, int) or big_rows < 1:
        raise BadInput(f"demo rows must be a positive whole number, got {big_rows!r}")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    created = False
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        exists = datasets.workspace_exists(conn, DEMO_WORKSPACE_ID)
        if not exists:
            created = True
            datasets.create_workspace(conn, DEMO_WORKSPACE_NAME, DEMO_WORKSPACE_ID)

            def make(name: str, schema: list[dict], kind: str = "tabular") -> uuid.UUID:
                ds_id = datasets.create_dataset(
                    conn, DEMO_WORKSPACE_ID, name, schema, kind=kind, dataset_id=demo_id(name)
                )
                stamps.seed_source(conn, ds_id, {"type": "demo", "seed": name})
                return ds_id

            def timed(label: str, seed: Callable[..., None], *args: Any) -> None:
                t0 = time.perf_counter()
                seed(conn, *args)
                timings[label] = round(time.perf_counter() - t0, 3)

            events = make("events", EVENTS_SCHEMA)
            timed("events", demo_rows.seed_events, events, big_rows)
            stamps.set_row_count(conn, events, big_rows)

            customers = make("customers", CUSTOMERS_SCHEMA)
            timed("customers", demo_rows.seed_customers, customers, CUSTOMERS_ROWS)
            _set_row_count(conn, customers)

            orders = make("orders", ORDERS_SCHEMA)
            timed("orders", demo_rows.seed_orders, orders, ORDERS_ROWS, CUSTOMERS_ROWS)
            _set_row_count(conn, orders)

            rollup = make("customer_rollup", ROLLUP_SCHEMA)
            timed("customer_rollup", demo_rows.seed_rollup, rollup, customers)
            _set_row_count(conn, rollup)

            edge = make("edge_cases", EDGE_SCHEMA)
            datasets.insert_rows(conn, edge, EDGE_ROWS, start_index=0)
            _set_row_count(conn, edge)

            make("empty", EMPTY_SCHEMA)

            manifest = make("product_images", MANIFEST_SCHEMA, kind="manifest")
            datasets.insert_rows(conn, manifest, MANIFEST_ROWS, start_index=0)
            _set_row_count(conn, manifest)

            if home is None:
                home = Settings.from_env().project.home
            _seed_sources(conn, make, home)

            for name, spec in _pipelines(customers, orders, rollup):
                datasets.insert_pipeline(conn, demo_id(f"pipeline:{name}"), DEMO_WORKSPACE_ID, name, spec)
            # flags/reader_datasets.py: a write flip of the rollup is refused while this stands
            declare_if_absent(conn, "dashboards.aggregate", rollup, "demo: the rollup dashboard", "demo")
    summary = demo_summary(conn)
    summary["created"] = created
    summary["seconds"] = round(time.perf_counter() - started, 3)
    if timings:
        summary["insert_seconds"] = timings
    return summary


def demo_summary(conn: psycopg.Connection) -> dict[str, Any]:
    """What the demo workspace holds now (row counts from datasets.row_count)."""
    rows = scopes.workspace_summaries(conn, DEMO_WORKSPACE_ID)
    pipelines = datasets.workspace_pipelines(conn, DEMO_WORKSPACE_ID)
    return {
        "workspace_id": str(DEMO_WORKSPACE_ID),
        "present": bool(rows),
        "datasets": [{"id": str(r[0]), "name": r[1], "kind": r[2], "rows": r[3]} for r in rows],
        "pipelines": [{"id": str(r[0]), "name": r[1]} for r in pipelines],
    }
