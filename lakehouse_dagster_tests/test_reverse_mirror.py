"""The reverse mirror (mirror/reverse.py): native Iceberg commits applied to dataset_rows exactly once, with their
identity, in one transaction, without echo, so that a writer rollback needs no backfill.

Real Postgres, real Iceberg tables, native writes through the real write router and chunked writer
(native_helpers.py); the CLI in this process (a subprocess costs seconds on a loaded machine), in a subprocess
where the process must die (a kill before the commit)."""

from __future__ import annotations

import json
import uuid

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.failpoints import FailpointError
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.native_run import iceberg_only
from lakehouse_dagster.mirror.poller import Cursor, datasets_behind, pending_syncs
from lakehouse_dagster.mirror.reverse import PostgresWritten, apply_due, apply_reverse, position
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.parity.maintained import SEG_BITS
from lakehouse_dagster.status.recording import STREAMS, Position, read_stream
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli
from .native_helpers import SCHEMA, native_write, row, runbook_ready, snapshot, table_rows


def _json(lh, *args: str):
    return json.loads(lh(*args, "--json", check=True)[1])


def ready_native(conn, dsn, settings, lh, writer: str, rows: int = 6) -> uuid.UUID:
    """native_helpers.ready_native with the CLI in this process."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(rows)])
    runbook_ready(conn, dsn, settings, d)
    lh("write-flags", "set", writer, "iceberg_native", "--dataset", str(d), check=True)
    return d


def _pg_rows(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, row_id::text, created_at, data from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


def _identity(rows: list[dict]) -> list[tuple]:
    return [(r["__row_index"], r["__row_id"], r["__created_at"]) for r in rows]


def _tracking(conn, d) -> tuple:
    """What change tracking says of the dataset: a reverse apply moves none of it."""
    return conn.execute(
        "select d.rows_version, d.rows_xid, d.rows_rewrite_version, d.mirrored_version,"
        " (select count(*) from lakehouse_row_changes c where c.dataset_id = d.id) from datasets d where d.id = %s",
        (d,),
    ).fetchone()


def _same_as_table(conn, settings, dsn, d) -> None:
    pg, ice = _pg_rows(conn, d), table_rows(settings, dsn, d)
    assert [p[:3] for p in pg] == _identity(ice)
    assert [p[3]["s"] for p in pg] == [r["s"] for r in ice]


def _digest_is_exact(conn, d) -> None:
    """The maintained Postgres digest of the dataset (filled) is what summing its rows afresh gives."""
    state = conn.execute(
        "select filled, hash_sql from lakehouse_pg_digest_state where dataset_id = %s", (d,)
    ).fetchone()
    assert state is not None and state[0]
    kept = conn.execute(
        "select seg, sum(n), sum(s) from lakehouse_pg_digest_deltas where dataset_id = %s group by seg"
        " having sum(n) <> 0 or sum(s) <> 0 order by seg",
        (d,),
    ).fetchall()
    fresh = conn.execute(
        f"select row_index >> {SEG_BITS}, count(*), sum({state[1]}) from dataset_rows where dataset_id = %s"
        " group by 1 order by 1",
        (d,),
    ).fetchall()
    assert kept == fresh


def test_a_native_append_is_applied_once_with_identity_and_no_echo(conn, dsn, settings, lh):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 10)], start=6)
    tracked = _tracking(conn, d)
    xid = conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]

    r = apply_reverse(dsn, catalog, settings, d)
    assert (r.how, r.copied, r.removed, r.pg_rows, r.snapshot_id) == ("append", 4, 0, 10, snapshot(settings, dsn, d))
    _same_as_table(conn, settings, dsn, d)
    assert conn.execute("select row_count, max_row_index from datasets where id = %s", (d,)).fetchone() == (10, 9)
    assert position(conn, d).snapshot_id == r.snapshot_id
    assert iceberg_only(conn, catalog, settings, d) is None  # the native marker ends at the reverse's snapshot
    native = evaluate(dsn, catalog, settings, d)  # the canary's digests: every value as the table's
    assert (native.verdict, native.detail["agrees_with_postgres"]) == ("native", True)

    # no echo: change tracking did not move, the poller's change query finds nothing, nothing is behind
    assert _tracking(conn, d) == tracked
    pending, _, scanned = pending_syncs(conn, Cursor(xid + 1), limit=100, exclude_native=False)
    assert (pending, scanned) == ([], 0)
    assert d not in [
        p.dataset_id
        for p in datasets_behind(conn, after_seconds=0, max_retries=0, limit=100, exclude_native=False).fresh
    ]
    # the recorder sees nothing of the apply in any of its streams (no sync, no flag, no backfill, ...)
    for stream in STREAMS:
        changes, _ = read_stream(conn, stream, Position(xid + 1), 100)
        assert changes == [], (stream, changes)
    assert conn.execute(
        "select how from lakehouse_pg_reconciled where dataset_id = %s order by id", (d,)
    ).fetchall() == [("reverse",)]

    again = apply_reverse(dsn, catalog, settings, d)
    assert (again.how, again.copied, again.pg_rows) == ("noop", 0, 10) and "already at snapshot" in again.summary()

    # the next native append: only its file, and a batch helper finds it
    native_write(conn, dsn, settings, d, "sync.append", [row(10), row(11)], start=10)
    batch = apply_due(dsn, catalog, settings)
    assert [(b.dataset_id, b.how, b.copied) for b in batch.applied] == [(d, "append", 2)] and not batch.failed
    _same_as_table(conn, settings, dsn, d)
    assert apply_due(dsn, catalog, settings).applied == []


def test_a_native_overwrite_is_a_full_re_sync(conn, dsn, settings, lh):
    d = ready_native(conn, dsn, settings, lh, "sync.full", rows=6)
    native_write(conn, dsn, settings, d, "sync.full", [{**row(i), "s": f"new {i}"} for i in range(4)], start=0)
    tracked = _tracking(conn, d)
    _digest_is_exact(conn, d)  # filled: the re-sync's delete takes the digest shortcut (not hashed row by row)
    other = datasets.create_dataset(conn, datasets.create_workspace(conn, "other"), "other", SCHEMA)
    datasets.insert_rows(conn, other, [row(i) for i in range(3)])
    r = apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    assert (r.how, r.removed, r.copied, r.pg_rows) == ("full", 6, 4, 4)
    _digest_is_exact(conn, d)  # the sums of the 4 new rows exactly, the 6 deleted ones gone with their deltas
    # the shortcut's setting is the re-sync's transaction's only: a delete of the app's is hashed as ever
    from lakehouse_dagster.parity.maintained import ensure_pg

    ensure_pg(conn, other, datasets.get_dataset(conn, other).columns)
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 1", (other,))
    _digest_is_exact(conn, other)
    assert _tracking(conn, d) == tracked  # the delete and the insert: no echo either
    assert evaluate(dsn, load_catalog(settings, dsn), settings, d).detail["agrees_with_postgres"] is True
    _same_as_table(conn, settings, dsn, d)
    assert [p[3]["s"] for p in _pg_rows(conn, d)] == [f"new {i}" for i in range(4)]
    assert conn.execute("select row_count, max_row_index from datasets where id = %s", (d,)).fetchone() == (4, 3)


def _unseen(conn, statement: str, params=()) -> None:
    """A write to dataset_rows that change tracking does not see (the replica role): rows as an older release left
    them, holding a key the mirror dropped silently."""
    with conn.transaction():
        conn.execute("set local session_replication_role = replica")
        conn.execute(statement, params)


def test_a_full_re_sync_refuses_to_erase_keys_the_table_has_no_column_for(conn, dsn, settings, lh):
    """Issue 42 item 5: the re-sync deleted every row and copied the table's back, erasing undeclared keys."""
    d = ready_native(conn, dsn, settings, lh, "sync.full", rows=6)
    _unseen(
        conn,
        'update dataset_rows set data = data || \'{"note": "keep me"}\' where dataset_id = %s and row_index = 2',
        (d,),
    )
    native_write(conn, dsn, settings, d, "sync.full", [{**row(i), "s": f"new {i}"} for i in range(4)], start=0)
    before, at = _pg_rows(conn, d), position(conn, d)
    with pytest.raises(BadInput) as err:
        apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    message = str(err.value)
    assert "\n" not in message and str(d) in message
    assert "refuses to re-sync it in full: 1 row(s) of dataset_rows hold key(s) the Iceberg table has no column" in (
        message
    )
    assert "'note' (1 row)" in message and message.endswith("nothing was written")
    assert _pg_rows(conn, d) == before  # the key and every row kept
    assert position(conn, d) == at
    # the operator removes the key (or declares it): the re-sync runs
    _unseen(conn, "update dataset_rows set data = data - 'note' where dataset_id = %s", (d,))
    r = apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    assert (r.how, r.removed, r.copied) == ("full", 6, 4)
    _same_as_table(conn, settings, dsn, d)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_failure_before_the_commit_leaves_postgres_whole_and_the_next_apply_finishes(
    conn, dsn, settings, lh, monkeypatch
):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    before = _pg_rows(conn, d)

    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "reverse-before-commit:raise")
    with pytest.raises(FailpointError):
        apply_reverse(dsn, catalog, settings, d)
    assert _pg_rows(conn, d) == before and position(conn, d) is None

    # a kill (SIGKILL) before the commit, through the CLI: still nothing half-applied
    proc = cli("reverse", "sync", "--dataset", str(d), env={"LAKEHOUSE_FAILPOINT": "reverse-before-commit"})
    assert proc.returncode == -9, proc.stderr
    assert _pg_rows(conn, d) == before and position(conn, d) is None

    # a failure after the commit: the snapshot is applied whole; the next apply is a no-op
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "reverse-after-commit:raise")
    with pytest.raises(FailpointError):
        apply_reverse(dsn, catalog, settings, d)
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    assert len(_pg_rows(conn, d)) == 9 and position(conn, d).snapshot_id == snapshot(settings, dsn, d)
    assert apply_reverse(dsn, catalog, settings, d).how == "noop"
    _same_as_table(conn, settings, dsn, d)


