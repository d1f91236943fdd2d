"""Read router (freshness gate, fallback, iceberg_only) and write router (clamp, fail-loud native writes),
on a real Postgres, real Iceberg tables written by the real mirror / chunked writer."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from lakehouse_dagster.core.errors import NotFound, SyncFailed
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.reader import load_dataset_table, read_iceberg
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.routing.pg_reader import read_postgres
from lakehouse_dagster.routing.projection import projection_for
from lakehouse_dagster.routing.read_router import resolve_read_source
from lakehouse_dagster.routing.write_router import native_write, route_write
from lakehouse_dagster.tracking import datasets

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


def _rows(start, count):
    return [
        {
            "name": f"row {i}",
            "n": i,
            "x": i / 4,
            "ok": i % 2 == 0,
            "at": f"2024-01-01T00:00:{i % 60:02d}+01:00",
            "day": "2024-02-29",
            "meta": {"k": i, "tags": ["a", None]},
        }
        for i in range(start, start + count)
    ]


@pytest.fixture
def catalog(settings, dsn):
    return load_catalog(settings, dsn)


@pytest.fixture
def dataset(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "events", SCHEMA)
    datasets.insert_rows(conn, d, _rows(0, 10))
    return d


def _mirror(dsn, catalog, settings, d):
    return sync_dataset(dsn, catalog, settings, d)


class Executors:
    """A Postgres and an Iceberg executor that do the real reads and record which ran."""

    def __init__(self, conn, catalog, settings, dataset_id, columns=None, limit=None, order=True):
        self.conn, self.catalog, self.settings = conn, catalog, settings
        self.dataset = datasets.get_dataset(conn, dataset_id)
        self.proj = projection_for(self.dataset, columns, limit=limit, order_by_row_index=order)
        self.calls: list[str] = []

    def postgres(self, decision):
        self.calls.append("pg")
        return read_postgres(self.conn, self.dataset, self.proj)

    def iceberg(self, decision):
        self.calls.append("iceberg")
        table = load_dataset_table(self.catalog, self.settings, self.dataset.id)
        return read_iceberg(
            table,
            self.proj.columns,
            limit=self.proj.limit,
            order_by_row_index=self.proj.order_by_row_index,
            snapshot_id=decision.snapshot_id,
        )


def _route(conn, reader, d, ex):
    source = resolve_read_source(conn, FlagResolver(conn, 0), reader, d)
    return source.run(postgres=ex.postgres, iceberg=ex.iceberg)


def _break_table_files(settings, d):
    """A real Iceberg read error: the snapshot's data files are gone from the warehouse."""
    warehouse = Path(settings.catalog.warehouse.removeprefix("file://"))
    files = [p for p in warehouse.rglob("*.parquet") if d.hex in str(p)]
    assert files
    for p in files:
        p.unlink()


# --- read router -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["off", "shadow"])
def test_off_and_shadow_serve_postgres_even_with_a_snapshot(conn, dsn, catalog, settings, dataset, mode, caplog):
    _mirror(dsn, catalog, settings, dataset)
    if mode != "off":
        set_override(conn, "read", "export.stream", mode, dataset=dataset, actor="t")
    ex = Executors(conn, catalog, settings, dataset)
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.read_router"):
        result = _route(conn, "export.stream", dataset, ex)
    assert ex.calls == ["pg"]
    assert (result.decision.source, result.decision.reason) == ("pg", f"pg@{mode}")
    assert result.value.num_rows == 10
    assert f"[read-router] export.stream ds={dataset} mode={mode}" in caplog.text
    assert f"reason=pg@{mode}" in caplog.text


