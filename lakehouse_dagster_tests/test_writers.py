"""Source writers: every writer in both modes against files, postgres and cdc sources; same content on the pg
path + mirror as on the native path; cursor and data advance together (also across a SIGKILL); bad values
fail loudly with nothing committed; locked writers and bad specs are refused."""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import Backpressure, SyncFailed
from lakehouse_dagster.core.guards import admission_slot, dataset_lock
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.sources.writers import pending_source_changes, run_writer
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster.tracking.ingest_state import STATE_PROPERTY

SCHEMA = [
    {"name": "name", "type": "string"},
    {"name": "n", "type": "int64"},
    {"name": "x", "type": "float64"},
    {"name": "ok", "type": "boolean"},
    {"name": "at", "type": "timestamp"},
    {"name": "day", "type": "date"},
    {"name": "meta", "type": "json"},
]
CONTENT = [c["name"] for c in SCHEMA]
SPECIAL = [math.nan, math.inf, -math.inf]


def _records(start: int, count: int) -> list[dict]:
    """Awkward values: unicode, NaN/±Infinity, nulls, pre-1970 and offset timestamps, nested json whose keys
    are not in jsonb order, numbers with trailing zeros."""
    out = []
    for i in range(start, start + count):
        out.append(
            {
                "name": None if i % 7 == 3 else f'ünï {i} ✓ "q"\\',
                "n": i * 1000 - 5,
                "x": SPECIAL[i % 3] if i % 5 == 1 else (None if i % 5 == 2 else i / 8),
                "ok": None if i % 6 == 0 else i % 2 == 0,
                "at": f"19{60 + i % 30}-03-04T05:06:07.{i:06d}+02:00",
                "day": f"2000-01-{1 + i % 28:02d}",
                "meta": None if i % 4 == 0 else {"zeta": i, "a": [1, None, "x"], "bb": {"y": 1.50, "k": True}},
            }
        )
    return out


def _arrow(records: list[dict]) -> pa.Table:
    """The records as a typed Arrow table (Parquet): json as JSON text, timestamps typed."""
    import datetime as dt

    cols = {
        "name": pa.array([r["name"] for r in records], pa.string()),
        "n": pa.array([r["n"] for r in records], pa.int64()),
        "x": pa.array([r["x"] for r in records], pa.float64()),
        "ok": pa.array([r["ok"] for r in records], pa.bool_()),
        "at": pa.array([dt.datetime.fromisoformat(r["at"]) for r in records], pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date.fromisoformat(r["day"]) for r in records], pa.date32()),
        "meta": pa.array([None if r["meta"] is None else json.dumps(r["meta"]) for r in records], pa.string()),
    }
    return pa.table(cols)


def _json_line(r: dict) -> str:
    def enc(v):
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    return json.dumps({k: enc(v) for k, v in r.items()})


def write_source_file(path: Path, fmt: str, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(_arrow(records), path)
    elif fmt == "ndjson":
        path.write_text("".join(_json_line(r) + "\n" for r in records))
    else:
        texts = {
            c: [
                None
                if v is None
                else (
                    str(v).lower()
                    if isinstance(v, bool)
                    else (
                        "NaN"
                        if isinstance(v, float) and math.isnan(v)
                        else ("Infinity" if v == math.inf else "-Infinity" if v == -math.inf else str(v))
                    )
                )
                for v in (r[c] for r in records)
            ]
            for c in CONTENT
        }
        texts["at"] = [r["at"] for r in records]
        texts["meta"] = [None if r["meta"] is None else json.dumps(r["meta"]) for r in records]
        pacsv.write_csv(pa.table({c: pa.array(v, pa.string()) for c, v in texts.items()}), path)
    return path


@pytest.fixture
def catalog(settings, dsn):
    return load_catalog(settings, dsn)


@pytest.fixture
def workspace(conn):
    return datasets.create_workspace(conn, "w")


def _dataset(conn, ws, name="src", schema=SCHEMA):
    return datasets.create_dataset(conn, ws, name, schema)


def native(conn, d, writer):
    """The writer flipped to iceberg_native for one dataset, its readers on Iceberg first (prerequisite #1: the
    write router refuses a native write while a reader Iceberg can serve is still on Postgres)."""
    for r in SERVABLE_READERS:
        set_override(conn, "read", r.name, "iceberg", dataset=d, note="fase1", actor="t")
    set_override(conn, "write", writer, "iceberg_native", dataset=d, note="test", actor="t")


def canary_ok(conn, dsn, catalog, settings, d) -> None:
    """The runbook's parity gate before a dataset holding Postgres rows is flipped (the write router asks it)."""
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary

    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]


