"""The WAL consumer's maintained Postgres digest in capture mode "after-commit": computed after the app's
transaction, from a logical replication slot (tracking/capture.py), against a real server with wal_level =
logical. (The change tracking it writes in that mode, and the barrier: test_tracking_capture.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import SyncFailed
from lakehouse_dagster.parity import canary, maintained
from lakehouse_dagster.parity.digest import PinnedPostgres
from lakehouse_dagster.parity.errors import MaintainedDigestUnavailable
from lakehouse_dagster.testing.parity import pg_maintained, pg_reference
from lakehouse_dagster.tracking import capture, datasets
from lakehouse_dagster_tests.test_canary import evaluate, make_dataset, rows_for, sync
from lakehouse_dagster_tests.test_parity_incremental import app_writer, spread_rows


@pytest.fixture(autouse=True)
def _logical_wal(conn):
    # The embedded test server always has it; a server given by LAKEHOUSE_TEST_ADMIN_DSN may not.
    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs a server with wal_level = logical")


def digest_triggers_enabled(conn) -> set[str]:
    return {
        r[0]
        for r in conn.execute(
            "select tgname from pg_trigger where tgrelid = 'dataset_rows'::regclass and tgname like '%%_digest'"
            " and tgenabled <> 'D'"
        )
    }


def test_switching_to_after_commit_moves_the_hashing_out_of_the_app_transaction_and_back(conn, dsn):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 1, 65_535, 65_536, 131_072])
    columns = datasets.get_dataset(conn, d).columns
    assert maintained.ensure_pg(conn, d, columns) == "registered+filled"
    datasets.insert_rows(conn, d, rows_for(5, 40), start_index=200)  # counted by the triggers, before the switch
    out = capture.enable(conn)
    assert out["mode"] == "after-commit" and out["changed"] is True
    assert digest_triggers_enabled(conn) == set()
    assert conn.execute("select relreplident from pg_class where oid = 'dataset_rows'::regclass").fetchone()[0] == "f"
    deltas_before = conn.execute("select count(*) from lakehouse_pg_digest_deltas").fetchone()[0]
    datasets.insert_rows(conn, d, rows_for(50, 100), start_index=300_000)  # after the switch: no trigger ran
    assert conn.execute("select count(*) from lakehouse_pg_digest_deltas").fetchone()[0] == deltas_before
    # not applied yet: the canary's pin waits behind the barrier and catches the consumer up, never stale
    with PinnedPostgres(dsn, dataset_id=d) as pg:
        assert maintained.pg_segments(pg.conn, d, columns) == pg_reference(dsn, d)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "changed"}\' where dataset_id = %s'
        " and row_index in (1, 65536, 300010)",
        (d,),
    )
    conn.execute("update dataset_rows set row_index = row_index + 7 where dataset_id = %s and row_index = 65535", (d,))
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index >= 300020", (d,))
    with conn.transaction():  # a rolled back write leaves nothing
        conn.execute("delete from dataset_rows where dataset_id = %s", (d,))
        raise psycopg.Rollback()
    with conn.transaction():  # several statements in one transaction
        datasets.insert_rows(conn, d, rows_for(3, 900), start_index=400_000)
        conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 400001", (d,))
    done = capture.catch_up(conn)
    # four app transactions and the consumer's own (it wrote the tracking the pin caught up); the rolled back
    # one is not in the stream
    assert done["transactions"] == 5 and done["rows"] > 0
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    again = capture.catch_up(conn)  # exactly once: nothing left, nothing applied twice (what it decodes is
    assert again["rows"] == 0 and again["tracked"] == 0  # the consumer's own write of the tracking)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    # back to the triggers: what was written before the switch is applied, then the slot is gone
    datasets.insert_rows(conn, d, rows_for(4, 700), start_index=500_000)
    off = capture.disable(conn)
    assert off["mode"] == "triggers" and off["transactions"] >= 1
    assert digest_triggers_enabled(conn) == set(capture.DIGEST_TRIGGERS)
    assert (
        conn.execute("select count(*) from pg_replication_slots where database = current_database()").fetchone()[0] == 0
    )
    datasets.insert_rows(conn, d, rows_for(2, 800), start_index=600_000)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_refuses_without_logical_wal_and_changes_nothing(conn, monkeypatch):
    real = conn.execute

    def execute(query, *a, **kw):
        if query == "show wal_level":
            return real("select 'replica'")
        return real(query, *a, **kw)

    monkeypatch.setattr(conn, "execute", execute)
    with pytest.raises(capture.CaptureError, match="wal_level is 'replica'.*nothing was changed"):
        capture.enable(conn)
    monkeypatch.undo()
    assert capture.state(conn).mode == "triggers" and digest_triggers_enabled(conn) == set(capture.DIGEST_TRIGGERS)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_canary_in_after_commit_compares_maintained_sums_and_agrees_with_a_full_redigest(conn, dsn, settings):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 5, 70_000, 140_000])
    capture.enable(conn)
    datasets.insert_rows(conn, d, rows_for(40, 7))
    sync(settings, dsn, d)
    first = evaluate(settings, dsn, d)
    assert first.verdict == canary.OK and first.detail["digest"] == "maintained", first.detail
    assert first.detail["maintained_prepare"]["postgres"] == "registered+filled"
    datasets.insert_rows(conn, d, rows_for(10, 500))  # an append: applied by the canary's catch-up
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "u"}\' where dataset_id = %s and row_index = 70000', (d,)
    )
    sync(settings, dsn, d)
    after = evaluate(settings, dsn, d)
    assert after.verdict == canary.OK and after.detail["digest"] == "maintained", after.detail
    assert after.detail["wal_consumer"]["transactions"] >= 2
    assert after.detail["maintained_prepare"]["postgres"] == "ready"
    full = evaluate(settings, dsn, d, full=True)
    assert full.verdict == canary.OK and full.detail["maintained_agrees"] is True and full.pg_digest == after.pg_digest
    # a change the mirror has not seen: the maintained comparison finds it, down to the row
    with conn.transaction():
        conn.execute("set local session_replication_role = replica")  # silences triggers, not the WAL
        conn.execute(
            'update dataset_rows set data = data || \'{"s": "drift"}\' where dataset_id = %s and row_index = 5', (d,)
        )
    # tracked from the WAL all the same: a new version the mirror has not seen, never a silent drift
    drift = evaluate(settings, dsn, d)
    assert drift.verdict == canary.LAGGING, drift.detail
    sync(settings, dsn, d)
    again = evaluate(settings, dsn, d)
    assert again.verdict == canary.OK and again.detail["digest"] == "maintained", again.detail
    assert again.detail["maintained_prepare"]["postgres"] == "ready"
    capture.disable(conn)


def test_concurrent_writers_consumers_and_a_fill_lose_nothing_and_count_nothing_twice(conn, dsn):
    d = make_dataset(conn, 2000)
    columns = datasets.get_dataset(conn, d).columns
    capture.enable(conn)
    errors: list[BaseException] = []
    stop = threading.Event()

    def consumer():
        try:
            with connect(dsn) as c:
                while not stop.is_set():
                    capture.catch_up(c, chunk=50)  # small chunks: many consumer transactions
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=app_writer, args=(dsn, d, k, errors)) for k in range(3)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    time.sleep(0.3)
    outcome = maintained.ensure_pg(conn, d, columns)  # registration and fill while writers and a consumer run
    for t in threads[:-1]:
        t.join()
    stop.set()
    threads[-1].join()
    assert not errors, repr(errors[0])
    assert outcome == "registered+filled"
    capture.catch_up(conn)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    capture.disable(conn)


def consumer_killed_at(dsn: str, needle: str) -> None:
    """A catch-up in a process of its own, SIGKILLed when it is about to run a query containing ``needle``."""
    code = (
        "import os, psycopg, signal\n"
        "from lakehouse_dagster.tracking import capture\n"
        "real = psycopg.Connection.execute\n"
        "def execute(self, query, *a, **kw):\n"
        f"    if isinstance(query, str) and {needle!r} in query:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(self, query, *a, **kw)\n"
        "psycopg.Connection.execute = execute\n"
        f"capture.catch_up(psycopg.connect({dsn!r}, autocommit=True))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def test_a_consumer_killed_between_its_commit_and_the_slot_advance_applies_nothing_twice(conn, dsn):
    d = make_dataset(conn, 10)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    capture.enable(conn)
    datasets.insert_rows(conn, d, rows_for(20, 50))
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index < 3", (d,))
    # A separate process applies the chunk and is killed before pg_replication_slot_advance.
    consumer_killed_at(dsn, "pg_replication_slot_advance")
    slot = capture.state(conn).slot
    confirmed, applied = conn.execute(
        "select confirmed_flush_lsn, (select applied_lsn from lakehouse_digest_capture)"
        " from pg_replication_slots where slot_name = %s",
        (slot,),
    ).fetchone()
    assert applied > confirmed  # the deltas committed, the slot did not move
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    again = capture.catch_up(conn)  # peeks the same transactions again and skips them
    assert again["transactions"] >= 2
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    capture.disable(conn)


def test_digest_triggers_enabled_behind_the_consumers_back_drop_the_sums_instead_of_counting_twice(conn, dsn, settings):
    d = make_dataset(conn, 30)
    capture.enable(conn)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).detail["digest"] == "maintained"
    conn.execute("alter table dataset_rows enable always trigger lakehouse_rows_ins_digest")
    datasets.insert_rows(conn, d, rows_for(3, 900))
    with pytest.raises(capture.CaptureError, match="re-enabled"):
        capture.catch_up(conn)
    assert conn.execute("select count(*) from lakehouse_pg_digest_state").fetchone()[0] == 0
    with pytest.raises(SyncFailed, match="re-enabled"):  # no reader pairs rows with tracking it cannot trust
        sync(settings, dsn, d)
    capture.enable(conn)  # switching again disables them and resumes
    assert digest_triggers_enabled(conn) == set()
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).detail["digest"] == "maintained"
    capture.disable(conn)


def test_commits_not_yet_flushed_are_left_for_the_next_catch_up_never_skipped(conn, dsn):
    d = make_dataset(conn, 10)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    capture.enable(conn)
    with connect(dsn) as app:
        app.execute("set synchronous_commit = off")  # commits return before their WAL is flushed
        for k in range(60):
            datasets.insert_rows(app, d, rows_for(1, 100 + k), start_index=1000 + k)
            if k % 20 == 19:
                capture.catch_up(conn)  # may run before the walwriter flushed the last commits
        written = app.execute("select pg_current_wal_insert_lsn()").fetchone()[0]
    deadline = time.monotonic() + 60
    while not conn.execute("select pg_current_wal_flush_lsn() >= %s::pg_lsn", (written,)).fetchone()[0]:
        assert time.monotonic() < deadline, "the walwriter did not flush the commits"
        time.sleep(0.05)  # the walwriter flushes them within wal_writer_delay (200 ms): waited for, not slept
    capture.catch_up(conn)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    capture.disable(conn)


def test_cli_switches_reports_and_catches_up(conn, dsn, settings, capsys):
    from lakehouse_dagster.cli.main import main as cli_main

    d = make_dataset(conn, 5)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    assert cli_main(["digest-capture"]) == 0
    assert "capture mode: triggers (wal_level logical)" in capsys.readouterr().out
    assert cli_main(["digest-capture", "after-commit"]) == 0
    out = capsys.readouterr().out
    assert "capture mode: after-commit" in out and "bytes of WAL not consumed" in out
    datasets.insert_rows(conn, d, rows_for(7, 70))
    assert cli_main(["digest-capture", "catch-up", "--json"]) == 0
    assert '"transactions": 1' in capsys.readouterr().out
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    assert cli_main(["digest-capture", "triggers"]) == 0
    assert "capture mode: triggers" in capsys.readouterr().out
    assert capture.state(conn).slot is None


def test_statements_over_two_datasets_large_transactions_and_truncate(conn, dsn):
    from lakehouse_dagster_tests.test_app_write_cost import _insert_both

    a, b, c = make_dataset(conn, 5, name="a"), make_dataset(conn, 5, name="b"), make_dataset(conn, 5, name="c")
    for d in (a, b):
        maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    capture.enable(conn)
    _insert_both(conn, a, c, 1000)  # a registered and an unregistered dataset in one statement
    _insert_both(conn, b, a, 2000)
    with conn.transaction():  # more rows than one hash call takes, in one transaction, plus a small write
        datasets.insert_rows(conn, a, rows_for(capture.HASH_BATCH * 2 + 17, 5000), start_index=10_000)
        conn.execute("delete from dataset_rows where dataset_id = %s and row_index between 10000 and 10500", (a,))
        datasets.insert_rows(conn, b, rows_for(3, 9000), start_index=20_000)
    done = capture.catch_up(conn, chunk=100)  # chunks end at transaction boundaries, a transaction is never split
    assert done["dropped"] == 0
    for d in (a, b):
        assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("truncate dataset_rows")  # what to subtract is not in the stream: every registration dropped
    assert capture.catch_up(conn)["dropped"] == 2
    assert conn.execute("select count(*) from lakehouse_pg_digest_state").fetchone()[0] == 0
    capture.disable(conn)


def _consumer_tick(dsn):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.mirror.digest_capture import digest_capture_consumer
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(), resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    ) as context:
        return digest_capture_consumer(context)


def test_the_consumer_sensor_keeps_the_slot_drained_and_says_why_it_cannot(conn, dsn):
    d = make_dataset(conn, 5)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    assert "capture mode triggers" in _consumer_tick(dsn).skip_message
    capture.enable(conn)
    datasets.insert_rows(conn, d, rows_for(4, 40))
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 0", (d,))
    tick = _consumer_tick(dsn)
    assert tick.skip_message.startswith("capture mode after-commit: decoded 2 transaction(s), hashed 5 row change(s)")
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("select pg_drop_replication_slot(%s)", (capture.state(conn).slot,))  # gone behind our back
    assert "cannot consume: replication slot" in _consumer_tick(dsn).skip_message
    out = capture.disable(conn)  # the sums of a missing slot are unknown: dropped, the triggers back on
    assert out["registrations_dropped"] == 1 and "missing" in out["consumer_error"]
    assert capture.state(conn).slot is None and not capture.state(conn).applying
    assert digest_triggers_enabled(conn) == set(capture.DIGEST_TRIGGERS)


def test_replica_identity_reset_behind_its_back_drops_the_sums_instead_of_adding_a_row_twice(conn, dsn):
    d = make_dataset(conn, 8)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    capture.enable(conn)
    conn.execute("alter table dataset_rows replica identity default")  # updates now carry no old values
    conn.execute('update dataset_rows set data = data || \'{"s": "x"}\' where dataset_id = %s and row_index = 3', (d,))
    assert capture.catch_up(conn)["dropped"] == 1
    with pytest.raises(MaintainedDigestUnavailable, match="not registered"):
        pg_maintained(dsn, d)
    capture.disable(conn)


def test_each_catch_up_lets_the_slot_release_the_wal_before_the_previous_one(conn, dsn):
    capture.enable(conn)
    slot = capture.state(conn).slot
    conn.execute("create table noise (i int, t text)")  # WAL of a table outside the publication

    def restart_lag() -> int:
        return conn.execute(
            "select pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint from pg_replication_slots"
            " where slot_name = %s",
            (slot,),
        ).fetchone()[0]

    for _ in range(4):  # ~320 kB of WAL per round; without a running-transactions record per catch-up the
        conn.execute("insert into noise select g, repeat('x', 100) from generate_series(1, 2000) g")  # lag grows
        capture.catch_up(conn)
        capture.catch_up(conn)
    assert restart_lag() < 400_000  # the WAL since the previous round at most (without: 1.3 MB and growing)
    capture.disable(conn)


def test_in_capture_mode_triggers_a_fill_does_not_wait_for_the_consumers_lock(conn, dsn):
    d = make_dataset(conn, 50)
    with connect(dsn) as other:  # e.g. another dataset's fill, or a consumer, holding the lock
        other.execute("select pg_advisory_lock(%s, %s)", capture.CONSUME_LOCK)
        conn.execute("set lock_timeout = '2s'")
        assert maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns) == "registered+filled"
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_a_switch_that_cannot_lock_the_table_changes_nothing_and_leaves_no_slot(conn, dsn):
    d = make_dataset(conn, 3)
    with connect(dsn, autocommit=False) as app:  # an app transaction that has written and is still open
        datasets.insert_rows(app, d, rows_for(1, 50), start_index=100)
        with pytest.raises(capture.CaptureError, match="stayed open.*nothing was changed"):
            capture.enable(conn, lock_timeout_ms=300)
        assert capture.state(conn).mode == "triggers" and digest_triggers_enabled(conn) == set(capture.DIGEST_TRIGGERS)
        assert (
            conn.execute("select count(*) from pg_replication_slots where database = current_database()").fetchone()[0]
            == 0
        )
        app.rollback()
    capture.enable(conn)
    with connect(dsn, autocommit=False) as app:
        datasets.insert_rows(app, d, rows_for(1, 50), start_index=100)
        with pytest.raises(capture.CaptureError, match="still capture mode after-commit"):
            capture.disable(conn, lock_timeout_ms=300)
        assert capture.state(conn).mode == "after-commit" and digest_triggers_enabled(conn) == set()
        app.rollback()
    capture.disable(conn)


def test_repair_after_a_lost_slot_drops_the_sums_and_the_next_fill_is_exact(conn, dsn):
    d = make_dataset(conn, 20)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    capture.enable(conn)
    conn.execute("select pg_drop_replication_slot(%s)", (capture.state(conn).slot,))  # as if invalidated
    datasets.insert_rows(conn, d, rows_for(5, 300))  # a write no consumer will ever see
    with pytest.raises(capture.CaptureError, match="missing.*repair"):
        capture.catch_up(conn)
    out = capture.repair(conn)
    assert out["repaired"] is True and out["registrations_dropped"] == 1
    with pytest.raises(MaintainedDigestUnavailable, match="not registered"):
        pg_maintained(dsn, d)
    assert maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns) == "registered+filled"
    datasets.insert_rows(conn, d, rows_for(3, 400))
    capture.catch_up(conn)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    capture.disable(conn)
