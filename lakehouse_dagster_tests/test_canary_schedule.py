"""The canary schedule scales (issue 22): a tick asks for the oldest verdicts first in batch runs, capped, and never
for a dataset already in a queued run; a batch run checks every dataset, records each verdict with source
``schedule``, rolls back on a MISMATCH and fails naming it. Real Postgres, real Iceberg tables, real Dagster runs on
a persistent instance (schedules are evaluated as the daemon does)."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.parity.canary_batch import parity_canary_batch_job
from lakehouse_dagster.dagster.defs.parity.canary_schedule import parity_canary_schedule
from lakehouse_dagster.dagster.defs.parity.checks import CANARY_TAG, identity_ready, parity, snapshot_freshness
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.parity import canary
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.runbooks.canary_rounds import plan_round, split_near_equal
from lakehouse_dagster_tests.flag_helpers import refusal
from lakehouse_dagster_tests.test_canary import behind_the_mirrors_back, evaluate, make_dataset, sync
from lakehouse_dagster_tests.test_parity_dagster import downstream_reader


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


def _defs(dsn) -> dg.Definitions:
    from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows

    return dg.Definitions(
        assets=[pg_dataset_rows, iceberg_dataset_table, downstream_reader],
        asset_checks=[parity, snapshot_freshness, identity_ready],
        jobs=[parity_canary_batch_job],
        schedules=[parity_canary_schedule],
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
    )


def _tick(instance, dsn):
    ctx = dg.build_schedule_context(instance=instance, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)})
    return parity_canary_schedule(ctx)


def _datasets(request: dg.RunRequest) -> list[str]:
    return request.run_config["ops"]["check_datasets"]["config"]["datasets"]


def _queue(instance, dsn, request: dg.RunRequest) -> dg.DagsterRun:
    """What the daemon does with a run request: a QUEUED run of the job with its config and tags (a queued run
    names the code location it comes from)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    job = _defs(dsn).resolve_job_def(parity_canary_batch_job.name)
    location = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="lakehouse_dagster.dagster.definitions"), location_name="lakehouse"
    )
    run = instance.create_run_for_job(
        job,
        run_config=request.run_config,
        tags=request.tags,
        status=dg.DagsterRunStatus.QUEUED,
        remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job.name),
    )
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.QUEUED
    return run


def _flipped(conn, settings, dsn, n: int, name: str = "ds") -> list:
    out = []
    for i in range(n):
        d = make_dataset(conn, 6, name=f"{name}{i}")
        sync(settings, dsn, d)
        set_override(conn, "read", "export.stream", "iceberg", dataset=d, note="fase1 canary", actor="pytest")
        out.append(d)
    return out


def test_batches_are_near_equal_and_ceil_many():
    assert [len(b) for b in split_near_equal(list(range(5)), 2)] == [2, 2, 1]
    assert [len(b) for b in split_near_equal(list(range(2500)), 1000)] == [834, 833, 833]
    plan = plan_round(list(range(10)), in_flight_datasets={0, 1}, in_flight_runs=1, max_runs=3, cap=100, batch_size=3)
    # 8 due; 2 free runs of 3 → the 6 oldest not in flight
    assert plan.batches == [[2, 3, 4], [5, 6, 7]] and plan.left == 2
    full = plan_round(list(range(4)), in_flight_datasets=set(), in_flight_runs=3, max_runs=3, cap=9, batch_size=2)
    assert full.batches == [] and full.why_nothing() == (
        "nothing requested: 3 canary run(s) in flight, the limit (LAKEHOUSE_CANARY_MAX_RUNS=3); 4 due flipped "
        "dataset(s) wait for them to finish"
    )


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_tick_asks_for_the_oldest_verdicts_in_batches_and_never_twice(conn, dsn, settings, instance, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CANARY_BATCH_SIZE", "2")
    monkeypatch.setenv("LAKEHOUSE_CANARY_MAX_PER_TICK", "5")
    monkeypatch.setenv("LAKEHOUSE_CANARY_MAX_RUNS", "4")
    ds = _flipped(conn, settings, dsn, 7)
    plain = make_dataset(conn, 3, name="not-flipped")
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d) for d in [*ds, plain]])
    # earlier scheduled verdicts, oldest first: ds[3], ds[1], ds[4], ds[2]; ds[0], ds[5], ds[6] never scheduled
    for d in (ds[3], ds[1], ds[4], ds[2]):
        auto_rollback.record_and_roll_back(conn, evaluate(settings, dsn, d), source="schedule")
    never = sorted([ds[0], ds[5], ds[6]])

    first = _tick(instance, dsn)
    # cap 5 in batches of 2: ceil(5/2) = 3 runs, the 5 oldest verdicts (never-checked first)
    assert [len(_datasets(r)) for r in first] == [2, 2, 1]
    assert [d for r in first for d in _datasets(r)] == [str(d) for d in [*never, ds[3], ds[1]]]
    assert all(r.tags[CANARY_TAG] == "schedule" for r in first)
    assert len({r.run_key for r in first}) == 3
    names = {str(d): f"ds{i}" for i, d in enumerate(ds)}
    assert first[0].tags["lakehouse/dataset_names"] == ",".join(names[d] for d in _datasets(first[0]))
    assert first[2].tags["lakehouse/dataset_name"] == "ds1"  # a run of one dataset: its own tags
    queued = [_queue(instance, dsn, r) for r in first]

    # second tick while those are queued: one run is free (limit 4), and only the two not in flight are asked for
    second = _tick(instance, dsn)
    assert [_datasets(r) for r in second] == [[str(ds[4]), str(ds[2])]]
    _queue(instance, dsn, second[0])
    third = _tick(instance, dsn)  # everything flipped is in flight now
    assert isinstance(third, dg.SkipReason) and third.skip_message == (
        "nothing requested: every flipped dataset is in one of the 4 canary run(s) in flight (7 dataset(s))"
    )

    # a queued run executes (as the daemon would launch it): its verdicts say schedule, with its run id
    run = queued[0]
    result = (
        _defs(dsn)
        .resolve_job_def(parity_canary_batch_job.name)
        .execute_in_process(instance=instance, run_config=run.run_config, tags=run.tags)
    )
    assert result.success
    checked = _datasets(first[0])
    rows = conn.execute(
        "select dataset_id::text, verdict, source, run_id from lakehouse_read_parity where run_id = %s order by 1",
        (result.run_id,),
    ).fetchall()
    assert rows == [(d, "ok", "schedule", result.run_id) for d in sorted(checked)]
    evaluations = result.get_asset_check_evaluations()
    assert {(e.partition, e.check_name) for e in evaluations} == {
        (d, c) for d in checked for c in ("parity", "snapshot_freshness", "identity_ready")
    }
    assert canary.latest_verdicts(conn, [plain]) == {}  # never asked for: not flipped


