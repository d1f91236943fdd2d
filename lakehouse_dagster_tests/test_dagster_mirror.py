"""The mirror as Dagster sees it: real runs (materialize) and the poller evaluated on an instance."""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest

from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.flags import set_override
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.poller import Cursor
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _tick(instance, dsn, cursor=None):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    return mirror_poller(ctx)


class _Res:
    def __init__(self, run_requests):
        self.run_requests = run_requests


def _asked(res) -> list[str]:
    """The datasets a tick asked to mirror: those of its mirror_batch_job runs (or mirror_job partitions)."""
    out = []
    for r in res.run_requests:
        out += [r.partition_key] if r.partition_key else r.run_config["ops"]["mirror_datasets"]["config"]["datasets"]
    return out


def _datasets(conn, n, rows=3):
    ws = datasets.create_workspace(conn, "w")
    ids = []
    for i in range(n):
        d = datasets.create_dataset(conn, ws, f"d{i}", SCHEMA)
        datasets.insert_rows(conn, d, [{"n": k, "s": str(k)} for k in range(rows)])
        ids.append(d)
    return ws, ids


def test_materialize_partition_lands_in_iceberg(conn, dsn, settings, instance):
    _, (d,) = _datasets(conn, 1, rows=10)
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    result = dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table],
        partition_key=str(d),
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
    )
    assert result.success
    mats = result.asset_materializations_for_node("iceberg__dataset_table")
    meta = mats[0].metadata
    assert meta["rows"].value == 10 and meta["path"].value == "mirror" and meta["mode"].value == "full"
    for key in ("snapshot_id", "bytes_written", "seconds", "rows_per_s", "peak_rss_mb"):
        assert key in meta
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert str(table.current_snapshot().snapshot_id) == meta["snapshot_id"].value
    assert sorted(table.scan().to_arrow()["n"].to_pylist()) == list(range(10))
    # the run's sync is in the sync log, linked to the run
    assert conn.execute("select status, run_id from iceberg_sync_log where dataset_id = %s", (d,)).fetchone() == (
        "succeeded",
        result.run_id,
    )


def test_materialize_bad_row_fails_the_run_loudly(conn, dsn, settings, instance):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "bad", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": 1}, {"n": "x"}])
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    result = dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table],
        partition_key=str(d),
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "row_index 1 column n: expected int64, got a JSON string" in failure.step_failure_data.error_display_string
    assert conn.execute("select status from datasets where id = %s", (d,)).fetchone()[0] == "errored"


def test_poller_requests_exactly_the_changed_datasets_and_advances(conn, dsn, settings, instance):
    ws, ids = _datasets(conn, 3)
    manifest = datasets.create_dataset(conn, ws, "m", [], kind="manifest")
    conn.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 0, '{}')", (manifest,))
    first = _tick(instance, dsn)
    assert sorted(_asked(first)) == sorted(str(i) for i in ids)
    assert [r.job_name for r in first.run_requests] == ["mirror_batch_job"]  # one run for the three
    added = first.dynamic_partitions_requests[0].partition_keys
    assert sorted(added) == sorted(str(i) for i in ids)  # manifest datasets get no partition
    instance.add_dynamic_partitions(datasets_partitions.name, list(added))
    c1 = Cursor.loads(first.cursor)
    assert c1.xid > 0

    # nothing changed: nothing requested, cursor does not move back
    second = _tick(instance, dsn, first.cursor)
    assert second.run_requests == [] and Cursor.loads(second.cursor).xid >= c1.xid

    # one dataset mirrored, another changed: only the changed one, with a new run key
    sync_dataset(dsn, load_catalog(settings, dsn), settings, ids[0])
    datasets.insert_rows(conn, ids[1], [{"n": 99}])
    third = _tick(instance, dsn, second.cursor)
    assert _asked(third) == [str(ids[1])]
    version = conn.execute("select rows_version from datasets where id = %s", (ids[1],)).fetchone()[0]
    assert third.run_requests[0].run_key == f"mirror:{ids[1]}:{version}"  # a lone dataset keeps its own key
    assert third.run_requests[0].run_key not in {r.run_key for r in first.run_requests}
    assert third.dynamic_partitions_requests == []  # already known partition
    assert Cursor.loads(third.cursor).xid >= Cursor.loads(second.cursor).xid


