"""A dataset's partition pages never go back in time (issue 42, item 9): whoever records a dataset's table into Dagster
(the mirror stream and batch runs, mirror_job, the ingest job's native path, the lakehouse_recorder) never records an
older snapshot over a newer one, nor does the reverse mirror's materialization of postgres/dataset_rows. The order
is the table's own (its commits' order in the sync log, serialised by the dataset lock), never the order in which
the events happen to be written.

The issue's case, through real parts: a mirrored table (append, append), the writer flipped, two native commits
(each newer than the mirror's snapshots), the recorder's tick recording the newest — then the stream's event for
the mirror's second snapshot, written late (its glue was busy), on a real Dagster instance on Postgres storage."""

import uuid

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.mirror.mirror_batch import synced_materializations
from lakehouse_dagster.dagster.defs.mirror.reverse_job import reverse_materialization
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.recording.recorder import recorded_events
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions
from lakehouse_dagster.dagster.private_apis import dagster_log_now
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.status.page_order import sync_order
from lakehouse_dagster.status.partition_state import partition_states
from lakehouse_dagster.status.recording import Cursor, Plan
from lakehouse_dagster.tracking import datasets

from .native_helpers import SCHEMA, native_write, row, runbook_ready
from .test_recorder import Recorder, _materializations, _meta, instance  # noqa: F401 - instance: the fixture

_LATE: dict = {}  # what the late writer job logs (set by the test, read by the op)


@dg.op(out={})
def _late_stream_glue(context: dg.OpExecutionContext, lakehouse: LakehouseResource):
    """What the mirror stream's glue does with a SyncResult it takes from its queue (stream_job.py), here for a sync
    that landed before the commits the page already shows."""
    with lakehouse.connect() as conn:
        events = synced_materializations(conn, lakehouse.settings(), _LATE["sync"], context.log, context.instance)
        dagster_log_now(context, events)


@dg.op(out={})
def _late_reverse_glue(context: dg.OpExecutionContext, lakehouse: LakehouseResource):
    """What the stream's glue (or a reverse_mirror_job run) does with a reverse apply's result, late."""
    with lakehouse.connect() as conn:
        event = reverse_materialization(conn, _LATE["reverse"])
        dagster_log_now(context, [event] if event is not None else [])


@dg.job
def _late_stream_job():
    _late_stream_glue()


@dg.job
def _late_reverse_job():
    _late_reverse_glue()


def _newest(inst, key, d) -> dict:
    """The partition's newest materialization (the one the page shows as current), its metadata."""
    return _meta(_materializations(inst, key, d)[0])


def _mirrored(conn, dsn, settings) -> uuid.UUID:
    """Mirrored (its first sync), read-flipped, canary ok: ready for the write flip."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    runbook_ready(conn, dsn, settings, d)
    return d


def test_a_stream_event_written_after_newer_commits_never_puts_the_table_page_back(
    conn,
    dsn,
    settings,
    instance,  # noqa: F811
    lh,  # noqa: F811
):
    catalog = load_catalog(settings, dsn)
    d = _mirrored(conn, dsn, settings)
    datasets.insert_rows(conn, d, [row(4), row(5)], start_index=4)
    late = sync_dataset(dsn, catalog, settings, d)  # the mirror's append: the stream's sync, its event not yet written
    assert late.mode == "incremental"
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]
    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    first = native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    newest = native_write(conn, dsn, settings, d, "sync.append", [row(7)], start=7)
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    rec = Recorder(instance, dsn)
    rec.tick()  # the recorder: the table as its newest commit left it
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newest) != str(first)

    _LATE["sync"] = late  # ~30 s later the stream's glue writes the mirror's old event
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    assert _late_stream_job.execute_in_process(resources=resources, instance=instance).success
    page = _newest(instance, ICEBERG_TABLE, d)
    assert page["snapshot_id"] == str(newest), (
        f"the page went back in time: it shows snapshot {page['snapshot_id']} (the mirror's, before the flip) as "
        f"current; the table is at {newest}"
    )
    rec.tick()  # the recorder's next tick leaves it so
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newest)

    # the order the pages use (the sync log's) is the table's own: its snapshots' Iceberg sequence numbers
    table = load_table_or_none(catalog, table_identifier(settings, d))
    by_sequence = [s.snapshot_id for s in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number)]
    order = sync_order(conn, [(d, s) for s in by_sequence])
    assert len(order) == len(by_sequence) >= 4
    assert sorted(by_sequence, key=lambda s: order[(d, s)]) == by_sequence


def test_a_recorder_tick_whose_read_is_older_than_a_run_s_event_records_no_older_snapshot(
    conn,
    dsn,
    settings,
    instance,  # noqa: F811
):
    """The recorder reads a dataset's state, then (before its events are written) a run lands a newer sync and
    materializes it: the tick's events must not show the older snapshot as the table now."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    catalog = load_catalog(settings, dsn)
    older = sync_dataset(dsn, catalog, settings, d)
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    states = partition_states(conn, settings, [d])  # the tick's read
    datasets.insert_rows(conn, d, [row(3)], start_index=3)
    newer = sync_dataset(dsn, catalog, settings, d)  # a run's sync, and the run's own materialization of it
    _LATE["sync"] = newer
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    assert _late_stream_job.execute_in_process(resources=resources, instance=instance).success
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newer.snapshot_id)

    plan = Plan({d: []}, [], [], [], [], {}, Cursor(), {d: ["verdict ok (cli, now)"]})
    events = recorded_events(instance, conn, plan, states)
    for e in events:  # as the daemon stores them
        instance.report_runless_asset_event(e)
    shown = [
        {k: getattr(v, "value", v) for k, v in e.metadata.items()}.get("snapshot_id")
        for e in events
        if e.asset_key == ICEBERG_TABLE
    ]
    assert str(older.snapshot_id) not in shown, f"the tick recorded snapshot {older.snapshot_id}, older than the page's"
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newer.snapshot_id)


