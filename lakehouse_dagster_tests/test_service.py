"""The HTTP service (`lakehouse serve`) as the live app calls it: one real server process per module on a free
loopback port, a real Postgres, real Iceberg tables written by the real mirror and writers. Rows served over HTTP
are compared with the in-process read router's (routing/exercise.py), reasons and headers with its decisions."""

from __future__ import annotations

import contextlib
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
from lakehouse_dagster.core.guards import admission_slot
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.routing.exercise import read_through_router
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.testing.pg import with_db
from lakehouse_dagster.testing.service import ServiceProcess, new_token
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.conftest import TEMPLATE_DB

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
    env: dict = dataclasses.field(default_factory=dict)  # the server's configuration (a second replica's too)

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


@contextlib.contextmanager
def make_world(pg_admin_dsn, root: Path, extra_env: dict | None = None):
    """A database of its own, a warehouse under ``root`` and a server process; ``extra_env``: more of its
    configuration (test_rest_catalog.py: a REST catalog and its S3)."""
    name = f"svc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'create database "{name}" template "{TEMPLATE_DB}"')  # (one per pytest worker)
    dsn = with_db(pg_admin_dsn, name)
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
        "LAKEHOUSE_SHADOW_SAMPLE": "1",  # every read in mode shadow is compared (test_shadow_reads_over_http)
        **(extra_env or {}),
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
        yield World(dsn, settings, catalog, server, ws, env)
    finally:
        server.stop()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture(scope="module")
def world(pg_admin_dsn, template_dsn, tmp_path_factory):
    with make_world(pg_admin_dsn, tmp_path_factory.mktemp("service")) as w:
        yield w


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


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
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
    assert 'lakehouse_reverse_mirror_datasets{state="behind"}' in text and "lakehouse_reverse_mirror_lag_max" in text
    assert 'lakehouse_canary_latest_verdicts{verdict="MISMATCH"}' in text
    assert "process_resident_memory_bytes" in text
    assert 'lakehouse_ingest_requests_total{outcome="503",writer="sync.full"}' in text
    assert str(d) not in text  # no dataset ids in labels


# --- every router reason over HTTP ------------------------------------------------------------------------------


def _break_table_files(world, d) -> None:
    """A real Iceberg read error: the snapshot's data files are gone from the warehouse."""
    warehouse = Path(world.settings.catalog.warehouse.removeprefix("file://"))
    files = [p for p in warehouse.rglob("*.parquet") if d.hex in str(p)]
    assert files
    for p in files:
        p.unlink()


def test_strict_reads_iceberg_only_when_caught_up_and_postgres_when_lagging(world, client):
    d = world.dataset(40)
    world.flag("studio.preview", "iceberg", d)
    got = client.read("studio.preview", d, order="row_index")
    assert (got.source, got.reason) == ("iceberg", "iceberg@strict")
    with world.conn() as conn:
        datasets.insert_rows(conn, d, _rows(40, 3))  # Postgres moves past the snapshot
    lag = client.read("studio.preview", d, order="row_index")
    assert (lag.source, lag.reason, lag.snapshot_id) == ("postgres", "pg@lagging", None)
    assert lag.table.num_rows == 43
    assert _same(
        lag.table.to_pylist(), world.in_process("studio.preview", d, order_by_row_index=True).value.to_pylist()
    )
    # an EVENTUAL reader tolerates the lag
    world.flag("studio.digest", "iceberg", d)
    assert client.route("studio.digest", d)["reason"] == "iceberg@eventual"


def test_no_snapshot_shadow_and_off_serve_postgres(world, client):
    d = world.dataset(6, mirrored=False)
    world.flag("export.stream", "iceberg", d)
    assert client.read("export.stream", d).reason == "pg@no-snapshot"
    world.flag("graph.kuzu", "shadow", d)
    assert client.read("graph.kuzu", d).reason == "pg@shadow"
    assert client.read("studio.digest", d).reason == "pg@off"


def _shadow_outcomes(world, d, n: int) -> list[tuple]:
    """The first ``n`` comparisons recorded for ``d`` (the service's workers write them off the request path)."""
    with world.conn() as conn:
        _wait(
            lambda: (
                conn.execute("select count(*) from lakehouse_shadow_reads where dataset_id = %s", (d,)).fetchone()[0]
                >= n
            ),
            f"{n} shadow comparison(s) of {d}",
        )
        return conn.execute(
            "select outcome, pg_version, iceberg_version, pg_row from lakehouse_shadow_reads where dataset_id = %s"
            " order by id",
            (d,),
        ).fetchall()


