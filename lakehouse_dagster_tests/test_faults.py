"""The mirror's fault model (issue 9): commit outcome, retries, interruptions, guard locks — on a real
Postgres, real Iceberg tables, real processes killed or stopped at named failpoints."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from lakehouse_dagster.core.errors import BadInput, CommitOutcomeUnknown, SyncFailed, is_transient
from lakehouse_dagster.core.failpoints import parse
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.faults import (
    cli_sync,
    cli_sync_popen,
    data_files_on_disk,
    default_sigint,
    referenced_files,
    terminate_lock_session,
    wait_stopped,
)
from lakehouse_dagster.tracking import datasets

pytestmark = pytest.mark.slow  # real processes killed or stopped at failpoints

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


def _make(conn, rows=500):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i, "s": f"r{i}"} for i in range(rows)])
    return d


def _sync(settings, dsn, d, **kw):
    return sync_dataset(dsn, load_catalog(settings, dsn), settings, d, **kw)


def _table(settings, dsn, d):
    return load_catalog(settings, dsn).load_table(table_identifier(settings, d))


def _version(conn, d):
    return conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]


def _pg_values(conn, d):
    return sorted(
        r[0] for r in conn.execute("select (data->>'n')::bigint from dataset_rows where dataset_id = %s", (d,))
    )


def _assert_table_is_whole(settings, dsn, conn, d):
    """Every file the current snapshot references exists, and the table holds exactly Postgres' rows."""
    t = _table(settings, dsn, d)
    assert referenced_files(t, t.current_snapshot().snapshot_id) <= data_files_on_disk(t)
    assert sorted(t.scan().to_arrow()["n"].to_pylist()) == _pg_values(conn, d)
    return t


def _log(conn, d):
    return conn.execute(
        "select sync_id, status, source_version, snapshot_id, error from iceberg_sync_log where dataset_id = %s"
        " order by started_at",
        (d,),
    ).fetchall()


# --- failpoints --------------------------------------------------------------------------------------


def test_failpoint_spec_is_checked_when_armed():
    assert parse("before-commit, in-commit:raise*2") == {"before-commit": ("kill", None), "in-commit": ("raise", 2)}
    with pytest.raises(BadInput, match="unknown failpoint 'befor-commit'"):
        parse("befor-commit")
    with pytest.raises(BadInput, match="unknown action 'explode'"):
        parse("in-commit:explode")


def test_cli_refuses_an_unknown_failpoint_in_one_line(conn, dsn, settings):
    d = _make(conn, 10)
    proc = cli_sync(d, "no-such-point")
    assert proc.returncode == 2 and "unknown failpoint 'no-such-point'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- commit outcome ----------------------------------------------------------------------------------


def test_error_after_the_compare_and_swap_keeps_the_files_and_the_sync_succeeds(conn, dsn, settings, monkeypatch):
    """A connection lost after the swap: the old writer deleted the files the table now references."""
    d = _make(conn)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "in-commit:oserror")
    result = _sync(settings, dsn, d)
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    assert result.mode == "full" and result.total_rows == 500
    _assert_table_is_whole(settings, dsn, conn, d)
    assert [r[1] for r in _log(conn, d)] == ["succeeded"]
    again = _sync(settings, dsn, d)
    assert again.mode == "noop"
    _assert_table_is_whole(settings, dsn, conn, d)


def test_unknown_outcome_keeps_the_files_and_the_next_sync_settles_them(conn, dsn, settings, monkeypatch):
    d = _make(conn)
    first = _sync(settings, dsn, d)
    conn.execute("update dataset_rows set data = data || '{\"n\": -1}' where dataset_id = %s and row_index = 0", (d,))
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "commit-start:oserror")
    with pytest.raises(SyncFailed) as err:
        _sync(settings, dsn, d)
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    assert isinstance(err.value.__cause__, CommitOutcomeUnknown) and err.value.transient
    failed_id, status, _, _, error = _log(conn, d)[-1]
    assert status == "failed" and error.startswith("unsettled: ")
    t = _table(settings, dsn, d)
    assert t.current_snapshot().snapshot_id == first.snapshot_id
    kept = {f for f in data_files_on_disk(t) if str(failed_id) in f}
    assert kept, "files of a commit whose outcome is unknown must be kept"

    again = _sync(settings, dsn, d)
    assert again.mode == "full"
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert not {f for f in data_files_on_disk(t) if str(failed_id) in f}  # settled: did not land, removed
    assert data_files_on_disk(t) == referenced_files(t)
    row = [r for r in _log(conn, d) if r[0] == failed_id][0]
    assert row[1] == "failed" and row[4].startswith("abandoned")