def ingest(dsn, catalog, settings, conn, d, writer, **kw):
    return run_writer(dsn, catalog, settings, FlagResolver(conn, 0), d, writer, **kw)


def table_rows(catalog, settings, d) -> list[dict]:
    table = load_table_or_none(catalog, table_identifier(settings, d))
    if table is None or table.current_snapshot() is None:
        return []
    got = table.scan().to_arrow().sort_by("__row_index").to_pylist()
    return got


def content(rows: list[dict]) -> list[tuple]:
    """__row_index + the content columns, with NaN made comparable."""

    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    return [tuple(norm(r.get(c)) for c in ["__row_index", *CONTENT]) for r in rows]


def pg_count(conn, d) -> int:
    return conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]


# --- files: both paths give the same table --------------------------------------------------------------


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
@pytest.mark.parametrize("fmt", ["parquet", "csv", "ndjson"])
def test_files_pg_path_plus_mirror_equals_native_path(conn, dsn, catalog, settings, workspace, tmp_path, fmt):
    src = tmp_path / "src"
    write_source_file(src / f"a.{fmt}", fmt, _records(0, 40))
    write_source_file(src / f"b.{fmt}", fmt, _records(40, 25))
    via_pg, via_native = _dataset(conn, workspace, "pg"), _dataset(conn, workspace, "native")
    for d in (via_pg, via_native):
        set_source(conn, d, {"type": "files", "uri": str(src / f"*.{fmt}"), "format": fmt})
    native(conn, via_native, "sync.append")

    r_pg = ingest(dsn, catalog, settings, conn, via_pg, "sync.append")
    assert (r_pg.path, r_pg.rows, r_pg.snapshot_id, r_pg.total_rows) == ("pg", 65, None, 65)
    assert pg_count(conn, via_pg) == 65 and load_table_or_none(catalog, table_identifier(settings, via_pg)) is None
    sync_dataset(dsn, catalog, settings, via_pg)

    r_native = ingest(dsn, catalog, settings, conn, via_native, "sync.append")
    assert (r_native.path, r_native.rows, r_native.total_rows) == ("native", 65, 65) and r_native.snapshot_id
    assert pg_count(conn, via_native) == 0  # dataset_rows untouched
    log = conn.execute(
        "select path, status, rows, snapshot_id from iceberg_sync_log where dataset_id = %s", (via_native,)
    ).fetchall()
    assert log == [("native", "succeeded", 65, r_native.snapshot_id)]
    assert conn.execute("select row_count from datasets where id = %s", (via_native,)).fetchone()[0] == 65

    a, b = table_rows(catalog, settings, via_pg), table_rows(catalog, settings, via_native)
    assert len(a) == 65 and content(a) == content(b)
    assert [r["__row_index"] for r in b] == list(range(65))
    assert len({r["__row_id"] for r in b}) == 65 and all(uuid.UUID(r["__row_id"]).version == 4 for r in b)
    meta = next(r["meta"] for r in b if r["meta"] is not None)
    assert meta == '{"a": [1, null, "x"], "bb": {"k": true, "y": 1.5}, "zeta": 1}'  # jsonb's own text form


