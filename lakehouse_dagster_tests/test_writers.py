"""Source writers: every writer in both modes against files, postgres and cdc sources; same content on the pg
path + mirror as on the native path; cursor and data advance together (also across a SIGKILL); bad values
fail loudly with nothing committed; locked writers and bad specs are refused."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from lakehouse_dagster.errors import BadInput, SyncFailed
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.iceberg.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.ingest.sync import sync_dataset
from lakehouse_dagster.ingest.writers import pending_source_changes, run_writer
from lakehouse_dagster.sources import get_source, set_source
from lakehouse_dagster.sources.state import STATE_PROPERTY
from lakehouse_dagster.store import datasets as ds

from .flag_helpers import cli, cli_json

SCHEMA = [
    {"name": "name", "type": "string"},
    {"name": "n", "type": "int64"},
    {"name": "x", "type": "float64"},
    {"name": "ok", "type": "boolean"},
    {"name": "at", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "meta", "type": "json"},
]
CONTENT = [c["name"] for c in SCHEMA]
SPECIAL = [math.nan, math.inf, -math.inf]


def _records(start: int, count: int) -> list[dict]:
    """Awkward values: unicode, NaN/±Infinity, nulls, pre-1970 and offset timestamps, nested json whose keys
    are not in jsonb order, numbers with trailing zeros."""
    out = []
    for i in range(start, start + count):
        out.append({
            "name": None if i % 7 == 3 else f"ünï {i} ✓ \"q\"\\",
            "n": i * 1000 - 5,
            "x": SPECIAL[i % 3] if i % 5 == 1 else (None if i % 5 == 2 else i / 8),
            "ok": None if i % 6 == 0 else i % 2 == 0,
            "at": f"19{60 + i % 30}-03-04T05:06:07.{i:06d}+02:00",
            "day": f"2000-01-{1 + i % 28:02d}",
            "meta": None if i % 4 == 0 else {"zeta": i, "a": [1, None, "x"], "bb": {"y": 1.50, "k": True}},
        })
    return out


def _arrow(records: list[dict]) -> pa.Table:
    """The records as a typed Arrow table (Parquet): json as JSON text, timestamps typed."""
    import datetime as dt

    cols = {
        "name": pa.array([r["name"] for r in records], pa.string()),
        "n": pa.array([r["n"] for r in records], pa.int64()),
        "x": pa.array([r["x"] for r in records], pa.float64()),
        "ok": pa.array([r["ok"] for r in records], pa.bool_()),
        "at": pa.array([dt.datetime.fromisoformat(r["at"]) for r in records], pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date.fromisoformat(r["day"]) for r in records], pa.date32()),
        "meta": pa.array([None if r["meta"] is None else json.dumps(r["meta"]) for r in records], pa.string()),
    }
    return pa.table(cols)


def _json_line(r: dict) -> str:
    def enc(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v
    return json.dumps({k: enc(v) for k, v in r.items()})


def write_source_file(path: Path, fmt: str, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(_arrow(records), path)
    elif fmt == "ndjson":
        path.write_text("".join(_json_line(r) + "\n" for r in records))
    else:
        t = _arrow(records)
        texts = {c: [None if v is None else (str(v).lower() if isinstance(v, bool) else
                                             ("NaN" if isinstance(v, float) and math.isnan(v) else
                                              ("Infinity" if v == math.inf else "-Infinity" if v == -math.inf else str(v))))
                     for v in (r[c] for r in records)] for c in CONTENT}
        texts["at"] = [r["at"] for r in records]
        texts["meta"] = [None if r["meta"] is None else json.dumps(r["meta"]) for r in records]
        del t
        pacsv.write_csv(pa.table({c: pa.array(v, pa.string()) for c, v in texts.items()}), path)
    return path


@pytest.fixture
def catalog(settings, dsn):
    return load_catalog(settings, dsn)


@pytest.fixture
def workspace(conn):
    return ds.create_workspace(conn, "w")


def _dataset(conn, ws, name="src", schema=SCHEMA):
    return ds.create_dataset(conn, ws, name, schema)


def native(conn, d, writer):
    set_override(conn, "write", writer, "iceberg_native", dataset=d, note="test", actor="t")


def ingest(dsn, catalog, settings, conn, d, writer, **kw):
    return run_writer(dsn, catalog, settings, FlagResolver(conn, 0), d, writer, **kw)


def table_rows(catalog, settings, d) -> list[dict]:
    table = load_table_or_none(catalog, table_identifier(settings, d))
    if table is None or table.current_snapshot() is None:
        return []
    got = table.scan().to_arrow().sort_by("__row_index").to_pylist()
    return got


def content(rows: list[dict]) -> list[tuple]:
    """__row_index + the content columns, with NaN made comparable."""
    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return [tuple(norm(r.get(c)) for c in ["__row_index", *CONTENT]) for r in rows]


def pg_count(conn, d) -> int:
    return conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]


# --- files: both paths give the same table --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv", "ndjson"])
def test_files_pg_path_plus_mirror_equals_native_path(conn, dsn, catalog, settings, workspace, tmp_path, fmt):
    src = tmp_path / "src"
    write_source_file(src / f"a.{fmt}", fmt, _records(0, 40))
    write_source_file(src / f"b.{fmt}", fmt, _records(40, 25))
    via_pg, via_native = _dataset(conn, workspace, "pg"), _dataset(conn, workspace, "native")
    for d in (via_pg, via_native):
        set_source(conn, d, {"type": "files", "uri": str(src / f"*.{fmt}"), "format": fmt})
    native(conn, via_native, "sync.append")

    r_pg = ingest(dsn, catalog, settings, conn, via_pg, "sync.append")
    assert (r_pg.path, r_pg.rows, r_pg.snapshot_id, r_pg.total_rows) == ("pg", 65, None, 65)
    assert pg_count(conn, via_pg) == 65 and load_table_or_none(catalog, table_identifier(settings, via_pg)) is None
    sync_dataset(dsn, catalog, settings, via_pg)

    r_native = ingest(dsn, catalog, settings, conn, via_native, "sync.append")
    assert (r_native.path, r_native.rows, r_native.total_rows) == ("native", 65, 65) and r_native.snapshot_id
    assert pg_count(conn, via_native) == 0  # dataset_rows untouched
    log = conn.execute("select path, status, rows, snapshot_id from iceberg_sync_log where dataset_id = %s",
                       (via_native,)).fetchall()
    assert log == [("native", "succeeded", 65, r_native.snapshot_id)]
    assert conn.execute("select row_count from datasets where id = %s", (via_native,)).fetchone()[0] == 65

    a, b = table_rows(catalog, settings, via_pg), table_rows(catalog, settings, via_native)
    assert len(a) == 65 and content(a) == content(b)
    assert [r["__row_index"] for r in b] == list(range(65))
    assert len({r["__row_id"] for r in b}) == 65 and all(uuid.UUID(r["__row_id"]).version == 4 for r in b)
    meta = next(r["meta"] for r in b if r["meta"] is not None)
    assert meta == '{"a": [1, null, "x"], "bb": {"k": true, "y": 1.5}, "zeta": 1}'  # jsonb's own text form