def test_eventual_gate_needs_a_succeeded_snapshot_and_tolerates_lag(conn, dsn, catalog, settings, dataset, caplog):
    set_override(conn, "read", "export.stream", "iceberg", dataset=dataset, note="fase1 canary", actor="t")
    ex = Executors(conn, catalog, settings, dataset)
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.read_router"):
        assert _route(conn, "export.stream", dataset, ex).decision.reason == "pg@no-snapshot"
    assert "reason=pg@no-snapshot" in caplog.text
    # A failed sync is not a snapshot.
    conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, status, finished_at) values (%s, %s, 'failed', now())",
        (dataset, uuid.uuid4()),
    )
    assert _route(conn, "export.stream", dataset, ex).decision.reason == "pg@no-snapshot"

    synced = _mirror(dsn, catalog, settings, dataset)
    ex.calls.clear()
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.read_router"):
        result = _route(conn, "export.stream", dataset, ex)
    assert ex.calls == ["iceberg"]
    assert (result.decision.source, result.decision.reason, result.decision.snapshot_id) == (
        "iceberg",
        "iceberg@eventual",
        synced.snapshot_id,
    )
    assert f"reason=iceberg@eventual snapshot={synced.snapshot_id}" in caplog.text
    assert result.value.equals(read_postgres(conn, ex.dataset, ex.proj))  # same rows, same types

    datasets.insert_rows(conn, dataset, _rows(10, 5))  # PG moves ahead: EVENTUAL keeps serving the snapshot
    result = _route(conn, "export.stream", dataset, ex)
    assert result.decision.reason == "iceberg@eventual" and result.value.num_rows == 10


def test_strict_gate_serves_iceberg_only_when_caught_up(conn, dsn, catalog, settings, dataset):
    set_override(conn, "read", "studio.preview", "iceberg", actor="t")
    ex = Executors(conn, catalog, settings, dataset)
    assert _route(conn, "studio.preview", dataset, ex).decision.reason == "pg@no-snapshot"
    _mirror(dsn, catalog, settings, dataset)
    assert _route(conn, "studio.preview", dataset, ex).decision.reason == "iceberg@strict"
    datasets.insert_rows(conn, dataset, _rows(10, 1))
    result = _route(conn, "studio.preview", dataset, ex)
    assert (result.decision.reason, result.value.num_rows) == ("pg@lagging", 11)  # the latest write is visible
    _mirror(dsn, catalog, settings, dataset)
    result = _route(conn, "studio.preview", dataset, ex)
    assert (result.decision.reason, result.value.num_rows) == ("iceberg@strict", 11)


def test_iceberg_error_falls_back_to_postgres_with_the_log_line(conn, dsn, catalog, settings, dataset, caplog):
    _mirror(dsn, catalog, settings, dataset)
    set_override(conn, "read", "studio.digest", "iceberg", dataset=dataset, actor="t")
    _break_table_files(settings, dataset)
    ex = Executors(conn, catalog, settings, dataset)
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.read_router"):
        result = _route(conn, "studio.digest", dataset, ex)
    assert ex.calls == ["iceberg", "pg"]
    assert (result.decision.source, result.decision.reason) == ("pg", "pg@fallback")
    assert result.value.num_rows == 10 and result.fallback_error
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"[read-router] studio.digest ds={dataset} iceberg read failed → PG fallback: {result.fallback_error}"
    )
    assert "\n" not in warning.getMessage()

    # The same through the command an operator runs.
    proc = cli(
        "read",
        "--reader",
        "studio.digest",
        "--dataset",
        str(dataset),
        "--columns",
        "n,name",
        "--limit",
        "3",
        "--order-by-row-index",
        check=True,
    )
    assert f"[read-router] studio.digest ds={dataset} iceberg read failed → PG fallback: " in proc.stderr
    assert "reason=pg@fallback" in proc.stdout and "row 2" in proc.stdout and "(3 row(s) from pg)" in proc.stdout


def test_iceberg_only_never_falls_back(conn, dsn, catalog, settings, dataset, caplog):
    _mirror(dsn, catalog, settings, dataset)
    set_override(conn, "read", "graph.kuzu", "iceberg_only", note="fase1 no-fallback", actor="t")
    _break_table_files(settings, dataset)
    ex = Executors(conn, catalog, settings, dataset)
    with pytest.raises(Exception) as info:
        _route(conn, "graph.kuzu", dataset, ex)
    assert not isinstance(info.value, NotFound)
    assert ex.calls == ["iceberg"]  # Postgres never served
    assert "PG fallback" not in caplog.text

    proc = cli("read", "--reader", "graph.kuzu", "--dataset", str(dataset))
    assert proc.returncode != 0 and proc.stdout == ""
    assert "iceberg_only has no PG fallback" in proc.stderr.strip().splitlines()[-1]


