"""The demo datasets fed by a source (demo/workspace.py's second list): the two source tables in the project's own
Postgres, the click files (Parquet and CSV), and each dataset's source set.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from lakehouse_dagster.sources import set_source

CLICKS_SCHEMA = [
    {"name": "click_id", "type": "int64"},
    {"name": "user_name", "type": "string"},
    {"name": "url", "type": "string"},
    {"name": "clicked_at", "type": "timestamp"},
    {"name": "duration_ms", "type": "float64"},
    {"name": "converted", "type": "boolean"},
    {"name": "attrs", "type": "json"},
]
ACCOUNTS_SCHEMA = [
    {"name": "account_id", "type": "int64"},
    {"name": "name", "type": "string"},
    {"name": "country", "type": "string"},
    {"name": "arr", "type": "float64"},
    {"name": "active", "type": "boolean"},
    {"name": "signed_up", "type": "date"},
    {"name": "profile", "type": "json"},
]
INVENTORY_SCHEMA = [
    {"name": "lsn", "type": "int64"},
    {"name": "op", "type": "string"},
    {"name": "sku", "type": "string"},
    {"name": "qty", "type": "int64"},
    {"name": "changed_at", "type": "timestamp"},
]
CLICKS_FILES, CLICKS_ROWS_PER_FILE = 2, 5_000
ACCOUNTS_ROWS, INVENTORY_ROWS = 2_000, 3_000
SOURCE_SCHEMA = "lakehouse_demo"

# The two source tables in the project's own Postgres (constant SQL: no identifier comes from input).
_SOURCE_TABLES_SQL = """
create schema if not exists lakehouse_demo;
create table if not exists lakehouse_demo.crm_accounts (
  account_id bigint primary key, name text, country text, arr float8, active boolean, signed_up date, profile jsonb);
insert into lakehouse_demo.crm_accounts
select g.n, (array['Acme', 'Björk AB', '株式会社 Demo', 'Zoë & Co', 'O''Neil Ltd'])[1 + (g.n %% 5)::int] || ' ' || g.n,
       (array['FR', 'DE', 'JP', 'BR', 'US', 'NO'])[1 + (g.n %% 6)::int],
       case when g.n %% 97 = 0 then null else round((g.n * 7919 %% 100000) / 7.0, 2) end,
       g.n %% 4 <> 0, date '2019-01-01' + (g.n %% 2000)::int,
       case when g.n %% 3 = 0 then null else jsonb_build_object('tier', g.n %% 3, 'tags', jsonb_build_array('a', 'ü')) end
  from generate_series(1::bigint, %(accounts)s::bigint) as g(n)
on conflict do nothing;
create table if not exists lakehouse_demo.inventory_cdc (
  lsn bigint primary key, op text not null, sku text, qty bigint, changed_at timestamptz);
insert into lakehouse_demo.inventory_cdc
select g.n, (array['insert', 'update', 'update', 'delete'])[1 + (g.n %% 4)::int], 'SKU-' || (g.n %% 250),
       case when g.n %% 4 = 3 then null else (g.n * 31) %% 500 end,
       timestamptz '2024-05-01 00:00:00+00' + g.n * interval '17 seconds'
  from generate_series(1::bigint, %(changes)s::bigint) as g(n)
on conflict do nothing;
"""


def _click_batch(start: int, n: int):
    """Deterministic click rows (typed Arrow): every column type, nulls, unicode, NaN."""

    base = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
    ids = range(start, start + n)
    return pa.table(
        {
            "click_id": pa.array(list(ids), pa.int64()),
            "user_name": pa.array(
                [None if i % 41 == 0 else ["ana", "Zoë", "日本", "o'neil", ""][i % 5] + str(i % 300) for i in ids]
            ),
            "url": pa.array([f"/p/{i % 97}?q=caf%C3%A9" for i in ids]),
            "clicked_at": pa.array([base + dt.timedelta(seconds=7 * i) for i in ids], pa.timestamp("us", tz="UTC")),
            "duration_ms": pa.array(
                [float("nan") if i % 53 == 0 else None if i % 29 == 0 else i % 9000 / 3 for i in ids], pa.float64()
            ),
            "converted": pa.array([None if i % 31 == 0 else i % 7 == 0 for i in ids], pa.bool_()),
            "attrs": pa.array([None if i % 4 == 0 else f'{{"ab": "{"ab"[i % 2]}", "n": {i % 10}}}' for i in ids]),
        }
    )


def _as_csv_text(table):
    """CSV cells as a person would write them: ISO timestamps, true/false, NaN (not pyarrow's nan)."""

    def cell(v):
        if v is None:
            return None
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        if isinstance(v, dt.datetime):
            return v.isoformat()
        return str(v)

    return pa.table(
        {name: pa.array([cell(v) for v in table.column(name).to_pylist()], pa.string()) for name in table.column_names}
    )


def write_click_files(directory: Path) -> list[Path]:
    """The file-backed demo sources: Parquet files and a CSV file (same columns) in one directory."""

    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(CLICKS_FILES):
        path = directory / f"part-{i:05d}.parquet"
        pq.write_table(_click_batch(i * CLICKS_ROWS_PER_FILE, CLICKS_ROWS_PER_FILE), path)
        out.append(path)
    path = directory / "part-00000.csv"
    pacsv.write_csv(_as_csv_text(_click_batch(CLICKS_FILES * CLICKS_ROWS_PER_FILE, CLICKS_ROWS_PER_FILE)), path)
    out.append(path)
    return out


def _seed_sources(conn: psycopg.Connection, make, home: Path) -> None:

    for statement in filter(str.strip, _SOURCE_TABLES_SQL.split(";\n")):
        conn.execute(statement, {"accounts": ACCOUNTS_ROWS, "changes": INVENTORY_ROWS} if "%(" in statement else None)
    directory = home / "demo" / "web_clicks"
    write_click_files(directory)
    # make() stores the legacy {"type": "demo"} marker; set_source validates and replaces it.
    set_source(
        conn,
        make("web_clicks", CLICKS_SCHEMA),
        {"type": "files", "uri": str(directory / "*.parquet"), "format": "parquet"},
    )
    set_source(
        conn, make("web_clicks_csv", CLICKS_SCHEMA), {"type": "files", "uri": str(directory / "*.csv"), "format": "csv"}
    )
    set_source(
        conn,
        make("crm_accounts", ACCOUNTS_SCHEMA),
        {"type": "postgres", "table": f"{SOURCE_SCHEMA}.crm_accounts", "cursor_column": None, "dsn_env": None},
    )
    set_source(
        conn,
        make("inventory_changes", INVENTORY_SCHEMA),
        {
            "type": "cdc",
            "table": f"{SOURCE_SCHEMA}.inventory_cdc",
            "position_column": "lsn",
            "op_column": "op",
            "dsn_env": None,
        },
    )
