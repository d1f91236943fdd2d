"""Capture mode "after-commit": change tracking written by the WAL consumer after the app's commit, and the
barrier that keeps it exact for the readers that pair it with rows (tracking/capture.py, tracking/barrier.py),
against a real server with wal_level = logical, real syncs and real canaries."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.mirror.poller import Cursor, pending_syncs
from lakehouse_dagster.parity import canary, maintained
from lakehouse_dagster.testing.parity import pg_maintained, pg_reference
from lakehouse_dagster.tracking import barrier, capture, datasets
from lakehouse_dagster_tests.test_canary import evaluate, make_dataset, rows_for, sync
from lakehouse_dagster_tests.test_parity_incremental import app_writer


@pytest.fixture(autouse=True)
def _logical_wal(conn):
    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs a server with wal_level = logical")
    yield
    capture.disable(conn)  # the slot is per server: leave none behind


def settle(c, ids, **kw) -> bool:
    """What the readers that decide from the current version do: True when it had to wait for the consumer."""
    with barrier.read_tracking_consistently(c, ids, **kw) as behind:
        return bool(behind)


def tracking(conn, d) -> tuple:
    return conn.execute(
        "select rows_version, rows_rewrite_version, max_row_index, rows_xid::text::bigint from datasets where id = %s",
        (d,),
    ).fetchone()


def enabled(conn) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "select tgname from pg_trigger where tgrelid = 'dataset_rows'::regclass"
            " and not tgisinternal and tgenabled <> 'D'"
        )
    }


def _steps(conn, d):
    """The same app writes, one transaction each (a rolled-back one among them)."""

    def one(statements):
        def run():
            with conn.transaction():
                for q, p in statements:
                    conn.execute(q, p)

        return run

    def rolled_back():
        with conn.transaction():
            conn.execute("delete from dataset_rows where dataset_id = %s", (d,))
            raise psycopg.Rollback()

    upd = 'update dataset_rows set data = data || \'{"s": "u"}\' where dataset_id = %s and row_index = any(%s)'
    return [
        lambda: datasets.insert_rows(conn, d, rows_for(10, 0), start_index=0),  # a pure append
        lambda: datasets.insert_rows(conn, d, rows_for(10, 10), start_index=10),
        one([(upd, (d, [5]))]),
        one([("delete from dataset_rows where dataset_id = %s and row_index = 3", (d,))]),
        lambda: datasets.insert_rows(conn, d, rows_for(1, 3), start_index=3),  # an insert below the max
        one([("update dataset_rows set row_index = 10000 where dataset_id = %s and row_index = 19", (d,))]),
        rolled_back,
        one(
            [
                ("insert into dataset_rows (dataset_id, row_index, data) values (%s, 10001, '{}')", (d,)),
                (upd, (d, [4, 7])),
            ]
        ),  # an append and an update in one transaction
        lambda: datasets.insert_rows(conn, d, rows_for(5, 20_000), start_index=20_000),
    ]


def _observe(conn, d, before) -> tuple:
    v, rw, mx, _ = tracking(conn, d)
    changes = sorted(
        conn.execute(
            "select bucket, min_idx, max_idx, prev_version = %s from lakehouse_row_changes"
            " where dataset_id = %s and version = %s",
            (before[1], d, v),
        ).fetchall()
    )
    return (v != before[0], rw == v, mx, changes)


def test_the_consumer_writes_the_change_tracking_the_triggers_would(conn):
    a, b = make_dataset(conn, 0, name="by-triggers"), make_dataset(conn, 0, name="by-wal")
    by_triggers = []
    for step in _steps(conn, a):
        before = tracking(conn, a)
        step()
        by_triggers.append(_observe(conn, a, before))

    out = capture.enable(conn)
    assert out["mode"] == "after-commit" and capture.state(conn).mode == "after-commit"
    assert enabled(conn) >= set(capture.BARRIER_TRIGGERS) and not enabled(conn) & set(capture.TRACKING_TRIGGERS)
    by_wal = []
    for step in _steps(conn, b):
        before = tracking(conn, b)
        step()
        assert tracking(conn, b) == before  # out of the app's transaction: nothing written yet
        capture.catch_up(conn)
        by_wal.append(_observe(conn, b, before))
    assert by_wal == by_triggers
    assert [s[0] for s in by_wal] == [True] * 6 + [False] + [True] * 2  # the rolled back write moved nothing
    # rows_xid is the consumer's own transaction, which committed after the write: the poller's cursor holds
    assert tracking(conn, b)[3] > tracking(conn, a)[3]


def test_statements_over_two_datasets_and_a_switch_back_applies_what_was_pending(conn):
    a, b = make_dataset(conn, 5, name="a"), make_dataset(conn, 5, name="b")
    capture.enable(conn)
    va, vb = tracking(conn, a), tracking(conn, b)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "both"}\' where dataset_id = any(%s) and row_index = 1',
        ([a, b],),
    )
    datasets.insert_rows(conn, a, rows_for(3, 100), start_index=100)
    # not caught up: back to the triggers; the switch applies both under its lock, before the triggers resume
    out = capture.disable(conn)
    assert out["mode"] == "triggers" and capture.state(conn).slot is None
    assert set(capture.TRACKING_TRIGGERS) <= enabled(conn) and not enabled(conn) & set(capture.BARRIER_TRIGGERS)
    ta, tb = tracking(conn, a), tracking(conn, b)
    assert ta[0] > va[0] and ta[1] == ta[0] and ta[2] == 102  # the update rewrote, the append raised the max
    assert tb[0] > vb[0] and tb[1] == tb[0] and tb[2] == 4
    datasets.insert_rows(conn, a, rows_for(1, 200), start_index=200)  # the triggers again: a later version
    assert tracking(conn, a)[0] > ta[0] and tracking(conn, a)[2] == 200


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_syncs_and_canaries_in_after_commit_mirror_exactly(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    capture.enable(conn)
    for k in range(4):
        datasets.insert_rows(conn, d, rows_for(100, 10 + 100 * k), start_index=10 + 100 * k)  # the sync catches up
        r = sync(settings, dsn, d)
        assert r.mode == "incremental" and r.rows == 100 and r.total_rows == 110 + 100 * k, r
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK and v.pg_version == tracking(conn, d)[0], v.detail
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "edit"}\' where dataset_id = %s and row_index = 3', (d,)
    )
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 5", (d,))
    r = sync(settings, dsn, d)  # the consumer's row-range records: only the first file is rewritten
    assert r.mode == "partial" and r.total_rows == 409, (r.mode, r.reason)
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK, v.detail
    assert evaluate(settings, dsn, d, full=True).verdict == canary.OK
    assert pending_syncs(conn, Cursor(), limit=10)[0] == []  # mirrored at its version


def test_writers_racing_syncs_and_canaries_never_see_tracking_and_rows_disagree(conn, dsn, settings):
    d = make_dataset(conn, 2000)
    sync(settings, dsn, d)
    capture.enable(conn)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=app_writer, args=(dsn, d, k, errors)) for k in range(3)]
    for t in threads:
        t.start()
    verdicts = []  # mostly lagging (the writers outrun the syncs); what matters is that none is a mismatch
    while any(t.is_alive() for t in threads):
        sync(settings, dsn, d)
        verdicts.append(evaluate(settings, dsn, d))
    for t in threads:
        t.join()
    assert not errors, repr(errors[0])
    sync(settings, dsn, d)
    final = evaluate(settings, dsn, d, full=True)
    assert final.verdict == canary.OK, final.detail
    # while they ran a canary could find Iceberg behind (a write after the sync), never a mismatch
    assert verdicts and all(v.verdict in (canary.OK, canary.LAGGING) for v in verdicts), [
        (v.verdict, v.detail.get("reason")) for v in verdicts if v.verdict not in (canary.OK, canary.LAGGING)
    ]
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def _appender(dsn, d, start: int, n: int, stop: threading.Event, errors: list) -> None:
    try:
        with connect(dsn) as c:
            for i in range(start, start + n):
                if stop.is_set():
                    return
                c.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, %s, '{}')", (d, i))
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_pinned_snapshot_always_sees_exactly_the_rows_its_tracking_describes(conn, dsn):
    """Appenders race pins; in each pin, the tracking's max_row_index is the max of the rows the snapshot holds.
    The same loop with the pin taken outside the barrier finds them apart (the test can fail)."""
    from lakehouse_dagster.mirror.pinned_read import PinnedSnapshot

    d = make_dataset(conn, 0)
    capture.enable(conn)
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=_appender, args=(dsn, d, k * 1_000_000, 100_000, stop, errors)) for k in (1, 2)]
    for t in threads:
        t.start()
    apart = {"barrier": 0, "naive": 0}
    try:
        for _ in range(40):
            pin = PinnedSnapshot(dsn, d)
            try:
                tracked = pin._row[2]
                seen = pin.conn.execute(
                    "select max(row_index) from dataset_rows where dataset_id = %s", (d,)
                ).fetchone()[0]
                apart["barrier"] += tracked != (seen if seen is not None else -1)
            finally:
                pin.close()
            with connect(dsn) as c:  # the same read without the barrier: a consumer catch-up, then a snapshot
                capture.catch_up(c)
                c.execute("begin isolation level repeatable read")
                tracked, seen = c.execute(
                    "select max_row_index, (select max(row_index) from dataset_rows"
                    " where dataset_id = %s) from datasets where id = %s",
                    (d, d),
                ).fetchone()
                c.execute("rollback")
                apart["naive"] += tracked != (seen if seen is not None else -1)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, repr(errors[0])
    assert apart["barrier"] == 0 and apart["naive"] > 0, apart


def test_a_fill_racing_writers_in_after_commit_counts_every_write_once(conn, dsn):
    d = make_dataset(conn, 2000)
    columns = datasets.get_dataset(conn, d).columns
    capture.enable(conn)
    errors: list[BaseException] = []
    threads = [threading.Thread(target=app_writer, args=(dsn, d, k, errors)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert maintained.ensure_pg(conn, d, columns) == "registered+filled"
    for t in threads:
        t.join()
    assert not errors, repr(errors[0])
    capture.catch_up(conn)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_an_app_transaction_holding_its_datasets_row_is_not_the_one_that_gives_way(conn, dsn):
    """The app locks its datasets row, then writes rows while a reader holds the barrier and the consumer must
    write that row: the reader lets go and retries; the app's transaction commits, nobody deadlocks."""
    d = make_dataset(conn, 5)
    capture.enable(conn)
    datasets.insert_rows(conn, d, rows_for(2, 10), start_index=10)  # tracking still to write for d
    app = connect(dsn)
    app.execute("begin")
    app.execute("update datasets set name = name where id = %s", (d,))  # holds the datasets row
    settled: list = []

    def reader():
        with connect(dsn) as c:
            t = time.perf_counter()
            settled.append(settle(c, [d]))
            settled.append(time.perf_counter() - t)

    r = threading.Thread(target=reader)
    r.start()
    time.sleep(0.3)  # the reader holds the barrier and retries the consumer's NOWAIT
    app.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 50, '{}')", (d,))
    app.execute("commit")  # no deadlock error: the barrier gave way
    r.join(timeout=20)
    app.close()
    assert settled and settled[0] is True
    v, rw, mx, _ = tracking(conn, d)
    assert mx == 50  # both writes applied