def test_shadow_reads_over_http_are_compared_with_iceberg_off_the_request_path(world, client):
    d = world.dataset(40, name="shadowed")
    world.flag("graph.kuzu", "shadow", d)
    served = client.read("graph.kuzu", d)  # a whole read: every row streamed, then compared
    assert served.reason == "pg@shadow" and served.table.num_rows == 40
    ((outcome, pg_version, iceberg_version, _),) = _shadow_outcomes(world, d, 1)
    assert outcome == "match" and pg_version == iceberg_version
    with world.conn() as conn, conn.transaction():  # the triggers bypassed: same versions, a different value
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{n}', '-1') where dataset_id = %s and row_index = 7", (d,)
        )
        conn.execute("alter table dataset_rows enable trigger user")
    assert client.read("graph.kuzu", d).table.num_rows == 40
    outcome, _, _, pg_row = _shadow_outcomes(world, d, 2)[1]
    assert outcome == "mismatch" and "-1" in json.dumps(pg_row)  # the first differing row, as Postgres served it


def test_fallback_on_an_iceberg_error_is_served_by_postgres_logged_and_recorded(world, client):
    d = world.dataset(25)
    world.flag("export.stream", "iceberg", d)
    _break_table_files(world, d)
    got = client.read("export.stream", d, order="row_index")
    assert (got.source, got.reason, got.snapshot_id) == ("postgres", "pg@fallback", None)
    with world.conn() as conn:
        pg = read_through_router(
            conn, world.catalog, world.settings, "export.stream", d, limit=None, order_by_row_index=True
        )[0]
        recorded = conn.execute(
            "select reader, error from lakehouse_read_fallbacks where dataset_id = %s", (d,)
        ).fetchall()
    assert pg.decision.reason == "pg@fallback"  # in-process, the same decision
    assert _same(got.table.to_pylist(), pg.value.to_pylist())
    assert len(recorded) == 2 and recorded[0][0] == "export.stream" and "missing" in recorded[0][1]
    assert f"[read-router] export.stream ds={d} iceberg read failed → PG fallback" in world.server.log_text()
    assert 'lakehouse_read_fallbacks_total{reader="export.stream"}' in client.metrics()

    # iceberg_only: no fallback — 502 with the CLI's reason, nothing streamed
    world.flag("export.stream", "iceberg_only", d)
    resp = _post_read(world, {"reader": "export.stream", "dataset_id": str(d)})
    assert resp.status_code == 502
    assert resp.json()["error"].startswith(f"export.stream ds={d}: iceberg read failed and mode iceberg_only has no PG")
    with world.conn() as conn:
        assert (
            conn.execute("select count(*) from lakehouse_read_fallbacks where dataset_id = %s", (d,)).fetchone()[0] == 2
        )


NATIVE_SCHEMA = [{"name": "n", "type": "int64"}, {"name": "name", "type": "string"}]


def _sourced(world, rows: int, *, slow_seconds: float = 0) -> tuple[uuid.UUID, str]:
    """A dataset fed by a Postgres table of ``rows`` rows (its source reads for ``slow_seconds`` at least)."""
    table = f"src_{uuid.uuid4().hex[:10]}"
    with world.conn() as conn:
        conn.execute(f"create table public.{table} (n bigint primary key, name text)")
        conn.execute(f"insert into public.{table} select g, 'r' || g from generate_series(1, {rows}) g")
        d = datasets.create_dataset(conn, world.workspace, table, NATIVE_SCHEMA)
        if slow_seconds:
            query = f"select s.n, s.name from public.{table} s, pg_sleep({slow_seconds})"
            set_source(conn, d, {"type": "postgres", "query": query})
        else:
            set_source(conn, d, {"type": "postgres", "table": f"public.{table}"})
    return d, table


def _native(world, d, writer="sync.full") -> None:
    """The writer flipped to iceberg_native, its readers on Iceberg first (prerequisite #1)."""
    with world.conn() as conn:
        for r in SERVABLE_READERS:
            set_override(conn, "read", r.name, "iceberg", dataset=d, note="fase1", actor="pytest")
        set_override(conn, "write", writer, "iceberg_native", dataset=d, note="fase4", actor="pytest")


