"""Rolling a writer back to pg after native writes: nothing dropped, nothing duplicated.

Real Postgres, real Iceberg tables, the real CLI in a subprocess. A dataset is made ready the way the
runbook does it (mirrored, read-flipped, canary ok), flipped through the gated CLI, written natively
through the write router and the chunked writer, then rolled back.

The backfill's path: the reverse mirror is off here (globally), as for a dataset whose reverse was off when its writer
was rolled back. With it on the rollback applies it first and needs no backfill (test_reverse_mirror.py).
"""

from __future__ import annotations

import json

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.native_run import iceberg_only
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli
from .native_helpers import (
    SERVABLE,
    add_source_rows,
    native_write,
    pg_source_table,
    ready_native,
    row,
    snapshot,
    table_rows,
)


@pytest.fixture(autouse=True)
def _reverse_off(conn):
    set_reverse(conn, False, note="the backfill's path", actor="pytest")


def test_rollback_without_backfill_refuses_to_mirror_over_iceberg_only_rows(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 10)], start=6)
    native_write(conn, dsn, settings, d, "sync.append", [row(10)], start=10)
    snap, before = snapshot(settings, dsn, d), table_rows(settings, dsn, d)

    out = cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True).stdout
    assert "sync.append rolled back to pg for 1 dataset(s):" in out
    assert f"orders ({d}): 5 row(s) in 2 native snapshot(s) exist only in Iceberg" in out
    assert f"lakehouse backfill --dataset {d}" in out
    assert f"lakehouse ingest --dataset {d} --writer sync.full" in out

    # a new pg-path write makes the mirror want to run: it refuses, with the reason and both ways forward
    datasets.insert_rows(conn, d, [row(99)])
    with pytest.raises(BadInput) as refused:
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    msg = str(refused.value)
    assert "\n" not in msg and "5 row(s) in 2 native snapshot(s) exist only in Iceberg" in msg
    assert "lakehouse backfill" in msg and "--writer sync.full" in msg
    assert snapshot(settings, dsn, d) == snap and table_rows(settings, dsn, d) == before
    proc = cli("sync", "--dataset", str(d))
    assert proc.returncode == 2 and "exist only in Iceberg" in proc.stderr