def test_no_fallback_to_postgres_for_a_dataset_written_iceberg_native(conn, dsn, catalog, settings, dataset, caplog):
    """Under mode iceberg a failed Iceberg read normally falls back; Postgres is stale for a native dataset."""
    _mirror(dsn, catalog, settings, dataset)
    set_override(conn, "read", "studio.digest", "iceberg", dataset=dataset, actor="t")
    set_override(conn, "write", "sync.append", "iceberg_native", dataset=dataset, actor="t")
    _break_table_files(settings, dataset)
    ex = Executors(conn, catalog, settings, dataset)
    with caplog.at_level(logging.INFO, logger="lakehouse_dagster.read_router"), pytest.raises(Exception) as info:
        _route(conn, "studio.digest", dataset, ex)
    assert not isinstance(info.value, NotFound)
    assert ex.calls == ["iceberg"]  # Postgres never served
    assert "PG fallback" not in caplog.text and "written iceberg-native, Postgres is stale, no fallback" in caplog.text
    proc = cli("read", "--reader", "studio.digest", "--dataset", str(dataset))
    assert proc.returncode != 0 and proc.stdout == ""
    assert "the dataset is written iceberg-native, so there is no PG fallback" in proc.stderr
    # once the writer is rolled back, the fallback is there again
    set_override(conn, "write", "sync.append", "pg", dataset=dataset, actor="t")
    result = _route(conn, "studio.digest", dataset, Executors(conn, catalog, settings, dataset))
    assert result.decision.reason == "pg@fallback"


def test_iceberg_only_still_obeys_the_freshness_gate(conn, catalog, settings, dataset):
    set_override(conn, "read", "export.stream", "iceberg_only", actor="t")
    ex = Executors(conn, catalog, settings, dataset)
    result = _route(conn, "export.stream", dataset, ex)
    assert (result.decision.reason, ex.calls) == ("pg@no-snapshot", ["pg"])


def test_clamped_reader_stays_on_postgres(conn, dsn, catalog, settings, dataset):
    _mirror(dsn, catalog, settings, dataset)
    conn.execute(
        "insert into lakehouse_flag_overrides (kind, name, scope, mode, set_by)"
        " values ('read', 'sdk.files.list', 'global', 'iceberg_only', 'psql')"
    )
    ex = Executors(conn, catalog, settings, dataset)
    result = _route(conn, "sdk.files.list", dataset, ex)
    assert (result.decision.mode, result.decision.flag.reason, result.decision.reason) == (
        "off",
        "clamped to ceiling",
        "pg@off",
    )


def test_unknown_dataset_and_column_are_refused(conn, settings, dataset):
    with pytest.raises(NotFound):
        resolve_read_source(conn, FlagResolver(conn), "export.stream", uuid.uuid4())
    proc = cli("read", "--reader", "export.stream", "--dataset", str(dataset), "--columns", "n,nope")
    assert proc.returncode == 2 and "unknown column(s) 'nope'" in proc.stderr
    proc = cli("read", "--reader", "export.streem", "--dataset", str(dataset))
    assert proc.returncode == 2 and "unknown reader 'export.streem'" in proc.stderr


def test_read_command_serves_iceberg_with_projection_and_limit(conn, dsn, catalog, settings, dataset):
    _mirror(dsn, catalog, settings, dataset)
    cli("flags", "set", "export.stream", "iceberg", "--dataset", str(dataset), "--note", "fase1 canary", check=True)
    out = cli_json(
        "read",
        "--reader",
        "export.stream",
        "--dataset",
        str(dataset),
        "--columns",
        "__row_index,n,meta",
        "--limit",
        "4",
        "--order-by-row-index",
    )
    assert out["decision"]["source"] == "iceberg" and out["decision"]["reason"] == "iceberg@eventual"
    assert out["decision"]["mode_reason"] == "dataset override"
    assert out["rows"] == [{"__row_index": i, "n": i, "meta": f'{{"k": {i}, "tags": ["a", null]}}'} for i in range(4)]


