"""The mirror (Postgres → Iceberg) on a real Postgres and real Iceberg tables."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
import uuid

import pytest

from lakehouse_dagster.core.errors import BadInput, SyncFailed
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

ALL_TYPES = [
    {"name": "s", "type": "string"},
    {"name": "i", "type": "int64"},
    {"name": "f", "type": "float64"},
    {"name": "b", "type": "boolean"},
    {"name": "ts", "type": "timestamp"},
    {"name": "d", "type": "date"},
    {"name": "j", "type": "json"},
]

ROWS = [
    {
        "s": "plain",
        "i": 1,
        "f": 0.1,
        "b": True,
        "ts": "2024-03-10T12:34:56.123456+02:00",
        "d": "2024-02-29",
        "j": {"b": [1, 2, {"z": None}], "a": "x"},
    },
    {
        "s": "ünïcödé ✓ 🦆 \u4e2d\u6587",
        "i": -9223372036854775808,
        "f": 1e-300,
        "b": False,
        "ts": "1970-01-01T00:00:00Z",
        "d": "1900-01-01",
        "j": [1, "two", 3.5],
    },
    {"s": None, "i": None, "f": None, "b": None, "ts": None, "d": None, "j": None},
    {},  # every key missing
    {
        "s": "",
        "i": 9223372036854775807,
        "f": -0.0,
        "b": True,
        "ts": "2038-01-19T03:14:07.999999-05:30",
        "d": "9999-12-31",
        "j": {"nested": {"deep": {"deeper": [True, False, None]}}},
    },
    {"s": "specials", "i": 0, "f": "NaN", "j": "just a string"},
    {"s": "inf", "f": "Infinity"},
    {"s": "-inf", "f": "-Infinity", "j": 12345678901234567890},
    {"s": "tiny", "f": 5e-324, "j": 1.5},
    {"s": "big", "f": 1.7976931348623157e308, "j": {}},
]


def _table(settings, dsn, ds_id):
    return load_catalog(settings, dsn).load_table(table_identifier(settings, ds_id))


def _make(conn, schema=ALL_TYPES, rows=ROWS, name="d"):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, name, schema)
    datasets.insert_rows(conn, d, rows)
    return d


def _sync(settings, dsn, d, **kw):
    return sync_dataset(dsn, load_catalog(settings, dsn), settings, d, **kw)


def _expected_float(v):
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v, v) if isinstance(v, str) else v


def _ts(v):
    return None if v is None else dt.datetime.fromisoformat(v.replace("Z", "+00:00")).astimezone(dt.UTC)


def test_every_type_round_trips_exactly(conn, dsn, settings):
    d = _make(conn)
    result = _sync(settings, dsn, d)
    assert (result.mode, result.rows, result.total_rows) == ("full", len(ROWS), len(ROWS))
    got = _table(settings, dsn, d).scan().to_arrow().sort_by("__row_index").to_pylist()
    pg_json = {
        r[0]: r[1]
        for r in conn.execute("select row_index, (data->'j')::text from dataset_rows where dataset_id = %s", (d,))
    }
    # jsonb numbers are numeric, which has no negative zero: the source itself holds -0.0 as 0.0
    pg_float = {
        r[0]: r[1] for r in conn.execute("select row_index, data->>'f' from dataset_rows where dataset_id = %s", (d,))
    }
    assert pg_float[4] == "0.0"
    assert [g["__row_index"] for g in got] == list(range(len(ROWS)))
    for g, src in zip(got, ROWS):
        assert g["s"] == src.get("s")
        assert g["i"] == src.get("i")
        f = _expected_float(src.get("f"))
        if isinstance(f, float) and math.isnan(f):
            assert math.isnan(g["f"])
        else:
            f = (
                None
                if f is None
                else _expected_float(
                    float(pg_float[g["__row_index"]]) if not isinstance(f, float) or not math.isinf(f) else f
                )
            )
            assert g["f"] == f and (f is None or math.copysign(1, g["f"]) == math.copysign(1, f))
        assert g["b"] == src.get("b")
        assert g["ts"] == _ts(src.get("ts"))
        assert g["d"] == (None if src.get("d") is None else dt.date.fromisoformat(src["d"]))
        # json: Postgres' jsonb text form, one normal form (keys sorted, canonical spacing)
        expected_json = None if src.get("j") is None else pg_json[g["__row_index"]]
        assert g["j"] == expected_json
        if src.get("j") is not None:
            assert json.loads(g["j"]) == src["j"]
        uuid.UUID(g["__row_id"])
        assert g["__created_at"] is not None
    row = conn.execute("select row_count, status from datasets where id = %s", (d,)).fetchone()
    assert row == (len(ROWS), "ready")
    log = conn.execute(
        "select status, rows, snapshot_id, has_identity, source_version, path from iceberg_sync_log where dataset_id = %s",
        (d,),
    ).fetchall()
    version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    assert log == [("succeeded", len(ROWS), result.snapshot_id, True, version, "mirror")]


def test_second_sync_without_change_commits_nothing(conn, dsn, settings):
    d = _make(conn)
    first = _sync(settings, dsn, d)
    snaps = len(_table(settings, dsn, d).snapshots())
    second = _sync(settings, dsn, d)
    assert second.mode == "noop" and second.snapshot_id == first.snapshot_id
    assert len(_table(settings, dsn, d).snapshots()) == snaps


def test_incremental_appends_only_new_rows_and_full_replaces(conn, dsn, settings):
    schema = [{"name": "n", "type": "int64"}]
    d = _make(conn, schema, [{"n": i} for i in range(100)])
    _sync(settings, dsn, d)
    datasets.insert_rows(conn, d, [{"n": i} for i in range(100, 150)])
    inc = _sync(settings, dsn, d)
    assert (inc.mode, inc.rows, inc.total_rows) == ("incremental", 50, 150)
    t = _table(settings, dsn, d)
    assert t.current_snapshot().summary.operation.value == "append"
    assert sorted(t.scan().to_arrow()["n"].to_pylist()) == list(range(150))
    # an update is not an append: the next sync must rewrite the table
    conn.execute("update dataset_rows set data = '{\"n\": -1}' where dataset_id = %s and row_index = 3", (d,))
    full = _sync(settings, dsn, d)
    assert (full.mode, full.rows, full.total_rows) == ("full", 150, 150)
    values = _table(settings, dsn, d).scan().to_arrow()["n"].to_pylist()
    assert sorted(values) == sorted([-1] + [i for i in range(150) if i != 3])
    # a delete shrinks the mirrored table
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index >= 140", (d,))
    again = _sync(settings, dsn, d)
    assert again.mode == "full" and again.total_rows == 140
    assert _table(settings, dsn, d).scan().to_arrow().num_rows == 140
    assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == 140


def test_schema_evolution_adds_columns_and_keeps_removed_ones(conn, dsn, settings):
    d = _make(
        conn,
        [{"name": "a", "type": "int64"}, {"name": "old", "type": "string"}],
        [{"a": 1, "old": "x"}, {"a": 2, "old": "y"}],
    )
    _sync(settings, dsn, d)
    datasets.set_schema(conn, d, [{"name": "a", "type": "int64"}, {"name": "new", "type": "json"}])
    conn.execute('update dataset_rows set data = data || \'{"new": {"k": 1}}\' where dataset_id = %s', (d,))
    # the rows still hold 'old', which the schema no longer declares: its values would vanish, so refused ...
    with pytest.raises(SyncFailed, match="2 row\\(s\\) of dataset_rows hold 1 key\\(s\\) .*'old' \\(2 rows\\)"):
        _sync(settings, dsn, d)
    # ... until they no longer do (the operator dropped the column on purpose)
    conn.execute("update dataset_rows set data = data - 'old' where dataset_id = %s", (d,))
    result = _sync(settings, dsn, d)
    assert result.mode == "full"
    t = _table(settings, dsn, d)
    names = [f.name for f in t.schema().fields]
    assert names == ["__row_index", "__row_id", "__created_at", "a", "old", "new"]
    assert all(not f.required for f in t.schema().fields if f.name in ("old", "new"))
    rows = t.scan().to_arrow().sort_by("__row_index").to_pylist()
    assert [(r["a"], r["old"], r["new"]) for r in rows] == [(1, None, '{"k": 1}'), (2, None, '{"k": 1}')]


def test_schema_change_alone_triggers_resync(conn, dsn, settings):
    d = _make(conn, [{"name": "a", "type": "int64"}, {"name": "b", "type": "string"}], [{"a": 1, "b": "shown"}])
    _sync(settings, dsn, d)
    datasets.set_schema(
        conn, d, [{"name": "a", "type": "int64"}, {"name": "b", "type": "string"}, {"name": "c", "type": "int64"}]
    )
    result = _sync(settings, dsn, d)
    assert result.mode == "full"
    assert _table(settings, dsn, d).scan().to_arrow()["b"].to_pylist() == ["shown"]


def test_an_undeclared_key_fails_the_sync_naming_it_and_commits_nothing(conn, dsn, settings):
    """Issue 42 item 5: a key the schema does not declare has no Iceberg column; it never vanishes silently."""
    rows = [{"a": 1}, {"a": 2, "hidden": "x"}, {"a": 3, "hidden": "y", "zz": 1}, {"a": 4}]
    d = _make(conn, [{"name": "a", "type": "int64"}], rows)
    with pytest.raises(SyncFailed) as err:
        _sync(settings, dsn, d)
    message = str(err.value)
    assert "\n" not in message and str(d) in message, message
    assert "2 row(s) of dataset_rows hold 2 key(s) its schema does not declare: 'hidden' (2 rows), 'zz' (1 row)" in (
        message
    )
    assert "declare them in datasets.schema, or remove them from the rows" in message
    assert err.value.transient is False  # a retry cannot help
    assert (
        load_catalog(settings, dsn).table_exists(table_identifier(settings, d)) is False
        or _table(settings, dsn, d).current_snapshot() is None
    )
    status, error = conn.execute("select status, error from datasets where id = %s", (d,)).fetchone()
    assert status == "errored" and "'hidden'" in error
    assert list((settings.project.home.parent / "warehouse").rglob("*.parquet")) == []
    # declared: it is mirrored
    datasets.set_schema(conn, d, [{"name": "a", "type": "int64"}, {"name": "hidden", "type": "string"}])
    with pytest.raises(SyncFailed, match="1 row\\(s\\) .* 1 key\\(s\\) .*: 'zz' \\(1 row\\)"):
        _sync(settings, dsn, d)
    conn.execute("update dataset_rows set data = data - 'zz' where dataset_id = %s", (d,))
    assert _sync(settings, dsn, d).total_rows == 4
    assert _table(settings, dsn, d).scan().to_arrow().sort_by("__row_index")["hidden"].to_pylist() == [
        None,
        "x",
        "y",
        None,
    ]


def test_an_undeclared_key_in_an_append_fails_the_incremental_sync_and_keeps_the_snapshot(conn, dsn, settings):
    d = _make(conn, [{"name": "a", "type": "int64"}], [{"a": 1}])
    first = _sync(settings, dsn, d)
    datasets.insert_rows(conn, d, [{"a": 2, "extra": True}])
    with pytest.raises(SyncFailed, match="'extra' \\(1 row\\)"):
        _sync(settings, dsn, d)
    assert _table(settings, dsn, d).current_snapshot().snapshot_id == first.snapshot_id


@pytest.mark.parametrize(
    "schema,bad,message",
    [
        ([{"name": "n", "type": "int64"}], {"n": "12"}, "row_index 2 column n: expected int64, got a JSON string"),
        ([{"name": "n", "type": "int64"}], {"n": 1.5}, "row_index 2 column n: expected int64, got a JSON number"),
        ([{"name": "t", "type": "timestamp"}], {"t": "not a time"}, "row_index 2 column t: expected timestamp"),
        ([{"name": "b", "type": "boolean"}], {"b": 1}, "row_index 2 column b: expected boolean, got a JSON number"),
        ([{"name": "f", "type": "float64"}], {"f": "1.5"}, "row_index 2 column f: expected float64, got a JSON string"),
    ],
)
def test_bad_row_fails_loudly_and_commits_nothing(conn, dsn, settings, schema, bad, message):
    col = schema[0]["name"]
    good = {"int64": 1, "timestamp": "2020-01-01T00:00:00Z", "boolean": True, "float64": 2.5}[schema[0]["type"]]
    d = _make(conn, schema, [{col: good}, {col: good}, bad, {col: good}])
    with pytest.raises(SyncFailed) as err:
        _sync(settings, dsn, d)
    assert message in str(err.value) and str(d) in str(err.value)
    assert (
        load_catalog(settings, dsn).table_exists(table_identifier(settings, d)) is False
        or _table(settings, dsn, d).current_snapshot() is None
    )
    status, error = conn.execute("select status, error from datasets where id = %s", (d,)).fetchone()
    assert status == "errored" and message in error
    log = conn.execute("select status, error, snapshot_id from iceberg_sync_log where dataset_id = %s", (d,)).fetchall()
    assert len(log) == 1 and log[0][0] == "failed" and message in log[0][1] and log[0][2] is None
    files = list((settings.project.home.parent / "warehouse").rglob("*.parquet"))
    assert files == []  # the files written before the failure were removed


def test_bad_row_after_a_good_sync_keeps_the_old_snapshot(conn, dsn, settings):
    d = _make(conn, [{"name": "n", "type": "int64"}], [{"n": 1}])
    first = _sync(settings, dsn, d)
    datasets.insert_rows(conn, d, [{"n": "oops"}])
    with pytest.raises(SyncFailed, match="row_index 1 column n"):
        _sync(settings, dsn, d)
    t = _table(settings, dsn, d)
    assert t.current_snapshot().snapshot_id == first.snapshot_id
    assert t.scan().to_arrow()["n"].to_pylist() == [1]


def test_refusals(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    m = datasets.create_dataset(conn, ws, "m", [], kind="manifest")
    with pytest.raises(BadInput, match="manifest"):
        _sync(settings, dsn, m)
    with pytest.raises(BadInput, match="not a valid UUID"):
        _sync(settings, dsn, "not-a-uuid")
    d = _make(conn, [{"name": "n", "type": "int64"}], [{"n": 1}])
    with pytest.raises(BadInput, match="unknown sync mode"):
        _sync(settings, dsn, d, mode="sideways")
    assert conn.execute("select count(*) from iceberg_sync_log").fetchone()[0] == 0


def test_empty_dataset_syncs_to_an_empty_snapshot(conn, dsn, settings):
    d = _make(conn, [{"name": "n", "type": "int64"}], [])
    result = _sync(settings, dsn, d)
    assert result.total_rows == 0 and result.snapshot_id is not None
    assert _table(settings, dsn, d).scan().to_arrow().num_rows == 0


def test_chunks_bound_file_size(conn, dsn, settings):
    d = _make(conn, [{"name": "n", "type": "int64"}], [{"n": i} for i in range(2500)])
    result = sync_dataset(dsn, load_catalog(settings, dsn), settings.replace(sync={"chunk_rows": 1000}), d)
    assert result.rows == 2500 and result.files >= 3
    t = _table(settings, dsn, d)
    assert len(t.snapshots()) == 1  # many files, one commit
    assert all(task.file.record_count <= 1000 for task in t.scan().plan_files())


KILL_SCRIPT = r"""
import os, sys, time, uuid
import lakehouse_dagster.lake.writer as w
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
orig = w._FileRoller.write
def slow(self, batch):
    orig(self, batch)
    if len(self.paths) >= 2:
        print("WROTE", flush=True)
        time.sleep(600)