@pytest.mark.parametrize("mode", ["pg", "native"])
def test_files_append_takes_only_unseen_files_and_full_replaces(
    conn, dsn, catalog, settings, workspace, tmp_path, mode
):
    src = tmp_path / "src"
    d = _dataset(conn, workspace)
    write_source_file(src / "a.parquet", "parquet", _records(0, 10))
    set_source(conn, d, {"type": "files", "uri": str(src), "format": "parquet"})
    if mode == "native":
        native(conn, d, "sync.append")
        native(conn, d, "sync.full")

    def rows_now():
        if mode == "native":
            return content(table_rows(catalog, settings, d))
        sync_dataset(dsn, catalog, settings, d)
        return content(table_rows(catalog, settings, d))

    assert pending_source_changes(dsn, settings, d).startswith("files:1:")
    first = ingest(dsn, catalog, settings, conn, d, "sync.append")
    assert (first.path, first.rows, first.cursor) == (mode, 10, {"files": 1})
    assert pending_source_changes(dsn, settings, d) is None
    again = ingest(dsn, catalog, settings, conn, d, "sync.append")
    assert (again.new, again.rows) == (False, 0)  # nothing new: nothing written
    write_source_file(src / "b.parquet", "parquet", _records(10, 5))
    token = pending_source_changes(dsn, settings, d)
    assert token.startswith("files:1:") and token == pending_source_changes(dsn, settings, d)  # stable
    second = ingest(dsn, catalog, settings, conn, d, "sync.append")
    assert (second.rows, second.total_rows, second.cursor) == (5, 15, {"files": 2})
    got = rows_now()
    assert [r[0] for r in got] == list(range(15)) and [r[2] for r in got] == [r["n"] for r in _records(0, 15)]
    # a file rewritten in place (new size/mtime) is new again; sync.full re-reads everything, from row 0
    time.sleep(0.01)
    write_source_file(src / "a.parquet", "parquet", _records(100, 3))
    full = ingest(dsn, catalog, settings, conn, d, "sync.full")
    assert (full.rows, full.total_rows) == (8, 8)
    got = rows_now()
    assert [r[0] for r in got] == list(range(8))
    assert [r[2] for r in got] == [r["n"] for r in _records(100, 3) + _records(10, 5)]
    assert pending_source_changes(dsn, settings, d) is None


# --- postgres and cdc sources ---------------------------------------------------------------------------


def _source_table(conn, name="public.src_events"):
    conn.execute(f"""create table {name} (id bigint primary key, name text, n bigint, x numeric, ok boolean,
                     at timestamptz, day date, meta jsonb, extra text)""")


def _insert_source(conn, start, count, name="public.src_events"):
    for r in _records(start, count):
        x = r["x"]
        conn.execute(
            f"insert into {name} values (%s, %s, %s, %s, %s, %s, %s, %s, 'ignored')",
            (
                r["n"],
                r["name"],
                r["n"],
                None if x is None or not math.isfinite(x) else x,
                r["ok"],
                r["at"],
                r["day"],
                None if r["meta"] is None else json.dumps(r["meta"]),
            ),
        )


def _mirror_or_table(dsn, catalog, settings, d, mode):
    if mode == "pg":
        sync_dataset(dsn, catalog, settings, d)
    return table_rows(catalog, settings, d)