def test_ordered_limited_iceberg_read_matches_postgres_across_files(conn, dsn, catalog, settings, dataset):
    """Several data files (one per sync); the ordered read prunes by __row_index bounds and still agrees."""
    _mirror(dsn, catalog, settings, dataset)
    for start in (10, 25, 40):
        datasets.insert_rows(conn, dataset, _rows(start, 15))
        _mirror(dsn, catalog, settings, dataset)
    table = load_dataset_table(catalog, settings, dataset)
    assert len(list(table.scan().plan_files())) >= 4
    d = datasets.get_dataset(conn, dataset)
    for columns, limit in ((None, 7), (["name", "x"], 12), (["at", "day", "ok"], 55), (None, None), (["n"], 0)):
        proj = projection_for(d, columns, limit=limit, order_by_row_index=True)
        got = read_iceberg(table, proj.columns, limit=limit, order_by_row_index=True)
        assert got.equals(read_postgres(conn, d, proj)), (columns, limit)
    unordered = read_iceberg(table, ("n",), limit=5)
    assert unordered.num_rows == 5


# --- write router ------------------------------------------------------------------------------------------


def _pg_state(conn, d):
    return conn.execute(
        "select (select count(*) from dataset_rows where dataset_id = %s), rows_version, max_row_index"
        " from datasets where id = %s",
        (d, d),
    ).fetchone()


def _batch(d, start, count, *, bad=False):
    schema = arrow_schema(d.columns)
    rows = [
        {
            "__row_index": start + i,
            "__row_id": str(uuid.uuid4()),
            "__created_at": None,
            **{c.name: None for c in d.columns},
            "name": f"native {start + i}",
            "n": start + i,
        }
        for i in range(count)
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
    if bad:  # a batch that does not fit the dataset's schema: a column missing
        batch = batch.drop_columns(["meta"])
    return batch


def _bad_types_batch(d):
    fields = [pa.field(f.name, pa.string()) if f.name == "n" else f for f in arrow_schema(d.columns)]
    return pa.RecordBatch.from_pylist([{"__row_index": 0, "n": "not a number"}], schema=pa.schema(fields))


FAILURES = {
    "batch missing a column": lambda d, settings, dsn: (_batch(d, 0, 3, bad=True), load_catalog(settings, dsn)),
    "value of the wrong type": lambda d, settings, dsn: (_bad_types_batch(d), load_catalog(settings, dsn)),
    "warehouse not writable": lambda d, settings, dsn: (
        _batch(d, 0, 3),
        load_catalog(settings.replace(catalog={"warehouse": "file:///proc/lakehouse-not-writable"}), dsn),
    ),
}


def _new_native_ready(conn):
    """A new, empty dataset whose readers are on Iceberg: the write router lets its native writes through
    (nothing in Postgres to lose; prerequisite #1 holds), so the failures below are the writer's own."""
    d = datasets.create_dataset(conn, datasets.create_workspace(conn, "w"), "events", SCHEMA)
    for r in SERVABLE_READERS:
        set_override(conn, "read", r.name, "iceberg", dataset=d, note="fase1", actor="t")
    return d


@pytest.mark.parametrize("failure", list(FAILURES))
def test_failed_native_write_is_loud_and_never_touches_dataset_rows(conn, dsn, settings, failure, caplog):
    dataset = _new_native_ready(conn)
    set_override(conn, "write", "sync.append", "iceberg_native", dataset=dataset, note="fase4 canary", actor="t")
    d = datasets.get_dataset(conn, dataset)
    before = _pg_state(conn, dataset)
    batch, catalog = FAILURES[failure](d, settings, dsn)
    pg_calls = []

    def pg_write():
        pg_calls.append(1)
        return datasets.insert_rows(conn, dataset, _rows(100, 1))

    with caplog.at_level(logging.INFO), pytest.raises(SyncFailed, match="iceberg_native write failed") as info:
        route_write(
            conn,
            FlagResolver(conn, 10),
            "sync.append",
            dataset,
            pg_write=pg_write,
            iceberg_write=native_write(catalog, settings, d, [batch], writer="sync.append"),
            settings=settings,
        )
    assert "nothing was written to dataset_rows" in str(info.value)
    assert pg_calls == [] and _pg_state(conn, dataset) == before
    status, error = conn.execute("select status, error from datasets where id = %s", (dataset,)).fetchone()
    assert status == "errored" and error
    (log,) = conn.execute(
        "select writer, path, status, error, finished_at, snapshot_id from iceberg_sync_log where dataset_id = %s",
        (dataset,),
    ).fetchall()
    assert log[:3] == ("sync.append", "native", "failed") and log[3] == error and log[4] is not None and log[5] is None
    assert f"iceberg_native write failed: {dataset}" in caplog.text
    table = load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, dataset))
    assert table is None or table.current_snapshot() is None  # nothing committed either

    # The retry (here with a good batch and the right warehouse) succeeds and clears the error.
    good = native_write(load_catalog(settings, dsn), settings, d, [_batch(d, 0, 3)], writer="sync.append")
    outcome = route_write(
        conn, FlagResolver(conn, 10), "sync.append", dataset, pg_write=pg_write, iceberg_write=good, settings=settings
    )
    assert outcome.value.rows == 3 and pg_calls == [] and _pg_state(conn, dataset) == before
    assert conn.execute("select status, error from datasets where id = %s", (dataset,)).fetchone() == ("ready", None)


