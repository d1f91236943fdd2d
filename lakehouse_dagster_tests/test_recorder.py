"""Every change recorded where the operator looks: the lakehouse_recorder sensor, evaluated on a real Dagster
instance on Postgres storage, after each CLI path run for real (sync, ingest on both paths, the write flip's first
native sync, a writer rollback, the backfill, the orphan sweep, flag changes at every scope). The events the tick
returns are reported on the instance as the daemon does with a SensorResult (dagster/_daemon/sensor.py:
report_runless_asset_event for each, then the dynamic partition requests), and read back from the instance."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from lakehouse_dagster.cli.main import main as cli_main
from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, mirror_job, pg_dataset_rows
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
from lakehouse_dagster.dagster.defs.recording.recorder import lakehouse_recorder
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, MIGRATION_OVERVIEW, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.sources.ingest import ingest_job
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.status.recording import Cursor
from lakehouse_dagster.tracking import datasets

from .conftest import pg_dagster_instance
from .native_helpers import SCHEMA, SERVABLE, add_source_rows, pg_source_table, row


@pytest.fixture
def instance(pg_admin_dsn, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with pg_dagster_instance(pg_admin_dsn, home) as (inst, _):
        yield inst


class Recorder:
    """The sensor's ticks on one instance, its cursor carried from tick to tick as the daemon stores it."""

    def __init__(self, instance: dg.DagsterInstance, dsn: str):
        self.instance, self.dsn, self.cursor = instance, dsn, None
        self.skipped: str | None = None  # the last tick's skip line (Postgres down), its cursor kept

    def tick(self, *, prune: bool = False) -> list:
        cursor = self.cursor
        if prune and cursor:  # the next tick compares partitions with datasets (every 5 minutes otherwise)
            c = json.loads(cursor)
            c["pruned_at"] = 0.0
            cursor = json.dumps(c)
        ctx = dg.build_sensor_context(
            instance=self.instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=self.dsn)}
        )
        result = lakehouse_recorder(ctx)
        if isinstance(result, dg.SkipReason):  # nothing recorded, the cursor where it was
            self.skipped = result.skip_message
            return []
        assert isinstance(result, dg.SensorResult)
        self.skipped = None
        for event in result.asset_events:  # what the daemon does with a SensorResult, in its order
            self.instance.report_runless_asset_event(event)
        for request in result.dynamic_partitions_requests or []:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                self.instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    if self.instance.has_dynamic_partition(request.partitions_def_name, key):
                        self.instance.delete_dynamic_partition(request.partitions_def_name, key)
        self.cursor = result.cursor
        return list(result.asset_events)


def _materializations(instance, key: dg.AssetKey, partition) -> list:
    """Every materialization of the partition, newest first."""
    return list(
        instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[str(partition)]), limit=100
        ).records
    )


def _observations(instance, key: dg.AssetKey, partition=None) -> list:
    flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[str(partition)] if partition else None)
    return list(instance.fetch_observations(flt, limit=100).records)


def _meta(record) -> dict:
    event = record.asset_materialization or record.asset_observation
    return {k: getattr(v, "value", v) for k, v in event.metadata.items()}


def _table(settings, dsn, d):
    return load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, d))


def _shows_the_table_as_it_is(instance, settings, dsn, d) -> dict:
    """The partition's latest materialization carries the table's current snapshot and row count (pyiceberg)."""
    table = _table(settings, dsn, d)
    latest = _meta(_materializations(instance, ICEBERG_TABLE, d)[0])
    assert latest["snapshot_id"] == str(table.current_snapshot().snapshot_id)
    assert latest["dagster/row_count"] == table.scan().to_arrow().num_rows
    return latest


def _cli(*args: str) -> int:
    return cli_main([*args])