@pytest.mark.parametrize("mode", ["pg", "native"])
def test_postgres_incremental_advances_the_cursor_with_the_rows(conn, dsn, catalog, settings, workspace, mode):
    _source_table(conn)
    _insert_source(conn, 0, 12)
    d = _dataset(conn, workspace)
    spec = set_source(conn, d, {"type": "postgres", "table": "public.src_events", "cursor_column": "id"})
    assert spec.default_writer == "sync.incremental"
    if mode == "native":
        native(conn, d, "sync.incremental")
    r1 = ingest(dsn, catalog, settings, conn, d, "sync.incremental")
    assert (r1.path, r1.rows, r1.cursor) == (mode, 12, _records(11, 1)[0]["n"])
    assert pending_source_changes(dsn, settings, d) is None
    _insert_source(conn, 12, 4)
    assert pending_source_changes(dsn, settings, d) == f"mark:{_records(15, 1)[0]['n']}"
    r2 = ingest(dsn, catalog, settings, conn, d, "sync.incremental")
    assert (r2.rows, r2.total_rows, r2.cursor) == (4, 16, _records(15, 1)[0]["n"])
    assert not ingest(dsn, catalog, settings, conn, d, "sync.incremental").new
    rows = _mirror_or_table(dsn, catalog, settings, d, mode)
    assert [r["n"] for r in rows] == [r["n"] for r in _records(0, 16)]
    assert [r["__row_index"] for r in rows] == list(range(16))


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_cursor_is_one_truth_across_a_flip_and_back(conn, dsn, catalog, settings, workspace):
    _source_table(conn)
    _insert_source(conn, 0, 5)
    d = _dataset(conn, workspace)
    set_source(conn, d, {"type": "postgres", "table": "public.src_events", "cursor_column": "id"})
    assert ingest(dsn, catalog, settings, conn, d, "sync.incremental").path == "pg"
    sync_dataset(dsn, catalog, settings, d)  # caught up, as a flip requires
    canary_ok(conn, dsn, catalog, settings, d)  # and parity ok at that version
    native(conn, d, "sync.incremental")
    _insert_source(conn, 5, 3)
    r = ingest(dsn, catalog, settings, conn, d, "sync.incremental")
    assert (r.path, r.rows) == ("native", 3)  # continued from the pg path's cursor: no re-ingest, no skip
    set_override(conn, "write", "sync.incremental", "pg", dataset=d, note="rollback", actor="t")
    _insert_source(conn, 8, 2)
    back = ingest(dsn, catalog, settings, conn, d, "sync.incremental")
    assert (back.path, back.rows) == ("pg", 2)  # continued from the native cursor
    # identity never collides: the pg rows continue after the Iceberg-only rows 5..7
    assert [
        i for (i,) in conn.execute("select row_index from dataset_rows where dataset_id = %s order by 1", (d,))
    ] == [0, 1, 2, 3, 4, 8, 9]
    assert [x["__row_index"] for x in table_rows(catalog, settings, d)] == list(range(8))


@pytest.mark.parametrize("mode", ["pg", "native"])
def test_cdc_append_takes_changes_past_the_position_as_rows(conn, dsn, catalog, settings, workspace, mode):
    conn.execute("create table public.changes (lsn bigint primary key, op text, name text, n bigint)")
    conn.execute("insert into public.changes values (10, 'I', 'a', 1), (20, 'U', 'a', 2), (30, 'D', 'a', null)")
    d = _dataset(
        conn,
        workspace,
        "cdc",
        [
            {"name": "lsn", "type": "int64"},
            {"name": "op", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "n", "type": "int64"},
        ],
    )
    spec = set_source(conn, d, {"type": "cdc", "table": "public.changes", "position_column": "lsn", "op_column": "op"})
    assert spec.default_writer == "cdc.append"
    if mode == "native":
        native(conn, d, "cdc.append")
    r1 = ingest(dsn, catalog, settings, conn, d, "cdc.append")
    assert (r1.rows, r1.cursor) == (3, 30)
    conn.execute("insert into public.changes values (40, 'I', 'b', 7)")
    assert pending_source_changes(dsn, settings, d) == "mark:40"
    r2 = ingest(dsn, catalog, settings, conn, d, "cdc.append")
    assert (r2.rows, r2.total_rows, r2.cursor) == (1, 4, 40)
    rows = _mirror_or_table(dsn, catalog, settings, d, mode)
    assert [(r["lsn"], r["op"], r["n"]) for r in rows] == [(10, "I", 1), (20, "U", 2), (30, "D", None), (40, "I", 7)]


def test_postgres_source_pg_and_native_paths_agree(conn, dsn, catalog, settings, workspace):
    _source_table(conn)
    _insert_source(conn, 0, 30)
    a, b = _dataset(conn, workspace, "a"), _dataset(conn, workspace, "b")
    for d in (a, b):
        set_source(conn, d, {"type": "postgres", "query": "select * from public.src_events where id > 0"})
    native(conn, b, "sync.full")
    assert ingest(dsn, catalog, settings, conn, a, "sync.full").path == "pg"
    sync_dataset(dsn, catalog, settings, a)
    assert ingest(dsn, catalog, settings, conn, b, "sync.full").path == "native"
    ra, rb = table_rows(catalog, settings, a), table_rows(catalog, settings, b)
    assert len(ra) == 29 and content(ra) == content(rb)