def test_the_barrier_waits_for_writers_in_flight_and_refuses_after_its_timeout(conn, dsn):
    d = make_dataset(conn, 5)
    capture.enable(conn)
    app = connect(dsn)
    app.execute("begin")
    app.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 70, '{}')", (d,))
    with pytest.raises(capture.BarrierTimeout, match=f"writers of dataset {d} kept a lock"):
        settle(conn, [d], timeout_s=0.5)
    done: list = []
    t = threading.Thread(target=lambda: done.append(settle(connect(dsn), [d], timeout_s=10)))
    t.start()
    time.sleep(0.3)
    assert not done  # waiting for the app's commit
    app.execute("commit")
    app.close()
    t.join(timeout=10)
    assert done == [True] and tracking(conn, d)[2] == 70


def test_the_poller_sees_writes_once_the_consumer_wrote_their_tracking(conn, dsn, settings):
    d = make_dataset(conn, 5)
    sync(settings, dsn, d)
    capture.enable(conn)
    cursor = pending_syncs(conn, Cursor(), limit=10)[1]
    datasets.insert_rows(conn, d, rows_for(2, 10), start_index=10)
    assert barrier.catch_up_without_waiting(conn)["transactions"] >= 1
    pending, _, _ = pending_syncs(conn, cursor, limit=10)
    assert [p.dataset_id for p in pending] == [d]