def test_a_landed_sync_whose_snapshot_was_expired_keeps_its_files_when_settled(conn, dsn, settings):
    """The reaper settles an unrecorded sync by looking for its snapshot; snapshot expiry (lake/writer.py)
    could remove one that landed. Its files are then still the table's, and deleting them would break the
    table: the reaper keeps every live file and records the sync as landed."""
    from lakehouse_dagster.mirror.reaper import fence

    d = _make(conn)
    _sync(settings, dsn, d)
    datasets.insert_rows(conn, d, [{"n": 500 + i, "s": "x"} for i in range(5)])
    landed = _sync(settings, dsn, d)
    assert landed.mode == "incremental"
    t = fence(_table(settings, dsn, d), "test: the landed snapshot is no longer the head")
    t.maintenance.expire_snapshots().by_id(landed.snapshot_id).commit()
    conn.execute(
        "update iceberg_sync_log set status = 'running', snapshot_id = null where sync_id = %s", (landed.sync_id,)
    )  # as if killed right after its commit, and its snapshot expired since

    _sync(settings, dsn, d)  # the next sync settles it
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert {f for f in data_files_on_disk(t) if str(landed.sync_id) in f}  # its file is kept
    row = [r for r in _log(conn, d) if r[0] == landed.sync_id][0]
    assert row[1] == "succeeded" and "expired" in row[4]


def test_killed_inside_the_commit_is_recorded_with_the_version_it_covers(conn, dsn, settings):
    d = _make(conn)
    v1 = _version(conn, d)
    proc = cli_sync(d, "in-commit")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    killed_id = _log(conn, d)[0][0]
    datasets.insert_rows(conn, d, [{"n": 1000 + i} for i in range(20)])
    result = _sync(settings, dsn, d)
    assert result.mode == "incremental" and result.total_rows == 520
    killed = [r for r in _log(conn, d) if r[0] == killed_id][0]
    assert killed[1] == "succeeded" and killed[2] == v1
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert data_files_on_disk(t) == referenced_files(t)


def test_a_retry_that_finds_its_own_snapshot_records_the_version_that_snapshot_covers(conn, dsn, settings, monkeypatch):
    """Attempt 1 committed and failed after; Postgres moved on; attempt 2 (same sync id) must not claim
    the newer version, so the poller still sees the dataset behind."""
    d = _make(conn)
    v1 = _version(conn, d)
    sync_id = uuid.uuid4()
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "after-commit-before-log:raise")
    with pytest.raises(Exception, match="failpoint after-commit-before-log fired"):
        _sync(settings, dsn, d, sync_id=sync_id)
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    datasets.insert_rows(conn, d, [{"n": 1000}])
    v2 = _version(conn, d)
    retry = _sync(settings, dsn, d, sync_id=sync_id)
    assert retry.source_version == v1 and retry.rows == 0
    assert [(r[1], r[2]) for r in _log(conn, d)] == [("succeeded", v1)]
    pending, _, _ = pending_syncs(conn, Cursor(), limit=100)
    assert [(p.dataset_id, p.rows_version) for p in pending] == [(d, v2)]
    caught_up = _sync(settings, dsn, d)
    assert caught_up.source_version == v2 and caught_up.total_rows == 501
    assert pending_syncs(conn, Cursor(), limit=100)[0] == []


# --- transient or not --------------------------------------------------------------------------------


