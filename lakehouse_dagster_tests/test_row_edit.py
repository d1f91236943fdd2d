"""row.edit partial rewrites: a sync after a small update/delete/insert-below-max replaces only the Iceberg
data files whose __row_index range holds changed rows, in one snapshot, fail-loud and exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster.tracking.row_changes import file_ranges

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
ROWS = 1000
CHUNK = 100  # 10 data files of 100 rows each


@pytest.fixture
def small(settings):
    return settings.replace(sync={"chunk_rows": CHUNK})


def _make(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "edit", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i, "s": f"row-{i}"} for i in range(ROWS)])
    return d


def _sync(settings, dsn, d, **kw):
    return sync_dataset(dsn, load_catalog(settings, dsn), settings, d, **kw)


def _table(settings, dsn, d):
    return load_catalog(settings, dsn).load_table(table_identifier(settings, d))


def _ranges(table) -> dict[str, tuple[int, int]]:
    return {f.file_path: (lo, hi) for f, lo, hi in file_ranges(table)}


def _assert_equal(conn, settings, dsn, d):
    """Iceberg holds exactly Postgres' rows, and the canary (maintained sums, then a full digest) says ok."""
    pg = conn.execute(
        "select row_index, (data->>'n')::bigint, data->>'s' from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()
    t = _table(settings, dsn, d).scan(selected_fields=("__row_index", "n", "s")).to_arrow().sort_by("__row_index")
    assert list(zip(t["__row_index"].to_pylist(), t["n"].to_pylist(), t["s"].to_pylist())) == [tuple(r) for r in pg]
    catalog = load_catalog(settings, dsn)
    assert canary.evaluate(dsn, catalog, settings, d, smoke=True).verdict == "ok"
    assert canary.evaluate(dsn, catalog, settings, d, full=True).verdict == "ok"
    assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == len(pg)


def _changes(table, before: dict) -> tuple[set, set]:
    after = _ranges(table)
    return set(before) - set(after), set(after) - set(before)


def _touching(ranges: dict, *row_indexes) -> set:
    return {p for p, (lo, hi) in ranges.items() if any(lo <= i <= hi for i in row_indexes)}


def test_full_sync_writes_files_of_disjoint_row_index_ranges(conn, dsn, small):
    d = _make(conn)
    first = _sync(small, dsn, d)
    assert first.mode == "full" and first.files == ROWS // CHUNK
    spans = sorted(_ranges(_table(small, dsn, d)).values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # two readers, still one range per file
    assert sum(hi - lo + 1 for lo, hi in spans) == ROWS


@pytest.mark.parametrize(
    "edit, rows",
    [
        (
            'update dataset_rows set data = \'{"n": -1, "s": "edited"}\' where dataset_id = %s and row_index in (250, 251)',
            (250, 251),
        ),
        ("delete from dataset_rows where dataset_id = %s and row_index between 640 and 645", (640, 645)),
    ],
)
def test_update_or_delete_rewrites_only_the_touched_file(conn, dsn, small, edit, rows):
    d = _make(conn)
    _sync(small, dsn, d)
    before = _ranges(_table(small, dsn, d))
    conn.execute(edit, (d,))
    result = _sync(small, dsn, d)
    assert result.mode == "partial", result.reason
    table = _table(small, dsn, d)
    deleted, added = _changes(table, before)
    assert deleted == _touching(before, *rows) and len(deleted) == 1
    assert len(added) == 1
    summary = table.current_snapshot().summary
    assert summary["deleted-data-files"] == "1" and summary["added-data-files"] == "1"
    assert (
        conn.execute("select mode from iceberg_sync_log where sync_id = %s", (result.sync_id,)).fetchone()[0]
        == "partial"
    )
    _assert_equal(conn, small, dsn, d)


def test_insert_below_max_and_append_in_one_partial_sync(conn, dsn, small):
    d = _make(conn)
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 420", (d,))
    _sync(small, dsn, d)
    before = _ranges(_table(small, dsn, d))
    datasets.insert_rows(conn, d, [{"n": 4200, "s": "back"}], start_index=420)  # below the max: a rewrite
    datasets.insert_rows(conn, d, [{"n": 5000 + i, "s": "tail"} for i in range(30)])  # a pure append
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "x"}\' where dataset_id = %s and row_index = 910', (d,)
    )
    result = _sync(small, dsn, d)
    assert result.mode == "partial", result.reason
    deleted, added = _changes(_table(small, dsn, d), before)
    assert deleted == _touching(before, 420, 910) and len(deleted) == 2
    assert result.total_rows == ROWS + 30
    _assert_equal(conn, small, dsn, d)
    # the records are pruned once mirrored; the next edit is partial again
    assert conn.execute("select count(*) from lakehouse_row_changes where dataset_id = %s", (d,)).fetchone()[0] == 0
    conn.execute('update dataset_rows set data = data || \'{"s": "y"}\' where dataset_id = %s and row_index = 5', (d,))
    assert _sync(small, dsn, d).mode == "partial"
    _assert_equal(conn, small, dsn, d)


def test_large_change_truncate_or_unknown_history_go_full(conn, dsn, small):
    d = _make(conn)
    _sync(small, dsn, d)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "big"}\' where dataset_id = %s and row_index < 400', (d,)
    )
    big = _sync(small, dsn, d)
    assert big.mode == "full" and "over 25%" in big.reason
    _assert_equal(conn, small, dsn, d)

    conn.execute(
        'update dataset_rows set data = data || \'{"s": "one"}\' where dataset_id = %s and row_index = 3', (d,)
    )
    conn.execute("delete from lakehouse_row_changes where dataset_id = %s", (d,))  # a link of the chain missing
    unknown = _sync(small, dsn, d)
    assert unknown.mode == "full" and "not known" in unknown.reason
    _assert_equal(conn, small, dsn, d)

    conn.execute("truncate dataset_rows")
    datasets.insert_rows(conn, d, [{"n": i, "s": "again"} for i in range(50)])
    truncated = _sync(small, dsn, d)
    assert truncated.mode == "full" and truncated.total_rows == 50
    _assert_equal(conn, small, dsn, d)