def test_poller_sees_a_transaction_that_commits_after_a_later_one(conn, dsn, settings, instance):
    _, (a, b) = _datasets(conn, 2, rows=1)
    start = _tick(instance, dsn).cursor
    slow = psycopg.connect(dsn)  # opens first, commits last
    slow.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 100, '{\"n\": 1}')", (a,))
    datasets.insert_rows(conn, b, [{"n": 5}])
    tick = _tick(instance, dsn, start)
    assert _asked(tick) == [str(b)]
    slow.commit()
    slow.close()
    later = _tick(instance, dsn, tick.cursor)
    assert str(a) in _asked(later)


def test_poller_caps_requests_per_tick_and_pages_forward(conn, dsn, settings, instance, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_SENSOR_MAX_REQUESTS", "2")
    monkeypatch.setenv("LAKEHOUSE_MIRROR_BATCH_SIZE", "1")  # runs of one dataset: 2 datasets per tick
    _, ids = _datasets(conn, 5, rows=1)
    seen, cursor = [], None
    for _ in range(5):
        res = _tick(instance, dsn, cursor)
        assert len(_asked(res)) <= 2
        seen += _asked(res)
        cursor = res.cursor
    assert sorted(seen) == sorted(str(i) for i in ids)


def test_poller_skips_native_datasets_and_honours_enable_flag(conn, dsn, settings, instance, monkeypatch):
    _, (a, b) = _datasets(conn, 2)
    set_override(conn, "write", "sync.full", "iceberg_native", dataset=str(a), actor="pytest", note="test")
    res = _tick(instance, dsn)
    assert _asked(res) == [str(b)]
    monkeypatch.setenv("ENABLE_ICEBERG_SYNC", "false")
    off = _tick(instance, dsn)
    assert isinstance(off, dg.SkipReason) and "ENABLE_ICEBERG_SYNC" in off.skip_message


def test_code_location_loads():
    from lakehouse_dagster.dagster.definitions import defs

    d = defs()
    assert d.resolve_job_def("mirror_job") is not None
    keys = {k.to_user_string() for k in d.resolve_asset_graph().get_all_asset_keys()}
    assert {"postgres/dataset_rows", "iceberg/dataset_table"} <= keys
    assert d.resolve_sensor_def("mirror_poller") is not None


BACKOFF = 60  # s: a tick "inside the backoff" stays inside it however loaded the machine; time passes by _age


def _age(conn, seconds: float) -> None:
    """Move the sweep's clock ``seconds`` on: its idle time is now() − the later of the last request and the last
    sync's end (mirror/poller.py _BEHIND), so both are moved back instead of the test sleeping."""
    conn.execute("update lakehouse_mirror_requests set last_at = last_at - make_interval(secs => %s)", (seconds,))
    conn.execute(
        "update iceberg_sync_log set started_at = started_at - make_interval(secs => %s),"
        " finished_at = finished_at - make_interval(secs => %s)",
        (seconds, seconds),
    )


def test_poller_retries_a_failed_sync_after_a_backoff_and_then_gives_up(conn, dsn, settings, instance, monkeypatch):
    """A sync that failed is otherwise requested again only when its dataset changes: the sweep retries it."""
    from lakehouse_dagster.core.errors import SyncFailed

    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS", str(BACKOFF))
    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_MAX", "1")
    _, (good, bad) = _datasets(conn, 2)
    datasets.insert_rows(conn, bad, [{"n": "x"}])  # a value the mirror refuses: every sync of it fails
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, good, mode="full")

    def fail() -> str:
        with pytest.raises(SyncFailed):
            sync_dataset(dsn, catalog, settings, bad, mode="full")
        return str(
            conn.execute(
                "select sync_id from iceberg_sync_log where dataset_id = %s order by id desc limit 1", (bad,)
            ).fetchone()[0]
        )

    fail()
    cursor = _tick(instance, dsn).cursor  # the change itself: requested once by the regular path
    assert _tick(instance, dsn, cursor).run_requests == []  # failed just now: inside the backoff
    _age(conn, BACKOFF + 1)
    (req,) = _tick(instance, dsn, cursor).run_requests
    version = conn.execute("select rows_version from datasets where id = %s", (bad,)).fetchone()[0]
    assert _asked(_Res([req])) == [str(bad)] and req.run_key == f"mirror:{bad}:{version}:attempt:2"
    assert req.tags["lakehouse/attempt"] == "2" and req.tags["lakehouse/source_version"] == str(version)
    fail()  # the retry failed too: two in a row is past LAKEHOUSE_RETRY_FAILED_MAX=1
    _age(conn, 2 * BACKOFF + 1)  # longer than the next backoff would be
    assert _tick(instance, dsn, cursor).run_requests == []
    # fixing the data is a change: the regular path requests it again
    conn.execute("update dataset_rows set data = '{\"n\": 5}' where dataset_id = %s and data->>'n' = 'x'", (bad,))
    assert _asked(_tick(instance, dsn, cursor)) == [str(bad)]