def test_failures_are_classified_transient_or_not(conn, dsn, settings, monkeypatch):
    d = _make(conn, 50)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "before-commit:oserror")
    with pytest.raises(SyncFailed) as io_err:
        _sync(settings, dsn, d)
    assert io_err.value.transient and is_transient(io_err.value)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "before-commit:raise")
    with pytest.raises(SyncFailed) as bug:
        _sync(settings, dsn, d)
    assert not bug.value.transient
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    datasets.insert_rows(conn, d, [{"n": "not a number"}])
    with pytest.raises(SyncFailed) as bad:
        _sync(settings, dsn, d)
    assert "expected int64, got a JSON string" in str(bad.value) and not bad.value.transient
    datasets.set_schema(conn, d, [{"name": "n", "type": "string"}])
    with pytest.raises(SyncFailed, match="changed type") as changed:
        _sync(settings, dsn, d)
    assert not changed.value.transient
    # a lock timeout (another sync holds the dataset lock past the wait) is transient too
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.guards import dataset_lock

    with connect(dsn) as other, dataset_lock(other, d):
        with pytest.raises(SyncFailed, match="held the lock") as timeout:
            with dataset_lock(conn, d, timeout_s=0.2):
                pass
    assert is_transient(timeout.value)


# --- interruptions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_interrupted_after_the_commit_is_recorded_as_succeeded(conn, dsn, settings, sig):
    d = _make(conn)
    proc = cli_sync(d, f"after-commit-before-log:{sig}")
    assert proc.returncode == 130 and "interrupted" in proc.stderr, (proc.returncode, proc.stderr)
    [(_, status, version, snapshot_id, _)] = _log(conn, d)
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert (status, version, snapshot_id) == ("succeeded", _version(conn, d), t.current_snapshot().snapshot_id)
    assert conn.execute("select status, row_count from datasets where id = %s", (d,)).fetchone() == ("ready", 500)
    assert pending_syncs(conn, Cursor(), limit=100)[0] == []


def test_interrupted_before_the_commit_is_not_a_data_error(conn, dsn, settings):
    d = _make(conn)
    _sync(settings, dsn, d)
    conn.execute("update dataset_rows set data = data || '{\"n\": -1}' where dataset_id = %s and row_index = 3", (d,))
    proc = cli_sync(d, "before-commit:sigint")
    assert proc.returncode == 130, proc.stderr
    status, error = _log(conn, d)[-1][1], _log(conn, d)[-1][4]
    assert status == "failed" and "interrupted" in error
    assert conn.execute("select status from datasets where id = %s", (d,)).fetchone()[0] == "ready"
    assert [p.dataset_id for p in pending_syncs(conn, Cursor(), limit=100)[0]] == [d]
    _sync(settings, dsn, d)
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert data_files_on_disk(t) == referenced_files(t)


# --- guard locks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["before-commit", "commit-start"])
def test_a_sync_whose_lock_session_died_never_commits_over_the_next_sync(conn, dsn, settings, point):
    """A's lock session dies while A is frozen just before (or inside, before the swap of) its commit;
    B takes the lock, reaps A's row and deletes its files, and commits. A, resumed, must not commit:
    its snapshot would point at deleted files (or overwrite B's newer one)."""
    d = _make(conn, 800)
    _sync(settings, dsn, d)
    conn.execute("update dataset_rows set data = data || '{\"n\": -7}' where dataset_id = %s and row_index = 5", (d,))
    a = cli_sync_popen(d, f"{point}:stop")
    try:
        wait_stopped(a)
        terminate_lock_session(conn, d)
        conn.execute(
            "update dataset_rows set data = data || '{\"n\": -8}' where dataset_id = %s and row_index = 6", (d,)
        )
        b = _sync(settings, dsn, d)
        assert b.mode == "full"
        os.kill(a.pid, signal.SIGCONT)
        out, err = a.communicate(timeout=120)
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
    assert a.returncode == 75 and "not committing" in err, (a.returncode, err)  # its session lost: try again
    t = _assert_table_is_whole(settings, dsn, conn, d)
    assert t.current_snapshot().summary.additional_properties["lakehouse.sync-id"] == str(b.sync_id)
    assert data_files_on_disk(t) == referenced_files(t)
    assert conn.execute("select status from datasets where id = %s", (d,)).fetchone()[0] == "ready"
    assert _sync(settings, dsn, d).mode == "noop"