KILL_BEFORE_COMMIT = r"""
import sys
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
s = Settings.from_env().replace(sync={"chunk_rows": 100})
sync_dataset(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, sys.argv[1])
"""


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_kill_before_commit_leaves_nothing_visible_and_the_next_sync_converges(conn, dsn, small, tmp_path):
    d = _make(conn)
    first = _sync(small, dsn, d)
    conn.execute('update dataset_rows set data = data || \'{"s": "k"}\' where dataset_id = %s and row_index = 77', (d,))
    env = dict(os.environ, LAKEHOUSE_FAILPOINT="before-commit")
    proc = subprocess.run(
        [sys.executable, "-c", KILL_BEFORE_COMMIT, str(d)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    table = _table(small, dsn, d)
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # nothing visible
    on_disk = {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")}
    assert len(on_disk) > first.files  # the dead sync's new file is on disk, unreferenced
    result = _sync(small, dsn, d)
    assert result.mode == "partial", result.reason
    _assert_equal(conn, small, dsn, d)
    referenced = {task.file.file_path.rsplit("/", 1)[-1] for task in _table(small, dsn, d).scan().plan_files()}
    dead = {
        n
        for n in {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")} - referenced
        if str(first.sync_id) not in n and str(result.sync_id) not in n
    }
    assert not dead  # the killed sync's files were settled


def test_retried_sync_with_the_same_sync_id_is_a_noop(conn, dsn, small):
    d = _make(conn)
    _sync(small, dsn, d)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "r"}\' where dataset_id = %s and row_index = 500', (d,)
    )
    sync_id = uuid.uuid4()
    first = _sync(small, dsn, d, sync_id=sync_id)
    assert first.mode == "partial"
    snapshots = len(_table(small, dsn, d).snapshots())
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "r2"}\' where dataset_id = %s and row_index = 501', (d,)
    )
    retry = _sync(small, dsn, d, sync_id=sync_id)
    assert retry.mode == "noop" and retry.snapshot_id == first.snapshot_id
    assert len(_table(small, dsn, d).snapshots()) == snapshots
    assert _sync(small, dsn, d).mode == "partial"  # a new sync id catches up with the newer edit
    _assert_equal(conn, small, dsn, d)


def test_files_without_row_index_bounds_go_full(conn, dsn, small):
    d = _make(conn)
    _sync(small, dsn, d)
    with _table(small, dsn, d).transaction() as tx:  # files written from now on carry no column bounds
        tx.set_properties({"write.metadata.metrics.default": "counts"})
    conn.execute('update dataset_rows set data = data || \'{"s": "a"}\' where dataset_id = %s and row_index = 10', (d,))
    assert _sync(small, dsn, d).mode == "partial"  # the old files' bounds are enough to plan it
    conn.execute('update dataset_rows set data = data || \'{"s": "b"}\' where dataset_id = %s and row_index = 11', (d,))
    result = _sync(small, dsn, d)
    assert result.mode == "full" and "no __row_index bounds" in result.reason
    _assert_equal(conn, small, dsn, d)


def test_a_partial_commit_planned_on_a_stale_snapshot_commits_nothing(conn, dsn, small, tmp_path):
    import pyarrow as pa
    from pyiceberg.exceptions import ValidationException

    from lakehouse_dagster.lake.schema import arrow_schema
    from lakehouse_dagster.lake.writer import TableWrite
    from lakehouse_dagster.parity.write_digests import write_digested

    d = _make(conn)
    _sync(small, dsn, d)
    table = _table(small, dsn, d)
    stale = next(f for f, lo, hi in file_ranges(table) if lo <= 0 <= hi)
    conn.execute('update dataset_rows set data = data || \'{"s": "z"}\' where dataset_id = %s and row_index = 0', (d,))
    assert _sync(small, dsn, d).mode == "partial"  # rewrites the file holding row 0: `stale` is gone now
    before = _table(small, dsn, d).current_snapshot().snapshot_id
    on_disk = {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")}
    dataset = datasets.get_dataset(conn, d)
    batch = pa.RecordBatch.from_pylist(
        [{"__row_index": 0, "__row_id": str(uuid.uuid4()), "__created_at": None, "n": 0, "s": "again"}],
        schema=arrow_schema(dataset.columns),
    )
    with pytest.raises(ValidationException, match="stale snapshot"):
        write_digested(
            load_catalog(small, dsn),
            small,
            dataset,
            [batch],
            TableWrite("partial", uuid.uuid4(), 0, delete_files=[stale]),
        )
    assert _table(small, dsn, d).current_snapshot().snapshot_id == before
    assert {p.name for p in (tmp_path / "warehouse").rglob("*.parquet")} == on_disk  # its file was deleted


def test_an_update_that_moves_a_row_index_rewrites_its_old_file_and_appends_it(conn, dsn, small):
    d = _make(conn)
    _sync(small, dsn, d)
    before = _ranges(_table(small, dsn, d))
    conn.execute("update dataset_rows set row_index = 5000 where dataset_id = %s and row_index = 333", (d,))
    result = _sync(small, dsn, d)
    assert result.mode == "partial", result.reason
    deleted, added = _changes(_table(small, dsn, d), before)
    assert deleted == _touching(before, 333) and len(added) == 2  # the file without it, and the moved row
    _assert_equal(conn, small, dsn, d)