def _fed(conn, dsn, settings, rows: int = 6) -> tuple[uuid.UUID, str, uuid.UUID]:
    """A dataset fed by a Postgres table (sync.full, no cursor), its readers on Iceberg: ready for a write flip once
    mirrored (the flip's preflight runs the canary)."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    src = pg_source_table(conn, [row(i) for i in range(rows)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": None, "dsn_env": None})
    return d, src, ws


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_every_cli_change_is_recorded_on_the_dataset_partition(conn, dsn, settings, instance, tmp_path, capsys):
    """Long on purpose: one dataset through the Fase 4 runbook from the CLI, the recorder ticking after each step."""
    d, src, ws = _fed(conn, dsn, settings)
    rec = Recorder(instance, dsn)
    assert rec.tick() == []  # nothing happened yet: nothing recorded

    # lakehouse ingest (pg path), then lakehouse sync: the mirror's snapshot is recorded, the partition added
    assert _cli("ingest", "--dataset", str(d), "--writer", "sync.full") == 0
    assert rec.tick() == []  # the pg path changes Postgres only: the table is not there yet
    assert _cli("sync", "--dataset", str(d)) == 0
    events = rec.tick()
    assert [(e.asset_key, e.partition) for e in events] == [(ICEBERG_TABLE, str(d))]
    assert str(d) in instance.get_dynamic_partitions(datasets_partitions.name)
    meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert (meta["path"], meta["mode"], meta["dataset_name"], meta["total_rows"]) == ("mirror", "full", "orders", 6)
    assert "outside Dagster" in meta["written_by"] and meta["dagster/table_name"] == f"lakehouse.ds_{d.hex}"
    assert meta["dagster/uri"] == _table(settings, dsn, d).location()
    schema = meta["dagster/column_schema"]
    assert [c.name for c in schema.columns] == ["__row_index", "__row_id", "__created_at", "a", "s", "x", "at", "doc"]
    assert [c.type for c in schema.columns][3:] == ["int64", "string", "float64", "timestamp", "json"]
    assert meta["readers_on_iceberg"] == "none (every reader serves Postgres)" and meta["latest_verdict"] == "none"
    assert rec.tick() == []  # the cursor: a second tick records nothing new

    # readers to Iceberg (dataset scope: an observation on the partition each), then the write flip: its first
    # native sync replaces the table, the flip itself is an observation with actor and note
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, note="fase1 canary", actor="pytest")
    events = rec.tick()
    assert {(e.asset_key, e.partition) for e in events} == {(ICEBERG_TABLE, str(d))}
    assert all(isinstance(e, dg.AssetObservation) for e in events) and len(events) == len(SERVABLE)
    assert _cli("write-flags", "flip", "sync.full", "--dataset", str(d), "--note", "fase4 canary") == 0
    capsys.readouterr()
    events = rec.tick()
    materialized = [e for e in events if isinstance(e, dg.AssetMaterialization)]
    observed = [e for e in events if isinstance(e, dg.AssetObservation)]
    assert [e.partition for e in materialized] == [str(d)]
    meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert (meta["path"], meta["writer"]) == ("native", "sync.full")
    assert meta["writers_native"] == "sync.full" and meta["latest_verdict"] == "ok"
    assert "first-native-sync" in meta["latest_verdict_detail"]
    flags = {r.data["name"]: (r.data["mode"], r.data["reason"]) for r in meta["flags"].records}
    assert flags["sync.full"] == ("iceberg_native", "dataset override")
    assert flags["export.stream"] == ("iceberg", "dataset override")
    assert flags["row.edit"] == ("pg", "registry default")
    (flip,) = [
        m for m in map(_meta, _observations(instance, ICEBERG_TABLE, d)) if m["flag_changed"].startswith("writer")
    ]
    assert (flip["flag_changed"], flip["flag_mode"], flip["flag_mode_before"], flip["scope"]) == (
        "writer sync.full",
        "iceberg_native",
        "(no override)",
        f"dataset:{d}",
    )
    assert (flip["actor"], flip["note"], flip["flag_action"]) == ("pytest", "fase4 canary", "set")
    assert len(observed) == 1

    # lakehouse ingest on the native path (the source moved on): the new snapshot is the one shown
    add_source_rows(conn, src, [row(6), row(7)])
    before = _materializations(instance, ICEBERG_TABLE, d)[0]
    assert _cli("ingest", "--dataset", str(d), "--writer", "sync.full") == 0
    assert len(rec.tick()) == 1
    meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert meta["snapshot_id"] != _meta(before)["snapshot_id"] and meta["dagster/row_count"] == 8
    assert rec.tick() == []

    # the writer rolled back to pg (dataset scope): an observation; the table did not change, so no materialization
    shown = len(_materializations(instance, ICEBERG_TABLE, d))
    # the reverse off (the backfill's path below; with it on the rollback applies it first and needs none)
    set_reverse(conn, False, dataset=d, note="the backfill's path", actor="pytest")
    assert _cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d), "--note", "rollback: investigate") == 0
    (event,) = rec.tick()
    assert isinstance(event, dg.AssetObservation) and event.partition == str(d)
    meta = {k: v.value for k, v in event.metadata.items()}
    assert (meta["flag_changed"], meta["flag_mode"], meta["flag_mode_before"], meta["note"]) == (
        "writer sync.full",
        "pg",
        "iceberg_native",
        "rollback: investigate",
    )
    assert meta["writers_native"] == "none (every writer lands in Postgres)"
    # the page shows its latest event's metadata: the observation says what the table is now too
    assert meta["snapshot_id"] == str(_table(settings, dsn, d).current_snapshot().snapshot_id)
    assert meta["dagster/row_count"] == 8 and meta["path"] == "native"
    assert len(_materializations(instance, ICEBERG_TABLE, d)) == shown
    _shows_the_table_as_it_is(instance, settings, dsn, d)

    # the backfill copies the rows only Iceberg holds into Postgres: postgres/dataset_rows is materialized
    assert _cli("backfill", "--dataset", str(d)) == 0
    (event,) = rec.tick()
    assert (event.asset_key, event.partition) == (PG_ROWS, str(d))
    meta = _meta(_materializations(instance, PG_ROWS, d)[0])
    in_pg = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]
    assert meta["dagster/row_count"] == in_pg == 8 and meta["rows_copied"] == 8
    assert meta["dagster/table_name"].endswith(".dataset_rows") and "@" not in meta["dagster/uri"]
    assert [c.name for c in meta["dagster/column_schema"].columns][:3] == ["row_index", "row_id", "created_at"]

    # the orphan sweep removes a file a killed writer left: recorded with what it removed, snapshot unchanged
    table = _table(settings, dsn, d)
    stray = Path(table.location().removeprefix("file://")) / "data" / "left-by-a-killed-writer.parquet"
    stray.write_bytes(b"PAR1 not really")
    assert _cli("orphans", "--dataset", str(d), "--delete", "--grace-seconds", "0") == 0
    assert not stray.exists()
    (event,) = rec.tick()
    meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert meta["orphan_files_removed"] >= 1 and meta["swept_by"] == "pytest"
    assert rec.tick() == []

    # wider scopes: observations on lakehouse/migration_overview, with actor and note, and fanned out to the
    # dataset's partition (one observation for both changes: its modes now)
    assert _cli("flags", "set", "studio.digest", "shadow", "--workspace", str(ws), "--note", "ws shadow") == 0
    assert _cli("flags", "set", "graph.kuzu", "shadow", "--note", "global shadow") == 0
    events = rec.tick()
    assert [(e.asset_key, e.partition) for e in events] == [(MIGRATION_OVERVIEW, None)] * 2 + [(ICEBERG_TABLE, str(d))]
    changed = events[-1].metadata["changed"].value
    assert "reader graph.kuzu shadow" in changed and "reader studio.digest shadow" in changed
    flags = {r.data["name"]: (r.data["mode"], r.data["reason"]) for r in events[-1].metadata["flags"].value.records}
    assert flags["graph.kuzu"] == ("iceberg", "dataset override")  # the dataset's own override still wins
    assert json.loads(rec.cursor)["fanout"] == {} and rec.tick() == []
    overview = sorted((_meta(o) for o in _observations(instance, MIGRATION_OVERVIEW)), key=lambda m: m["audit_id"])
    assert [(m["flag_changed"], m["flag_mode"], m["scope"], m["actor"], m["note"]) for m in overview] == [
        ("reader studio.digest", "shadow", f"workspace:{ws}", "pytest", "ws shadow"),
        ("reader graph.kuzu", "shadow", "global", "pytest", "global shadow"),
    ]

    # the dataset is deleted: its partition goes at the next comparison
    with conn.transaction():  # rows first: a cascade from datasets trips change tracking (reported; not ours here)
        conn.execute("delete from dataset_rows where dataset_id = %s", (d,))
        conn.execute("delete from datasets where id = %s", (d,))
    assert rec.tick(prune=True) == []
    assert str(d) not in instance.get_dynamic_partitions(datasets_partitions.name)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_run_made_sync_is_not_recorded_twice_and_carries_the_standard_keys(conn, dsn, settings, instance):
    ws = datasets.create_workspace(conn, "w")
    a = datasets.create_dataset(conn, ws, "a", SCHEMA)
    b = datasets.create_dataset(conn, ws, "b", SCHEMA)
    for d in (a, b):
        datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    instance.add_dynamic_partitions(datasets_partitions.name, [str(a), str(b)])
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    result = dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table], partition_key=str(a), resources=resources, instance=instance
    )
    assert result.success
    batch = mirror_batch_job.execute_in_process(
        run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(b)]}}}},
        resources=resources,
        instance=instance,
    )
    assert batch.success
    rec = Recorder(instance, dsn)
    assert [e for e in rec.tick() if isinstance(e, dg.AssetMaterialization)] == []  # the runs recorded them
    for d, run_id in ((a, result.run_id), (b, batch.run_id)):
        (record,) = _materializations(instance, ICEBERG_TABLE, d)
        assert record.run_id == run_id
        meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
        assert meta["dagster/table_name"] == f"lakehouse.ds_{d.hex}" and meta["dagster/uri"].startswith("file://")
        assert [c.name for c in meta["dagster/column_schema"].columns][:3] == [
            "__row_index",
            "__row_id",
            "__created_at",
        ]
        assert meta["latest_verdict"] in ("ok", "none") and "flags" in meta
        (pg,) = _materializations(instance, PG_ROWS, d)
        assert _meta(pg)["dagster/row_count"] == 4
        assert "password" not in _meta(pg)["dagster/uri"] and settings.postgres.dsn not in _meta(pg)["dagster/uri"]
    assert mirror_job.name == "mirror_job"

    # ingest_job on the pg path materializes postgres/dataset_rows with the standard keys too
    c = datasets.create_dataset(conn, ws, "c", SCHEMA)
    src = pg_source_table(conn, [row(i) for i in range(5)])
    set_source(conn, c, {"type": "postgres", "table": src, "cursor_column": None, "dsn_env": None})
    instance.add_dynamic_partitions(datasets_partitions.name, [str(c)])
    ingested = ingest_job.execute_in_process(
        run_config={"ops": {"ingest_op": {"config": {"writer": "sync.full"}}}},
        partition_key=str(c),
        resources=resources,
        instance=instance,
    )
    assert ingested.success
    meta = _meta(_materializations(instance, PG_ROWS, c)[0])
    assert meta["dagster/row_count"] == 5 and meta["dagster/table_name"].endswith(".dataset_rows")
    assert [col.name for col in meta["dagster/column_schema"].columns][3:] == ["a", "s", "x", "at", "doc"]
    assert rec.tick() == []  # the pg path leaves the table to the mirror: nothing to record yet

    # a CLI sync afterwards is recorded: the partition then shows the CLI's snapshot
    datasets.insert_rows(conn, a, [row(4)], start_index=4)
    sync_dataset(dsn, load_catalog(settings, dsn), settings, a)
    assert [e.partition for e in rec.tick()] == [str(a)]
    _shows_the_table_as_it_is(instance, settings, dsn, a)
    assert rec.tick() == []


def test_a_sync_of_a_run_in_flight_waits_for_the_run_then_is_recorded_if_the_run_did_not(conn, dsn, settings, instance):
    """A run's sync (the write_flip job's first native sync does not materialize) is left to the run while it is in
    flight; once it has ended the recorder records it, since the partition does not show that snapshot."""
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    run = instance.create_run_for_job(
        job_def=mirror_batch_job,
        run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(d)]}}}},
        status=dg.DagsterRunStatus.STARTED,
    )
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d, run_id=run.run_id)
    rec = Recorder(instance, dsn)
    assert rec.tick() == []
    assert str(d) in json.loads(rec.cursor)["waiting"]
    assert rec.tick() == []  # still in flight
    instance.report_run_failed(run)
    assert [e.partition for e in rec.tick()] == [str(d)]
    _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert json.loads(rec.cursor)["waiting"] == {} and rec.tick() == []


def test_a_flag_change_that_commits_late_is_recorded_once_and_never_skipped(conn, dsn, settings, instance):
    """The audit's bigserial id is drawn before commit: a change whose transaction started first but commits last
    has the lower id. The recorder reads by transaction id, so it is neither skipped nor recorded twice."""
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    # another dataset for the early change: two verbs on ONE dataset never interleave (the lifecycle lock)
    d2 = datasets.create_dataset(conn, ws, "d2", SCHEMA)
    rec = Recorder(instance, dsn)
    rec.tick()
    positions = []

    def flags_position() -> int:
        positions.append(json.loads(rec.cursor)["positions"]["flags"]["xid"])
        return positions[-1]

    flags_position()
    with psycopg.connect(dsn) as late:  # not autocommit: its transaction stays open until we commit
        set_override(late, "read", "export.stream", "shadow", dataset=d, note="late", actor="pytest")
        set_override(conn, "read", "graph.kuzu", "shadow", dataset=d2, note="early", actor="pytest")
        assert [e.metadata["note"].value for e in rec.tick()] == ["early"]
        flags_position()
        assert rec.tick() == []  # seen above the horizon: not again
        assert flags_position() == positions[-2]  # held below the open transaction
        late.commit()
    assert [e.metadata["note"].value for e in rec.tick()] == ["late"]
    flags_position()
    assert rec.tick() == []
    assert flags_position() > positions[0] and positions == sorted(positions)  # only forward
    notes = sorted(_meta(o)["note"] for x in (d, d2) for o in _observations(instance, ICEBERG_TABLE, x))
    assert notes == ["early", "late"]


def test_the_first_ticks_show_every_synced_table_and_page_at_the_cap(conn, dsn, settings, instance, monkeypatch):
    """Syncs from before the recorder (no transaction id) are shown once by the first pass, a page per tick."""
    ws = datasets.create_workspace(conn, "w")
    ids = []
    for i in range(3):
        d = datasets.create_dataset(conn, ws, f"d{i}", SCHEMA)
        datasets.insert_rows(conn, d, [row(k) for k in range(2)])
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
        ids.append(d)
    with conn.transaction():  # as a sync before migration 028 left it (its trigger would stamp the update)
        conn.execute("alter table iceberg_sync_log disable trigger lakehouse_sync_log_changed_xid")
        conn.execute("update iceberg_sync_log set changed_xid = null")
        conn.execute("alter table iceberg_sync_log enable trigger lakehouse_sync_log_changed_xid")
    monkeypatch.setenv("LAKEHOUSE_RECORDER_MAX_EVENTS", "2")
    rec = Recorder(instance, dsn)
    first, second = rec.tick(), rec.tick()
    assert sorted(e.partition for e in first + second) == sorted(str(d) for d in ids) and len(first) == 2
    assert json.loads(rec.cursor)["seeded"] is True
    assert rec.tick() == []
    for d in ids:
        _shows_the_table_as_it_is(instance, settings, dsn, d)


def test_the_cursor_round_trips_whole():
    from lakehouse_dagster.status.recording import Position, Waiting

    c = Cursor(
        {"syncs": Position(812, 40, frozenset({(41, 815), (44, 900)})), "flags": Position(700)},
        {uuid.uuid4(): Waiting(("run-a", "run-b"), 1234.5)},
        99.0,
        False,
        uuid.uuid4(),
        {"global": ((uuid.uuid4(), None), (None, uuid.uuid4())), str(uuid.uuid4()): ((None, None),)},
        {uuid.uuid4(): 123456789, uuid.uuid4(): None},
        {uuid.uuid4(): (987654321, 1700000030.5)},
    )
    assert Cursor.loads(c.dumps()) == c and Cursor.loads(None) == Cursor()
    assert Cursor.loads(c.dumps()).position("sweeps") == Position()  # a stream never read starts at 0


def test_the_resource_shows_its_settings_as_env_vars_and_never_the_dsn(dsn, settings, monkeypatch):
    from lakehouse_dagster.dagster.defs.resources import resources, shown_settings

    monkeypatch.setenv("LAKEHOUSE_INGEST_CHUNK_ROWS", "1000")
    shown = shown_settings()
    assert shown["warehouse"].env_var_name == "LAKEHOUSE_WAREHOUSE"
    assert shown["ingest_chunk_rows"].env_var_name == "LAKEHOUSE_INGEST_CHUNK_ROWS"
    assert "catalog_uri" not in shown  # unset: empty on the page, its default from core/settings/
    resource = resources().resources["lakehouse"]
    assert resource.pg_dsn.env_var_name == "LAKEHOUSE_PG_DSN" and dsn not in repr(resource)
    live = LakehouseResource(pg_dsn=dsn, ingest_chunk_rows=1000)
    assert live.settings().sync.chunk_rows == 1000 and live.settings().catalog.warehouse == settings.catalog.warehouse
    assert live.catalog() is live.catalog()  # built once per run (per resource instance)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_write_flip_jobs_first_sync_and_its_auto_rollback_are_recorded(conn, dsn, settings, instance):
    """The write_flip job's first native sync carries the run's id but the job materializes nothing: once the run
    has ended the recorder shows the new snapshot. The source moved on, so the canary says MISMATCH and
    auto-rollback sets the writer back to pg: an observation with its actor and note."""
    from lakehouse_dagster.dagster.defs.runbooks.rollout import write_flip_job

    d, src, _ = _fed(conn, dsn, settings)
    assert _cli("ingest", "--dataset", str(d), "--writer", "sync.full") == 0
    assert _cli("sync", "--dataset", str(d)) == 0
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, actor="pytest")
    rec = Recorder(instance, dsn)
    rec.tick()
    add_source_rows(conn, src, [row(6)])  # the source moved on since Postgres was last written
    result = write_flip_job.execute_in_process(
        run_config={"ops": {"write_flip_preflight": {"config": {"writer": "sync.full", "dataset_id": str(d)}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success  # STOP: canary MISMATCH, rolled back
    events = rec.tick()
    (table,) = [e for e in events if isinstance(e, dg.AssetMaterialization)]
    meta = _shows_the_table_as_it_is(instance, settings, dsn, d)
    assert meta["path"] == "native" and meta["written_by"].endswith(f"dagster run {result.run_id}")
    assert meta["latest_verdict"] == "MISMATCH" and meta["writers_native"].startswith("none")
    flips = [{k: v.value for k, v in e.metadata.items()} for e in events if isinstance(e, dg.AssetObservation)]
    assert [(f["flag_changed"], f["flag_mode"]) for f in flips] == [
        ("writer sync.full", "iceberg_native"),
        ("writer sync.full", "pg"),
    ]
    assert flips[0]["actor"] == f"pytest (dagster run {result.run_id[:8]})"
    assert flips[1]["actor"] == "pytest (auto-rollback)"
    assert flips[1]["note"] == f"auto-rollback: MISMATCH (first-native-sync, {result.run_id})"
    assert rec.tick() == []


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_reverse_mirror_behind_is_said_on_the_postgres_rows_page_once_and_again_when_it_ends(
    conn, dsn, settings, instance, monkeypatch
):
    """Issue 31, the partition page's reverse lag: each apply materializes the postgres/dataset_rows partition naming
    its snapshot, so a reverse that then falls behind would leave an old apply as the page's newest event. The
    recorder says so once the lag passes LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS (one event per episode, however many
    ticks), and again when it ends: caught up, or the reverse turned off."""
    import time

    from lakehouse_dagster.mirror.reverse import apply_reverse

    from .native_helpers import native_write, ready_native

    monkeypatch.setenv("LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS", "1")
    d = ready_native(conn, dsn, settings, "sync.full")
    rec = Recorder(instance, dsn)

    def page_events() -> list:
        return [e for e in rec.tick() if e.asset_key == PG_ROWS and str(e.partition) == str(d)]

    assert page_events() == []  # native, nothing committed natively yet: nothing to say
    snap = native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(20, 23)], start=0)
    assert page_events() == []  # behind for less than the bound: the stream's normal lag never shows
    time.sleep(1.2)
    (behind,) = page_events()
    assert isinstance(behind, dg.AssetObservation)
    assert behind.description.startswith("dataset_rows is behind Iceberg: reverse behind by 1 commit(s)")
    assert f"Iceberg is at {snap}" in behind.description
    assert f"lakehouse reverse sync --dataset {d}" in behind.description
    meta = {k: getattr(v, "value", v) for k, v in behind.metadata.items()}
    assert meta["reverse_behind"] is True and meta["iceberg_snapshot_id"] == str(snap)
    assert meta["reverse_pending_commits"] == 1
    committed = conn.execute(
        "select finished_at from iceberg_sync_log where snapshot_id = %s and status = 'succeeded'", (snap,)
    ).fetchone()[0]
    assert meta["reverse_behind_since"] == committed.isoformat(timespec="seconds")  # stays true while it lasts
    assert page_events() == []  # one event per episode, not one per tick

    result = apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    assert result.snapshot_id == snap
    (ended,) = page_events()
    assert ended.description == (
        f"dataset_rows no longer behind Iceberg: caught up: it holds snapshot {snap}, the table's newest native commit"
    )
    assert {k: getattr(v, "value", v) for k, v in ended.metadata.items()}["reverse_behind"] is False
    assert page_events() == []

    # a new episode, ended by turning the reverse off: the page must not keep saying "behind" (nor "caught up")
    native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(30, 32)], start=0)
    time.sleep(1.2)
    assert [e.description.split(":")[0] for e in page_events()] == ["dataset_rows is behind Iceberg"]
    set_reverse(conn, False, dataset=d, note="keep Postgres as it is", actor="pytest")
    (off,) = page_events()
    assert off.description.startswith("dataset_rows no longer behind Iceberg: its reverse mirror was turned off")
    stored = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=PG_ROWS, asset_partitions=[str(d)]), limit=10
    ).records
    assert [r.asset_observation.description.split(":")[0] for r in stored] == [  # newest first, as the page lists
        "dataset_rows no longer behind Iceberg",
        "dataset_rows is behind Iceberg",
        "dataset_rows no longer behind Iceberg",
        "dataset_rows is behind Iceberg",
    ]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_complete_and_its_restore_leave_an_event_on_the_postgres_rows_page(conn, dsn, settings, instance, capsys):
    """Issue 42: after complete the postgres/dataset_rows page kept its old row count, and a restore never appeared.
    Every lifecycle move is read by the recorder; those that change what Postgres holds materialize that page."""
    from .test_complete import _completable

    def lh(*args: str, check: bool = False):
        code = cli_main(list(args))
        out, err = capsys.readouterr()
        assert not check or code == 0, err
        return code, out, err

    d = _completable(conn, dsn, settings, lh)
    rec = Recorder(instance, dsn)
    rec.tick()
    rec.tick()
    lh("complete", "--dataset", str(d), check=True)
    rec.tick()
    meta = _meta(_materializations(instance, PG_ROWS, d)[0])
    assert meta["dagster/row_count"] == 0
    assert meta["lifecycle_move"] == "completing → complete"
    assert meta["lifecycle"].startswith("complete (reverse off)")
    lh("backfill", "--dataset", str(d), check=True)
    rec.tick()
    meta = _meta(_materializations(instance, PG_ROWS, d)[0])
    assert meta["lifecycle_move"] == "restoring → native" and meta["dagster/row_count"] == 10
    assert meta["lifecycle"].startswith("native (reverse on)")