def test_the_barrier_triggers_disabled_behind_its_back_stop_the_consumer_with_the_reason(conn):
    d = make_dataset(conn, 2)
    capture.enable(conn)
    conn.execute("alter table dataset_rows disable trigger lakehouse_rows_barrier_ins")
    with pytest.raises(capture.CaptureError, match="barrier trigger.*after-commit"):
        capture.catch_up(conn)
    with pytest.raises(capture.CaptureError, match="barrier trigger"):
        settle(conn, [d])
    assert capture.enable(conn)["changed"] is True  # enabled again
    assert capture.catch_up(conn)["transactions"] >= 0


def test_cli_switches_between_the_two_modes_and_the_consumer_sensor_writes_the_tracking(conn, dsn, settings, capsys):
    from lakehouse_dagster.cli.main import main as cli_main
    from lakehouse_dagster_tests.test_digest_capture import _consumer_tick

    d = make_dataset(conn, 5)
    assert cli_main(["digest-capture", "wal-tracking"]) == 0  # the previous release's word: an operator's script
    out, err = capsys.readouterr()
    assert "capture mode: after-commit" in out and "written by the WAL consumer after the commit" in out
    assert err == "lakehouse digest-capture: note: wal-tracking was renamed after-commit\n"
    assert cli_main(["digest-capture", "after-commit"]) == 0  # idempotent
    assert "capture mode: after-commit" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the third mode is gone
        cli_main(["digest-capture", "wal"])
    assert "invalid choice: 'wal'" in capsys.readouterr().err
    before = tracking(conn, d)
    datasets.insert_rows(conn, d, rows_for(3, 10), start_index=10)
    tick = _consumer_tick(dsn).skip_message  # the sensor the daemon runs every 30 s
    assert "decoded 1 transaction(s)" in tick and "change tracking written for 1 dataset(s)" in tick, tick
    assert tracking(conn, d)[0] > before[0] and tracking(conn, d)[2] == 12
    datasets.insert_rows(conn, d, rows_for(1, 20), start_index=20)
    assert cli_main(["digest-capture", "triggers"]) == 0  # tracking back in the app's transaction
    assert "capture mode: triggers (wal_level logical)\n" in capsys.readouterr().out
    assert tracking(conn, d)[2] == 20  # applied by the switch, under its lock
    assert set(capture.TRACKING_TRIGGERS) <= enabled(conn) and not enabled(conn) & set(capture.BARRIER_TRIGGERS)
    datasets.insert_rows(conn, d, rows_for(1, 21), start_index=21)
    assert tracking(conn, d)[2] == 21  # by the trigger, in the transaction


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_reader_frozen_behind_the_barrier_holds_the_apps_writes_for_seconds_not_for_ever(conn, dsn):
    import signal
    import subprocess
    import sys

    d = make_dataset(conn, 5)
    capture.enable(conn)
    code = (
        "import os, signal, psycopg, uuid\n"
        "from lakehouse_dagster.tracking import barrier\n"
        f"c = psycopg.connect({dsn!r}, autocommit=True)\n"
        f"with barrier.read_tracking_consistently(c, [uuid.UUID({str(d)!r})], on_own_connection=True):\n"
        "    print('held', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"  # frozen: a GC pause, a swapped-out process
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"held", proc.stderr.read().decode()[-2000:]
        with connect(dsn) as app:
            app.execute("set statement_timeout = '120s'")  # a barrier never released fails here, not by a clock
            t = time.perf_counter()
            app.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 10, '{}')", (d,))
            waited = time.perf_counter() - t
        # the server ended the frozen session after HOLD_IDLE_TIMEOUT_MS idle, which released the barrier (a lower
        # bound only: a loaded machine may take longer, never less); the frozen process is still stopped
        assert waited > barrier.HOLD_IDLE_TIMEOUT_MS / 1000 - 0.5, waited
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert settle(conn, [d]) is True and tracking(conn, d)[2] == 10