def test_rollback_of_a_reverse_synced_dataset_needs_no_backfill(conn, dsn, settings, lh):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 10)], start=6)
    apply_reverse(dsn, catalog, settings, d)
    snap, ice = snapshot(settings, dsn, d), table_rows(settings, dsn, d)

    out = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)[1]
    assert f"reverse-synced up to snapshot {snap}: no backfill needed" in out and "backfill --dataset" not in out

    # the forward mirror runs at once: no refusal, nothing to do, Postgres == Iceberg
    r = sync_dataset(dsn, catalog, settings, d)
    assert (r.mode, r.rows) == ("noop", 0) and snapshot(settings, dsn, d) == snap
    _same_as_table(conn, settings, dsn, d)
    # noop, then ok: the canary asks the lifecycle who is the truth (Postgres again), not who wrote the snapshot
    # (issue 42, item 4: it said "native ... Postgres is not authoritative for it", and a re-flip went on that)
    v = evaluate(dsn, catalog, settings, d, smoke=True)
    assert v.verdict == "ok", v.detail
    # the live app writes again on the pg path: the next forward sync is a pure append of just that row
    datasets.insert_rows(conn, d, [row(99)])
    r = sync_dataset(dsn, catalog, settings, d)
    assert (r.mode, r.rows, r.total_rows) == ("incremental", 1, 11)
    assert _identity(table_rows(settings, dsn, d))[:10] == _identity(ice)
    _same_as_table(conn, settings, dsn, d)