def test_backfill_then_mirror_gives_an_identical_table(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 12)], start=6)
    before = table_rows(settings, dsn, d)
    catalog = load_catalog(settings, dsn)
    native = evaluate(dsn, catalog, settings, d)
    assert native.verdict == "native" and native.detail["agrees_with_postgres"] is False

    # refused while the writer is still native; nothing written
    proc = cli("backfill", "--dataset", str(d))
    assert proc.returncode == 2 and "roll the writer back first" in proc.stderr
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 6

    cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    found = iceberg_only(conn, catalog, settings, d)
    assert (found.rows, found.snapshots, found.replaced, len(found.added_files)) == (6, 1, False, 1)  # only that file
    out = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert (out["copied"], out["removed"], out["moved"], out["pg_rows"]) == (6, 0, 0, 12)
    assert iceberg_only(conn, catalog, settings, d) is None
    # identity preserved: Postgres rows are the table's rows
    pg = conn.execute(
        "select row_index, row_id::text, created_at from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()
    assert pg == [(r["__row_index"], r["__row_id"], r["__created_at"]) for r in before]

    r = sync_dataset(dsn, catalog, settings, d)
    assert r.mode in ("noop", "incremental") and r.rows == 0  # a no-op or a pure (empty) append
    assert table_rows(settings, dsn, d) == before
    v = evaluate(dsn, catalog, settings, d, smoke=True)
    assert (v.verdict, v.smoke, v.pg_count) == ("ok", "match", 12)
    assert (v.iceberg_digest, v.iceberg_count) == (native.iceberg_digest, native.iceberg_count)
    again = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert again["nothing_to_do"] and again["pg_rows"] == 12


def test_backfill_after_a_native_replace_and_pg_writes_after_the_rollback(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.full", rows=6)
    # a native sync.full replaces the content: rows 0..3 with new values, fresh identity
    native_write(conn, dsn, settings, d, "sync.full", [{**row(i), "s": f"new {i}"} for i in range(4)], start=0)
    replaced = table_rows(settings, dsn, d)
    out = cli("write-flags", "clear", "sync.full", "--dataset", str(d), check=True).stdout
    assert "4 row(s) in 1 native snapshot(s) exist only in Iceberg (a native sync.full replaced the table" in out
    # a pg-path append after the rollback lands at row_index 6, 7 (Postgres' max was 5)
    datasets.insert_rows(conn, d, [row(50), row(51)])

    res = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    # the 6 stale rows are superseded, the 4 native rows copied; the pg-path rows kept (no collision: not moved)
    assert (res["removed"], res["copied"], res["pg_rows"]) == (6, 4, 6)
    pg = conn.execute(
        "select row_index, row_id::text, data->>'s' from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()
    assert pg[:4] == [(r["__row_index"], r["__row_id"], r["s"]) for r in replaced]
    assert [p[2] for p in pg[4:]] == ["v50 ü", "v51 ü"]

    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, d)
    v = evaluate(dsn, catalog, settings, d, smoke=True)
    assert (v.verdict, v.smoke, v.iceberg_count) == ("ok", "match", 6)


def test_pg_rows_written_after_the_rollback_move_above_the_iceberg_only_rows(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append", rows=3)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(3, 7)], start=3)  # 3..6
    cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    datasets.insert_rows(conn, d, [row(70), row(71)])  # Postgres' max is 2: these land at 3, 4 (collide)
    res = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert (res["copied"], res["moved"], res["removed"], res["pg_rows"]) == (4, 2, 0, 9)
    got = conn.execute(
        "select row_index, (data->>'a')::int from dataset_rows where dataset_id = %s order by 1", (d,)
    ).fetchall()
    assert got == [(i, i) for i in range(7)] + [(7, 70), (8, 71)]
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, d)
    v = evaluate(dsn, catalog, settings, d, smoke=True)
    assert (v.verdict, v.iceberg_count) == ("ok", 9)


def test_a_pg_full_sync_after_the_rollback_lets_the_mirror_run_again(conn, dsn, settings):
    catalog = load_catalog(settings, dsn)
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(
        conn,
        ws,
        "fed",
        [
            {"name": "a", "type": "int64"},
            {"name": "s", "type": "string"},
            {"name": "x", "type": "float64"},
            {"name": "at", "type": "timestamp"},
            {"name": "doc", "type": "json"},
        ],
    )
    src = pg_source_table(conn, [row(i) for i in range(6)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": None, "dsn_env": None})

    def ingest():
        return run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.full")

    assert ingest().path == "pg"
    sync_dataset(dsn, catalog, settings, d)
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, actor="pytest")
    assert run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results[0].verdict == "ok"
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), check=True)
    add_source_rows(conn, src, [row(6), row(7)])
    native = ingest()
    assert (native.path, native.rows) == ("native", 8)

    out = cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d), check=True).stdout
    assert "8 row(s) in 1 native snapshot(s) exist only in Iceberg (a native sync.full replaced the table" in out
    with pytest.raises(BadInput):
        sync_dataset(dsn, catalog, settings, d)

    assert ingest().path == "pg"  # repopulates Postgres from the source: the marker is gone
    assert iceberg_only(conn, catalog, settings, d) is None
    r = sync_dataset(dsn, catalog, settings, d)
    assert (r.mode, r.total_rows) == ("full", 8)
    v = evaluate(dsn, catalog, settings, d, smoke=True)
    assert (v.verdict, v.iceberg_count) == ("ok", 8)
    assert sorted(x["a"] for x in table_rows(settings, dsn, d)) == list(range(8))


