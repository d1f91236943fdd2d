"""Staleness the UI shows without waiting for a run: the mirror poller's runless materialization marks a dataset's Iceberg partition
behind until its mirror lands, the flipped datasets' snapshot_freshness check fails on a timer (runless), and a
mirror batch whose parity check ends ERROR fails naming the dataset after the others landed. Real Dagster instances
(Postgres storage where the storage's queries matter), real syncs, real Iceberg tables."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, mirror_freshness_policy, pg_dataset_rows
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import mirror_batch_job
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.defs.status.freshness import CHECK_KEY, flipped_freshness_checks
from lakehouse_dagster.dagster.private_apis import dagster_report_check_result
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

from .conftest import pg_dagster_instance
from .flag_helpers import refusal

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


def _dataset(conn, ws, name, rows=3):
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i, "s": f"{name}-{i}"} for i in range(rows)])
    return d


def _resources(dsn):
    return {"lakehouse": LakehouseResource(pg_dsn=dsn)}


def _daemon_tick(sensor, instance, dsn, cursor=None):
    """Evaluate a sensor and record what the daemon records from its result: asset events, then new partitions."""
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources=_resources(dsn)))
    if isinstance(result, dg.SensorResult):
        for event in result.asset_events:
            instance.report_runless_asset_event(event)
        for req in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(datasets_partitions.name, list(req.partition_keys))
    return result


def _launch(instance, dsn, req):
    return mirror_batch_job.execute_in_process(
        run_config=req.run_config, tags=req.tags, instance=instance, resources=_resources(dsn), raise_on_error=False
    )


def _stale(instance, key, partition):
    """The stale status the UI paints on a partition (Dagster's own resolver over the two mirror assets)."""
    from dagster._utils.test.data_versions import (  # noqa: PLC0415 - lazy: Dagster's test helper, this test only
        get_stale_status_resolver,
    )

    return (
        get_stale_status_resolver(instance, [pg_dataset_rows, iceberg_dataset_table]).get_status(key, partition).value
    )


def _data_version(instance, key, partition) -> str | None:
    record = instance.get_latest_data_version_record(key, partition_key=partition)
    return record.event_log_entry.tags.get("dagster/data_version") if record else None


def _reported(instance, partition):
    """The runless materializations of postgres/dataset_rows recorded for a partition, newest first."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=PG_ROWS, asset_partitions=[partition]), limit=20
    ).records
    return [r for r in records if r.run_id == ""]


def test_the_pollers_report_marks_the_partition_behind_until_the_mirror_lands(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "orders")
    key = str(d)
    with dg.DagsterInstance.ephemeral() as instance:
        first = _daemon_tick(mirror_poller, instance, dsn)
        (reported,) = _reported(instance, key)  # recorded by the tick itself, no run
        version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        assert reported.event_log_entry.tags["dagster/data_version"] == str(version)
        assert reported.asset_materialization.metadata["dataset_name"].value == "orders"
        assert _launch(instance, dsn, first.run_requests[0]).success
        assert _stale(instance, ICEBERG_TABLE, key) == "FRESH"
        assert _data_version(instance, PG_ROWS, key) == _data_version(instance, ICEBERG_TABLE, key) == str(version)

        datasets.insert_rows(conn, d, [{"n": 9, "s": "late"}])  # Postgres moves on; no run has happened yet
        # why a materialization and not an observation: Dagster reads observations for staleness only on observable
        # source assets, and postgres/dataset_rows is materializable (an observation leaves the partition fresh)
        instance.report_runless_asset_event(
            dg.AssetObservation(PG_ROWS, partition=key, tags={"dagster/data_version": "observed"})
        )
        assert _stale(instance, ICEBERG_TABLE, key) == "FRESH"
        runs = len(instance.get_runs())
        second = _daemon_tick(mirror_poller, instance, dsn, first.cursor)
        new_version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        assert len(_reported(instance, key)) == 2 and len(instance.get_runs()) == runs
        assert _data_version(instance, PG_ROWS, key) == str(new_version)  # recorded, runless
        assert _data_version(instance, ICEBERG_TABLE, key) == str(version)  # the Iceberg side is behind ...
        assert _stale(instance, ICEBERG_TABLE, key) == "STALE"  # ... and the UI says so, no run needed
        _daemon_tick(mirror_poller, instance, dsn, second.cursor)  # a tick with nothing new records nothing
        assert len(_reported(instance, key)) == 2

        assert _launch(instance, dsn, second.run_requests[0]).success  # the mirror lands
        assert _data_version(instance, ICEBERG_TABLE, key) == str(new_version)
        assert _stale(instance, ICEBERG_TABLE, key) == "FRESH"


def test_the_pollers_reports_are_stored_for_every_changed_dataset_on_postgres_storage(
    conn, dsn, settings, pg_admin_dsn, tmp_path
):
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}", rows=1) for i in range(30)]
    with pg_dagster_instance(pg_admin_dsn, tmp_path) as (instance, _):
        _daemon_tick(mirror_poller, instance, dsn)
        versions = dict(conn.execute("select id, rows_version from datasets").fetchall())
        for d in ids:
            (r,) = _reported(instance, str(d))
            assert r.event_log_entry.tags["dagster/data_version"] == str(versions[d])
            assert _data_version(instance, PG_ROWS, str(d)) == str(versions[d])


def test_the_iceberg_asset_carries_a_time_window_freshness_policy():
    policy = iceberg_dataset_table.specs_by_key[ICEBERG_TABLE].freshness_policy
    assert policy == mirror_freshness_policy(86400)
    assert policy.fail_window.to_timedelta().total_seconds() == 86400
    assert policy.warn_window.to_timedelta().total_seconds() == 21600
    assert mirror_freshness_policy(0) is None
    assert mirror_freshness_policy(120).warn_window is None  # a quarter would be under Dagster's minute


def _results(instance, partition):
    """The partition's snapshot_freshness results, newest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(CHECK_KEY, limit=50)
    return [r for r in records if r.partition == partition]


def _latest(instance, partition) -> tuple[str, str] | None:
    """(status, run id) of the partition's latest snapshot_freshness result."""
    infos = instance.event_log_storage.get_asset_check_partition_info([CHECK_KEY], partition_keys=[partition])
    return (infos[0].latest_execution_status.value, infos[0].latest_planned_run_id) if infos else None


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_flipped_dataset_past_its_window_fails_its_freshness_check_without_a_run(
    conn, dsn, settings, pg_admin_dsn, tmp_path, monkeypatch
):
    monkeypatch.setenv("LAKEHOUSE_LAGGING_AFTER_SECONDS", "1")
    ws = datasets.create_workspace(conn, "w")
    flipped, other = _dataset(conn, ws, "flipped"), _dataset(conn, ws, "not_flipped")
    set_override(conn, "read", "export.stream", "iceberg", dataset=flipped, note="fase1 canary", actor="pytest")
    with pg_dagster_instance(pg_admin_dsn, tmp_path) as (instance, _):
        tick = _daemon_tick(mirror_poller, instance, dsn)
        assert _launch(instance, dsn, tick.run_requests[0]).success  # both mirrored and checked in the run
        assert _latest(instance, str(flipped))[0] == "SUCCEEDED"
        runs = len(instance.get_runs())
        skipped = _daemon_tick(flipped_freshness_checks, instance, dsn)
        assert "are current" in skipped.skip_message  # both fresh: nothing to record

        time.sleep(2.2)  # the snapshots are now older than the 1 s window
        for d in (flipped, other):
            datasets.insert_rows(conn, d, [{"n": 9, "s": "late"}])  # behind, and the mirror does not run
        said = _daemon_tick(flipped_freshness_checks, instance, dsn).skip_message
        assert said == "recorded snapshot_freshness of 1 flipped dataset(s) without a run: 1 failed (flipped)"
        (record,) = _results(instance, str(flipped))[:1]
        # the flipped dataset only: the other's latest result is still its mirror run's (not flipped: no timer)
        assert instance.get_run_by_id(_results(instance, str(other))[0].run_id) is not None
        evaluation = record.event.dagster_event.event_specific_data
        assert not evaluation.passed and "more than the allowed 1 s" in evaluation.description
        assert evaluation.metadata["dataset_name"].value == "flipped"
        status, run_id = _latest(instance, str(flipped))
        assert status == "FAILED" and run_id.startswith("runless-")  # recorded on its partition, by no run
        assert instance.get_run_by_id(run_id) is None and len(instance.get_runs()) == runs
        # recorded once: the next tick finds it already failed
        assert "are current" in _daemon_tick(flipped_freshness_checks, instance, dsn).skip_message

        # synced outside Dagster (lakehouse sync): the timer turns it green again, still without a run
        sync_dataset(dsn, load_catalog(settings, dsn), settings, flipped)
        said = _daemon_tick(flipped_freshness_checks, instance, dsn).skip_message
        assert said.endswith("1 passed again (flipped)")
        assert _latest(instance, str(flipped))[0] == "SUCCEEDED"
        assert "caught up" in _results(instance, str(flipped))[0].event.dagster_event.event_specific_data.description
        # ... and when it lags again, it fails again (a second result on the partition without a run)
        time.sleep(2.2)
        datasets.insert_rows(conn, flipped, [{"n": 10, "s": "later"}])
        assert "1 failed (flipped)" in _daemon_tick(flipped_freshness_checks, instance, dsn).skip_message
        assert _latest(instance, str(flipped))[0] == "FAILED" and len(instance.get_runs()) == runs


def test_dagsters_runless_path_keeps_one_result_per_partition(pg_admin_dsn, tmp_path):
    """Why the timer does not return its results as SensorResult(asset_events): Dagster 1.13 files each runless check
    result under run id "", and the storage's unique index refuses a second one on the same partition. When this
    test fails, Dagster fixed it: report through SensorResult and drop private_apis.dagster_report_check_result."""
    evaluation = dg.AssetCheckEvaluation(
        asset_key=ICEBERG_TABLE, check_name="snapshot_freshness", passed=False, partition="p1"
    )
    with pg_dagster_instance(pg_admin_dsn, tmp_path) as (instance, _):
        instance.report_runless_asset_event(evaluation)
        with pytest.raises(Exception, match="idx_asset_check_executions_unique"):
            instance.report_runless_asset_event(evaluation)


def test_the_sensor_evaluates_at_most_its_bound_per_tick_oldest_first(conn, dsn, settings, monkeypatch):
    from lakehouse_dagster.dagster.defs.status import freshness

    monkeypatch.setenv("LAKEHOUSE_LAGGING_AFTER_SECONDS", "1")
    ws = datasets.create_workspace(conn, "w")
    ids = [_dataset(conn, ws, f"d{i}") for i in range(3)]
    set_override(conn, "read", "export.stream", "iceberg", workspace=ws, note="fase1 ws", actor="pytest")
    catalog = load_catalog(settings, dsn)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(datasets_partitions.name, [str(d) for d in ids])
        for d in ids:
            sync_dataset(dsn, catalog, settings, d)
        # d1's view is the oldest, then d2, then d0
        for d, age in zip(ids, (1000, 3000, 2000)):
            conn.execute(
                "update iceberg_sync_log set finished_at = now() - make_interval(secs => %s) where dataset_id = %s",
                (age, d),
            )
            datasets.insert_rows(conn, d, [{"n": 9, "s": "late"}])
        time.sleep(1.2)
        resource = LakehouseResource(pg_dsn=dsn)
        assert freshness.due(instance, resource, limit=2) == [str(ids[1]), str(ids[2])]
        for e in freshness.evaluations(resource, freshness.due(instance, resource, limit=2)):
            dagster_report_check_result(instance, e)
        assert freshness.due(instance, resource, limit=2) == [str(ids[0])]  # the rest, next tick


def test_a_mirror_batch_with_a_divergence_fails_naming_the_dataset_after_the_others_landed(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    good, bad = _dataset(conn, ws, "good"), _dataset(conn, ws, "diverged")
    catalog = load_catalog(settings, dsn)
    for d in (good, bad):
        sync_dataset(dsn, catalog, settings, d)
    with conn.transaction():  # a row changed behind the mirror's back: no version moves, no trigger sees it
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            'update dataset_rows set data = \'{"n": 1, "s": "edited"}\' where dataset_id = %s and row_index = 1', (bad,)
        )
        conn.execute("alter table dataset_rows enable trigger user")
    for d in (good, bad):
        datasets.insert_rows(conn, d, [{"n": 3, "s": "new"}])  # both behind: the poller asks for both
    with dg.DagsterInstance.ephemeral() as instance:
        tick = _daemon_tick(mirror_poller, instance, dsn)
        (req,) = tick.run_requests
        result = _launch(instance, dsn, req)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = refusal(failure)
    assert message.startswith(f"1 of 2 dataset(s) failed a blocking check: diverged ({bad}): parity.")
    assert "good" not in message
    # ... after both landed: each partition materialized, the good one's checks passed, its new row in Iceberg
    landed = {
        e.event_specific_data.materialization.partition
        for e in result.all_events
        if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == ICEBERG_TABLE
    }
    assert landed == {str(good), str(bad)}
    checks = {
        (e.event_specific_data.partition, e.event_specific_data.check_name): e.event_specific_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert checks[(str(good), "parity")] and not checks[(str(bad), "parity")]
    rows = catalog.load_table(table_identifier(settings, good)).scan().to_arrow()["s"].to_pylist()
    assert "new" in rows and len(rows) == 4
    verdict = conn.execute(
        "select verdict from lakehouse_read_parity where dataset_id = %s order by id desc limit 1", (bad,)
    ).fetchone()[0]
    assert verdict == "MISMATCH"