# --- Dagster: transient failures are retried, bad data is not ------------------------------------------


def _materialize(dsn, d, instance):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    return dg.materialize(
        [pg_dataset_rows, iceberg_dataset_table],
        partition_key=str(d),
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )


@pytest.fixture
def instance():
    import dagster as dg

    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def test_a_transient_failure_is_retried_by_the_asset_and_the_run_succeeds(conn, dsn, settings, instance, monkeypatch):
    """An object-store I/O error once (before the commit): the step retries under its RetryPolicy."""
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions

    d = _make(conn, 50)
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "before-commit:oserror*1")
    result = _materialize(dsn, d, instance)
    assert result.success
    restarts = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(restarts) == 1
    assert [r[1] for r in _log(conn, d)] == ["succeeded"]  # one sync id per run: attempt 2 reused the row
    _assert_table_is_whole(settings, dsn, conn, d)


def test_bad_data_fails_the_asset_without_retrying(conn, dsn, settings, instance):
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions

    d = _make(conn, 5)
    datasets.insert_rows(conn, d, [{"n": "x"}])
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
    result = _materialize(dsn, d, instance)
    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


# --- the native write path (route_write → write_arrow) ------------------------------------------------

NATIVE_SCRIPT = """
import sys, uuid
import pyarrow as pa
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.routing.write_router import native_write, route_write
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster.core.db import connect
s = Settings.from_env()
conn = connect(s.postgres.dsn)
d = datasets.get_dataset(conn, sys.argv[1])
start, count = int(sys.argv[2]), int(sys.argv[3])
rows = [{"__row_index": start + i, "__row_id": str(uuid.uuid4()), "__created_at": None, "n": start + i, "s": "x"}
        for i in range(count)]
batch = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(d.columns))
route_write(conn, FlagResolver(conn, 0), "sync.append", d.id, pg_write=lambda: None,
            iceberg_write=native_write(load_catalog(s, s.postgres.dsn), s, d, [batch], writer="sync.append", conn=conn),
            settings=s)
"""


def _native_dataset(conn):
    from lakehouse_dagster.flags import set_override
    from lakehouse_dagster.flags.registry import SERVABLE_READERS

    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "native", SCHEMA)
    for r in SERVABLE_READERS:  # new and empty, read-flipped: the write router lets its native writes through
        set_override(conn, "read", r.name, "iceberg", dataset=d, note="fase1", actor="t")
    set_override(conn, "write", "sync.append", "iceberg_native", dataset=d, note="fase4 canary", actor="t")
    return d