def test_a_rollback_right_after_a_native_write_applies_the_reverse_first_and_needs_no_backfill(conn, dsn, settings, lh):
    """The driver's window: a native commit the stream has not applied yet when the writer is rolled back."""
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    assert position(conn, d) is None  # nothing drove the reverse yet
    snap = snapshot(settings, dsn, d)
    out = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)[1]
    assert f"reverse-synced up to snapshot {snap}: no backfill needed" in out and "backfill --dataset" not in out
    assert position(conn, d).snapshot_id == snap
    _same_as_table(conn, settings, dsn, d)
    r = sync_dataset(dsn, load_catalog(settings, dsn), settings, d)  # the forward mirror resumes at once
    assert (r.mode, r.rows) == ("noop", 0)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_rollback_while_the_reverse_is_behind_or_off_says_run_the_backfill(conn, dsn, settings, lh, monkeypatch):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "reverse-before-commit:raise")  # the catch-up before it fails
    code, out, err = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d))
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    assert code == 0 and f"the reverse mirror could not catch up dataset {d} before the rollback" in err
    assert "reverse was behind (it never applied a snapshot): run lakehouse backfill" in out
    assert f"lakehouse backfill --dataset {d}" in out
    # not native any more: the reverse leaves it alone and says what to do
    with pytest.raises(BadInput, match="not written iceberg-native.*lakehouse backfill"):
        apply_reverse(dsn, load_catalog(settings, dsn), settings, d)

    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    lh("reverse", "off", "--dataset", str(d), "--note", "no copy", check=True)
    out = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)[1]
    assert "reverse was off: run lakehouse backfill" in out