def test_a_sync_event_written_after_a_newer_change_of_the_app_never_puts_the_rows_page_back(
    conn,
    dsn,
    settings,
    instance,  # noqa: F811
):
    """The app writes while a sync runs; the mirror poller records the newer rows_version on postgres/dataset_rows;
    then the sync's events are written: the table's (still the table now), not the rows page's older version."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    synced = sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    datasets.insert_rows(conn, d, [row(3)], start_index=3)
    now = datasets.get_dataset(conn, d).rows_version
    assert now > synced.source_version
    ctx = dg.build_sensor_context(instance=instance, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)})
    assert mirror_poller(ctx).run_requests  # it records the change and asks for its sync
    assert _newest(instance, PG_ROWS, d)["rows_version"] == str(now)
    _LATE["sync"] = synced
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    assert _late_stream_job.execute_in_process(resources=resources, instance=instance).success
    assert _newest(instance, PG_ROWS, d)["rows_version"] == str(now), "the rows page went back to the sync's version"
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(synced.snapshot_id)


@dg.op(out={})
def _raced_glue(context: dg.OpExecutionContext):
    """A run writing events it built (and checked) before a newer commit landed: a check and its write are two steps."""
    dagster_log_now(context, _LATE["events"])


@dg.job
def _raced_job():
    _raced_glue()


def test_an_older_event_that_raced_the_recorder_is_put_right_by_its_next_tick(
    conn,
    dsn,
    settings,
    instance,  # noqa: F811
):
    """The window a check leaves: a run checks its sync is the table now and builds its events; a newer commit lands
    and the recorder records it; then the run writes its (now older) events. The recorder's next tick shows the
    table now again."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    catalog = load_catalog(settings, dsn)
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    older = sync_dataset(dsn, catalog, settings, d)
    _LATE["events"] = synced_materializations(conn, settings, older)  # checked: the table now, at this moment
    assert _LATE["events"]
    datasets.insert_rows(conn, d, [row(3)], start_index=3)
    newer = sync_dataset(dsn, catalog, settings, d)
    rec = Recorder(instance, dsn)
    rec.tick()
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newer.snapshot_id)
    assert _raced_job.execute_in_process(instance=instance).success  # written after the recorder's
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(older.snapshot_id)  # the window
    rec.tick()
    assert _newest(instance, ICEBERG_TABLE, d)["snapshot_id"] == str(newer.snapshot_id), "the page stayed back"
    rec.tick()  # put right once: nothing more
    assert len(_materializations(instance, ICEBERG_TABLE, d)) == 3


def test_a_reverse_apply_event_written_after_a_newer_apply_never_puts_the_rows_page_back(
    conn,
    dsn,
    settings,
    instance,  # noqa: F811
    lh,  # noqa: F811
):
    catalog = load_catalog(settings, dsn)
    d = _mirrored(conn, dsn, settings)
    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    native_write(conn, dsn, settings, d, "sync.append", [row(4)], start=4)
    late = apply_reverse(dsn, catalog, settings, d)  # its event not yet written
    newest = native_write(conn, dsn, settings, d, "sync.append", [row(5)], start=5)
    applied = apply_reverse(dsn, catalog, settings, d)
    assert applied.snapshot_id == newest != late.snapshot_id
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    for r in (applied, late):  # the newer apply's event first, the older one's late
        _LATE["reverse"] = r
        assert _late_reverse_job.execute_in_process(resources=resources, instance=instance).success
    page = _newest(instance, PG_ROWS, d)
    assert page["lakehouse/reverse_snapshot_id"] == str(newest), page


@pytest.fixture(autouse=True)
def _forget():
    yield
    _LATE.clear()