# --- fail loud ------------------------------------------------------------------------------------------


def _everything(conn, catalog, settings, d):
    table = load_table_or_none(catalog, table_identifier(settings, d))
    return (
        conn.execute("select row_index, data from dataset_rows where dataset_id = %s order by 1", (d,)).fetchall(),
        conn.execute("select seq, state from lakehouse_source_state where dataset_id = %s", (d,)).fetchall(),
        None if table is None else [s.snapshot_id for s in table.snapshots()],
        None if table is None else table.properties.get(STATE_PROPERTY),
    )


@pytest.mark.parametrize("mode", ["pg", "native"])
@pytest.mark.parametrize("fmt", ["parquet", "csv", "ndjson"])
def test_bad_value_fails_loudly_naming_where_and_commits_nothing(
    conn, dsn, catalog, settings, workspace, tmp_path, mode, fmt
):
    src = tmp_path / "src"
    d = _dataset(conn, workspace)
    write_source_file(src / f"a.{fmt}", fmt, _records(0, 5))
    set_source(conn, d, {"type": "files", "uri": str(src), "format": fmt})
    if mode == "native":
        native(conn, d, "sync.append")
    ingest(dsn, catalog, settings, conn, d, "sync.append")
    before = _everything(conn, catalog, settings, d)
    bad = src / f"b.{fmt}"
    if fmt == "parquet":  # a float where the dataset declares int64
        t = _arrow(_records(5, 4))
        t = t.set_column(t.schema.get_field_index("n"), "n", pa.array([1.0, 2.0, 3.25, 4.0]))
        pq.write_table(t, bad)
        where, got = "row 1", "a double value"
    elif fmt == "csv":
        write_source_file(bad, "csv", _records(5, 4))
        bad.write_text(bad.read_text().replace("7995", "SECRET-79"))
        where, got = "row 4", "text that is not an integer"
    else:
        lines = [_json_line(r) for r in _records(5, 4)]
        lines[2] = lines[2].replace('"n": 6995', '"n": "SECRET-6995"')
        bad.write_text("\n".join(lines) + "\n")
        where, got = "line 3", "a JSON string"
    with pytest.raises(SyncFailed) as info:
        ingest(dsn, catalog, settings, conn, d, "sync.append")
    message = str(info.value)
    assert f"{d}" in message and f"file {bad} {where} column n: expected int64, got {got}" in message
    assert "SECRET" not in message and "3.25" not in message
    assert _everything(conn, catalog, settings, d) == before  # nothing committed, neither Postgres nor Iceberg
    status, error = conn.execute("select status, error from datasets where id = %s", (d,)).fetchone()
    assert status == "errored" and "column n" in error
    if mode == "native":
        # the good ingest succeeded, the bad one is recorded failed with the same one-line reason
        log = conn.execute(
            "select status, error from iceberg_sync_log where dataset_id = %s order by started_at", (d,)
        ).fetchall()
        assert [x[0] for x in log] == ["succeeded", "failed"] and "column n: expected int64" in log[1][1]
        files = [p.name for p in Path(settings.catalog.warehouse.removeprefix("file://")).rglob("*.parquet")]
        assert len(files) == 1  # the failed attempt's files were removed


def test_postgres_bad_value_names_table_and_cursor(conn, dsn, catalog, settings, workspace):
    conn.execute("create table public.s (id int primary key, n text)")
    conn.execute("insert into public.s values (1, '5'), (2, '6.5'), (3, '7')")
    d = _dataset(conn, workspace, "p", [{"name": "n", "type": "int64"}])
    set_source(conn, d, {"type": "postgres", "table": "public.s", "cursor_column": "id"})
    native(conn, d, "sync.incremental")
    with pytest.raises(SyncFailed, match=r"postgres table public.s row 2 at id=2 column n: expected int64") as info:
        ingest(dsn, catalog, settings, conn, d, "sync.incremental")
    assert "6.5" not in str(info.value)
    assert table_rows(catalog, settings, d) == [] and pg_count(conn, d) == 0