w._FileRoller.write = slow
s = Settings.from_env().replace(sync={"chunk_rows": 500})
sync_dataset(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, sys.argv[1], readers=1)
"""


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_killed_sync_leaves_no_partial_snapshot_and_next_sync_succeeds(conn, dsn, settings, tmp_path):
    d = _make(conn, [{"name": "n", "type": "int64"}], [{"n": i} for i in range(5000)])
    first = _sync(settings, dsn, d)
    conn.execute("update dataset_rows set data = '{\"n\": -5}' where dataset_id = %s and row_index = 0", (d,))
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(d)], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        line = proc.stdout.readline()
        assert "WROTE" in line, "the child never reached the middle of its sync"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    t = _table(settings, dsn, d)
    assert t.current_snapshot().snapshot_id == first.snapshot_id  # no partial snapshot
    assert (
        conn.execute(
            "select count(*) from iceberg_sync_log where dataset_id = %s and status = 'running'", (d,)
        ).fetchone()[0]
        == 1
    )
    result = _sync(settings, dsn, d)
    assert result.mode == "full" and result.total_rows == 5000
    statuses = dict(
        conn.execute("select status, count(*) from iceberg_sync_log where dataset_id = %s group by 1", (d,)).fetchall()
    )
    assert statuses == {"succeeded": 2, "failed": 1}
    t = t.refresh()
    assert sorted(t.scan().to_arrow()["n"].to_pylist())[0] == -5
    # the dead sync's files are gone: only files referenced by the table remain in data/
    referenced = {task.file.file_path.split("/")[-1] for task in t.scan().plan_files()}
    data_dir = [p for p in (settings.project.home.parent / "warehouse").rglob("*.parquet")]
    on_disk = {p.name for p in data_dir}
    first_files = {f for f in on_disk if str(first.sync_id) in f}
    assert on_disk - first_files == referenced


def test_writers_racing_to_create_the_namespace_all_succeed(dsn, settings):
    """Found by the ingest bench: the SqlCatalog's check-then-insert lets a loser fail on the primary key."""
    import threading

    from lakehouse_dagster.lake.catalog import ensure_namespace

    catalogs = [load_catalog(settings.replace(catalog={"namespace": f"race{i}"}), dsn) for i in range(8)]
    for round_ in range(5):  # the window is small: several rounds, 8 writers released together each time
        barrier, errors = threading.Barrier(8), []

        def create(catalog, ns=f"race_ns_{round_}"):
            barrier.wait()
            try:
                ensure_namespace(catalog, ns)
            except Exception as exc:  # noqa: BLE001 - the assertion below names it
                errors.append(exc)

        threads = [threading.Thread(target=create, args=(c,)) for c in catalogs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert catalogs[0].namespace_exists(f"race_ns_{round_}")