def test_a_native_dataset_is_read_from_postgres_only_through_the_reverse_mirrors_copy(world, client):
    d, _ = _sourced(world, 12)
    _native(world, d)
    refused = _post_read(world, {"reader": "export.stream", "dataset_id": str(d)})
    assert refused.status_code == 409
    assert refused.json()["error"].startswith(f"refused: export.stream ds={d} is written iceberg-native")
    assert client.route("export.stream", d)["source"] == "refused"

    written = client.ingest(d, "sync.full")
    assert written["path"] == "native" and written["rows"] == 12 and written["snapshot_id"]
    world.flag("export.stream", "off", d)  # off by hand: still never Postgres
    got = client.read("export.stream", d, order="row_index")
    assert (got.source, got.reason, str(got.snapshot_id)) == ("iceberg", "iceberg@native", written["snapshot_id"])
    assert got.table.column("n").to_pylist() == list(range(1, 13))
    # a Postgres-locked reader reads the reverse mirror's copy (on by default); /metrics counts it behind
    assert client.route("objects.sync", d)["reason"] == "pg@reverse"
    state = {k: _metric(client, f'lakehouse_reverse_mirror_datasets{{state="{k}"}}') for k in ("caught_up", "behind")}
    assert state["behind"] >= 1 and _metric(client, "lakehouse_reverse_mirror_lag_max_seconds") >= 0
    apply_reverse(world.dsn, world.catalog, world.settings, d)
    assert _metric(client, 'lakehouse_reverse_mirror_datasets{state="caught_up"}') == state["caught_up"] + 1
    assert _metric(client, 'lakehouse_reverse_mirror_datasets{state="behind"}') == state["behind"] - 1
    served = client.read("objects.sync", d, order="row_index")
    assert (served.source, served.reason) == ("postgres", "pg@reverse")
    assert served.table.column("n").to_pylist() == list(range(1, 13))
    off = _metric(client, 'lakehouse_reverse_mirror_datasets{state="off"}')
    with (
        world.conn() as conn
    ):  # the reverse off: nothing keeps Postgres, so a locked reader is refused with the way out
        set_reverse(conn, False, dataset=d, note="stop the copy", actor="pytest")
    files = _post_read(world, {"reader": "sdk.files.list", "dataset_id": str(d)})
    assert files.status_code == 409 and "cannot be served by Iceberg" in files.json()["error"]
    assert f"lakehouse reverse on --dataset {d}" in files.json()["error"]
    # ... and a compute reader not flipped yet (issue 43) is served the latest snapshot: Iceberg is the truth
    assert client.route("objects.sync", d)["reason"] == "iceberg@native"
    assert _metric(client, 'lakehouse_reverse_mirror_datasets{state="off"}') == off + 1


# --- ingest -----------------------------------------------------------------------------------------------------


def _metric(client, series: str) -> float:
    """One series' value from GET /metrics (0 when absent)."""
    for line in client.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


OK_FULL = 'lakehouse_ingest_requests_total{outcome="ok",writer="sync.full"}'
NATIVE_ROWS = 'lakehouse_rows_ingested_total{path="native"}'


def test_ingest_runs_the_writer_on_the_path_its_flag_says(world, client):
    d, table = _sourced(world, 20)
    ok_before, native_before = _metric(client, OK_FULL), _metric(client, NATIVE_ROWS)
    r = client.ingest(d, "sync.full")
    assert (r["path"], r["rows"], r["total_rows"], r["snapshot_id"], r["new"]) == ("pg", 20, 20, None, True)
    assert r["sync_id"] and r["writer"] == "sync.full"
    with world.conn() as conn:
        assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 20
    sync_dataset(world.dsn, world.catalog, world.settings, d)
    with world.conn() as conn:  # the runbook's parity gate before a dataset holding Postgres rows goes native
        verdicts = run_canary_and_roll_back(conn, world.dsn, world.catalog, world.settings, dataset_ids=[str(d)])
        assert [v.verdict for v in verdicts.results] == ["ok"]
    _native(world, d)
    with world.conn() as conn:
        conn.execute(f"insert into public.{table} values (21, 'r21')")
    n = client.ingest(d, "sync.full")
    assert (n["path"], n["rows"], n["total_rows"]) == ("native", 21, 21) and n["snapshot_id"]
    with world.conn() as conn:
        log_row = conn.execute(
            "select status, rows, snapshot_id, path from iceberg_sync_log where sync_id = %s",
            (uuid.UUID(n["sync_id"]),),
        ).fetchone()
    assert log_row == ("succeeded", 21, int(n["snapshot_id"]), "native")
    assert _metric(client, OK_FULL) == ok_before + 2
    assert _metric(client, NATIVE_ROWS) == native_before + 21