def test_native_write_lands_in_iceberg_and_serves_strict_reads(conn, dsn, catalog, settings):
    ws = datasets.create_workspace(conn, "w")
    dataset = datasets.create_dataset(conn, ws, "native", SCHEMA)
    d = datasets.get_dataset(conn, dataset)
    set_override(conn, "write", "sync.full", "iceberg_native", workspace=ws, note="fase4 ws", actor="t")
    for r in SERVABLE_READERS:  # the workspace read-flipped first (prerequisite #1), as the write router asks
        set_override(conn, "read", r.name, "iceberg", workspace=ws, actor="t")
    assert native_dataset_ids(conn) == {dataset}  # the mirror poller skips it

    outcome = route_write(
        conn,
        FlagResolver(conn, 10),
        "sync.full",
        dataset,
        pg_write=lambda: pytest.fail("pg path taken"),
        iceberg_write=native_write(catalog, settings, d, [_batch(d, 0, 4), _batch(d, 4, 4)], writer="sync.full"),
        settings=settings,
    )
    assert outcome.decision.native and outcome.value.rows == 8
    table = load_dataset_table(catalog, settings, dataset)
    assert table.current_snapshot().snapshot_id == outcome.value.snapshot_id
    log = conn.execute(
        "select path, mode, status, rows, snapshot_id, source_version, has_identity from iceberg_sync_log"
        " where sync_id = %s",
        (outcome.sync_id,),
    ).fetchone()
    assert log == ("native", "replace", "succeeded", 8, outcome.value.snapshot_id, d.rows_version, True)
    assert conn.execute("select row_count, status from datasets where id = %s", (dataset,)).fetchone() == (8, "ready")
    assert _pg_state(conn, dataset)[0] == 0  # dataset_rows never written

    ex = Executors(conn, catalog, settings, dataset, columns=["name", "n"])
    result = _route(conn, "studio.preview", dataset, ex)
    assert result.decision.reason == "iceberg@strict"  # the native snapshot covers the current PG version
    assert result.value.to_pylist()[:2] == [{"name": "native 0", "n": 0}, {"name": "native 1", "n": 1}]


def test_pg_mode_and_clamped_writers_write_postgres(conn, dataset):
    conn.execute(
        "insert into lakehouse_flag_overrides (kind, name, scope, mode, set_by)"
        " values ('write', 'row.edit', 'global', 'iceberg_native', 'psql')"
    )
    for writer, reason in (("sync.full", "registry default"), ("row.edit", "clamped to ceiling")):
        outcome = route_write(
            conn,
            FlagResolver(conn, 0),
            writer,
            dataset,
            pg_write=lambda: datasets.insert_rows(conn, dataset, _rows(1000, 2)),
            iceberg_write=lambda sync_id, version: pytest.fail("native path taken"),
        )
        assert (outcome.decision.flag.mode, outcome.decision.flag.reason, outcome.value) == ("pg", reason, 2)
    assert conn.execute("select count(*) from iceberg_sync_log").fetchone()[0] == 0
