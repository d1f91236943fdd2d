"""The reverse mirror's driver (issue 31): the mirror stream applies the native commits of its shard's datasets to
dataset_rows (mirror/stream.py ``_Reverse``), the mirror_poller requests a reverse_mirror_job run per due dataset
that no live stream covers (run key reverse:<dataset>:<snapshot>), and each apply is a materialization of the
dataset's postgres/dataset_rows partition naming the snapshot applied.

Real Postgres, real Iceberg tables, native writes through the real write router (native_helpers.py); the stream
loop in a thread (test_mirror_stream.Stream), the jobs in process."""

from __future__ import annotations

import statistics
import time
import uuid

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.mirror import sensors
from lakehouse_dagster.dagster.defs.mirror.reverse_job import reverse_mirror_job
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.mirror.stream_job import mirror_stream
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS
from lakehouse_dagster.mirror.reverse import position
from lakehouse_dagster.mirror.stream import ReverseApplied, ReverseFailed, shard_of
from lakehouse_dagster.tracking import datasets

from .native_helpers import SCHEMA, native_write, row, runbook_ready, snapshot
from .test_mirror_stream import Stream
from .test_reverse_mirror import _same_as_table


def _native(conn, dsn, settings, lh, ws, name, *, shard=None, count=2, writer="sync.append") -> uuid.UUID:  # noqa: F811
    """A dataset made ready the runbook's way and its writer (sync.append) flipped to iceberg_native; ``shard``: one
    of that shard (of ``count``), datasets of the other shard created and left alone until one is."""
    while True:
        d = datasets.create_dataset(conn, ws, f"{name}-{uuid.uuid4().hex[:6]}", SCHEMA)
        if shard is None or shard_of(d, count) == shard:
            break
    datasets.insert_rows(conn, d, [row(i) for i in range(6)])
    runbook_ready(conn, dsn, settings, d)
    lh("write-flags", "set", writer, "iceberg_native", "--dataset", str(d), check=True)
    return d


def _wait_position(conn, d, snap, timeout=30.0) -> float:
    t0 = time.time()
    while (p := position(conn, d)) is None or p.snapshot_id != snap:
        if time.time() - t0 > timeout:
            raise AssertionError(f"dataset {d} not at snapshot {snap} within {timeout}s (at {p})")
        time.sleep(0.02)
    return time.time() - t0


def _applied(s: Stream) -> list:
    return [e.result for e in s.events if isinstance(e, ReverseApplied)]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_stream_applies_each_native_commit_of_its_shard_once_within_seconds(conn, dsn, settings, lh):  # noqa: F811
    ws = datasets.create_workspace(conn, "ws")
    mine = _native(conn, dsn, settings, lh, ws, "mine", shard=0)
    other = _native(conn, dsn, settings, lh, ws, "other", shard=1)
    native_write(conn, dsn, settings, other, "sync.append", [row(i) for i in range(6, 16)], start=6)
    with Stream(settings, dsn, shard=0, count=2) as s:
        assert s.held.wait(30)
        _wait_position(conn, mine, snapshot(settings, dsn, mine))  # the first sweep: no position yet
        took = []
        for k in range(5):  # 10-row native appends: each in Postgres within a couple of seconds of its commit
            start = 6 + 10 * k
            snap = native_write(
                conn, dsn, settings, mine, "sync.append", [row(i) for i in range(start, start + 10)], start=start
            )
            took.append(_wait_position(conn, mine, snap, timeout=10))
        time.sleep(0.5)  # anything applied twice would show by now
    # how fast is a figure (bench/bench_reverse.py, target p50 <= 2 s), not a property a loaded machine keeps
    print(f"native append -> dataset_rows: p50 {statistics.median(took):.3f}s, max {max(took):.3f}s ({took})")
    _same_as_table(conn, settings, dsn, mine)
    applied = _applied(s)
    assert {r.dataset_id for r in applied} == {mine}  # the other shard's dataset is left alone
    assert [r.how for r in applied[1:]] == ["append"] * 5 and [r.copied for r in applied[1:]] == [10] * 5
    snaps = [r.snapshot_id for r in applied]
    assert len(snaps) == len(set(snaps)) == 6  # each snapshot applied once
    assert position(conn, other) is None
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (other,)).fetchone()[0] == 6
    assert not [e for e in s.events if isinstance(e, ReverseFailed)]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_failed_reverse_apply_is_retried_after_a_backoff_not_in_a_hot_loop(conn, dsn, settings, lh, monkeypatch):  # noqa: F811
    ws = datasets.create_workspace(conn, "ws")
    d = _native(conn, dsn, settings, lh, ws, "d")
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(6), row(7)], start=6)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "reverse-before-commit:raise")
    with Stream(settings.replace(mirror={"retry_failed_after_seconds": 1}), dsn) as s:

        def failures() -> list[ReverseFailed]:
            return [e for e in s.events if isinstance(e, ReverseFailed)]

        t0 = time.time()
        while not failures():
            assert time.time() - t0 < 30, "no failure yielded"
            time.sleep(0.05)
        time.sleep(3)  # polls and a commit cursor meanwhile: the failed dataset is not asked again before its backoff
        (first,) = failures()
        assert first.dataset_id == d and first.attempts == 1 and first.retry_in == 1
        assert "FailpointError" in first.error and position(conn, d) is None
        monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
        _wait_position(conn, d, snap, timeout=15)  # the next sweep past the backoff asks again
    assert len(failures()) == 1
    assert [(r.dataset_id, r.how, r.copied) for r in _applied(s)] == [(d, "append", 2)]
    _same_as_table(conn, settings, dsn, d)


