"""The ingest job and the source_poller sensor, run for real: ephemeral Dagster instance, real Postgres
source tables and Parquet files, real run_writer on both paths."""

from __future__ import annotations

import uuid

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.dagster.defs.mirror.assets import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.sources.ingest import ingest_job, source_poller
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking import datasets

from .flag_helpers import refusal
from .native_helpers import SCHEMA, add_source_rows, pg_source_table, row, runbook_ready


def _fed(conn, ws, name, rows=3, cursor="a"):
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    src = pg_source_table(conn, [row(i) for i in range(rows)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": cursor, "dsn_env": None})
    return d, src


def _run(dsn, d, instance, config=None):
    instance.add_dynamic_partitions("datasets", [str(d)])
    return ingest_job.execute_in_process(
        run_config={"ops": {"ingest_op": {"config": config or {}}}},
        partition_key=str(d),
        instance=instance,
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        raise_on_error=False,
    )


def _materialized(result):
    return [
        e.event_specific_data.materialization
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION"
    ]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_ingest_job_takes_the_pg_path_then_the_native_path_with_the_flag_in_metadata_and_tags(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "ws")
    d, src = _fed(conn, ws, "fed")
    instance = dg.DagsterInstance.ephemeral()
    result = _run(dsn, d, instance)  # the source's default writer: sync.incremental (a cursor column)
    assert result.success
    (m,) = _materialized(result)
    assert m.asset_key == PG_ROWS and m.partition == str(d)
    meta = {k: v.value for k, v in m.metadata.items()}
    assert (meta["writer"], meta["path"], meta["rows"]) == ("sync.incremental", "pg", 3)
    assert meta["flag_reason"].startswith("pg (")
    tags = instance.get_run_by_id(result.run_id).tags
    assert (tags["lakehouse/write_path"], tags["lakehouse/writer"]) == ("pg", "sync.incremental")
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 3

    runbook_ready(conn, dsn, settings, d)  # mirrored, read-flipped, parity ok: the write router asks it
    set_override(conn, "write", "sync.incremental", "iceberg_native", dataset=d, note="fase4", actor="pytest")
    add_source_rows(conn, src, [row(3), row(4)])
    result = _run(dsn, d, instance, {"writer": "sync.incremental"})
    assert result.success
    (m,) = _materialized(result)
    meta = {k: v.value for k, v in m.metadata.items()}
    assert m.asset_key == ICEBERG_TABLE and (meta["path"], meta["rows"]) == ("native", 2)
    assert meta["flag_reason"].startswith("iceberg_native (")
    assert int(meta["snapshot_id"]) > 0
    assert instance.get_run_by_id(result.run_id).tags["lakehouse/write_path"] == "native"
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 3


def test_a_refused_ingest_fails_the_step_with_the_one_line_reason(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "ws")
    bare = datasets.create_dataset(conn, ws, "bare", SCHEMA)
    result = _run(dsn, bare, dg.DagsterInstance.ephemeral())
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    reason = refusal(failure)  # the step's error shows this one line and no stack (dagster/defs/shared/refusals.py)
    assert f"dataset {bare} has no source; set one with: lakehouse sources set --dataset {bare}" in reason
    assert "\n" not in reason.strip()
    assert not [e for e in result.all_events if e.event_type_value == "STEP_RESTARTED"]


def _tick(dsn, instance, cursor=None):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    return source_poller(ctx)


def test_the_source_poller_requests_exactly_the_datasets_with_something_new(conn, dsn, settings, tmp_path, monkeypatch):
    ws = datasets.create_workspace(conn, "ws")
    catalog = load_catalog(settings, dsn)
    news, news_src = _fed(conn, ws, "news")
    quiet, _ = _fed(conn, ws, "quiet")
    run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), quiet, "sync.incremental")  # up to date
    files = datasets.create_dataset(conn, ws, "files", [{"name": "a", "type": "int64"}])
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int64())}), tmp_path / "in" / "part-0.parquet")
    set_source(conn, files, {"type": "files", "uri": str(tmp_path / "in" / "*.parquet"), "format": "parquet"})
    legacy = datasets.create_dataset(conn, ws, "legacy", SCHEMA)
    conn.execute("update datasets set source = %s where id = %s", (Jsonb({"type": "demo", "seed": "x"}), legacy))
    datasets.create_dataset(conn, ws, "no source", SCHEMA)

    instance = dg.DagsterInstance.ephemeral()
    result = _tick(dsn, instance)
    asked = {r.partition_key: r for r in result.run_requests}
    assert set(asked) == {str(news), str(files)}
    assert asked[str(news)].run_key == f"ingest:{news}:sync.incremental:mark:2"
    assert asked[str(news)].tags["lakehouse/write_path"] == "pg"
    assert asked[str(files)].run_key.startswith(f"ingest:{files}:sync.append:files:1:")
    assert set(result.dynamic_partitions_requests[0].partition_keys) == {str(news), str(files)}

    # ingest what was asked for (the job's own function): nothing more to ask
    for d, writer in ((news, "sync.incremental"), (files, "sync.append")):
        run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, writer)
    assert _tick(dsn, instance).run_requests == []
    # new rows in one source: exactly that dataset again, under a new run key
    add_source_rows(conn, news_src, [row(10)])
    (again,) = _tick(dsn, instance).run_requests
    assert (again.partition_key, again.run_key) == (str(news), f"ingest:{news}:sync.incremental:mark:10")

    # capped per tick: one request, the cursor moves on and the next tick asks for the other
    pq.write_table(pa.table({"a": pa.array([3], pa.int64())}), tmp_path / "in" / "part-1.parquet")
    monkeypatch.setenv("LAKEHOUSE_SENSOR_MAX_REQUESTS", "1")
    first = _tick(dsn, instance)
    second = _tick(dsn, instance, first.cursor)
    assert len(first.run_requests) == len(second.run_requests) == 1
    assert {first.run_requests[0].partition_key, second.run_requests[0].partition_key} == {str(news), str(files)}
    assert uuid.UUID(first.cursor)