def _written(world) -> tuple:
    """Everything an ingest could write, for "nothing was written" checks."""
    with world.conn() as conn:
        return (
            conn.execute("select count(*), coalesce(sum(row_index), 0) from dataset_rows").fetchone(),
            conn.execute("select count(*) from iceberg_sync_log").fetchone(),
            conn.execute("select count(*), max(updated_at) from datasets").fetchone(),
            conn.execute("select count(*) from lakehouse_flag_overrides").fetchone(),
        )


def test_a_full_admission_bound_answers_503_with_retry_after_and_the_retry_succeeds(world, client):
    d, _ = _sourced(world, 5)
    before = _written(world)
    with connect(world.dsn) as a, connect(world.dsn) as b, admission_slot(a, 2), admission_slot(b, 2):
        resp = httpx.post(
            world.server.url + "/lakehouse/ingest",
            json={"dataset_id": str(d), "writer": "sync.full"},
            headers={"Authorization": f"Bearer {world.server.token}"},
            timeout=60,
        )
        assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
        assert resp.json() == {
            "error": "all 2 ingest slots are busy (LAKEHOUSE_MAX_CONCURRENT_INGEST); retry later or raise the bound"
        }
        assert _written(world) == before
        releaser = threading.Timer(1.0, lambda: (a.close(), b.close()))  # the holders end: their slots free
        releaser.start()
        t0 = time.monotonic()
        r = client.ingest(d, "sync.full")  # the client waits Retry-After and retries
        releaser.join()
    assert r["rows"] == 5 and time.monotonic() - t0 >= 1.5
    assert 'lakehouse_ingest_requests_total{outcome="503",writer="sync.full"}' in client.metrics()


def test_same_dataset_ingests_serialise_and_each_lands_whole(world, client):
    d, _ = _sourced(world, 30, slow_seconds=1.0)
    _native(world, d)
    results, errors = [], []

    def run():
        try:
            with world.server.client() as c:
                results.append(c.ingest(d, "sync.full"))
        except Exception as exc:  # pragma: no cover - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert errors == [] and sorted(r["rows"] for r in results) == [30, 30]
    with world.conn() as conn:
        spans = conn.execute(
            "select started_at, finished_at, status from iceberg_sync_log where dataset_id = %s order by started_at",
            (d,),
        ).fetchall()
    assert [s[2] for s in spans] == ["succeeded", "succeeded"]
    assert spans[0][1] <= spans[1][0]  # G3: the second started after the first finished
    table = load_table_or_none(world.catalog, table_identifier(world.settings, d))
    assert table.scan().to_arrow().num_rows == 30  # replaced, never doubled


def test_a_client_that_disconnects_mid_ingest_leaves_the_write_whole(world, client):
    d, _ = _sourced(world, 40, slow_seconds=2.0)
    _native(world, d)
    body = json.dumps({"dataset_id": str(d), "writer": "sync.full"}).encode()
    with socket.create_connection(("127.0.0.1", world.server.port)) as s:
        s.sendall(
            b"POST /lakehouse/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {world.server.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        with world.conn() as conn:  # mid-ingest: its sync row is running
            while not conn.execute(
                "select exists(select 1 from iceberg_sync_log where dataset_id = %s and status = 'running')", (d,)
            ).fetchone()[0]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    # the client is gone; the ingest finishes whole, recorded once, right
    with world.conn() as conn:
        while True:
            rows = conn.execute("select status, rows from iceberg_sync_log where dataset_id = %s", (d,)).fetchall()
            if rows and rows[0][0] != "running":
                break
            assert time.monotonic() < deadline + 30
            time.sleep(0.1)
        assert rows == [("succeeded", 40)]
        assert conn.execute("select row_count, status from datasets where id = %s", (d,)).fetchone() == (40, "ready")
    table = load_table_or_none(world.catalog, table_identifier(world.settings, d))
    assert table.scan().to_arrow().num_rows == 40
    deadline = time.monotonic() + 10
    while "the client went away before the answer; the ingest finished whole" not in world.server.log_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)


