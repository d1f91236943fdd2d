"""The orphan sweep as a Dagster job (a real in-process run on an ephemeral instance) and its schedule: the
same function as `lakehouse orphans` (mirror/sweep.py), over every dataset with a succeeded sync by default."""

from __future__ import annotations

import os
import shutil

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.mirror.orphan_sweep import orphan_sweep_job, orphan_sweep_schedule
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.lake import orphans

from .flag_helpers import cli, refusal
from .test_canary import age_files, evaluate, make_dataset, sync, table_of


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _run(instance, dsn, **config):
    return orphan_sweep_job.execute_in_process(
        run_config={"ops": {"orphan_sweep_op": {"config": config}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )


def _metadata(result) -> dict:
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}


def test_the_sweep_job_lists_then_removes_exactly_the_orphans_of_every_mirrored_dataset(conn, dsn, settings, instance):
    quick = settings.replace(sync={"snapshots_keep": 1, "snapshots_max_age_seconds": 0})
    a, b = make_dataset(conn, 5, name="a"), make_dataset(conn, 5, name="b")
    never = make_dataset(conn, 5, name="never")  # no sync: no table, not swept
    for _ in range(3):  # full rewrites: each replaces the files, and expires the snapshot before
        sync(quick, dsn, a, mode="full")
    sync(quick, dsn, b, mode="full")
    table = table_of(settings, dsn, a)
    # a metadata file a commit wrote and then lost the compare-and-swap with: in no metadata log
    lost = table.metadata_location.rsplit("/", 1)[0] + "/99999-lost-swap.metadata.json"
    shutil.copy(table.metadata_location.removeprefix("file://"), lost.removeprefix("file://"))
    refs = orphans.referenced(table)
    assert table.metadata_location in refs and lost not in refs
    age_files(settings)  # every file older than a grace of 1 s
    expected = {o.path for o in orphans.find_orphans(table, grace_seconds=1, protected_syncs=set())}
    assert len([p for p in expected if p.endswith(".parquet")]) == 2 and not expected & refs
    assert [p for p in expected if p.endswith(".metadata.json")] == [lost]  # never the current one or its log

    listed = _run(instance, dsn, grace_seconds=1)
    assert listed.success
    meta = _metadata(listed)
    assert (meta["datasets_swept"], meta["datasets_with_orphans"], meta["orphan_files"], meta["removed"]) == (
        2,
        1,
        len(expected),
        0,
    )
    out = listed.output_for_node("orphan_sweep_op")
    assert {x["dataset_id"] for x in out["datasets"]} == {str(a), str(b)} and str(never) not in str(out)
    assert set(next(x for x in out["datasets"] if x["dataset_id"] == str(a))["paths"]) == expected
    rows = {r.data["name"]: r.data for r in meta["orphans"].records}  # a table (TableMetadataValue), not markdown
    assert rows["a"]["orphan_files"] == len(expected) and all(
        os.path.exists(p.removeprefix("file://")) for p in expected
    )

    text = cli("orphans", "--grace-seconds", "1", check=True).stdout  # the CLI over all: those with orphans, totals
    assert f"{a}: {len(expected)} orphan file(s)" in text and f"{b}:" not in text
    assert f"2 dataset(s) swept: {len(expected)} orphan file(s)" in text and "0 removed" in text

    removed = _run(instance, dsn, grace_seconds=1, delete=True)
    assert removed.success and _metadata(removed)["removed"] == len(expected)
    assert not any(os.path.exists(p.removeprefix("file://")) for p in expected)
    table = table_of(settings, dsn, a)
    assert table.scan().to_arrow().num_rows == 5
    assert (
        evaluate(settings, dsn, a, full=True).verdict == "ok" and evaluate(settings, dsn, b, full=True).verdict == "ok"
    )
    assert _metadata(_run(instance, dsn, grace_seconds=1))["orphan_files"] == 0  # nothing left

    # the default grace (an hour) spares every file just written
    sync(quick, dsn, a, mode="full")
    assert _metadata(_run(instance, dsn))["orphan_files"] == 0

    # a named dataset without a table: refused with the reason before anything is removed, no stack trace
    refused = _run(instance, dsn, datasets=[str(a), str(never)], delete=True, grace_seconds=0)
    assert not refused.success
    [failure] = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
    message = refusal(failure)  # the reason alone, no stack (dagster/defs/shared/refusals.py)
    assert f"dataset {never} has no Iceberg table" in message
    assert {o.path for o in orphans.find_orphans(table_of(settings, dsn, a), grace_seconds=0, protected_syncs=set())}
    bad = _run(instance, dsn, datasets=["not-a-uuid"])
    assert not bad.success

    # one table that cannot be read: the others are still swept, then the run fails naming it
    meta = table_of(settings, dsn, b).metadata_location.removeprefix("file://")
    with open(meta, "w") as f:
        f.write("{ not json")
    age_files(settings)
    leftover = {
        o.path for o in orphans.find_orphans(table_of(settings, dsn, a), grace_seconds=1, protected_syncs=set())
    }
    assert leftover
    broken = _run(instance, dsn, grace_seconds=1, delete=True)
    assert not broken.success
    [failure] = [e for e in broken.all_events if e.event_type_value == "STEP_FAILURE"]
    assert f"1 of 2 dataset(s) could not be swept: b ({b})" in refusal(failure)
    assert not any(os.path.exists(p.removeprefix("file://")) for p in leftover)  # a's were removed all the same


def test_the_sweep_schedule_ships_stopped_and_removes_when_turned_on():
    assert orphan_sweep_schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    [request] = orphan_sweep_schedule.evaluate_tick(dg.build_schedule_context()).run_requests
    assert request.run_config == {"ops": {"orphan_sweep_op": {"config": {"delete": True}}}}