def test_a_run_that_died_before_logging_is_requested_again_after_the_backoff(
    conn, dsn, settings, instance, monkeypatch
):
    """No failed row exists (the run died before its sync logged anything): the sweep still asks again,
    never while a mirror run for the dataset is in flight, with a new run key per attempt, and stops once
    the dataset is caught up."""
    from lakehouse_dagster.dagster.definitions import defs

    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS", str(BACKOFF))
    monkeypatch.setenv("LAKEHOUSE_RETRY_FAILED_MAX", "3")
    _, (d,) = _datasets(conn, 1)
    version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    first = _tick(instance, dsn)
    assert [r.run_key for r in first.run_requests] == [f"mirror:{d}:{version}"]

    # the requested run is in flight (created, then started) and then dies without a trace in the sync log
    job = defs().resolve_job_def("mirror_job")
    run = instance.create_run_for_job(
        job_def=job, tags={"dagster/partition": str(d)}, status=dg.DagsterRunStatus.NOT_STARTED
    )
    _age(conn, BACKOFF + 1)  # past the backoff, but a run is in flight
    assert _tick(instance, dsn, first.cursor).run_requests == []
    instance.report_dagster_event(
        dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_START.value, job_name=job.name), run.run_id
    )
    _age(conn, BACKOFF + 1)
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
    assert _tick(instance, dsn, first.cursor).run_requests == []
    instance.report_run_failed(instance.get_run_by_id(run.run_id))
    assert conn.execute("select count(*) from iceberg_sync_log").fetchone()[0] == 0
    # the backoff restarts from the last tick that saw the run in flight
    assert _tick(instance, dsn, first.cursor).run_requests == []
    _age(conn, BACKOFF + 1)
    (again,) = _tick(instance, dsn, first.cursor).run_requests
    assert _asked(_Res([again])) == [str(d)] and again.run_key == f"mirror:{d}:{version}:attempt:2"
    assert again.tags["lakehouse/attempt"] == "2"
    # the next attempt waits twice as long, and gets its own run key again
    _age(conn, BACKOFF + 1)
    assert _tick(instance, dsn, first.cursor).run_requests == []
    _age(conn, BACKOFF)
    (third,) = _tick(instance, dsn, first.cursor).run_requests
    assert third.run_key == f"mirror:{d}:{version}:attempt:3"

    # caught up: never asked again
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    _age(conn, 10 * BACKOFF)
    assert _tick(instance, dsn, first.cursor).run_requests == []