# --- auth -------------------------------------------------------------------------------------------------------

ENDPOINT_CALLS = [
    ("POST", "/lakehouse/read", {"reader": "export.stream", "dataset_id": str(uuid.uuid4())}),
    ("POST", "/lakehouse/ingest", {"dataset_id": str(uuid.uuid4()), "writer": "sync.full"}),
    ("GET", "/lakehouse/route?reader=export.stream&dataset_id=" + str(uuid.uuid4()), None),
    ("GET", "/lakehouse/flags?dataset_id=" + str(uuid.uuid4()), None),
    ("GET", "/metrics", None),
    ("GET", "/readyz", None),
    ("GET", "/nowhere", None),
]


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token-of-some-length", "Basic abc", "Bearer", "{token}x"]
)
def test_every_endpoint_but_healthz_needs_the_token(world, authorization):
    before = _written(world)
    for method, path, body in ENDPOINT_CALLS:
        headers = {}
        if authorization is not None:
            headers["Authorization"] = authorization.replace("{token}", f"Bearer {world.server.token}")
        resp = httpx.request(method, world.server.url + path, json=body, headers=headers, timeout=30)
        assert resp.status_code == 401, (path, resp.text)
        assert resp.json() == {"error": "unauthorized"} and resp.headers["www-authenticate"] == "Bearer"
    assert _written(world) == before
    assert httpx.get(world.server.url + "/healthz").status_code == 200


