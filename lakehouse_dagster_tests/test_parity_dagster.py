"""The parity asset checks and the canary schedule in real Dagster runs (ephemeral instance, real
Postgres, real Iceberg): the blocking check stops a downstream asset in the same run."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import dagster as dg
import pyarrow as pa
import pytest

from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
from lakehouse_dagster.dagster.defs.parity.canary_batch import parity_canary_batch_job
from lakehouse_dagster.dagster.defs.parity.canary_schedule import (
    PARTITION_TAG,
    parity_canary_job,
    parity_canary_schedule,
)
from lakehouse_dagster.dagster.defs.parity.checks import ICEBERG_TABLE, identity_ready, parity, snapshot_freshness
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.flags.flipped import flipped_dataset_ids
from lakehouse_dagster.parity import canary
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.test_canary import behind_the_mirrors_back, make_dataset, rogue_overwrite, sync

DOWNSTREAM = dg.AssetKey(["readers", "export_stream"])


@dg.asset(key=DOWNSTREAM, deps=[ICEBERG_TABLE], partitions_def=datasets_partitions)
def downstream_reader() -> None:
    """Stands for anything that reads the Iceberg table (a flip, an export...)."""


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


@pytest.fixture
def persistent_instance(tmp_path):
    """Schedules are evaluated against a persistent instance (as the daemon does)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


def _materialize(instance, dsn, d, *, checks=(parity, identity_ready, snapshot_freshness)):
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    return dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table, *checks, downstream_reader],
        partition_key=str(d),
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )


def _evaluations(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def _materialized(result) -> set[dg.AssetKey]:
    return {e.event_specific_data.materialization.asset_key for e in result.get_asset_materialization_events()}


def test_checks_pass_and_downstream_runs(conn, dsn, settings, instance):
    d = make_dataset(conn, 25)
    result = _materialize(instance, dsn, d)
    assert result.success
    ev = _evaluations(result)
    assert set(ev) == {"parity", "identity_ready", "snapshot_freshness"}
    assert all(e.passed for e in ev.values()), {k: e.description for k, e in ev.items()}
    assert ev["parity"].partition == str(d)
    meta = ev["parity"].metadata
    assert meta["verdict"].value == "ok" and meta["pg_count"].value == meta["iceberg_count"].value == 25
    assert meta["pg_digest"].value == meta["iceberg_digest"].value
    assert DOWNSTREAM in _materialized(result)
    assert conn.execute(
        "select verdict, source, run_id from lakehouse_read_parity where dataset_id = %s", (d,)
    ).fetchall() == [("ok", "check", result.run_id)]


def test_blocking_parity_check_stops_downstream_in_the_same_run(conn, dsn, settings, instance):
    d = make_dataset(conn, 25)
    sync(settings, dsn, d)
    behind_the_mirrors_back(
        conn,
        'update dataset_rows set data = data || \'{"s": "tampered"}\' where dataset_id = %s and row_index = 11',
        (d,),
    )
    result = _materialize(instance, dsn, d, checks=(parity,))
    ev = _evaluations(result)
    assert not ev["parity"].passed and ev["parity"].severity == dg.AssetCheckSeverity.ERROR
    assert ev["parity"].metadata["verdict"].value == "MISMATCH"
    assert ev["parity"].metadata["mismatched_row_indexes"].value == [11]
    materialized = _materialized(result)
    assert ICEBERG_TABLE in materialized  # the mirror ran (a no-op: the version did not move)
    assert DOWNSTREAM not in materialized  # ...and the blocking check kept the reader from running
    assert conn.execute("select verdict from lakehouse_read_parity where dataset_id = %s", (d,)).fetchone() == (
        "MISMATCH",
    )


def test_identity_check_blocks_on_duplicated_row_index(conn, dsn, settings, instance):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    rogue_overwrite(settings, dsn, d, lambda t: pa.concat_tables([t, t.slice(3, 1)]), as_ours=True)
    result = _materialize(instance, dsn, d, checks=(identity_ready,))
    ev = _evaluations(result)["identity_ready"]
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    assert "1 duplicated __row_index" in ev.description
    assert DOWNSTREAM not in _materialized(result)


def _defs(dsn):
    return dg.Definitions(
        assets=[pg_dataset_rows, iceberg_dataset_table, downstream_reader],
        asset_checks=[parity, snapshot_freshness, identity_ready],
        jobs=[parity_canary_job],
        schedules=[parity_canary_schedule],
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
    )


def _run_canary_job(instance, dsn, d, run_config=None, tags=None):
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    job = _defs(dsn).resolve_job_def("parity_canary_job")
    result = job.execute_in_process(
        instance=instance, tags=tags or {PARTITION_TAG: str(d)}, run_config=run_config, raise_on_error=False
    )
    return {e.check_name: e for e in result.get_asset_check_evaluations()}, result


def test_freshness_and_what_a_check_that_cannot_see_says(conn, dsn, settings, instance):
    never = make_dataset(conn, 3, name="never")
    ev, _ = _run_canary_job(instance, dsn, never)
    assert {k: e.passed for k, e in ev.items()} == {
        "parity": False,
        "snapshot_freshness": False,
        "identity_ready": False,
    }
    assert (
        ev["parity"].metadata["verdict"].value == "no-snapshot" and ev["parity"].severity == dg.AssetCheckSeverity.ERROR
    )
    assert ev["snapshot_freshness"].severity == dg.AssetCheckSeverity.WARN

    d = make_dataset(conn, 5)
    sync(settings, dsn, d)
    ev, _ = _run_canary_job(instance, dsn, d)
    assert all(e.passed for e in ev.values()), {k: e.description for k, e in ev.items()}
    datasets.insert_rows(conn, d, [{"s": "late"}])  # Postgres moves on; the snapshot is now behind
    strict = {"ops": {"iceberg__dataset_table_snapshot_freshness": {"config": {"max_lag_seconds": 0}}}}
    ev, _ = _run_canary_job(instance, dsn, d, run_config=strict)
    assert not ev["snapshot_freshness"].passed and "behind Postgres" in ev["snapshot_freshness"].description
    assert ev["parity"].metadata["verdict"].value == "lagging"
    assert not ev["parity"].passed and ev["parity"].severity == dg.AssetCheckSeverity.WARN  # not blocking
    ev, _ = _run_canary_job(instance, dsn, d)  # default lag (an hour): a fresh snapshot is fine
    assert ev["snapshot_freshness"].passed


def test_schedule_checks_exactly_the_flipped_datasets(conn, dsn, settings, persistent_instance):
    instance = persistent_instance
    read_flipped = make_dataset(conn, 4, name="read-flipped")
    ws_flipped = make_dataset(conn, 4, name="ws-flipped")
    locked = make_dataset(conn, 4, name="locked")
    plain = make_dataset(conn, 4, name="plain")
    for d in (read_flipped, ws_flipped, locked, plain):
        sync(settings, dsn, d)
    set_override(conn, "read", "export.stream", "iceberg", dataset=read_flipped, note="fase1 canary", actor="pytest")
    ws = datasets.get_dataset(conn, ws_flipped).workspace_id
    set_override(conn, "write", "sync.full", "iceberg_native", workspace=ws, note="fase4 ws", actor="pytest")
    set_override(conn, "read", "studio.digest", "off", dataset=plain, note="explicitly at default", actor="pytest")
    # a hand-written row above a PG-locked writer's ceiling clamps to pg: not a flip
    conn.execute(
        "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
        " values ('write', 'row.edit', 'dataset', %s, 'iceberg_native', 'hand')",
        (locked,),
    )
    assert flipped_dataset_ids(conn) == {read_flipped, ws_flipped}

    instance.add_dynamic_partitions(datasets_partitions.name, [str(read_flipped), str(locked), str(plain)])
    tick = datetime.datetime(2026, 1, 1, 12, 30, tzinfo=datetime.UTC)
    ctx = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=tick, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    requests = parity_canary_schedule(ctx)
    # ws_flipped is not a partition yet (the mirror poller adds partitions): nothing to attach results to
    assert [r.run_config["ops"]["check_datasets"]["config"]["datasets"] for r in requests] == [[str(read_flipped)]]
    assert requests[0].tags["lakehouse/canary"] == "schedule"
    assert requests[0].tags["lakehouse/dataset_name"] == "read-flipped"
    assert requests[0].run_key == f"canary:{tick.isoformat()}:1/1"

    batch = dg.Definitions(
        assets=[pg_dataset_rows, iceberg_dataset_table],
        asset_checks=[parity, snapshot_freshness, identity_ready],
        jobs=[parity_canary_batch_job],
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
    ).resolve_job_def("parity_canary_batch_job")
    result = batch.execute_in_process(instance=instance, run_config=requests[0].run_config, tags=requests[0].tags)
    ev = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert result.success and ev["parity"].passed and ev["parity"].partition == str(read_flipped)
    assert conn.execute(
        "select verdict, source, run_id from lakehouse_read_parity where dataset_id = %s", (read_flipped,)
    ).fetchall() == [("ok", "schedule", result.run_id)]
    latest = canary.latest_verdicts(conn, [read_flipped, plain])
    assert latest[read_flipped]["verdict"] == "ok" and plain not in latest


def test_schedule_skips_when_nothing_is_flipped(conn, dsn, settings, persistent_instance):
    instance = persistent_instance
    make_dataset(conn, 2)
    ctx = dg.build_schedule_context(instance=instance, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)})
    assert isinstance(parity_canary_schedule(ctx), dg.SkipReason)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_code_location_loads_with_the_checks_and_schedule(dsn):
    """In a fresh process, as the code server loads it (Dagster keeps global load state per process)."""
    script = """
import json
from lakehouse_dagster.dagster.definitions import defs
d = defs()
table = ('iceberg', 'dataset_table')
checks = sorted(k.name for k in d.resolve_asset_graph().asset_check_keys if tuple(k.asset_key.path) == table)
mirror = d.resolve_job_def('mirror_job')
print(json.dumps({
    'checks': checks,
    'blocking': sorted(k.name for k in d.resolve_asset_graph().asset_check_keys if d.resolve_asset_graph().get_check_spec(k).blocking),
    'jobs': sorted(j.name for j in d.resolve_all_job_defs()),
    'schedules': sorted(s.name for s in d.schedules),
    'sensors': sorted(s.name for s in d.sensors),
    'mirror_checks': sorted(k.name for k in mirror.asset_layer.asset_graph.asset_check_keys),
}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LAKEHOUSE_PG_DSN": dsn},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["checks"] == ["identity_ready", "parity", "snapshot_freshness"]
    assert {"identity_ready", "parity"} <= set(out["blocking"]) and "snapshot_freshness" not in out["blocking"]
    assert {"parity_canary_job", "parity_canary_batch_job"} <= set(out["jobs"])
    assert "parity_canary_schedule" in out["schedules"] and "lakehouse_alerts" in out["sensors"]
    # the mirror job carries the checks, so a mirror run is gated by them
    assert set(out["mirror_checks"]) >= {"parity", "identity_ready", "snapshot_freshness"}