def test_the_reverse_setting_cli(conn, dsn, settings, lh):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    ws = conn.execute("select workspace_id from datasets where id = %s", (d,)).fetchone()[0]
    status = _json(lh, "reverse", "status")["datasets"]
    assert [(s["dataset_id"], s["enabled"], s["source"], s["state"]) for s in status] == [
        (str(d), True, "default", "behind")
    ]

    out = lh("reverse", "off", "--workspace", str(ws), "--note", "later", check=True)[1]
    assert f"reverse: (no setting) → off for workspace {ws}" in out
    code, _, err = lh("reverse", "sync", "--dataset", str(d))
    assert code == 2 and "reverse off (workspace setting)" in err
    assert "lakehouse reverse on --dataset" in err and position(conn, d) is None
    lh("reverse", "on", "--dataset", str(d), check=True)  # the dataset's setting wins
    assert _json(lh, "reverse", "status", "--dataset", str(d))["datasets"][0]["source"] == "dataset"
    synced = _json(lh, "reverse", "sync", "--dataset", str(d))
    assert synced["how"] == "append" and synced["pg_rows"] == 6  # Postgres held everything already
    assert _json(lh, "reverse", "status")["datasets"][0]["state"] == "caught up"

    audit = conn.execute("select count(*) from lakehouse_reverse_audit").fetchone()[0]
    for bad, says in (
        (("off", "--dataset", str(d), "--workspace", str(ws)), "give either --dataset or --workspace, not both"),
        (("on", "--dataset", "nope"), "dataset id"),
        (("on", "--dataset", "00000000-0000-0000-0000-000000000001"), "does not exist"),
        (("sync", "--full"), "--full re-syncs one dataset"),
    ):
        code, _, err = lh("reverse", *bad)
        assert code != 0 and says in err and len(err.strip().splitlines()) == 1, err
    assert conn.execute("select count(*) from lakehouse_reverse_audit").fetchone()[0] == audit
    assert [h["after"] for h in _json(lh, "reverse", "history")["history"]] == [True, False]