def test_the_token_is_never_printed_or_logged(world, client):
    d = world.dataset(3)
    client.read("export.stream", d)
    httpx.get(world.server.url + "/metrics", headers={"Authorization": "Bearer " + world.server.token[:-1]})
    log = world.server.log_text()
    assert "uvicorn.access" in log and "/lakehouse/read" in log  # the log is there, and it is not empty
    assert world.server.token not in log and world.server.token[:12] not in log
    assert world.server.token not in " ".join(world.server.proc.args)  # not on the command line either


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_serve_refuses_to_start_off_loopback_without_a_token_or_with_a_weak_one(world):
    env = {**__import__("os").environ, "LAKEHOUSE_PG_DSN": world.dsn}
    env.pop("LAKEHOUSE_API_TOKEN", None)
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lakehouse_dagster.cli.main", "serve", "--port", "1"]
    off = subprocess.run([*cmd, "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=60)
    assert off.returncode == 2 and off.stderr.count("\n") == 1, off.stderr
    assert "not a loopback address and LAKEHOUSE_API_TOKEN is not set" in off.stderr
    weak = subprocess.run(cmd, env={**env, "LAKEHOUSE_API_TOKEN": "short"}, capture_output=True, text=True, timeout=60)
    assert weak.returncode == 2 and "at least 16 characters" in weak.stderr and "short" not in weak.stderr


# --- bad input: a 4xx with one line, nothing written --------------------------------------------------------------

SMUGGLE = 'n"; drop table datasets; --'


def _bad_reads(d: uuid.UUID) -> list[tuple[object, int, str]]:
    ok = {"reader": "export.stream", "dataset_id": str(d)}
    return [
        (b"{not json", 400, "the read request body is not valid JSON"),
        (b"", 400, "the read request has no body"),
        (b"[1, 2]", 400, "is a JSON array, not an object"),
        (b"\xff\xfe", 400, "not UTF-8"),
        ({**ok, "reader": 7}, 400, "'reader' must be a string, got a JSON number"),
        ({"dataset_id": str(d)}, 400, "the read request needs 'reader'"),
        ({**ok, "reader": "export.streem"}, 400, "unknown reader 'export.streem'"),
        ({**ok, "reader": "sync.full"}, 400, "sync.full is a writer"),
        ({**ok, "reader": "x" * 5000}, 400, "is not a known reader"),
        ({**ok, "colums": ["n"]}, 400, "unknown field(s) 'colums' in the read request"),
        ({**ok, "dataset_id": "not-a-uuid"}, 400, "dataset_id 'not-a-uuid' is not a valid UUID"),
        ({**ok, "dataset_id": "1' or '1'='1"}, 400, "is not a valid UUID"),
        ({**ok, "dataset_id": str(uuid.uuid4())}, 404, "does not exist"),
        ({**ok, "columns": ["n", "nope"]}, 400, "unknown column(s) 'nope'"),
        ({**ok, "columns": [SMUGGLE]}, 400, "unknown column(s)"),
        ({**ok, "columns": "n,name"}, 400, "'columns' must be an array of column names"),
        ({**ok, "columns": ["n", 3]}, 400, "'columns' must be an array of column names"),
        ({**ok, "limit": -1}, 400, "'limit' must be a whole number from 0 to 1000000000, got -1"),
        ({**ok, "limit": 10**12}, 400, "'limit' must be a whole number from 0 to 1000000000"),
        ({**ok, "limit": "10"}, 400, 'got "10"'),
        ({**ok, "limit": True}, 400, "got true"),
        ({**ok, "limit": 1.5}, 400, "got 1.5"),
        ({**ok, "order": "name"}, 400, "'order' must be 'row_index'"),
    ]


def test_bad_read_requests_are_refused_in_one_line_and_write_nothing(world):
    d = world.dataset(4)
    before = _written(world)
    for body, status, says in _bad_reads(d):
        kw = {"content": body} if isinstance(body, bytes) else {"json": body}
        resp = httpx.post(
            world.server.url + "/lakehouse/read",
            headers={"Authorization": f"Bearer {world.server.token}", "Content-Type": "application/json"},
            timeout=30,
            **kw,
        )
        assert resp.status_code == status, (body, resp.text)
        error = resp.json()["error"]
        assert list(resp.json()) == ["error"] and "\n" not in error and says in error, (body, error)
    assert _written(world) == before
    with world.conn() as conn:
        assert conn.execute("select count(*) from datasets where id = %s", (d,)).fetchone()[0] == 1  # not dropped
    ndjson_csv = _post_read(world, {"reader": "export.stream", "dataset_id": str(d)}, accept="text/csv")
    assert ndjson_csv.status_code == 406 and "application/x-ndjson" in ndjson_csv.json()["error"]


def test_the_log_says_why_each_request_was_refused(world):
    """uvicorn's access line says only the status (`"POST /lakehouse/read HTTP/1.1" 400`): the line beside it says
    why, as the caller was told (issue 44); for a 401 what was wrong with the credentials, never the token given."""
    d = world.dataset(2)
    url, auth = world.server.url, {"Authorization": f"Bearer {world.server.token}"}
    bad = httpx.post(url + "/lakehouse/read", json={"reader": "export.streem", "dataset_id": str(d)}, headers=auth)
    nowhere = httpx.get(url + "/lakehouse/nothing", headers=auth)
    bare = httpx.get(url + "/lakehouse/flags")
    wrong = httpx.get(url + "/lakehouse/flags", headers={"Authorization": "Bearer not-the-token-at-all-0123"})
    assert (bad.status_code, nowhere.status_code, bare.status_code, wrong.status_code) == (400, 404, 401, 401)
    log = world.server.log_text()  # each line is written before its answer is sent
    assert f"POST /lakehouse/read: refused (400): {bad.json()['error']}" in log
    assert f"GET /lakehouse/nothing: refused (404): {nowhere.json()['error']}" in log
    assert (
        "GET /lakehouse/flags: refused (401): unauthorized (no Authorization header: send Authorization: Bearer" in log
    )
    assert "refused (401): unauthorized (the bearer token is not this service's LAKEHOUSE_API_TOKEN)" in log
    assert "not-the-token-at-all" not in log and world.server.token not in log


def test_bad_ingest_and_query_requests_are_refused_in_one_line_and_write_nothing(world):
    d, _ = _sourced(world, 3)
    plain = world.dataset(2, mirrored=False, name="no source")
    before = _written(world)
    auth = {"Authorization": f"Bearer {world.server.token}"}
    cases = [
        ({"dataset_id": str(d)}, 400, "the ingest request needs 'writer'"),
        ({"dataset_id": str(d), "writer": "row.edit"}, 400, "writer row.edit is locked to pg"),
        ({"dataset_id": str(d), "writer": "sync.fulll"}, 400, "unknown writer 'sync.fulll'"),
        ({"dataset_id": str(d), "writer": "export.stream"}, 400, "export.stream is a reader"),
        ({"dataset_id": "x'; drop table datasets; --", "writer": "sync.full"}, 400, "is not a valid UUID"),
        ({"dataset_id": str(uuid.uuid4()), "writer": "sync.full"}, 404, "does not exist"),
        ({"dataset_id": str(plain), "writer": "sync.full"}, 400, "has no source; set one with: lakehouse sources set"),
        ({"dataset_id": str(d), "writer": "sync.append"}, 400, "cannot run on dataset"),
        ({"dataset_id": str(d), "writer": "sync.full", "force": True}, 400, "unknown field(s) 'force'"),
    ]
    for body, status, says in cases:
        resp = httpx.post(world.server.url + "/lakehouse/ingest", json=body, headers=auth, timeout=30)
        assert resp.status_code == status, (body, resp.text)
        assert says in resp.json()["error"] and "\n" not in resp.json()["error"], (body, resp.text)
    queries = [
        ("/lakehouse/route?reader=export.stream", 400, "needs the query parameter(s) dataset_id"),
        (f"/lakehouse/route?reader=nope&dataset_id={d}", 400, "unknown reader 'nope'"),
        (f"/lakehouse/route?reader=export.stream&dataset_id={d}&x=1", 400, "unknown field(s) 'x'"),
        (f"/lakehouse/route?reader=export.stream&dataset_id={uuid.uuid4()}", 404, "does not exist"),
        ("/lakehouse/flags?dataset_id=42", 400, "is not a valid UUID"),
        (f"/lakehouse/flags?dataset_id={uuid.uuid4()}", 404, "does not exist"),
        ("/lakehouse/ingest", 405, "GET is not allowed on /lakehouse/ingest; use POST"),
        ("/lakehouse/nothing", 404, "no endpoint /lakehouse/nothing; the endpoints are"),
    ]
    for path, status, says in queries:
        resp = httpx.get(world.server.url + path, headers=auth, timeout=30)
        assert resp.status_code == status and says in resp.json()["error"], (path, resp.text)
    assert _written(world) == before


def test_oversized_bodies_are_refused_before_they_are_read(world):
    auth = {"Authorization": f"Bearer {world.server.token}", "Content-Type": "application/json"}
    big = b'{"reader": "export.stream", "pad": "' + b"x" * 70_000 + b'"}'
    declared = httpx.post(world.server.url + "/lakehouse/read", content=big, headers=auth, timeout=30)
    assert declared.status_code == 413 and "at most 65536 are accepted" in declared.json()["error"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(20):
            yield b"x" * 8192

    chunked = httpx.post(world.server.url + "/lakehouse/ingest", content=chunks(), headers=auth, timeout=30)
    assert chunked.status_code == 413 and "over 65536 bytes" in chunked.json()["error"]


# --- a reader that goes away mid-stream ---------------------------------------------------------------------------


def _big_dataset(world, rows: int) -> uuid.UUID:
    with world.conn() as conn:
        d = datasets.create_dataset(conn, world.workspace, "big", NATIVE_SCHEMA)
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, data) select %s, g,"
            " jsonb_build_object('n', g, 'name', repeat('ü', 150) || g) from generate_series(0, %s) g",
            (d, rows - 1),
        )
    return d


def _service_sessions(world) -> list[tuple]:
    with world.conn() as conn:
        return conn.execute(
            "select state, backend_xmin is not null from pg_stat_activity"
            " where datname = current_database() and application_name = 'lakehouse-serve'"
            " and (state <> 'idle' or backend_xmin is not null)"
        ).fetchall()


def _start_read_and_stop_reading(world, body: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", world.server.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw = json.dumps(body).encode()
    s.sendall(
        b"POST /lakehouse/read HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {world.server.token}\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    got = b""
    while len(got) < 20_000:
        got += s.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    return s


def _wait(predicate, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_reader_gone_mid_stream_frees_its_postgres_connection_and_snapshot(world, client):
    d = _big_dataset(world, 120_000)  # ~40 MB streamed: far more than the socket buffers hold
    cut_before = _metric(client, 'lakehouse_read_streams_cut_total{why="client_gone"}')
    s = _start_read_and_stop_reading(world, {"reader": "export.stream", "dataset_id": str(d)})
    # mid-stream: the read holds a transaction (its snapshot) on a service connection
    _wait(lambda: any(xmin for _, xmin in _service_sessions(world)), "the read's open transaction")
    assert _metric(client, "lakehouse_reads_in_flight") == 1
    s.close()
    _wait(lambda: _service_sessions(world) == [], "the read's transaction and snapshot to be released")
    _wait(lambda: _metric(client, "lakehouse_reads_in_flight") == 0, "the stream to close")
    assert _metric(client, 'lakehouse_read_streams_cut_total{why="client_gone"}') == cut_before + 1
    assert f"read export.stream ds={d} from pg ended after" in world.server.log_text()
    # the service is fine: the same read, whole
    assert client.read("export.stream", d, columns=["n"]).table.num_rows == 120_000


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_reader_gone_mid_stream_closes_its_iceberg_files(world, client):
    d = _big_dataset(world, 120_000)
    sync_dataset(world.dsn, world.catalog, world.settings, d)
    world.flag("export.stream", "iceberg", d)
    fd_dir = Path(f"/proc/{world.server.proc.pid}/fd")

    def open_data_files() -> list[str]:
        names = []
        for fd in fd_dir.iterdir():
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if d.hex in target and target.endswith(".parquet"):
                names.append(target)
        return names

    s = _start_read_and_stop_reading(world, {"reader": "export.stream", "dataset_id": str(d)})
    _wait(lambda: open_data_files() != [], "the read to hold its data file")
    s.close()
    _wait(lambda: open_data_files() == [], "the data file to be closed")
    _wait(lambda: _metric(client, "lakehouse_reads_in_flight") == 0, "the stream to close")
    assert f"read export.stream ds={d} from iceberg ended after" in world.server.log_text()


def test_the_python_client_leaving_a_stream_early_frees_the_read(world, client):
    d = _big_dataset(world, 120_000)
    cut_before = _metric(client, 'lakehouse_read_streams_cut_total{why="client_gone"}')
    with client.stream("export.stream", d) as s:
        first = next(iter(s))  # one batch read, the rest left unread
    assert 0 < first.num_rows < 120_000
    _wait(lambda: _service_sessions(world) == [], "the read's transaction and snapshot to be released")
    _wait(lambda: _metric(client, "lakehouse_reads_in_flight") == 0, "the stream to close")
    assert _metric(client, 'lakehouse_read_streams_cut_total{why="client_gone"}') == cut_before + 1


# --- an ordered read with a limit over overlapping files ------------------------------------------------------------

_POOLS: list = []


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_an_ordered_limited_read_of_overlapping_files_holds_the_limit_not_the_table(world):
    """Two data files whose __row_index ranges interleave (one group): {"order":"row_index","limit":10} returns the
    10 smallest rows, as the full ordered read does, and its Arrow memory peak follows the limit, not the table."""
    import pyarrow.compute as pc

    from lakehouse_dagster.routing.projection import projection_for
    from lakehouse_dagster.service.batches import iceberg_stream

    d = _big_dataset(world, 60_000)  # ~20 MB of Arrow
    sync_dataset(world.dsn, world.catalog, world.settings, d)
    table = load_table_or_none(world.catalog, table_identifier(world.settings, d))
    rows = table.scan().to_arrow()
    odd = pc.equal(pc.bit_wise_and(rows.column("__row_index"), 1), 1)
    with table.transaction() as tx:  # even rows in one file, odd in another: both span the whole range
        tx.overwrite(rows.filter(pc.invert(odd)))
        tx.append(rows.filter(odd))
    table = load_table_or_none(world.catalog, table_identifier(world.settings, d))
    files = list(table.scan().plan_files())
    assert len(files) == 2
    with world.conn() as conn:
        dataset = datasets.get_dataset(conn, d)

    def read(limit: int | None) -> tuple[pa.Table, int]:
        previous = pa.default_memory_pool()
        pool = pa.proxy_memory_pool(previous)
        _POOLS.append(pool)  # kept alive: buffers allocated through it outlive this call
        pa.set_memory_pool(pool)
        try:
            proj = projection_for(dataset, None, limit=limit, order_by_row_index=True)
            stream = iceberg_stream(table, None, dataset, proj, min(1000, limit or 1000))
            got = []
            while (batch := stream.next_batch()) is not None:
                got.append(batch)
            stream.close()
            return pa.Table.from_batches(got, schema=stream.schema), pool.max_memory()
        finally:
            pa.set_memory_pool(previous)

    whole, whole_peak = read(None)
    assert whole.column("__row_index").to_pylist() == list(range(60_000))
    for limit in (10, 2_500):
        part, peak = read(limit)
        assert part.to_pylist() == whole.slice(0, limit).to_pylist()
        assert peak < whole_peak / 4, (limit, peak, whole_peak)  # before: the whole group, ~the whole table
    assert read(0)[0].num_rows == 0