def test_a_gate_deciding_inside_its_transaction_settles_on_a_second_connection(conn, dsn, settings):
    """The flip gates decide inside a transaction: settle then works on a second connection, and the gate's
    next statement (READ COMMITTED) sees the version the consumer wrote."""
    from lakehouse_dagster.tracking import sync_log

    d = make_dataset(conn, 5)
    sync(settings, dsn, d)
    capture.enable(conn)
    datasets.insert_rows(conn, d, rows_for(2, 10), start_index=10)  # not mirrored: a flip must see it as behind
    with conn.transaction():
        assert settle(conn, [d]) is True
        synced = sync_log.latest_mirror_syncs(conn, [d])[d]  # what the write flip's gates read
    status, _, source_version, rows_version = synced
    assert status == "succeeded" and source_version < rows_version == tracking(conn, d)[0]


def test_repair_after_a_lost_slot_marks_every_dataset_changed_and_the_next_sync_is_full(conn, dsn, settings):
    """The lost WAL held tracking nobody wrote: which datasets it changed is unknown, so all of them are."""
    d = make_dataset(conn, 20)
    sync(settings, dsn, d)
    capture.enable(conn)
    conn.execute("select pg_drop_replication_slot(%s)", (capture.state(conn).slot,))  # as if invalidated
    datasets.insert_rows(conn, d, rows_for(5, 300), start_index=300)  # a write no consumer will ever see
    with pytest.raises(capture.CaptureError, match="missing.*repair"):
        settle(conn, [d])  # no reader reads a guess
    before = tracking(conn, d)
    out = capture.repair(conn)
    assert out["repaired"] is True and out["datasets_marked_changed"] >= 1
    v, rw, mx, _ = tracking(conn, d)
    assert v > before[0] and rw == v and mx is None  # a rewrite of unknown extent
    r = sync(settings, dsn, d)
    assert r.mode == "full" and r.total_rows == 25, (r.mode, r.reason)
    assert evaluate(settings, dsn, d).verdict == canary.OK
    # lost again, and this time the operator switches back instead of repairing: the same rule
    conn.execute("select pg_drop_replication_slot(%s)", (capture.state(conn).slot,))
    datasets.insert_rows(conn, d, rows_for(1, 400), start_index=400)
    before = tracking(conn, d)
    out = capture.disable(conn)
    assert out["mode"] == "triggers" and "consumer_error" in out
    v, rw, mx, _ = tracking(conn, d)
    assert v > before[0] and rw == v and mx is None
    assert sync(settings, dsn, d).total_rows == 26