def _flush_stats(conn) -> None:
    """Backends report their row counters in batches (within ~10 s when idle): a test asks for it at once."""
    conn.execute("select pg_stat_force_next_flush()")
    conn.execute("select 1")  # the forced report happens as the session goes idle after a statement


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_cursor_less_table_source_is_polled_by_its_change_counters(conn, dsn, settings, pg_admin_dsn, tmp_path):
    """Issue 22: rows inserted into a Postgres table source without a cursor column (writer sync.full) were never
    requested. The poller compares the table's change counters with those the last ingest stored."""
    from .conftest import pg_dagster_instance

    ws = datasets.create_workspace(conn, "ws")
    catalog = load_catalog(settings, dsn)
    crm, src = _fed(conn, ws, "crm_accounts", rows=4, cursor=None)
    query = datasets.create_dataset(conn, ws, "crm_query", SCHEMA)
    set_source(conn, query, {"type": "postgres", "query": f"select * from {src}", "dsn_env": None})
    # the rows' counters reported before the first ingest stores them (a counter reported after it, as a busy server
    # may do within ~10 s, asks for one more sync.full: harmless, and not what this test is about)
    _flush_stats(conn)
    with pg_dagster_instance(pg_admin_dsn, tmp_path) as (instance, _):
        first = {r.partition_key: r.run_key for r in _tick(dsn, instance).run_requests}
        assert first == {str(crm): f"ingest:{crm}:sync.full:initial", str(query): f"ingest:{query}:sync.full:initial"}
        for d in (crm, query):  # what the requested runs do
            run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.full")
        _flush_stats(conn)
        assert _tick(dsn, instance).run_requests == []  # nothing changed: nothing requested
        assert _tick(dsn, instance).run_requests == []

        add_source_rows(conn, src, [row(i) for i in range(10, 15)])  # 5 rows, as in the issue
        _flush_stats(conn)
        asked = {r.partition_key: r for r in _tick(dsn, instance).run_requests}
        assert set(asked) == {str(crm), str(query)}  # the table by its counters, the query by its rows' digest
        assert asked[str(crm)].run_key.startswith(f"ingest:{crm}:sync.full:changed:stats:")
        assert asked[str(query)].run_key.startswith(f"ingest:{query}:sync.full:changed:content:")
        assert asked[str(crm)].tags["lakehouse/source_news"].startswith("changed:stats:")
        # the requested run ingests the 9 rows, then the poller is quiet again
        run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), crm, "sync.full")
        assert conn.execute("select row_count from datasets where id = %s", (crm,)).fetchone()[0] == 9
        _flush_stats(conn)
        assert [r.partition_key for r in _tick(dsn, instance).run_requests] == [str(query)]
        # a delete and a truncate are changes too (truncate moves no counter: a new file node)
        run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), query, "sync.full")
        conn.execute(f"truncate {src}")
        _flush_stats(conn)
        assert {r.partition_key for r in _tick(dsn, instance).run_requests} == {str(crm), str(query)}


def test_sources_set_says_what_polling_costs(conn, dsn, settings, capsys):
    from lakehouse_dagster.cli.main import main

    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    src = pg_source_table(conn, [row(0)])
    for args, said in (
        (["--postgres-table", src], "the table's row-change counters (pg_stat_all_tables n_tup_ins/upd/del)"),
        (["--postgres-query", f"select * from {src}"], "every row digested (count + sum of row hashes) per visit"),
        (["--postgres-table", src, "--cursor-column", "a"], "one max(a) per visit past the stored mark"),
    ):
        assert main(["sources", "set", "--dataset", str(d), *args]) == 0
        out = capsys.readouterr().out
        assert "polling: " in out and said in out, out
