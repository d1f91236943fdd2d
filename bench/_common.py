"""Shared by the benchmarks: a Postgres to run against and a demo-shaped dataset of N rows."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from lakehouse_dagster.core.arrow_memory import prefer_jemalloc
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.schema.migrate import migrate
from lakehouse_dagster.tracking import datasets

prefer_jemalloc()  # every bench process allocates as the project's own processes do (core/arrow_memory.py)

# Demo-shaped (like the demo's `events`): 10 typed columns of every type, with nulls
# (JSON null and missing keys), unicode, NaN/±Infinity, pre-1970 timestamps and nested json.
BENCH_SCHEMA = [
    {"name": "name", "type": "string"},
    {"name": "label", "type": "string"},
    {"name": "qty", "type": "int64"},
    {"name": "bucket", "type": "int64"},
    {"name": "price", "type": "float64"},
    {"name": "ratio", "type": "float64"},
    {"name": "active", "type": "boolean"},
    {"name": "seen_at", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "attrs", "type": "json"},
]
GENERATE = """
insert into dataset_rows (dataset_id, row_index, created_at, data)
select %(ds)s, g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', jsonb_strip_nulls(jsonb_build_object(
  'name', 'item-' || g,
  'label', case when g %% 7 = 0 then null else 'ünïcode-' || (g %% 1000) || ' ✓ 日本' end,
  'qty', g * 7 - 1000000,
  'bucket', case when g %% 5 = 0 then null else g %% 100000 end,
  'price', case g %% 1000 when 1 then to_jsonb('NaN'::text) when 2 then to_jsonb('Infinity'::text)
                          when 3 then to_jsonb('-Infinity'::text) else to_jsonb(g * 0.1) end,
  'ratio', case when g %% 11 = 0 then null else to_jsonb((g %% 1000)::float8 / 7) end,
  'active', case when g %% 13 = 0 then null else g %% 2 = 0 end,
  'seen_at', to_char(timestamptz '1965-01-01 00:00:00+00' + g * interval '1.5 second',
                     'YYYY-MM-DD"T"HH24:MI:SS.US"+02:00"'),
  'day', to_char(date '2000-01-01' + (g %% 10000)::int, 'YYYY-MM-DD'),
  'attrs', case when g %% 9 = 0 then null else jsonb_build_object('a', g %% 10, 'tags', jsonb_build_array('x', g %% 3, null),
                                                                  'nested', jsonb_build_object('k', g %% 2, 'ü', 'v')) end))
  || case when g %% 17 = 0 then '{"attrs": null}'::jsonb else '{}'::jsonb end
from generate_series(%(lo)s::bigint, %(hi)s::bigint) g
"""


def admin_dsn() -> str:
    if os.environ.get("LAKEHOUSE_PG_DSN"):
        return os.environ["LAKEHOUSE_PG_DSN"]
    from lakehouse_dagster.core.embedded import start_embedded

    root = Path(tempfile.mkdtemp(prefix="lh-bench-"))
    return start_embedded(root / "pg", keep_running=False, delete_on_exit=True)


def mirror_settings(dsn: str, namespace: str, **kw):
    """Settings and catalog for a bench that mirrors: a temporary LAKEHOUSE_HOME with its own warehouse."""
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog

    root = Path(tempfile.mkdtemp(prefix=f"lh-{namespace}-"))
    (root / "warehouse").mkdir()
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        catalog={"warehouse": (root / "warehouse").as_uri(), "namespace": namespace},
        project={"home": root},
        **kw,
    )
    return settings, load_catalog(settings, dsn)


def fresh_database(admin: str, name: str) -> str:
    from lakehouse_dagster.testing.pg import with_db  # same URI rewriting the tests use

    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(name)))
        c.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    dsn = with_db(admin, name)
    with connect(dsn) as conn:
        migrate(conn)
    return dsn


def make_dataset(dsn: str, rows: int, name: str = "bench") -> tuple[uuid.UUID, float]:
    """Create a dataset of ``rows`` rows inside Postgres; returns (id, seconds)."""
    t = time.perf_counter()
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "bench")
        d = datasets.create_dataset(conn, ws, name, BENCH_SCHEMA)
        step = 500_000
        for lo in range(0, rows, step):
            conn.execute(GENERATE, {"ds": d, "lo": lo, "hi": min(rows, lo + step) - 1})
        conn.execute("vacuum analyze dataset_rows")
    return d, time.perf_counter() - t


def child_env(dsn: str, settings) -> dict[str, str]:
    """The environment of a bench's child process (a mirror, a stream, a reverse apply) on the bench's database and
    warehouse, importing this checkout's package."""
    return {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_WAREHOUSE": settings.catalog.warehouse,
        "LAKEHOUSE_NAMESPACE": settings.catalog.namespace,
        "LAKEHOUSE_HOME": str(settings.project.home),
    }
