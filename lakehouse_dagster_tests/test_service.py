"""The HTTP service (`lakehouse serve`) as the live app calls it: one real server process per module on a free
loopback port, a real Postgres, real Iceberg tables written by the real mirror and writers. Rows served over HTTP
are compared with the in-process read router's (routing/exercise.py), reasons and headers with its decisions."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.guards import admission_slot, dataset_lock
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.routing.exercise import read_through_router
from lakehouse_dagster.service.client import ServiceError
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.testing.pg import with_db
from lakehouse_dagster.testing.service import ServiceProcess, new_token
from lakehouse_dagster.tracking import datasets

SCHEMA = [
    {"name": "name", "type": "string"},
    {"name": "n", "type": "int64"},
    {"name": "x", "type": "float64"},
    {"name": "ok", "type": "boolean"},
    {"name": "at", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "meta", "type": "json"},
]
ARROW = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"


def _rows(start: int, count: int) -> list[dict]:
    return [
        {
            "name": f"row {i} ✓",
            "n": i,
            "x": [i / 4, "NaN", "-Infinity"][i % 3] if i % 7 else None,
            "ok": i % 2 == 0,
            "at": f"2024-01-01T00:00:{i % 60:02d}+01:00",
            "day": "2024-02-29",
            "meta": {"k": i, "tags": ["a", None]},
        }
        for i in range(start, start + count)
    ]


@dataclasses.dataclass
class World:
    dsn: str
    settings: Settings
    catalog: object
    server: ServiceProcess
    workspace: uuid.UUID

    def conn(self) -> psycopg.Connection:
        return connect(self.dsn)

    def dataset(self, rows: int = 30, *, mirrored: bool = True, name: str = "events") -> uuid.UUID:
        with self.conn() as conn:
            d = datasets.create_dataset(conn, self.workspace, name, SCHEMA)
            if rows:
                datasets.insert_rows(conn, d, _rows(0, rows))
        if mirrored:
            sync_dataset(self.dsn, self.catalog, self.settings, d)
        return d

    def flag(self, reader: str, mode: str, d: uuid.UUID) -> None:
        with self.conn() as conn:
            set_override(conn, "read", reader, mode, dataset=d, note="test", actor="pytest")

    def in_process(self, reader: str, d: uuid.UUID, **kw):
        with self.conn() as conn:
            kw.setdefault("limit", None)
            result, _, _ = read_through_router(conn, self.catalog, self.settings, reader, d, **kw)
        return result


@pytest.fixture(scope="module")
def world(pg_admin_dsn, template_dsn, tmp_path_factory):
    name = f"svc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'create database "{name}" template "lakehouse_test_template"')
    dsn = with_db(pg_admin_dsn, name)
    root = tmp_path_factory.mktemp("service")
    (root / "warehouse").mkdir()
    env = {
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_HOME": str(root / "home"),
        "LAKEHOUSE_WAREHOUSE": (root / "warehouse").as_uri(),
        "LAKEHOUSE_NAMESPACE": "lakehouse",
        "LAKEHOUSE_ACTOR": "pytest",
        "LAKEHOUSE_SOAK_SECONDS": "0",
        "LAKEHOUSE_FLAG_TTL_SECONDS": "0",  # every request sees the flag the test just set
        "LAKEHOUSE_MAX_CONCURRENT_INGEST": "2",
        "LAKEHOUSE_API_BATCH_ROWS": "1000",
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        settings = Settings.from_env()
    catalog = load_catalog(settings, dsn)
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "service")
    server = ServiceProcess(env, root / "serve.log", token=new_token()).wait_ready()
    try:
        yield World(dsn, settings, catalog, server, ws)
    finally:
        server.stop()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def client(world):
    with world.server.client() as c:
        yield c


def _post_read(world, body, accept=ARROW, token=True, **kw) -> httpx.Response:
    headers = {"Accept": accept}
    if token:
        headers["Authorization"] = f"Bearer {world.server.token}"
    return httpx.post(world.server.url + "/lakehouse/read", json=body, headers=headers, timeout=60, **kw)


def _by_index(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["__row_index"])


def _json_value(v):
    """The NDJSON form of an Arrow value (service/encode.py)."""
    import datetime as dt
    import math

    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
    if isinstance(v, dt.datetime):
        return v.astimezone(dt.UTC).isoformat()
    if isinstance(v, dt.date):
        return v.isoformat()
    return v


def _same(a, b) -> bool:
    """Row lists equal, NaN equal to NaN."""
    return json.dumps(a, default=str, sort_keys=True) == json.dumps(b, default=str, sort_keys=True)


# --- happy paths ------------------------------------------------------------------------------------------------


def test_read_streams_the_routers_rows_as_arrow_and_ndjson_with_its_headers(world, client):
    d = world.dataset(2500)
    world.flag("export.stream", "iceberg", d)
    expected = world.in_process("export.stream", d, order_by_row_index=True)
    assert expected.decision.reason == "iceberg@eventual"

    got = client.read("export.stream", d, order="row_index")
    assert (got.source, got.reason, got.mode) == ("iceberg", "iceberg@eventual", "iceberg")
    assert got.snapshot_id == expected.decision.snapshot_id
    assert got.table.schema == expected.value.schema
    assert _same(got.table.to_pylist(), expected.value.to_pylist())
    assert got.table.num_rows == 2500

    # unordered: the same rows; a projection with a limit: the router's own
    assert _same(_by_index(client.read("export.stream", d).table), _by_index(expected.value))
    part = client.read("export.stream", d, columns=["n", "name", "__row_index"], limit=7, order="row_index")
    assert part.table.column_names == ["n", "name", "__row_index"]
    assert (
        part.table.to_pylist()
        == world.in_process(
            "export.stream", d, columns="n,name,__row_index", limit=7, order_by_row_index=True
        ).value.to_pylist()
    )

    nd = client.read_ndjson("export.stream", d, order="row_index", limit=50)
    assert (nd.source, nd.reason, nd.snapshot_id) == ("iceberg", "iceberg@eventual", expected.decision.snapshot_id)
    want = [{k: _json_value(v) for k, v in r.items()} for r in expected.value.slice(0, 50).to_pylist()]
    assert nd.rows == want

    # the raw response: the content type, the headers, an Arrow IPC stream pyarrow reads
    resp = _post_read(world, {"reader": "export.stream", "dataset_id": str(d), "limit": 3})
    assert resp.status_code == 200 and resp.headers["content-type"] == ARROW
    assert resp.headers["x-lakehouse-source"] == "iceberg"
    assert resp.headers["x-lakehouse-reason"] == "iceberg@eventual"
    assert resp.headers["x-lakehouse-snapshot-id"] == str(expected.decision.snapshot_id)
    assert ipc.open_stream(resp.content).read_all().num_rows == 3


def test_postgres_reads_stream_the_same_rows(world, client):
    d = world.dataset(2300, mirrored=False)
    expected = world.in_process("export.stream", d, order_by_row_index=True)
    assert expected.decision.reason == "pg@off"
    got = client.read("export.stream", d, order="row_index")
    assert (got.source, got.reason, got.snapshot_id) == ("postgres", "pg@off", None)
    assert got.table.schema == expected.value.schema
    assert _same(got.table.to_pylist(), expected.value.to_pylist())
    nd = client.read_ndjson("export.stream", d, columns=["n", "x", "at", "meta"], order="row_index", limit=4)
    assert nd.rows == [
        {k: _json_value(v) for k, v in r.items()}
        for r in world.in_process(
            "export.stream", d, columns="n,x,at,meta", order_by_row_index=True, limit=4
        ).value.to_pylist()
    ]
    empty = client.read("export.stream", d, limit=0)
    assert empty.table.num_rows == 0 and empty.table.schema == expected.value.schema


def test_route_flags_health_and_metrics(world, client):
    d = world.dataset(5)
    world.flag("studio.digest", "iceberg", d)
    route = client.route("studio.digest", d)
    assert route["source"] == "iceberg" and route["reason"] == "iceberg@eventual" and route["mode"] == "iceberg"
    assert route["snapshot_id"] is not None and route["consistency"] == "EVENTUAL" and route["native"] is False
    assert client.route("export.stream", d)["reason"] == "pg@off"

    flags = client.flags(d)
    readers = {r["name"]: r for r in flags["readers"]}
    writers = {w["name"]: w for w in flags["writers"]}
    assert readers["studio.digest"]["mode"] == "iceberg" and readers["studio.digest"]["reason"] == "dataset override"
    assert readers["export.stream"]["mode"] == "off" and readers["export.stream"]["reason"] == "registry default"
    assert writers["sync.full"]["mode"] == "pg" and writers["row.edit"]["ceiling"] == "pg"
    assert flags["dataset_name"] == "events"

    assert httpx.get(world.server.url + "/healthz").json() == {"status": "alive"}  # no token needed
    assert client.ready() == {"status": "ready", "postgres": "ok", "catalog": "ok"}
    client.read("studio.digest", d)
    text = client.metrics()
    assert 'lakehouse_read_decisions_total{reader="studio.digest",reason="iceberg@eventual"}' in text
    assert "lakehouse_status_up 1.0" in text
    assert "lakehouse_datasets_behind_mirror" in text and "lakehouse_mirror_lag_max_seconds" in text
    assert 'lakehouse_canary_latest_verdicts{verdict="MISMATCH"}' in text
    assert "process_resident_memory_bytes" in text
    assert 'lakehouse_ingest_requests_total{outcome="503",writer="sync.full"}' in text
    assert str(d) not in text  # no dataset ids in labels