def _native(d, start, count, failpoint=None):
    import subprocess
    import sys

    from lakehouse_dagster.testing.faults import cli_env

    return subprocess.run(
        [sys.executable, "-c", NATIVE_SCRIPT, str(d), str(start), str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(failpoint),
        preexec_fn=default_sigint,
    )


def _native_values(settings, dsn, d):
    return sorted(_table(settings, dsn, d).scan().to_arrow()["n"].to_pylist())


def test_native_write_killed_inside_its_commit_is_settled_by_the_next_native_write(conn, dsn, settings):
    d = _native_dataset(conn)
    assert _native(d, 0, 10, "in-commit").returncode == -signal.SIGKILL
    assert [r[1] for r in _log(conn, d)] == ["running"]
    done = _native(d, 10, 5)
    assert done.returncode == 0, done.stderr
    assert [r[1] for r in _log(conn, d)] == ["succeeded", "succeeded"]  # the killed one's commit had landed
    assert _native_values(settings, dsn, d) == list(range(15))
    t = _table(settings, dsn, d)
    assert data_files_on_disk(t) == referenced_files(t)


def test_native_write_killed_before_its_commit_leaves_no_orphans_after_the_next_write(conn, dsn, settings):
    d = _native_dataset(conn)
    assert _native(d, 0, 10).returncode == 0
    assert _native(d, 10, 10, "before-commit").returncode == -signal.SIGKILL
    assert _native(d, 20, 5).returncode == 0
    assert [r[1] for r in _log(conn, d)] == ["succeeded", "failed", "succeeded"]
    assert _native_values(settings, dsn, d) == list(range(10)) + list(range(20, 25))
    t = _table(settings, dsn, d)
    assert data_files_on_disk(t) == referenced_files(t)


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_native_write_interrupted_after_its_commit_is_recorded_as_succeeded(conn, dsn, settings, sig):
    d = _native_dataset(conn)
    script = NATIVE_SCRIPT.replace(
        "s = Settings",
        "import signal\nsignal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(SystemExit(143)))\ns = Settings",
    )
    import subprocess
    import sys

    from lakehouse_dagster.testing.faults import cli_env

    proc = subprocess.run(
        [sys.executable, "-c", script, str(d), "0", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(f"after-commit-before-log:{sig}"),
        preexec_fn=default_sigint,
    )
    assert proc.returncode in (-signal.SIGINT, 143), proc.stderr  # uncaught KeyboardInterrupt / SystemExit
    [(_, status, _, snapshot_id, _)] = _log(conn, d)
    assert (status, snapshot_id) == ("succeeded", _table(settings, dsn, d).current_snapshot().snapshot_id)
    assert conn.execute("select status, row_count from datasets where id = %s", (d,)).fetchone() == ("ready", 10)


def test_native_write_error_after_the_swap_keeps_its_files(conn, dsn, settings):
    d = _native_dataset(conn)
    done = _native(d, 0, 10, "in-commit:oserror")
    assert done.returncode == 0, done.stderr
    assert _native_values(settings, dsn, d) == list(range(10))
    assert [r[1] for r in _log(conn, d)] == ["succeeded"]


@pytest.mark.parametrize("point", ["in-commit", "before-commit"])
def test_a_compacting_native_write_killed_in_or_before_its_commit_converges(conn, dsn, settings, point):
    """The 17th small native append compacts the 16 before it in its one commit (routing/native_compaction.py);
    killed inside the commit (it landed) or before it (it did not), the next native write settles it: every row
    exactly once, the log true, no file on disk that no snapshot references."""
    from lakehouse_dagster.tracking.row_changes import COMPACT_FILES

    d = _native_dataset(conn)
    exec(compile(NATIVE_SCRIPT.split("s = Settings.from_env()")[0], "native", "exec"), scope := {})
    for k in range(COMPACT_FILES):  # in this process: 16 one-row appends
        scope["sys"].argv = ["-", str(d), str(k), "1"]
        exec(compile(NATIVE_SCRIPT, "native", "exec"), dict(scope))
    assert _native(d, COMPACT_FILES, 1, point).returncode == -signal.SIGKILL
    done = _native(d, COMPACT_FILES + 1, 1)
    assert done.returncode == 0, done.stderr
    statuses = [r[1] for r in _log(conn, d)]
    landed = point == "in-commit"
    assert statuses == ["succeeded"] * COMPACT_FILES + ["succeeded" if landed else "failed", "succeeded"]
    values = _native_values(settings, dsn, d)
    assert values == [v for v in range(COMPACT_FILES + 2) if landed or v != COMPACT_FILES]
    t = _table(settings, dsn, d)
    modes = [s.summary.additional_properties.get("lakehouse.mode") for s in t.snapshots()]
    assert modes.count("partial") == 1 and len(list(t.scan().plan_files())) <= 2  # compacted once, by one of them
    assert data_files_on_disk(t) == referenced_files(t)
    from lakehouse_dagster.mirror.native_run import iceberg_only

    found = iceberg_only(conn, load_catalog(settings, dsn), settings, d)  # the reaper's fence kept the run's totals
    assert (found.rows, found.snapshots, len(found.added_files)) == (
        len(values),
        len(values),
        len(t.scan().plan_files()),
    )
