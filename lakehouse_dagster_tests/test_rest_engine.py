"""A second Iceberg engine through the REST catalog (issue 46): DuckDB 1.5.5 with its iceberg extension (from PyPI,
beside the project's pinned duckdb: lakehouse_dagster/testing/duckdb_engine.py says why) attaches to SeaweedFS's
REST catalog, reads the project's tables and commits to them; the project tells its commits apart (lake/foreign.py).
Where Postgres is the truth (a mirrored dataset) the mirror refuses the changed table in one line naming DuckDB's
snapshot; where Iceberg is the truth (a native dataset) the reverse mirror takes DuckDB's rows into Postgres."""

from __future__ import annotations

import datetime as dt
import os
import signal
import uuid

import pytest

from lakehouse_dagster.core.errors import SyncFailed
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.lake.foreign import made_here
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.runbooks.reverse_parity import reverse_parity
from lakehouse_dagster.testing.duckdb_engine import DuckDBIceberg, ensure_installed
from lakehouse_dagster.testing.faults import cli_sync_popen, wait_stopped
from lakehouse_dagster.tracking import datasets

from .native_helpers import native_write, ready_native, row

pytestmark = (
    pytest.mark.slow
)  # DuckDB's child process loads three extensions (~2 s a call); the first run installs them

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


@pytest.fixture(scope="session")
def duckdb_root():
    return ensure_installed()


@pytest.fixture
def duck(seaweed, duckdb_root) -> DuckDBIceberg:
    return DuckDBIceberg.for_server(seaweed, duckdb_root)


def _table(settings, dsn, d):
    return load_catalog(settings, dsn).load_table(table_identifier(settings, d))