def _tick(instance, dsn, cursor=None):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    return mirror_poller(ctx)


def _reverse_asked(res) -> list[dg.RunRequest]:
    return [r for r in res.run_requests if r.job_name == "reverse_mirror_job"]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def test_streaming_off_the_poller_requests_a_reverse_run_per_due_dataset_and_the_run_applies_it(
    conn,
    dsn,
    settings,
    lh,  # noqa: F811
    instance,
    monkeypatch,
):
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "false")
    ws = datasets.create_workspace(conn, "ws")
    d = _native(conn, dsn, settings, lh, ws, "d")
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 16)], start=6)
    res = _tick(instance, dsn)
    (req,) = _reverse_asked(res)
    assert (req.run_key, req.partition_key) == (f"reverse:{d}:{snap}", str(d))
    assert str(d) in res.dynamic_partitions_requests[0].partition_keys

    instance.add_dynamic_partitions("datasets", [str(d)])
    result = reverse_mirror_job.execute_in_process(
        partition_key=str(d), resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}, instance=instance
    )
    assert result.success
    (mat,) = result.asset_materializations_for_node("reverse_apply_op")
    assert mat.asset_key == PG_ROWS and mat.partition == str(d)
    md = {k: v.value for k, v in mat.metadata.items()}
    assert md["lakehouse/reverse"] is True and md["lakehouse/reverse_snapshot_id"] == str(snap)
    assert (md["lakehouse/reverse_how"], md["rows_copied"], md["rows_removed"], md["dagster/row_count"]) == (
        "append",
        10,
        0,
        16,
    )
    assert f"snapshot {snap}" in mat.description
    assert position(conn, d).snapshot_id == snap
    _same_as_table(conn, settings, dsn, d)
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=PG_ROWS, asset_partitions=[str(d)]), limit=10
    ).records
    assert [r.run_id for r in records] == [result.run_id]

    # at its snapshot: nothing more is asked; a second run of the same partition is a no-op that logs nothing
    assert _reverse_asked(_tick(instance, dsn, res.cursor)) == []
    again = reverse_mirror_job.execute_in_process(
        partition_key=str(d), resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}, instance=instance
    )
    assert again.success and again.asset_materializations_for_node("reverse_apply_op") == []

    # a shard a live stream covers (a fresh heartbeat): its datasets are the stream's, no reverse run is asked
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "true")
    native_write(conn, dsn, settings, d, "sync.append", [row(16)], start=16)
    conn.execute(
        "insert into lakehouse_mirror_streams (shard_count, shard, run_id, started_at, heartbeat_at, deadline_at)"
        " values (1, 0, 'live', now(), now(), now() + interval '600 seconds')"
    )
    assert _reverse_asked(_tick(instance, dsn, res.cursor)) == []


