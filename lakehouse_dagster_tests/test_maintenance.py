"""Table maintenance (lake/maintenance.py): compaction of small files in one commit that keeps every row and its
identity values, expiry of old snapshots that keeps the newest and every snapshot a reader was handed, both under
the dataset's lock (G3), and a trickle of small appends left with a bounded number of snapshots and files."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import LockTimeout
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.lake.maintenance import compact_small_files, expirable, expire_snapshots, reader_pins
from lakehouse_dagster.lake.writer import SOURCE_VERSION
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
IDENTITY = ["__row_index", "__row_id", "__created_at"]


def _dataset(conn, rows: int = 5):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "trickle", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": k, "s": f"r{k}"} for k in range(rows)])
    return d


def _append_and_sync(conn, dsn, catalog, settings, d, n: int = 1):
    lo = conn.execute(
        "select coalesce(max(row_index) + 1, 0) from dataset_rows where dataset_id = %s", (d,)
    ).fetchone()[0]
    datasets.insert_rows(conn, d, [{"n": lo + k, "s": f"r{lo + k}"} for k in range(n)])
    return sync_dataset(dsn, catalog, settings, d)


def _table(catalog, settings, d):
    return catalog.load_table(table_identifier(settings, d))


def _rows(table, snapshot_id=None) -> pa.Table:
    data = table.scan(snapshot_id=snapshot_id).to_arrow()
    return data.sort_by("__row_index").select(["n", "s", *IDENTITY])


def _pg_rows(conn, d) -> list[tuple]:
    return conn.execute(
        "select (data->>'n')::bigint, data->>'s', row_index from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


def _live_files(table) -> list:
    return [t.file for t in table.scan().plan_files()]


def test_small_files_are_compacted_in_one_commit_keeping_every_row_and_its_identity(conn, dsn, settings):
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn)
    sync_dataset(dsn, catalog, settings, d)
    for _ in range(8):  # fewer than the sync's own compaction waits for (16): eight small files stay
        _append_and_sync(conn, dsn, catalog, settings, d)
    table = _table(catalog, settings, d)
    before_rows, before_files = _rows(table), _live_files(table)
    before_snapshots, version = len(table.metadata.snapshots), table.properties[SOURCE_VERSION]
    assert len(before_files) == 9

    done = compact_small_files(conn, catalog, settings, d, min_files=4)
    assert done.skipped is None and done.compacted_files == 9 and done.rows == 13
    table = _table(catalog, settings, d)
    assert len(_live_files(table)) == done.files_after == 1
    assert len(table.metadata.snapshots) == before_snapshots + 1  # one commit
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert _rows(table).equals(before_rows)  # the same rows, the same identity values
    assert table.properties[SOURCE_VERSION] == version  # it covers the same source version
    # the files it replaced are not touched on disk: a reader holding the previous snapshot still reads it
    assert _rows(table, table.current_snapshot().parent_snapshot_id).equals(before_rows)

    # the mirror goes on from the compacted table: Postgres equals Iceberg after more changes
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "edited"}\' where dataset_id = %s and row_index = 2', (d,)
    )
    _append_and_sync(conn, dsn, catalog, settings, d, n=3)
    table = _table(catalog, settings, d)
    got = _rows(table)
    assert list(zip(got["n"].to_pylist(), got["s"].to_pylist(), got["__row_index"].to_pylist())) == _pg_rows(conn, d)
    assert got["__row_id"].to_pylist()[:13] == before_rows["__row_id"].to_pylist()

    assert compact_small_files(conn, catalog, settings, d, min_files=4).skipped.endswith("fewer than 4")


def test_compaction_and_expiry_wait_for_a_sync_holding_the_dataset_lock(conn, dsn, settings):
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn)
    sync_dataset(dsn, catalog, settings, d)
    for _ in range(5):
        _append_and_sync(conn, dsn, catalog, settings, d)
    snapshots = len(_table(catalog, settings, d).metadata.snapshots)
    with connect(dsn) as other, dataset_lock(other, d):  # as a sync of this dataset holds it (G3)
        with pytest.raises(LockTimeout):
            compact_small_files(conn, catalog, settings, d, min_files=2, lock_timeout_s=0.5)
        with pytest.raises(LockTimeout):
            expire_snapshots(conn, catalog, settings, d, older_than_seconds=0, pin_seconds=1, lock_timeout_s=0.5)
        assert len(_table(catalog, settings, d).metadata.snapshots) == snapshots  # nothing committed

        # released while the compaction waits: it then runs, after the lock holder
        done: dict = {}
        waiter = threading.Thread(
            target=lambda: done.update(c=compact_small_files(connect(dsn), catalog, settings, d, min_files=2))
        )
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive() and not done
    waiter.join(30)
    assert done["c"].skipped is None and len(_live_files(_table(catalog, settings, d))) == 1


def test_expiry_keeps_the_newest_and_every_snapshot_a_reader_was_handed(conn, dsn, settings):
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn)
    sync_dataset(dsn, catalog, settings, d)
    handed = conn.execute("select snapshot_id from lakehouse_latest_succeeded_sync(%s)", (d,)).fetchone()[0]
    expected = _rows(_table(catalog, settings, d), handed)  # what a reader handed that snapshot will read
    for _ in range(20):
        _append_and_sync(conn, dsn, catalog, settings, d)
    table = _table(catalog, settings, d)
    assert len(table.metadata.snapshots) >= 21
    assert handed in reader_pins(conn, d, 60)  # superseded a moment ago: a reader may not have loaded it yet

    done = expire_snapshots(conn, catalog, settings, d, keep=16, older_than_seconds=0, pin_seconds=60)
    table = _table(catalog, settings, d)
    live = {s.snapshot_id for s in table.metadata.snapshots}
    assert handed in live and handed not in done.expired  # pinned: older than every kept one, still there
    # nothing else is pinned for long: with a short window only the newest 16 (and the latest sync's) remain
    time.sleep(1.2)
    done = expire_snapshots(conn, catalog, settings, d, keep=16, older_than_seconds=0, pin_seconds=1)
    table = _table(catalog, settings, d)
    assert done.snapshots_after == len(table.metadata.snapshots) == 16
    assert handed in done.expired
    assert table.current_snapshot().snapshot_id in {s.snapshot_id for s in table.metadata.snapshots}
    latest = conn.execute("select snapshot_id from lakehouse_latest_succeeded_sync(%s)", (d,)).fetchone()[0]
    assert latest in {s.snapshot_id for s in table.metadata.snapshots}
    got = _rows(table)
    assert list(zip(got["n"].to_pylist(), got["s"].to_pylist(), got["__row_index"].to_pylist())) == _pg_rows(conn, d)
    assert expected.num_rows == 5
    # young snapshots are never expired, whatever their number
    assert expire_snapshots(conn, catalog, settings, d, keep=16, older_than_seconds=3600).expired == ()


def test_expirable_never_takes_a_pin_a_ref_or_the_newest():
    class Snap:
        def __init__(self, i):
            self.snapshot_id, self.timestamp_ms, self.sequence_number = i, i * 1000, i

    class Ref:
        def __init__(self, i):
            self.snapshot_id = i

    class Meta:
        snapshots = [Snap(i) for i in range(1, 41)]
        refs = {"main": Ref(40), "audit": Ref(3)}

    ids = expirable(Meta, keep=1, older_than_seconds=5, pinned={7}, now_ms=40_000)
    assert ids == [i for i in range(1, 25) if i not in (3, 7)]  # keep raised to 16: 25..40 stay
    assert expirable(Meta, keep=16, older_than_seconds=30, pinned=set(), now_ms=40_000) == [
        i for i in range(1, 10) if i != 3
    ]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_trickle_of_small_appends_stays_within_the_bounds(conn, dsn, settings):
    """A short version of the documented trickle (docs/benchmarks.md, bench/bench_trickle.py): an append and a sync
    per step, maintenance every few steps; the table never holds more than the bounds say."""
    catalog = load_catalog(settings, dsn)
    d = _dataset(conn)
    sync_dataset(dsn, catalog, settings, d)
    most_snapshots = most_files = 0
    for step in range(1, 49):
        _append_and_sync(conn, dsn, catalog, settings, d)
        if step % 8 == 0:
            compact_small_files(conn, catalog, settings, d)
            expire_snapshots(conn, catalog, settings, d, older_than_seconds=0, pin_seconds=1)
            table = _table(catalog, settings, d)
            most_snapshots = max(most_snapshots, len(table.metadata.snapshots))
            most_files = max(most_files, len(_live_files(table)))
    # 16 kept + the syncs of the last pin window (1 s) + the steps since the last maintenance; 16 small files + 1
    assert most_snapshots <= 16 + 8 + 8
    assert most_files <= 17
    got = _rows(_table(catalog, settings, d))
    assert list(zip(got["n"].to_pylist(), got["s"].to_pylist(), got["__row_index"].to_pylist())) == _pg_rows(conn, d)