def _pg_rows(conn, d) -> list[tuple]:
    return conn.execute(
        "select (data->>'n')::bigint, data->>'s' from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()


def test_duckdb_reads_a_mirrored_table_and_its_append_is_refused_by_the_mirror(conn, dsn, rest_settings, duck):
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": k, "s": f"v{k} ü"} for k in range(20)])
    assert sync_dataset(dsn, load_catalog(rest_settings, dsn), rest_settings, d).total_rows == 20
    name = duck.table(table_identifier(rest_settings, d))

    # the other engine reads the project's table through the REST catalog: Postgres' rows, in order
    [read] = duck.run(f"select n, s from {name} order by __row_index")
    assert [tuple(r) for r in read] == _pg_rows(conn, d)

    # ...and commits to it: two rows of its own (its own row indexes and ids), a snapshot without the project's marks
    before = _table(rest_settings, dsn, d).current_snapshot().snapshot_id
    duck.run(
        f"insert into {name} (__row_index, __row_id, __created_at, n, s) values "
        f"(1000, '{uuid.uuid4()}', now(), -1, 'duck'), (1001, '{uuid.uuid4()}', now(), -2, 'duck')"
    )
    table = _table(rest_settings, dsn, d)
    snap = table.current_snapshot()
    assert snap.parent_snapshot_id == before and not made_here(snap)
    assert len(table.scan().to_arrow()) == 22
    foreign = snap.snapshot_id

    # Postgres moves on; the mirror's next sync finds DuckDB's append and refuses in one line, committing nothing
    datasets.insert_rows(conn, d, [{"n": 20, "s": "pg"}])
    with pytest.raises(SyncFailed) as refused:
        sync_dataset(dsn, load_catalog(rest_settings, dsn), rest_settings, d)
    line = str(refused.value)
    assert "\n" not in line
    assert f"snapshot {foreign} (append by another engine" in line and "+2 row(s)" in line, line
    assert "--revert-foreign" in line
    assert _table(rest_settings, dsn, d).current_snapshot().snapshot_id == foreign  # nothing committed
    assert conn.execute("select status from datasets where id = %s", (d,)).fetchone() == ("errored",)

    # the operator's way out reverts it by name; DuckDB then reads exactly Postgres' 21 rows through the catalog
    r = sync_dataset(dsn, load_catalog(rest_settings, dsn), rest_settings, d, mode="full", revert_foreign=True)
    assert r.total_rows == 21 and str(foreign) in r.reason
    [read] = duck.run(f"select n, s from {name} order by __row_index")
    assert [tuple(r) for r in read] == _pg_rows(conn, d)

    # a DELETE (DuckDB writes a position delete file: merge-on-read) is a data change too, refused by name
    duck.run(f"delete from {name} where n = 3")
    deleted = _table(rest_settings, dsn, d).current_snapshot()
    assert deleted.summary.operation.value == "delete" and not made_here(deleted)
    with pytest.raises(SyncFailed) as refused:
        sync_dataset(dsn, load_catalog(rest_settings, dsn), rest_settings, d, mode="full")
    line = str(refused.value)
    assert f"snapshot {deleted.snapshot_id} (delete by another engine" in line and "1 delete record(s)" in line, line


def test_duckdb_rows_committed_to_a_native_table_are_taken_into_postgres(conn, dsn, rest_settings, duck):
    d = ready_native(conn, dsn, rest_settings, "sync.append")
    native_write(conn, dsn, rest_settings, d, "sync.append", [row(i) for i in range(6, 8)], start=6)
    catalog = load_catalog(rest_settings, dsn)
    assert apply_reverse(dsn, catalog, rest_settings, d).pg_rows == 8
    name = duck.table(table_identifier(rest_settings, d))

    at = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    duck.run(
        f'insert into {name} (__row_index, __row_id, __created_at, a, s, x, "at") values '
        f"(100, '{uuid.uuid4()}', now(), 100, 'duck ü', 0.5, '{at.isoformat()}'),"
        f" (101, '{uuid.uuid4()}', now(), 101, 'duck 2', null, null)"
    )
    foreign = _table(rest_settings, dsn, d).current_snapshot()
    assert not made_here(foreign)

    r = apply_reverse(dsn, catalog, rest_settings, d)
    assert (r.how, r.copied, r.pg_rows) == ("append", 2, 10), r.reason
    assert "another Iceberg engine" in r.reason and str(foreign.snapshot_id) in r.reason
    rows = conn.execute(
        "select row_index, data->>'a', data->>'s', data->>'x' from dataset_rows where dataset_id = %s"
        " and row_index >= 100 order by row_index",
        (d,),
    ).fetchall()
    assert rows == [(100, "100", "duck ü", "0.5"), (101, "101", "duck 2", None)]
    assert apply_reverse(dsn, catalog, rest_settings, d).copied == 0  # taken once


def test_a_duckdb_commit_racing_a_sync_wins_at_the_server_and_the_retry_refuses_it(conn, dsn, rest_settings, duck):
    """The REST server serialises commits across engines: ``lakehouse sync`` frozen inside its catalog commit call
    (before the server's check of its base snapshot), DuckDB commits meanwhile; resumed, the sync's commit is
    rejected by the server (409), its retry finds DuckDB's snapshot and refuses in one line, committing nothing."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": k, "s": f"v{k}"} for k in range(20)])
    sync_dataset(dsn, load_catalog(rest_settings, dsn), rest_settings, d)
    datasets.insert_rows(conn, d, [{"n": 20, "s": "pg"}])
    name = duck.table(table_identifier(rest_settings, d))

    proc = cli_sync_popen(d, "commit-start:stop")
    try:
        wait_stopped(proc, 120)
        duck.run(
            f"insert into {name} (__row_index, __row_id, __created_at, n, s) values (500, '{uuid.uuid4()}', now(), -5, 'duck')"
        )
        foreign = _table(rest_settings, dsn, d).current_snapshot()
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert proc.returncode == 4 and len(lines) == 1, (proc.returncode, stderr)
    assert f"snapshot {foreign.snapshot_id} (append by another engine" in lines[0], lines
    table = _table(rest_settings, dsn, d)
    assert table.current_snapshot().snapshot_id == foreign.snapshot_id  # nothing committed over it
    assert len(table.scan().to_arrow()) == 21


def _identity_rows(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, (data->>'a')::bigint, data->>'s' from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


@pytest.mark.parametrize("native_first", [False, True], ids=["mirror-written-last", "native-written-last"])
def test_duckdb_deleting_and_updating_rows_of_a_native_table_is_taken_into_postgres(
    conn, dsn, rest_settings, duck, native_first
):
    """DuckDB's DELETE and UPDATE write position delete files (merge-on-read): the reverse mirror re-syncs in full
    through them, and Postgres ends with exactly the rows DuckDB left. ``mirror-written-last``: the dataset went
    native, but the project's last commit to its table is still the mirror's (no native write yet): seen failing
    before the fix — the reverse mirror looked for Iceberg-only rows only on a table last written natively, said
    "Postgres already holds every row" and kept the deleted row (a delete leaves the summary's total-records as it
    was, so the row-count check let it through too). Then the project's own append on top of the delete files: seen
    failing too (a full re-sync, every time: the row-count check counted total-records without the position
    deletes), now an append of its rows."""
    d = ready_native(conn, dsn, rest_settings, "sync.append")
    catalog = load_catalog(rest_settings, dsn)
    if native_first:
        native_write(conn, dsn, rest_settings, d, "sync.append", [row(i) for i in range(6, 8)], start=6)
    before = apply_reverse(dsn, catalog, rest_settings, d).pg_rows
    name = duck.table(table_identifier(rest_settings, d))

    duck.run(f"delete from {name} where a = 1")
    deleted = _table(rest_settings, dsn, d).current_snapshot()
    assert not made_here(deleted) and deleted.summary.operation.value == "delete"
    r = apply_reverse(dsn, catalog, rest_settings, d)
    assert (r.how, r.pg_rows) == ("full", before - 1), r.reason
    assert "another Iceberg engine" in r.reason and str(deleted.snapshot_id) in r.reason
    [left] = duck.run(f"select __row_index, a, s from {name} order by __row_index")
    assert [tuple(x) for x in left] == _identity_rows(conn, d)

    duck.run(f"delete from {name} where a = 4", f"update {name} set s = 'by duck' where a = 2")
    r = apply_reverse(dsn, catalog, rest_settings, d)
    assert (r.how, r.pg_rows) == ("full", before - 2), r.reason
    [left] = duck.run(f"select __row_index, a, s from {name} order by __row_index")
    pg = _identity_rows(conn, d)
    assert [tuple(x) for x in left] == pg
    assert (2, 2, "by duck") in pg and all(a not in (1, 4) for _, a, _ in pg)
    assert apply_reverse(dsn, catalog, rest_settings, d).copied == 0  # taken once
    # the project's next native append on top of DuckDB's delete files copies just its rows (no full re-sync)
    native_write(conn, dsn, rest_settings, d, "sync.append", [row(i) for i in range(20, 22)], start=20)
    r = apply_reverse(dsn, catalog, rest_settings, d)
    assert (r.how, r.copied, r.pg_rows) == ("append", 2, before), r.reason
    # the project's own readers of the table's files honour DuckDB's delete files: the canary and reverse parity
    v = reverse_parity(dsn, catalog, rest_settings, d)
    assert v is not None and v.verdict == canary.OK, v
    v = canary.evaluate(dsn, catalog, rest_settings, d, full=True)  # every row digested on both sides
    # "native" when the project's last commit was native ("written iceberg-native ...; it still matches Postgres")
    assert v.verdict in (canary.OK, "native") and "match" in str(v.detail), v
    assert v.pg_count == v.iceberg_count == before, v