def test_streaming_off_a_failed_reverse_run_is_retried_under_a_new_key_after_the_backoff_never_beside_one_in_flight(
    conn,
    dsn,
    settings,
    lh,  # noqa: F811
    instance,
    monkeypatch,
):
    """Issue 42 item 8: the daemon skips a run key that already has a run, so a retry under the key of the failed run
    (reverse:<ds>:<snapshot>, the same while the dataset is behind) never ran. Runs are launched here as the daemon
    launches a request: its key and tags on the run."""
    monkeypatch.setenv("LAKEHOUSE_MIRROR_STREAM", "false")
    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS", "60")
    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_MAX", "2")
    ws = datasets.create_workspace(conn, "ws")
    d = _native(conn, dsn, settings, lh, ws, "d")
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(6), row(7)], start=6)
    instance.add_dynamic_partitions("datasets", [str(d)])
    clock = [0.0]
    monkeypatch.setattr(sensors, "_now", lambda: time.time() + clock[0], raising=False)

    def launch(req: dg.RunRequest, *, fail: bool):
        if fail:
            monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "reverse-before-commit:raise")
        try:
            return reverse_mirror_job.execute_in_process(
                partition_key=req.partition_key,
                tags={**req.tags, "dagster/run_key": req.run_key},
                resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
                instance=instance,
                raise_on_error=False,
            )
        finally:
            monkeypatch.delenv("LAKEHOUSE_FAILPOINT", raising=False)

    def keys() -> set[str]:
        return {r.tags.get("dagster/run_key") for r in instance.get_runs()}

    (req,) = _reverse_asked(_tick(instance, dsn))
    assert req.run_key == f"reverse:{d}:{snap}"
    assert not launch(req, fail=True).success and position(conn, d) is None

    clock[0] = 61  # past the backoff: a retry, under a key no run has (the daemon launches it)
    (retry,) = _reverse_asked(_tick(instance, dsn))
    assert retry.run_key not in keys(), "the retry's key is the failed run's: the daemon would skip it forever"
    assert retry.run_key == f"reverse:{d}:{snap}:attempt:2" and retry.tags["lakehouse/attempt"] == "2"
    clock[0] = 0  # within the backoff of that failure: nothing asked
    # the retry in flight: nothing more is asked for the dataset (no second run beside it), whatever the clock says
    run = instance.create_run_for_job(
        job_def=reverse_mirror_job,
        tags={**retry.tags, "dagster/run_key": retry.run_key},
        status=dg.DagsterRunStatus.STARTED,
    )
    clock[0] = 10_000
    assert _reverse_asked(_tick(instance, dsn)) == []
    instance.report_run_failed(run)  # the second failure at this snapshot: the backoff doubles (120 s)
    clock[0] = 61
    assert _reverse_asked(_tick(instance, dsn)) == []
    clock[0] = 121
    (third,) = _reverse_asked(_tick(instance, dsn))
    assert third.run_key == f"reverse:{d}:{snap}:attempt:3"
    assert not launch(third, fail=True).success
    clock[0] = 10_000  # three failures, LAKEHOUSE_RETRY_FAILED_MAX=2: retries used up
    assert _reverse_asked(_tick(instance, dsn)) == []
    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_MAX", "5")
    (fourth,) = _reverse_asked(_tick(instance, dsn))
    assert fourth.run_key == f"reverse:{d}:{snap}:attempt:4" and fourth.run_key not in keys()
    assert launch(fourth, fail=False).success and position(conn, d).snapshot_id == snap
    _same_as_table(conn, settings, dsn, d)
    assert _reverse_asked(_tick(instance, dsn)) == []  # caught up


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_stream_run_logs_each_reverse_apply_as_a_materialization_of_the_partition(
    conn,
    dsn,
    settings,
    lh,  # noqa: F811
    instance,
):
    ws = datasets.create_workspace(conn, "ws")
    d = _native(conn, dsn, settings, lh, ws, "d", writer="sync.full")
    snap = native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(3)], start=0)
    result = mirror_stream.execute_in_process(
        run_config={"ops": {"stream_shard_op": {"config": {"shard": 0, "shards": 1, "lifetime_seconds": 4}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
    )
    assert result.success
    # from the run's event log (what the UI reads): the stream logs its events at once, it does not yield them
    mats = [
        e.dagster_event.step_materialization_data.materialization
        for e in instance.all_logs(result.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION
    ]
    mats = [m for m in mats if m.asset_key == PG_ROWS]
    (mat,) = [m for m in mats if m.metadata.get("lakehouse/reverse")]
    md = {k: v.value for k, v in mat.metadata.items()}
    assert mat.partition == str(d) and md["lakehouse/reverse_snapshot_id"] == str(snap)
    assert (md["lakehouse/reverse_how"], md["rows_removed"], md["rows_copied"], md["dagster/row_count"]) == (
        "full",
        6,
        3,
        3,
    )
    assert position(conn, d).snapshot_id == snap
    _same_as_table(conn, settings, dsn, d)


def test_a_datasets_reverse_applies_are_paced_by_the_sync_share():
    """After an apply of T seconds a dataset's next apply waits T × (1/share − 1), as its forward syncs do
    (LAKEHOUSE_MIRROR_SYNC_SHARE): a dataset committed without pause is applied in batches, the app keeps the CPU."""
    import concurrent.futures
    import types

    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.mirror.reverse import ReverseResult
    from lakehouse_dagster.mirror.stream import _Reverse

    ds = uuid.uuid4()
    rev = _Reverse("", None, Settings.from_env().replace(stream={"sync_share": 0.25}), lambda d: True, 0)
    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_result(ReverseResult(ds, "append", 1, 10, 0, 10, 2.0, "appended"))
    rev.flying[fut] = ds
    lease = types.SimpleNamespace(stats=types.SimpleNamespace(last_commit_at=None, last_dataset_id=None))
    assert isinstance(rev.outcome(fut, 100.0, lease, 0), ReverseApplied)
    rev.due[ds] = 100.5  # the next native commit, seen at once
    assert rev.ready(101.0, set()) == [] and rev.nearest(set()) == pytest.approx(106.0)  # 2 s × 3
    assert rev.ready(106.0, set()) == [ds]
    other = uuid.uuid4()
    rev.due[other] = 101.0  # another dataset is not held back
    assert rev.ready(101.0, set()) == [other]
