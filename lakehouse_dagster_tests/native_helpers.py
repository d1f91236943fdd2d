"""Shared by the rollback / first-native-sync tests: a dataset made ready the runbook's way (mirrored,
read-flipped, canary ok, writer flipped through the gated CLI) and native writes through the real write
router and chunked writer."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pyarrow as pa
import pytest

from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.lake.writer import TableWrite
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.write_digests import write_digested
from lakehouse_dagster.routing.native_table import write_native_table
from lakehouse_dagster.routing.write_router import route_write
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli

SCHEMA = [
    {"name": "a", "type": "int64"},
    {"name": "s", "type": "string"},
    {"name": "x", "type": "float64"},
    {"name": "at", "type": "timestamp"},
    {"name": "doc", "type": "json"},
]
SERVABLE = [r.name for r in registry.SERVABLE_READERS]  # prerequisite #1: not the compute readers (proven first)
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def row(i: int) -> dict:
    x = [0.1, "NaN", "Infinity", -0.0, 1e-300][i % 5]
    return {
        "a": i,
        "s": f"v{i} ü",
        "x": x,
        "at": (T0 + dt.timedelta(seconds=i)).isoformat(),
        "doc": {"k": i, "z": [1, None]} if i % 2 else None,
    }


def ready_native(conn, dsn, settings, writer: str, rows: int = 6) -> uuid.UUID:
    """A dataset mirrored, read-flipped, canary ok, and ``writer`` flipped to iceberg_native (gated CLI)."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(rows)])
    runbook_ready(conn, dsn, settings, d)
    cli("write-flags", "set", writer, "iceberg_native", "--dataset", str(d), check=True)
    return d


def runbook_ready(conn, dsn, settings, d: uuid.UUID) -> None:
    """Mirrored, read-flipped (every reader Iceberg can serve), canary ok: what the Fase 4 runbook asks before
    a write flip, and what the write router asks before a dataset's first native write."""
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, note="fase1", actor="pytest")
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]


def native_write(
    conn, dsn, settings, d: uuid.UUID, writer: str, values: list[dict], *, start: int, legacy: bool = False
) -> int:
    """A native write through the real write router and chunked writer; returns the snapshot id. ``legacy``: as
    written before native commits carried their run's totals (no totals, no expiry, no compaction)."""
    catalog = load_catalog(settings, dsn)
    dataset = datasets.get_dataset(conn, d)
    schema = arrow_schema(dataset.columns)
    cols = {c.name: [v.get(c.name) for v in values] for c in dataset.columns}
    cols["x"] = [float(x) if x is not None else None for x in cols["x"]]
    cols["at"] = [dt.datetime.fromisoformat(t) for t in cols["at"]]
    cols["doc"] = [None if v is None else json.dumps(v, separators=(", ", ": ")) for v in cols["doc"]]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(range(start, start + len(values)), pa.int64()),
            pa.array([str(uuid.uuid4()) for _ in values]),
            pa.array([dt.datetime.now(dt.UTC)] * len(values), pa.timestamp("us", tz="UTC")),
        ]
        + [pa.array(cols[c.name], schema.field(c.name).type) for c in dataset.columns],
        schema=schema,
    )
    mode = registry.get_flag("write", writer).iceberg_mode

    def iceberg_write(sync_id, source_version):
        plan = TableWrite(mode, sync_id, source_version, path="native", max_row_index=start + len(values) - 1)
        if legacy:
            return write_digested(catalog, settings, dataset, [batch], plan)
        return write_native_table(catalog, settings, dataset, [batch], plan, conn=conn)

    out = route_write(
        conn,
        FlagResolver(conn, ttl_seconds=0),
        writer,
        d,
        pg_write=lambda: pytest.fail("pg path"),
        iceberg_write=iceberg_write,
        settings=settings,
    )
    return out.value.snapshot_id


def table_rows(settings, dsn, d) -> list[dict]:
    table = load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, d))
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["__row_index"])
    return [{**r, "x": repr(r["x"])} for r in rows]  # NaN != NaN: compare floats by their text


def snapshot(settings, dsn, d) -> int:
    return load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, d)).current_snapshot().snapshot_id


def pg_source_table(conn, values: list[dict]) -> str:
    """A source table in the project's own Postgres holding ``values`` (SCHEMA's columns); its name."""
    from psycopg import sql

    name = f"src_{uuid.uuid4().hex[:12]}"
    conn.execute(
        sql.SQL("create table {} (a bigint, s text, x float8, at timestamptz, doc jsonb)").format(sql.Identifier(name))
    )
    add_source_rows(conn, name, values)
    return f"public.{name}"


def add_source_rows(conn, table: str, values: list[dict]) -> None:
    from psycopg import sql
    from psycopg.types.json import Jsonb

    for v in values:
        conn.execute(
            sql.SQL("insert into {} values (%s, %s, %s::float8, %s, %s)").format(sql.Identifier(*table.split("."))),
            (v["a"], v["s"], str(v["x"]), v["at"], None if v["doc"] is None else Jsonb(v["doc"])),
        )