def test_a_postgres_side_write_to_a_native_dataset_is_refused_never_answered_by_a_deletion(conn, dsn, settings, lh):
    """Issue 42, item 8: the reverse noticed a write into Postgres only by a row count and answered it by deleting.
    Now its position records rows_version: such a write is seen in O(1) and the apply refuses, keeping every row."""
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    assert apply_reverse(dsn, catalog, settings, d).how == "append"
    # a row only Postgres holds (the live app's row.edit, locked to pg, wrote it while the dataset is native)
    datasets.insert_rows(conn, d, [row(50)])
    native_write(conn, dsn, settings, d, "sync.append", [row(7), row(8)], start=7)
    kept = _pg_rows(conn, d)
    with pytest.raises(PostgresWritten) as refused:
        apply_reverse(dsn, catalog, settings, d)
    text = str(refused.value)
    assert f"refused: dataset {d} is native (Iceberg is its truth), but its dataset_rows was written" in text
    assert f"lakehouse reverse sync --dataset {d} --full" in text and "nothing was written" in text
    assert _pg_rows(conn, d) == kept
    code, _, err = lh("reverse", "sync", "--dataset", str(d))
    assert code == 6 and "rows_version" in err and len(err.strip().splitlines()) == 1, err
    assert _pg_rows(conn, d) == kept
    # the operator accepts Iceberg's rows: a full re-sync, asked for
    assert apply_reverse(dsn, catalog, settings, d, full=True).how == "full"
    _same_as_table(conn, settings, dsn, d)
    # a position left by an earlier release (no rows_version): the count still tells, as before
    conn.execute("update lakehouse_reverse_position set rows_version = null where dataset_id = %s", (d,))
    datasets.insert_rows(conn, d, [row(51)])
    native_write(conn, dsn, settings, d, "sync.append", [row(10)], start=10)
    r = apply_reverse(dsn, catalog, settings, d)
    assert r.how == "full" and "Postgres would hold 11 row(s) where the snapshot has 10" in r.reason, r.reason
    _same_as_table(conn, settings, dsn, d)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_frozen_apply_whose_lock_session_died_stands_down_and_the_next_one_applies(conn, dsn, settings, lh):
    """Found by the crash harness's probe: an apply frozen before its commit, its dataset-lock session terminated
    meanwhile, used to commit when resumed, while a second apply that took the lock waited on its rows and failed."""
    import os
    import signal
    import subprocess
    import sys

    from lakehouse_dagster.testing.crash_harness import REVERSE_ONCE
    from lakehouse_dagster.testing.faults import cli_env, terminate_lock_session, wait_stopped

    d = ready_native(conn, dsn, settings, lh, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    before = _pg_rows(conn, d)
    proc = subprocess.Popen(
        [sys.executable, "-c", REVERSE_ONCE, str(d)],
        env=cli_env("reverse-before-commit:stop"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_stopped(proc)
        assert terminate_lock_session(conn, d) == 1  # its G3 session dies; the process itself lives on, frozen
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "GuardLost" in err and "not committing" in err, err
    # said as a reverse apply's (it wrote no files for a next sync to settle)
    assert "another reverse apply may own the dataset now; nothing of this apply is committed" in err, err
    assert _pg_rows(conn, d) == before and position(conn, d) is None  # it committed nothing
    r = apply_reverse(dsn, load_catalog(settings, dsn), settings, d)  # the next apply is not blocked, and applies
    assert r.how == "append" and r.copied == 3 and position(conn, d).snapshot_id == snapshot(settings, dsn, d)
    _same_as_table(conn, settings, dsn, d)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_in_capture_mode_after_commit_the_reverse_applies_without_echo_and_the_app_is_still_tracked(
    conn, dsn, settings, lh
):
    """Capture mode after-commit: the WAL consumer writes change tracking after the commit and cannot see the
    reverse's setting; the reverse's logical message, inside its transaction, tells it. Decoded in one chunk with
    live-app writes before and after it: the app's are tracked, the reverse's move nothing, and the maintained
    digest follows every row. A Postgres-locked reader is then served the copy."""
    from lakehouse_dagster.core.errors import ReadRefused
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.routing.read_router import resolve_read_source
    from lakehouse_dagster.tracking import capture

    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs wal_level = logical")
    d = ready_native(conn, dsn, settings, lh, "sync.append")  # its maintained digest filled by the canary
    app = datasets.create_dataset(conn, datasets.create_workspace(conn, "app"), "app", SCHEMA)
    datasets.insert_rows(conn, app, [row(i) for i in range(3)])
    catalog = load_catalog(settings, dsn)
    capture.enable(conn)
    try:
        native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 10)], start=6)
        capture.catch_up(conn)
        tracked, app_tracked = _tracking(conn, d), _tracking(conn, app)
        xid = conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]

        # the live app, before the reverse's commit; a non-transactional message with the reverse's prefix (sent
        # outside any transaction) marks nothing
        conn.execute("select pg_logical_emit_message(false, %s, 'not a transaction')", (capture.REVERSE_PREFIX,))
        datasets.insert_rows(conn, app, [row(3)], start_index=3)
        r = apply_reverse(dsn, catalog, settings, d)
        assert (r.how, r.copied, r.removed, r.pg_rows) == ("append", 4, 0, 10)
        conn.execute(  # and after it: a rewrite of the app's own
            'update dataset_rows set data = data || \'{"s": "edited"}\' where dataset_id = %s and row_index = 0',
            (app,),
        )
        assert capture.catch_up(conn)["transactions"] == 3  # all three in one chunk
        _same_as_table(conn, settings, dsn, d)
        assert conn.execute("select row_count, max_row_index from datasets where id = %s", (d,)).fetchone() == (10, 9)

        # no echo: the consumer moved no tracking of the reverse's rows, the poller finds only the app's dataset
        assert _tracking(conn, d) == tracked
        pending, _, _ = pending_syncs(conn, Cursor(xid + 1), limit=100, exclude_native=False)
        assert [p.dataset_id for p in pending] == [app]
        behind = datasets_behind(conn, after_seconds=0, max_retries=0, limit=100, exclude_native=False).fresh
        assert d not in [p.dataset_id for p in behind]
        # the live app's writes in the same chunk are tracked: a new version, a rewrite (the update), its range
        version, _, rewrite, _, ranges = _tracking(conn, app)
        assert version > app_tracked[0] and rewrite == version and ranges == app_tracked[4] + 1
        assert conn.execute("select max_row_index from datasets where id = %s", (app,)).fetchone()[0] == 3
        # the maintained digest followed the reverse's rows, at the version it had (none was drawn for them)
        _digest_is_exact(conn, d)
        assert conn.execute(
            "select s.applied_version = d.rows_version from lakehouse_pg_digest_state s join datasets d"
            " on d.id = s.dataset_id where s.dataset_id = %s",
            (d,),
        ).fetchone() == (True,)
        assert evaluate(dsn, catalog, settings, d).detail["agrees_with_postgres"] is True

        # a full re-sync: its delete and insert hashed from the stream (no digest shortcut here), no echo either
        xid = conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]
        full = apply_reverse(dsn, catalog, settings, d, full=True)
        assert (full.how, full.removed, full.copied, full.pg_rows) == ("full", 10, 10, 10)
        assert capture.catch_up(conn)["transactions"] == 1
        assert _tracking(conn, d) == tracked
        _digest_is_exact(conn, d)
        _same_as_table(conn, settings, dsn, d)
        assert pending_syncs(conn, Cursor(xid + 1), limit=100, exclude_native=False)[0] == []
        for stream in STREAMS:  # the recorder sees nothing of the apply
            changes, _ = read_stream(conn, stream, Position(xid + 1), 100)
            assert changes == [], (stream, changes)

        # Postgres-locked readers are served the reverse's copy (STRICT: it is caught up), not refused
        def pg(_decision):
            return sorted(
                int(r[0]) for r in conn.execute("select row_index from dataset_rows where dataset_id = %s", (d,))
            )

        def iceberg(_decision):
            raise AssertionError("a Postgres-locked reader was served Iceberg")

        for reader in ("pipeline.expectations", "dashboards.aggregate"):
            got = resolve_read_source(conn, FlagResolver(conn, 0), reader, d).run(postgres=pg, iceberg=iceberg)
            assert (got.decision.source, got.decision.reason, got.value) == ("pg", "pg@reverse", list(range(10)))
        native_write(conn, dsn, settings, d, "sync.append", [row(10)], start=10)
        with pytest.raises(ReadRefused, match="reverse mirror has not applied its latest snapshot"):
            resolve_read_source(conn, FlagResolver(conn, 0), "pipeline.expectations", d).run(
                postgres=pg, iceberg=iceberg
            )
    finally:
        capture.disable(conn)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_in_capture_mode_after_commit_an_apply_killed_before_its_commit_leaves_nothing_for_the_consumer(
    conn, dsn, settings, lh
):
    """The message is transactional: an apply killed (SIGKILL, in its own process) before its commit leaves no
    rows, no mark and no digest delta in the stream; the next apply lands once, untracked, the digest exact."""
    from lakehouse_dagster.tracking import capture

    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs wal_level = logical")
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    capture.enable(conn)
    try:
        native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
        capture.catch_up(conn)
        before, tracked = _pg_rows(conn, d), _tracking(conn, d)
        proc = cli("reverse", "sync", "--dataset", str(d), env={"LAKEHOUSE_FAILPOINT": "reverse-before-commit"})
        assert proc.returncode == -9, proc.stderr
        assert capture.catch_up(conn)["transactions"] == 0  # nothing of the killed apply was committed
        assert _pg_rows(conn, d) == before and position(conn, d) is None

        r = apply_reverse(dsn, catalog, settings, d)
        assert (r.how, r.copied, r.pg_rows) == ("append", 3, 9)
        assert capture.catch_up(conn)["transactions"] == 1
        assert _tracking(conn, d) == tracked
        _digest_is_exact(conn, d)
        _same_as_table(conn, settings, dsn, d)
    finally:
        capture.disable(conn)