def test_a_canary_batch_run_with_a_mismatch_fails_naming_it_and_records_every_other_verdict(
    conn, dsn, settings, instance
):
    good1, bad, good2 = _flipped(conn, settings, dsn, 3, name="orders")
    behind_the_mirrors_back(  # a change the mirror cannot see: Postgres differs, the versions still agree
        conn,
        'update dataset_rows set data = data || \'{"s": "tampered"}\' where dataset_id = %s and row_index = 2',
        (bad,),
    )
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d) for d in (good1, bad, good2)])
    result = (
        _defs(dsn)
        .resolve_job_def(parity_canary_batch_job.name)
        .execute_in_process(
            instance=instance,
            run_config={"ops": {"check_datasets": {"config": {"datasets": [str(good1), str(bad), str(good2)]}}}},
            tags={CANARY_TAG: "schedule"},
            raise_on_error=False,
        )
    )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    reason = refusal(failure)
    assert reason.startswith(f"1 of 3 dataset(s) failed a blocking check: orders1 ({bad}): parity.")
    assert "the other datasets were checked" in reason and "landed" not in reason
    verdicts = dict(
        conn.execute(
            "select dataset_id, verdict from lakehouse_read_parity where run_id = %s and source = 'schedule'",
            (result.run_id,),
        ).fetchall()
    )
    assert verdicts == {good1: "ok", bad: "MISMATCH", good2: "ok"}  # the one after the MISMATCH was checked too
    # auto-rollback exactly as before: the reader is off for the mismatching dataset only, noted with the run id
    assert FlagResolver(conn, ttl_seconds=0).resolve("read", "export.stream", bad).mode == "off"
    assert FlagResolver(conn, ttl_seconds=0).resolve("read", "export.stream", good2).mode == "iceberg"
    assert conn.execute(
        "select note from lakehouse_flag_audit where scope_id = %s and note like 'auto-rollback%%'", (bad,)
    ).fetchall() == [(f"auto-rollback: MISMATCH (schedule, {result.run_id})",)]
    parity_results = {e.partition: e.passed for e in result.get_asset_check_evaluations() if e.check_name == "parity"}
    assert parity_results == {str(good1): True, str(bad): False, str(good2): True}


def test_a_launchpad_typo_is_refused_and_nothing_is_checked(conn, dsn, settings, instance):
    (d,) = _flipped(conn, settings, dsn, 1)
    job = _defs(dsn).resolve_job_def(parity_canary_batch_job.name)
    for datasets, says in (
        ([str(d), "not-a-uuid"], "dataset id 'not-a-uuid' is not a valid UUID"),
        ([str(d), "123e4567-e89b-12d3-a456-426614174000"], "1 dataset(s) do not exist: 123e4567"),
    ):
        result = job.execute_in_process(
            instance=instance,
            run_config={"ops": {"check_datasets": {"config": {"datasets": datasets}}}},
            raise_on_error=False,
        )
        reason = refusal(result.get_step_failure_events()[0])
        assert says in reason and reason.endswith("nothing was checked") and "\n" not in reason
    assert conn.execute("select count(*) from lakehouse_read_parity").fetchone()[0] == 0