def test_the_write_rollback_job_reports_and_backfills(conn, dsn, settings):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.rollback import write_rollback_job

    d = ready_native(conn, dsn, settings, "cdc.append", rows=3)
    native_write(conn, dsn, settings, d, "cdc.append", [row(i) for i in range(3, 5)], start=3)
    result = write_rollback_job.execute_in_process(
        run_config={
            "ops": {
                "write_rollback_op": {
                    "config": {"writer": "cdc.append", "dataset_id": str(d), "backfill": True, "note": "rollback"}
                }
            }
        },
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    out = result.output_for_node("write_rollback_op")
    assert [(r["iceberg_only_rows"], r["iceberg_only_snapshots"]) for r in out["rolled_back"]] == [(2, 1)]
    assert [b["copied"] for b in out["backfilled"]] == [2]
    catalog = load_catalog(settings, dsn)
    assert iceberg_only(conn, catalog, settings, d) is None
    sync_dataset(dsn, catalog, settings, d)
    assert evaluate(dsn, catalog, settings, d).verdict == "ok"


def _live_files(table) -> list[tuple[str, int]]:
    """(path, least __row_index) of every live data file."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    fid = table.schema().find_field("__row_index").field_id
    return sorted(
        (t.file.file_path, from_bytes(LongType(), t.file.lower_bounds[fid])) for t in table.scan().plan_files()
    )


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_native_commits_expire_old_snapshots_and_the_iceberg_only_rows_stay_whole(conn, dsn, settings):
    """Native commits expire snapshots like mirror commits (lake/writer.py): each carries its run's totals
    (mirror/native_run.py), so the rows only Iceberg holds and the files a backfill copies are counted
    whole after the snapshots that added them are gone, through merged manifests; after the backfill, a new
    native run counts only its own rows though the backfilled snapshot is expired too."""
    quick = settings.replace(sync={"snapshots_keep": 1, "snapshots_max_age_seconds": 0})
    d = ready_native(conn, dsn, settings, "sync.append")
    n = 20  # past the manifest merge count (16)
    for k in range(n):
        native_write(conn, dsn, quick, d, "sync.append", [row(6 + k)], start=6 + k)
    catalog = load_catalog(quick, dsn)
    table = catalog.load_table(table_identifier(quick, d))
    assert len(table.metadata.snapshots) == 1  # every native commit expired the one before
    assert len(table.current_snapshot().manifests(table.io)) < n  # merged: the run's files are in older manifests
    found = iceberg_only(conn, catalog, quick, d)
    native_files = sorted(path for path, low in _live_files(table) if low >= 6)
    assert len(native_files) == n
    assert (found.snapshots, found.rows, found.replaced, sorted(found.added_files)) == (n, n, False, native_files)
    out = cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True).stdout
    assert f"{n} row(s) in {n} native snapshot(s) exist only in Iceberg" in out
    res = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert (res["copied"], res["removed"], res["moved"], res["pg_rows"]) == (n, 0, 0, 6 + n)
    assert iceberg_only(conn, catalog, quick, d) is None

    # the mirror catches up (nothing to write), the canary agrees, the writer goes native again: a new run
    assert sync_dataset(dsn, catalog, quick, d).rows == 0
    assert [v.verdict for v in run_canary(conn, dsn, catalog, quick, dataset_ids=[str(d)]).results] == ["ok"]
    cli("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    for k in range(3):
        native_write(conn, dsn, quick, d, "sync.append", [row(6 + n + k)], start=6 + n + k)
    table = catalog.load_table(table_identifier(quick, d))
    assert len(table.metadata.snapshots) == 1  # the backfilled snapshot is expired as well
    found = iceberg_only(conn, catalog, quick, d)
    newest = sorted(path for path, low in _live_files(table) if low >= 6 + n)
    assert (found.snapshots, found.rows, sorted(found.added_files)) == (3, 3, newest)
    cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    res = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert (res["copied"], res["pg_rows"]) == (3, 9 + n)
    assert sync_dataset(dsn, catalog, quick, d).total_rows == 9 + n
    assert evaluate(dsn, catalog, quick, d, full=True).verdict == "ok"


def test_a_native_replace_run_under_expiry_counts_every_row(conn, dsn, settings):
    """A native sync.full in the run marks it replaced for good, after its snapshot is expired."""
    quick = settings.replace(sync={"snapshots_keep": 1, "snapshots_max_age_seconds": 0})
    d = ready_native(conn, dsn, settings, "sync.full")
    native_write(conn, dsn, quick, d, "sync.full", [{**row(i), "s": f"new {i}"} for i in range(4)], start=0)
    cli("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    native_write(conn, dsn, quick, d, "sync.append", [row(4), row(5), row(6)], start=4)
    catalog = load_catalog(quick, dsn)
    assert len(catalog.load_table(table_identifier(quick, d)).metadata.snapshots) == 1
    found = iceberg_only(conn, catalog, quick, d)
    assert (found.snapshots, found.rows, found.replaced, found.added_files) == (2, 7, True, None)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_native_appends_compact_their_small_files_and_the_rollback_still_copies_exactly_the_run(conn, dsn, settings):
    """After 16 small native appends the next one rewrites their files with its own rows in one commit
    (routing/native_compaction.py): every row once, identity kept, the pre-flip file untouched; the run's totals
    count the new rows only, and the backfill copies exactly the native rows."""
    from lakehouse_dagster.tracking.row_changes import COMPACT_FILES

    d = ready_native(conn, dsn, settings, "sync.append")
    catalog = load_catalog(settings, dsn)
    before = {path for path, _ in _live_files(catalog.load_table(table_identifier(settings, d)))}
    n = COMPACT_FILES + 4
    snaps = []
    for k in range(n):
        snaps.append(native_write(conn, dsn, settings, d, "sync.append", [row(6 + k)], start=6 + k))
        if k == COMPACT_FILES - 1:
            identity = {r["__row_index"]: (r["__row_id"], r["__created_at"]) for r in table_rows(settings, dsn, d)}
    table = catalog.load_table(table_identifier(settings, d))
    modes = [table.snapshot_by_id(s).summary.additional_properties["lakehouse.mode"] for s in snaps]
    assert modes == ["append"] * COMPACT_FILES + ["partial"] + ["append"] * 3  # one compaction, in the 17th write
    live = _live_files(table)
    assert len(live) == 1 + 1 + 3 and before <= {p for p, _ in live}  # the mirror's file, the compacted one, 3 new
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["__row_index"] for r in rows) == list(range(6 + n))  # every row exactly once
    assert sorted(r["a"] for r in rows) == list(range(6 + n))
    assert all(
        identity[r["__row_index"]] == (r["__row_id"], r["__created_at"])
        for r in table_rows(settings, dsn, d)
        if r["__row_index"] in identity
    )  # rewritten, not re-identified
    found = iceberg_only(conn, catalog, settings, d)
    assert (found.snapshots, found.rows, found.replaced) == (n, n, False)
    assert sorted(found.added_files) == sorted(p for p, _ in live if p not in before)
    cli("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    res = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert (res["copied"], res["removed"], res["moved"], res["pg_rows"]) == (n, 0, 0, 6 + n)
    sync_dataset(dsn, catalog, settings, d)
    assert evaluate(dsn, catalog, settings, d, full=True).verdict == "ok"


def test_the_reapers_fence_is_no_native_write(conn, dsn, settings):
    """The reaper's fence (an empty snapshot) carries a run's totals on, and a fence under a snapshot written
    without totals (before they existed) is not counted as a native snapshot."""
    from lakehouse_dagster.mirror.reaper import fence

    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    catalog = load_catalog(settings, dsn)
    before = iceberg_only(conn, catalog, settings, d)
    fence(catalog.load_table(table_identifier(settings, d)), "test")
    after = iceberg_only(conn, catalog, settings, d)
    assert (
        (after.snapshots, after.rows, after.added_files)
        == (before.snapshots, before.rows, before.added_files)
        == (1, 1, before.added_files)
    )
    native_write(conn, dsn, settings, d, "sync.append", [row(7)], start=7, legacy=True)
    fence(catalog.load_table(table_identifier(settings, d)), "test")  # nothing to carry on: the current has no totals
    found = iceberg_only(conn, catalog, settings, d)
    assert (found.snapshots, found.rows, len(found.added_files)) == (2, 2, 2)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_source_writer_reports_the_rows_its_native_commit_compacted(conn, dsn, settings):
    """The ingest result (CLI text, JSON, the ingest op's metadata) says when a native append's commit also
    compacted the run's small files: its rows are the source's new rows, compacted_rows the rewritten ones."""
    from lakehouse_dagster.tracking.row_changes import COMPACT_FILES

    from .native_helpers import SCHEMA, runbook_ready

    catalog = load_catalog(settings, dsn)
    d = datasets.create_dataset(conn, datasets.create_workspace(conn, "ws"), "fed", SCHEMA)
    src = pg_source_table(conn, [row(0)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": "a", "dsn_env": None})

    def ingest():
        return run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.append")

    assert ingest().path == "pg"
    runbook_ready(conn, dsn, settings, d)
    cli("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    results = []
    for k in range(1, COMPACT_FILES + 2):
        add_source_rows(conn, src, [row(k)])
        results.append(ingest())
    assert [(r.path, r.rows) for r in results] == [("native", 1)] * (COMPACT_FILES + 1)
    assert [r.compacted_rows for r in results] == [0] * COMPACT_FILES + [COMPACT_FILES]
    assert results[-1].to_json()["compacted_rows"] == COMPACT_FILES and results[-1].total_rows == COMPACT_FILES + 2
    assert sorted(x["a"] for x in table_rows(settings, dsn, d)) == list(range(COMPACT_FILES + 2))