# --- every writer, both modes, each source type ---------------------------------------------------------

CASES = [
    ("files", "sync.full"),
    ("files", "sync.append"),
    ("postgres", "sync.full"),
    ("postgres", "sync.append"),
    ("postgres", "sync.incremental"),
    ("cdc", "sync.full"),
    ("cdc", "cdc.append"),
]


@pytest.mark.parametrize("mode", ["pg", "native"])
@pytest.mark.parametrize("source,writer", CASES)
def test_every_writer_in_both_modes(conn, dsn, catalog, settings, workspace, tmp_path, source, writer, mode):
    schema = [{"name": "pos", "type": "int64"}, {"name": "op", "type": "string"}, {"name": "n", "type": "int64"}]
    d = _dataset(conn, workspace, "w", schema)

    def add(lo, hi):
        if source == "files":
            pq.write_table(
                pa.table({"pos": list(range(lo, hi)), "op": ["I"] * (hi - lo), "n": list(range(lo, hi))}),
                tmp_path / "src" / f"part-{lo:04d}.parquet",
            )
        else:
            conn.execute(
                "insert into public.feed select g, 'I', g from generate_series(%s::bigint, %s::bigint) g", (lo, hi - 1)
            )

    if source == "files":
        (tmp_path / "src").mkdir()
        add(0, 6)
        spec = {"type": "files", "uri": str(tmp_path / "src" / "*.parquet")}
    else:
        conn.execute("create table public.feed (pos bigint primary key, op text, n bigint)")
        add(0, 6)
        spec = (
            {"type": "cdc", "table": "public.feed", "position_column": "pos", "op_column": "op"}
            if source == "cdc"
            else {"type": "postgres", "table": "public.feed", "cursor_column": "pos"}
        )
    set_source(conn, d, spec)
    if mode == "native":
        native(conn, d, writer)
    first = ingest(dsn, catalog, settings, conn, d, writer)
    add(6, 9)
    second = ingest(dsn, catalog, settings, conn, d, writer)
    assert (first.path, second.path) == (mode, mode)
    assert (first.rows, second.rows) == ((6, 9) if writer == "sync.full" else (6, 3))
    assert second.total_rows == 9 and second.sync_id and (second.snapshot_id is not None) == (mode == "native")
    if mode == "pg":
        assert pg_count(conn, d) == 9
        sync_dataset(dsn, catalog, settings, d)
    rows = table_rows(catalog, settings, d)
    assert [(r["__row_index"], r["pos"], r["n"]) for r in rows] == [(i, i, i) for i in range(9)]


# --- guards ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["pg", "native"])
def test_writers_take_the_mirrors_guards(conn, dsn, catalog, settings, workspace, tmp_path, mode):
    """G2: past the admission bound a writer gets Backpressure at once and writes nothing; G3: a writer waits
    for the dataset lock another ingest holds."""
    write_source_file(tmp_path / "src" / "a.parquet", "parquet", _records(0, 4))
    d = _dataset(conn, workspace)
    set_source(conn, d, {"type": "files", "uri": str(tmp_path / "src"), "format": "parquet"})
    if mode == "native":
        native(conn, d, "sync.append")
    one_slot = settings.replace(sync={"max_concurrent": 1})
    with connect(dsn) as other, admission_slot(other, 1):
        with pytest.raises(Backpressure):
            ingest(dsn, catalog, one_slot, conn, d, "sync.append")
    assert pg_count(conn, d) == 0 and table_rows(catalog, settings, d) == []
    done = threading.Event()
    with connect(dsn) as other, dataset_lock(other, d):

        def run():
            with connect(dsn) as own:
                ingest(dsn, catalog, settings, own, d, "sync.append")
            done.set()

        t = threading.Thread(target=run)
        t.start()
        time.sleep(1.0)
        assert not done.is_set()  # waiting for the lock
    t.join(60)
    assert done.is_set()
    if mode == "pg":
        assert pg_count(conn, d) == 4
    else:
        assert len(table_rows(catalog, settings, d)) == 4
