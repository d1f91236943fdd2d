"""Infrastructure faults injected for real (issue 32, a first slice): a Postgres of the test's own killed and
restarted (``pg_ctl restart -m immediate``: every session ends, crash recovery on start) during a mirror sync, a
native ingest and between recorder and alerts ticks; and a TCP fault proxy (testing/tcp_proxy.py) between the
project and Postgres that resets or stalls its connections. After each fault: the operator sees one line, the next
attempt (no restart of anything else) leaves Iceberg equal to Postgres exactly once, the sync log true and no
orphan the sweep would not remove."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror import sweep as orphan_sweep
from lakehouse_dagster.mirror.reaper import files_by_sync
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.schema.migrate import migrate
from lakehouse_dagster.testing.crash_harness import _LIBPQ_GOODBYE, Oracle
from lakehouse_dagster.testing.faults import cli_env, cli_sync_popen, data_files_on_disk, default_sigint, wait_stopped
from lakehouse_dagster.testing.pg import with_db
from lakehouse_dagster.testing.service import restart_postgres
from lakehouse_dagster.testing.tcp_proxy import TcpProxy
from lakehouse_dagster.tracking import datasets

from .test_service_faults import _pg

pytestmark = pytest.mark.slow  # Postgres restarts and a fault proxy: real processes killed at failpoints
LONG = os.environ.get("LAKEHOUSE_SUITE_LONG") == "1"  # bench/bench_suite_long.py: the seeded schedules' longer runs

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
ROWS, CHUNK = 6_000, 500  # 12 chunks: a fault after the first file lands mid-way


_TEMPLATE = "infra_template"  # migrated once; each test's database is a copy


@pytest.fixture(scope="module")
def _killable_server():
    """A Postgres server of this module's own, to kill and restart (test_service_faults.py's, once a module:
    starting one costs seconds)."""
    root = Path(tempfile.mkdtemp(prefix="lh-infra-"))
    try:
        admin = _pg(root, "start")["dsn"]
        with connect(admin) as c:
            c.execute(sql.SQL("create database {}").format(sql.Identifier(_TEMPLATE)))
        with connect(with_db(admin, _TEMPLATE)) as c:
            migrate(c)
        yield admin, root
    finally:
        _pg(root, "stop")
        shutil.rmtree(root, ignore_errors=True)


def _running(admin: str, root: Path) -> None:
    """Started again if a test left it stopped (`lakehouse pg start` costs a process start: only when needed)."""
    try:
        connect(admin, connect_timeout=2).close()
    except psycopg.OperationalError:
        _pg(root, "start")
        _wait_pg(admin)


@pytest.fixture
def own_postgres(_killable_server):
    """(dsn, root): a fresh database of this test's own on the killable server, running when the test starts
    (an earlier test may have left it stopped)."""
    admin, root = _killable_server
    _running(admin, root)
    name = f"t_{uuid.uuid4().hex[:16]}"
    with connect(admin) as c:
        c.execute(sql.SQL("create database {} template {}").format(sql.Identifier(name), sql.Identifier(_TEMPLATE)))
    yield with_db(admin, name), root
    _running(admin, root)
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def _settings(dsn: str, root: Path) -> Settings:
    (root / "warehouse").mkdir(exist_ok=True)
    return Settings.from_env().replace(
        postgres={"dsn": dsn},
        project={"home": root / "home"},
        catalog={"warehouse": (root / "warehouse").as_uri(), "namespace": "lakehouse"},
    )


def _env(settings: Settings, dsn: str, failpoint: str | None = None, **extra: str) -> dict:
    return cli_env(
        failpoint,
        LAKEHOUSE_PG_DSN=dsn,
        LAKEHOUSE_HOME=str(settings.project.home),
        LAKEHOUSE_WAREHOUSE=settings.catalog.warehouse,
        LAKEHOUSE_NAMESPACE="lakehouse",
        LAKEHOUSE_SOAK_SECONDS="0",
        LAKEHOUSE_INGEST_CHUNK_ROWS=str(CHUNK),
        **extra,
    )


def _sync_popen(settings: Settings, dsn: str, d, failpoint: str | None = None) -> subprocess.Popen:
    return cli_sync_popen(d, env=_env(settings, dsn, failpoint))


def _make(conn, rows: int = ROWS) -> uuid.UUID:
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, f"d{uuid.uuid4().hex[:6]}", SCHEMA)
    conn.execute(
        "insert into dataset_rows (dataset_id, row_index, data) select %s, g,"
        " jsonb_build_object('n', g, 's', 'r' || g) from generate_series(0, %s) g",
        (d, rows - 1),
    )
    return d


def _one_clear_line(stderr: str) -> str:
    """The one line the operator reads: no traceback, no multi-line driver message, nothing but libpq's own
    one-line notice of the server's shutdown beside it."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip() and ln != _LIBPQ_GOODBYE]
    assert len(lines) == 1, stderr
    return lines[0]


def _wait_pg(dsn: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            connect(dsn, connect_timeout=2).close()
            return
        except Exception:  # noqa: BLE001 - still in crash recovery
            assert time.monotonic() < deadline, "Postgres did not come back"
            time.sleep(0.1)


def _assert_exactly_once(dsn: str, settings: Settings, d) -> None:
    """The harness oracle (row counts, canary digest, __row_index unique, sync log, no orphan data file after the
    sync); then the orphan sweep removes whatever else the fault left (if anything) and leaves the table whole."""
    catalog = load_catalog(settings, dsn)
    with connect(dsn) as conn:
        bad = Oracle(dsn, settings).after_clean_sync(conn, d)
        assert bad == [], bad
        [swept] = orphan_sweep.sweep(conn, catalog, settings, [d], delete=True, grace_seconds=0)
        assert swept.error is None and swept.removed == len(swept.orphans), swept
        [again] = orphan_sweep.sweep(conn, catalog, settings, [d], delete=False, grace_seconds=0)
        assert again.orphans == [] and again.error is None, again
        assert Oracle(dsn, settings).after_clean_sync(conn, d) == []
        assert _statuses(conn, d)[-1] == "succeeded" and "running" not in _statuses(conn, d)


def _statuses(conn, d) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "select status from iceberg_sync_log where dataset_id = %s order by started_at, finished_at", (d,)
        )
    ]


def _frozen_sync(settings: Settings, dsn: str, d, point: str = "after-first-file") -> subprocess.Popen:
    proc = _sync_popen(settings, dsn, d, f"{point}:stop")
    wait_stopped(proc, 60)
    return proc


def _resume(proc: subprocess.Popen) -> tuple[int, str]:
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


# --- 1. Postgres killed during a mirror sync --------------------------------------------------------------


@pytest.mark.parametrize("point", ["after-first-file", "before-commit"])
def test_postgres_killed_mid_sync_fails_in_one_line_and_the_next_sync_lands_exactly_once(own_postgres, point):
    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        d = _make(conn)
    proc = _frozen_sync(settings, dsn, d, point)  # files written for some chunks, the lock session open
    restart_postgres(root / "pg", mode="immediate")
    code, err = _resume(proc)
    assert code != 0
    line = _one_clear_line(err)
    assert line.startswith("lakehouse sync: error:"), line
    _wait_pg(dsn)
    with connect(dsn) as conn:  # recorded by the failed sync itself, Postgres being back when it noticed
        assert _statuses(conn, d) == ["failed"]
    again = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "sync", "--dataset", str(d), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(settings, dsn),
    )
    assert again.returncode == 0, again.stderr
    _assert_exactly_once(dsn, settings, d)


# --- 4. the TCP fault proxy: connections reset and stalled -----------------------------------------------


def test_connections_reset_mid_sync_fail_in_one_line_and_the_next_sync_lands_exactly_once(own_postgres):
    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        d = _make(conn)
    with TcpProxy.for_dsn(dsn) as proxy:
        via = proxy.dsn(dsn)
        proc = _frozen_sync(settings, via, d)
        assert proxy.reset() >= 1  # the lock session, the pinned read, the catalog's pool: all cut
        code, err = _resume(proc)
        assert code != 0
        assert _one_clear_line(err).startswith("lakehouse sync: error:")
        done = _sync_popen(settings, via, d)  # through the same proxy: new connections are served
        _, err = done.communicate(timeout=120)
        assert done.returncode == 0, err
    _assert_exactly_once(dsn, settings, d)


def _sync_rows(conn, d) -> list[tuple[str, str]]:
    return conn.execute(
        "select status, coalesce(error, '') from iceberg_sync_log where dataset_id = %s order by started_at", (d,)
    ).fetchall()


def _mirrored_then_grown(dsn: str, settings, more: int):
    """A 1,000-row dataset mirrored by a clean sync, then ``more`` rows written by the app (the next sync's work)."""
    with connect(dsn) as conn:
        d = _make(conn, 1_000)
    first = _sync_popen(settings, dsn, d)
    assert first.communicate(timeout=120) and first.returncode == 0
    with connect(dsn) as conn:
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, data) select %s, g,"
            " jsonb_build_object('n', g, 's', 'r' || g) from generate_series(1000, %s) g",
            (d, 999 + more),
        )
    return d


def test_connections_reset_inside_the_commit_that_then_lands_record_it_as_landed_not_failed(own_postgres):
    """The crash harness's `commit-start:reset` (seed 20261204, cycle 5): the sync frozen inside the catalog's commit,
    before its swap, every connection reset. On resume the catalog's pool reconnects and the commit lands; the pinned
    read's transaction, still open on its reset session, then fails to end. That cleanup used to replace the sync's
    result: a sync whose snapshot is in the table was recorded `failed` and reported 'sync failed'. Now its log
    row is left for the next sync to record (its lock session is gone with the reset), which records it as landed."""
    dsn, root = own_postgres
    settings = _settings(dsn, root)
    d = _mirrored_then_grown(dsn, settings, 2_000)
    with TcpProxy.for_dsn(dsn) as proxy:
        proc = _frozen_sync(settings, proxy.dsn(dsn), d, "commit-start")
        assert proxy.reset() >= 3  # the lock session, the pinned read, the catalog's pool
        code, err = _resume(proc)
    assert code == 75, err
    line = _one_clear_line(err)
    assert "was committed but could not be recorded" in line, line
    with connect(dsn) as conn:
        assert [s for s, _ in _sync_rows(conn, d)] == ["succeeded", "running"]
    again = _sync_popen(settings, dsn, d)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert '"mode": "noop"' in out, out  # the frozen sync's snapshot covers the rows
    with connect(dsn) as conn:
        rows = _sync_rows(conn, d)
    assert [s for s, _ in rows] == ["succeeded", "succeeded", "succeeded"], rows
    assert "its commit landed but the sync did not record it" in rows[1][1], rows
    _assert_exactly_once(dsn, settings, d)


def test_a_commit_of_unknown_outcome_stays_unsettled_when_its_pinned_session_died_and_the_next_sync_settles_it(
    own_postgres,
):
    """A sync whose commit's outcome is unknown keeps its files for the next sync, which settles them
    (docs/design/faults.md). Its pinned read's session dying meanwhile (the reset or restart that made the outcome
    unknown, an idle-in-transaction timeout, pg_terminate_backend) used to turn that into a plain `failed` row: the
    pinned transaction's end, in a `finally`, raised on the dead session and replaced the CommitOutcomeUnknown, so
    the reaper never settled the sync and every file of it stayed an orphan (the flake of the seeded infra schedule,
    whose `commit-start:reset` left 15). Deterministic here: frozen with its files written, its pinned session is
    terminated, and the commit fails inside the catalog's call."""
    dsn, root = own_postgres
    settings = _settings(dsn, root)
    d = _mirrored_then_grown(dsn, settings, 5_000)
    proc = _sync_popen(settings, dsn, d, "before-commit:stop,commit-start:raise")
    wait_stopped(proc, 60)
    with connect(dsn) as conn:
        pinned = conn.execute(
            "select pid from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()"
            " and state = 'idle in transaction'"
        ).fetchall()
        assert len(pinned) == 1, pinned  # the pinned read (the readers are done; the lock session is idle)
        conn.execute("select pg_terminate_backend(%s)", (pinned[0][0],))
    code, err = _resume(proc)
    assert code == 75, err
    line = _one_clear_line(err)
    assert "commit outcome unknown" in line, line
    with connect(dsn) as conn:
        rows = _sync_rows(conn, d)
        sid = str(conn.execute("select sync_id from iceberg_sync_log where status = 'failed'").fetchone()[0])
    assert [s for s, _ in rows] == ["succeeded", "failed"], rows
    assert rows[1][1].startswith("unsettled: "), rows  # the reaper's to settle, not an orphan
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert len(files_by_sync(table).get(sid, [])) == 10  # 5,000 rows in files of 500, kept: the outcome is unknown
    again = _sync_popen(settings, dsn, d)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    with connect(dsn) as conn:
        rows = _sync_rows(conn, d)
    assert [s for s, _ in rows] == ["succeeded", "failed", "succeeded"], rows
    assert rows[1][1].startswith("abandoned: "), rows
    assert sid not in files_by_sync(table.refresh())  # settled by the next sync, not left to a sweep an hour later
    _assert_exactly_once(dsn, settings, d)  # no orphan data file after the next sync


def test_a_stalled_network_bounds_a_sync_by_its_connect_timeout_and_it_recovers_on_resume(own_postgres):
    """The network goes silent before a sync starts (its handshake completes, nothing after it is answered): the
    sync ends within the connect timeout (core/db.py CONNECT_TIMEOUT_SECONDS), not never, with one line; once the
    network answers again the next sync, through the same proxy, lands exactly once."""
    from lakehouse_dagster.core.db import CONNECT_TIMEOUT_SECONDS

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        d = _make(conn, 1_000)
    with TcpProxy.for_dsn(dsn) as proxy:
        via = proxy.dsn(dsn)
        proxy.stall()
        started = time.monotonic()
        stalled = _sync_popen(settings, via, d)
        _, err = stalled.communicate(timeout=CONNECT_TIMEOUT_SECONDS * 4)  # a hang fails here
        took = time.monotonic() - started
        assert stalled.returncode == 75, err
        line = _one_clear_line(err)
        assert line.startswith("lakehouse sync: error: Postgres is unreachable"), line
        assert CONNECT_TIMEOUT_SECONDS * 0.8 <= took, took  # it waited the connect timeout (a hang fails above)
        proxy.resume()
        done = _sync_popen(settings, via, d)
        _, err = done.communicate(timeout=120)
        assert done.returncode == 0, err
    _assert_exactly_once(dsn, settings, d)


# --- 2. Postgres killed during a native ingest ----------------------------------------------------------


def _native_popen(
    settings: Settings, dsn: str, d, start: int, count: int, failpoint: str | None = None, **env: str
) -> subprocess.Popen:
    from .test_faults import NATIVE_SCRIPT

    return subprocess.Popen(
        [sys.executable, "-c", NATIVE_SCRIPT, str(d), str(start), str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        env=_env(settings, dsn, failpoint, **env),
    )


def _native_rows(settings: Settings, dsn: str, d) -> list[int]:
    from lakehouse_dagster.lake.catalog import load_table_or_none

    t = load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, d))
    if t is None or t.current_snapshot() is None:
        return []
    return sorted(t.scan().to_arrow()["n"].to_pylist())


@pytest.mark.parametrize("point", ["before-commit", "after-commit-before-log"])
def test_postgres_killed_during_a_native_ingest_leaves_a_whole_commit_and_a_retry_lands_once(own_postgres, point):
    from .test_faults import _native_dataset

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        d = _native_dataset(conn)
    first = _native_popen(settings, dsn, d, 0, 1_000, f"{point}:stop")
    wait_stopped(first, 60)
    restart_postgres(root / "pg", mode="immediate")
    _resume(first)
    _wait_pg(dsn)
    landed = _native_rows(settings, dsn, d)
    assert landed in ([], list(range(1_000))), f"a partial commit: {len(landed)} rows"  # all or nothing
    if not landed:  # the client retries what did not land (the table says so)
        retry = _native_popen(settings, dsn, d, 0, 1_000)
        _, err = retry.communicate(timeout=120)
        assert retry.returncode == 0, err
    after = _native_popen(settings, dsn, d, 1_000, 5)  # the next write settles whatever the fault left
    _, err = after.communicate(timeout=120)
    assert after.returncode == 0, err
    assert _native_rows(settings, dsn, d) == list(range(1_005))  # every row exactly once
    with connect(dsn) as conn:
        statuses = _statuses(conn, d)
        assert "running" not in statuses and statuses[-1] == "succeeded", statuses
        assert conn.execute("select status, row_count from datasets where id = %s", (d,)).fetchone() == (
            "ready",
            1_005,
        )
    from lakehouse_dagster.testing.faults import referenced_files

    t = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert data_files_on_disk(t) - referenced_files(t) == set()  # no orphan data file left


# --- 3. Postgres killed between and during recorder ticks -----------------------------------------------


def test_postgres_killed_between_and_during_recorder_ticks_records_every_sync_once(
    own_postgres, pg_admin_dsn, tmp_path, monkeypatch
):
    """The recorder (a Dagster sensor) reads the lakehouse's Postgres; the instance's storage is elsewhere (the
    shared test server). Killed between two ticks: the next tick records the sync made before, once. Stopped
    during a tick: the tick is skipped in one line with its cursor kept, and the first tick once Postgres is back records
    what it missed, once. The in-process catalog (its SQLAlchemy pool) and syncs work on, unrestarted."""
    import dagster as dg

    from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions

    from .conftest import pg_dagster_instance
    from .test_recorder import Recorder, _materializations

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    for k, v in _env(settings, dsn).items():
        if k.startswith("LAKEHOUSE_"):
            monkeypatch.setenv(k, v)
    with connect(dsn) as conn:
        d = _make(conn, 100)
    catalog = load_catalog(settings, dsn)

    def add_rows_and_sync(start: int) -> None:
        with connect(dsn) as c:
            datasets.insert_rows(c, d, [{"n": i, "s": f"r{i}"} for i in range(start, start + 10)], start_index=start)
        sync_dataset(dsn, catalog, settings, d)

    def recorded(events) -> list[str]:
        return [e.partition for e in events if isinstance(e, dg.AssetMaterialization)]

    home = tmp_path / "dagster_home"
    home.mkdir()
    with pg_dagster_instance(pg_admin_dsn, home) as (instance, _):
        instance.add_dynamic_partitions(datasets_partitions.name, [str(d)])
        rec = Recorder(instance, dsn)
        sync_dataset(dsn, catalog, settings, d)
        assert recorded(rec.tick()) == [str(d)]

        add_rows_and_sync(100)
        restart_postgres(root / "pg", mode="immediate")  # between ticks
        _wait_pg(dsn)
        assert recorded(rec.tick()) == [str(d)]

        _wait_pg(dsn)
        add_rows_and_sync(110)  # the same process's catalog, after the restart
        before = rec.cursor
        assert _pg(root, "stop")["stopped"] is True  # during the next tick
        assert rec.tick() == []  # skipped in one line (dagster/defs/shared/outage.py), not a failed tick
        assert (rec.skipped or "").startswith("Postgres is unreachable or the session was lost"), rec.skipped
        assert "\n" not in (rec.skipped or "") and rec.cursor == before
        assert _pg(root, "start")["started"] is True
        assert recorded(rec.tick()) == [str(d)]
        assert recorded(rec.tick()) == []  # nothing twice
        assert len(_materializations(instance, ICEBERG_TABLE, d)) == 3  # nothing skipped


def test_postgres_killed_between_and_during_alerts_ticks_posts_every_failed_run_once(
    own_postgres, pg_admin_dsn, tmp_path, monkeypatch
):
    """The alerts sensor reads failed runs from the instance (elsewhere) and keeps its outbox in the lakehouse's
    Postgres. Killed between ticks: the next tick posts the run that failed before, once. Stopped during a tick:
    it is skipped in one line, its cursor kept, and the first tick once Postgres is back posts the run it missed,
    once; nothing twice after."""

    from .conftest import pg_dagster_instance
    from .test_alerts import Receiver, Ticks, failed_batch_run

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    for k, v in _env(settings, dsn).items():
        if k.startswith("LAKEHOUSE_"):
            monkeypatch.setenv(k, v)
    receiver = Receiver()
    monkeypatch.setenv("LAKEHOUSE_ALERT_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("LAKEHOUSE_ALERT_TIMEOUT_SECONDS", "1")
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "w")
        bad = datasets.create_dataset(conn, ws, "bad_orders", [{"name": "n", "type": "int64"}])
        datasets.insert_rows(conn, bad, [{"n": 1}, {"n": "x"}])  # every sync of it fails: a failed run each

    home = tmp_path / "dagster_home"
    home.mkdir()
    try:
        with pg_dagster_instance(pg_admin_dsn, home) as (instance, _):

            def failed_run() -> str:
                return failed_batch_run(instance, dsn, bad).run_id

            tick = Ticks(instance, dsn)
            tick()
            first = failed_run()
            restart_postgres(root / "pg", mode="immediate")  # between ticks
            _wait_pg(dsn)
            assert tick().startswith("1 new event(s) (run_failed 1); posted 1 event(s)")

            second = failed_run()
            before = tick.cursor
            assert _pg(root, "stop")["stopped"] is True  # during the next tick
            skipped = tick()  # skipped in one line, not a failed tick with a traceback
            assert skipped.startswith("Postgres is unreachable or the session was lost"), skipped
            assert "\n" not in skipped and tick.cursor == before
            assert _pg(root, "start")["started"] is True
            assert tick().startswith("1 new event(s) (run_failed 1); posted 1 event(s)")
            tick()
            posted = [t for t in receiver.texts() if t.startswith("Lakehouse run failed")]
            assert len(posted) == 2, receiver.texts()
            assert first[:8] in posted[0] and second[:8] in posted[1]
            with connect(dsn) as conn:
                assert conn.execute(
                    "select count(*), count(posted_at) from lakehouse_alerts where kind = 'run_failed'"
                ).fetchone() == (2, 2)
    finally:
        receiver.close()


# --- 4b. the service's pool, resolver and catalog under reset and stall ------------------------------------


def test_the_services_pool_resolver_and_catalog_recover_from_a_reset_and_a_stalled_connect_is_bounded(own_postgres):
    """ServiceDb (the service's connections for its whole life) through the proxy: every connection reset — the
    pooled ones, the flag resolver's, the catalog's SQLAlchemy pool — and the same object answers the next probe
    and read by itself. New connections stalled: lending one ends after the service's connect timeout (5 s) with
    psycopg's OperationalError (the service answers 503 on it), and works again once the network does."""
    from lakehouse_dagster.service.db import READ, ServiceDb

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        d = _make(conn, 100)
    with TcpProxy.for_dsn(dsn) as proxy:
        via = proxy.dsn(dsn)
        db = ServiceDb(via, settings.replace(postgres={"dsn": via}))
        try:
            assert db.probe() == {"postgres": "ok", "catalog": "ok"}
            held = [db.take(READ) for _ in range(3)]
            for c in held:
                db.give(c, READ)
            assert proxy.reset() >= 4  # three pooled, the resolver's, the catalog's
            assert db.probe() == {"postgres": "ok", "catalog": "ok"}  # by itself, no restart of anything
            with db.connection(READ) as c:
                assert c.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 100
            assert db.resolver().conn.execute("select 1").fetchone() == (1,)

            fresh = ServiceDb(via, settings.replace(postgres={"dsn": via}))  # nothing idle: its next lend connects anew
            try:
                proxy.stall()
                started = time.monotonic()
                with pytest.raises(psycopg.OperationalError):
                    fresh.take(READ)
                assert 4 <= time.monotonic() - started  # the connect timeout was waited (never less, whatever the load)
                proxy.resume()
                with fresh.connection(READ) as c:
                    assert c.execute("select 1").fetchone() == (1,)
                assert fresh.probe() == {"postgres": "ok", "catalog": "ok"}
            finally:
                fresh.close()
        finally:
            proxy.resume()
            db.close()


def test_every_session_gets_a_connect_timeout_and_keepalives_unless_its_dsn_names_them():
    from lakehouse_dagster.core.db import CONNECT_TIMEOUT_SECONDS, adbc_uri, sqlalchemy_url, with_default_param

    t = CONNECT_TIMEOUT_SECONDS
    keep = "keepalives=1&keepalives_idle=30&keepalives_interval=10&keepalives_count=3"
    assert (
        sqlalchemy_url("postgresql://u@/db?host=/tmp/s")
        == f"postgresql+psycopg://u@/db?host=/tmp/s&connect_timeout={t}&{keep}"
    )
    assert adbc_uri("postgresql+psycopg://u@h/db") == f"postgresql://u@h/db?connect_timeout={t}&{keep}"
    assert adbc_uri("postgresql://u@h/db?connect_timeout=2&keepalives=0") == (
        "postgresql://u@h/db?connect_timeout=2&keepalives=0&keepalives_idle=30&keepalives_interval=10"
        "&keepalives_count=3"
    )
    assert with_default_param("host=h dbname=x", "connect_timeout", t) == f"host=h dbname=x connect_timeout={t}"
    assert with_default_param("host='x", "connect_timeout", t) == "host='x"  # unparseable: the connect says why


def test_a_session_over_tcp_really_has_the_keepalives(own_postgres):
    """The socket of a session opened through the project's connect over TCP (the proxy listens on 127.0.0.1), and
    of the catalog's SQLAlchemy pool: keepalives on, idle 30 s, 3 probes 10 s apart."""
    import socket

    dsn, root = own_postgres

    def options(fd: int) -> tuple[int, int, int, int]:
        s = socket.socket(fileno=os.dup(fd))
        try:
            return (
                s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            )
        finally:
            s.close()

    with TcpProxy.for_dsn(dsn) as proxy:
        via = proxy.dsn(dsn)
        with connect(via) as conn:
            assert options(conn.pgconn.socket) == (1, 30, 10, 3)
        with psycopg.connect(via) as bare:  # libpq's own: keepalives on, the kernel's 2 h idle before a probe
            assert options(bare.pgconn.socket)[1] == int(Path("/proc/sys/net/ipv4/tcp_keepalive_time").read_text())
        catalog = load_catalog(_settings(via, root), via)
        with catalog.engine.connect() as sa:  # pyiceberg's SqlCatalog pool
            raw = sa.connection.driver_connection
            assert options(raw.pgconn.socket) == (1, 30, 10, 3)


# --- the crash harness with the infrastructure's faults (the long run: bench/bench_crash.py) -------------


def test_a_seeded_crash_schedule_with_postgres_restarts_and_resets_converges_with_no_violation(
    own_postgres, monkeypatch
):
    """A few cycles of the harness's schedule drawn from the infrastructure's faults alone (Postgres killed and
    restarted at a failpoint or at any moment, connections reset): every sync ends in one line with an exit the
    guide names, and the oracle holds after the next clean sync."""
    from lakehouse_dagster.testing.crash_harness import INFRA_ACTIONS, Infrastructure, run_cycles

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    for key, value in _env(settings, dsn).items():  # the harness's CLI syncs read this process's environment
        if key.startswith("LAKEHOUSE_"):
            monkeypatch.setenv(key, value)
    cycles = int(os.environ.get("LAKEHOUSE_CRASH_INFRA_CYCLES", "6" if LONG else "3"))
    with TcpProxy.for_dsn(dsn) as proxy:
        infra = Infrastructure(lambda: restart_postgres(root / "pg", mode="immediate"), proxy)
        report = run_cycles(
            dsn, settings, seed=20261204, cycles=cycles, datasets=2, actions=INFRA_ACTIONS, armed_share=1.0, infra=infra
        )
    print(report.as_dict())
    assert report.cycles == cycles
    assert report.faults_by_kind().get("pg-restart", 0) >= 2, report.as_dict()  # Postgres really went down
    assert report.violations == [], "\n".join(report.violations)


def test_a_seeded_crash_schedule_of_reverse_applies_with_postgres_restarts_and_resets_converges_with_no_violation(
    own_postgres, monkeypatch
):
    """The harness's reverse cycles (issue 31) under the infrastructure's faults alone: the operator's
    ``lakehouse reverse sync`` frozen before, inside or after its commit while Postgres restarts or its
    connections are reset, or Postgres restarted at any moment of it. It ends in one line with an exit the guide
    names; Postgres holds a whole snapshot; the clean apply applies it exactly once, without echo
    (bench/bench_crash.py --reverse-share 1 --infra-only runs >= 100)."""
    from lakehouse_dagster.testing.crash_harness import INFRA_ACTIONS, Infrastructure, run_cycles

    dsn, root = own_postgres
    monkeypatch.setenv("LAKEHOUSE_SOAK_SECONDS", "0")  # the native dataset is read-flipped just before its writers
    settings = _settings(dsn, root)
    for key, value in _env(settings, dsn).items():  # the harness's CLI processes read this process's environment
        if key.startswith("LAKEHOUSE_"):
            monkeypatch.setenv(key, value)
    cycles = int(os.environ.get("LAKEHOUSE_CRASH_INFRA_REVERSE_CYCLES", "6" if LONG else "4"))
    with TcpProxy.for_dsn(dsn) as proxy:
        infra = Infrastructure(lambda: restart_postgres(root / "pg", mode="immediate"), proxy)
        report = run_cycles(
            dsn,
            settings,
            seed=20261205,
            cycles=cycles,
            datasets=2,
            actions=INFRA_ACTIONS,
            armed_share=1.0,
            infra=infra,
            reverse_share=1.0,
        )
    print(report.as_dict())
    assert report.cycles == cycles and report.ops["reverse"] == cycles
    assert report.faults_by_kind().get("pg-restart", 0) >= 2, report.as_dict()  # Postgres really went down
    assert report.violations == [], "\n".join(report.violations)


def test_an_adbc_session_lost_or_refused_is_postgres_unreachable_but_a_query_it_refused_is_not(dsn):
    """The reverse apply copies on an ADBC session: the CLI's one line (exit 75) and the sensors' skipped tick
    must know its driver's errors as they know psycopg's (found by the crash harness: a Postgres restart under a
    reverse apply was a traceback, exit 1). A query the server refused is not an outage."""
    import adbc_driver_postgresql.dbapi as adbc

    from lakehouse_dagster.core.db import adbc_uri
    from lakehouse_dagster.core.errors import postgres_unreachable

    with pytest.raises(Exception) as refused:  # nothing listens on port 1
        adbc.connect("postgresql://nobody@127.0.0.1:1/none")
    assert "Connection refused" in (postgres_unreachable(refused.value) or "")
    with adbc.connect(adbc_uri(dsn)) as session, connect(dsn) as killer:
        cur = session.cursor()
        cur.execute("select pg_backend_pid()")
        pid = cur.fetchone()[0]
        with pytest.raises(Exception) as bad_query:
            cur.execute("select 1 / 0")
        assert postgres_unreachable(bad_query.value) is None, bad_query.value  # SQLSTATE 22012: not an outage
        session.rollback()
        killer.execute("select pg_terminate_backend(%s)", (pid,))
        with pytest.raises(Exception) as lost:
            cur.execute("select 1")
            cur.fetchone()
        line = postgres_unreachable(lost.value)
        assert line is not None and line.startswith("Postgres is unreachable or the session was lost ("), lost.value
        assert "\n" not in line


@pytest.mark.parametrize("check", [False, True], ids=["unlock", "check-held"])
def test_a_lock_session_left_mid_command_is_closed_so_its_with_block_logs_no_rollback_warning(dsn, caplog, check):
    """A reset can leave libpq thinking a command still runs on the dataset lock's session without marking it
    broken (found by the crash harness's reverse cycles: 3 resets in 39 printed psycopg's `error ignored in
    rollback on <psycopg.Connection [ACTIVE]> …: another command is already in progress` beside the CLI's one
    line). The guard closes such a session (its locks go with it), so the caller's ``with connect(...)`` does not
    roll back on it; the work's own error is what bubbles up."""
    from lakehouse_dagster.core.errors import GuardLost
    from lakehouse_dagster.core.guards import check_held, dataset_lock

    d = uuid.uuid4()
    with pytest.raises(GuardLost if check else RuntimeError), connect(dsn) as conn, dataset_lock(conn, d):
        conn.pgconn.send_query(b"select 1")  # libpq busy with a command nobody reads, the connection not broken
        if check:
            check_held()
        raise RuntimeError("the work failed")
    assert conn.closed
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    with connect(dsn) as other, dataset_lock(other, d, timeout_s=5):  # the lock went with the session
        pass


# --- 5. Postgres killed under a stream run and under a batch run ------------------------------------------


def test_postgres_killed_under_a_stream_run_ends_it_in_one_line_and_its_successor_mirrors_everything_once(
    own_postgres,
):
    """A stream run (the mirror_stream job, executed for real) loses its shard's lock with its session when Postgres
    is killed, so it must stop (another run may own the shard now) within seconds and say why in one line; the
    successor the supervisor starts mirrors everything written before, during and after the outage exactly once."""
    import dagster as dg

    from lakehouse_dagster.dagster.defs.mirror.stream_job import mirror_stream
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    from .test_mirror_stream import Stream, assert_nothing_twice, assert_parity, caught_up, wait_caught_up

    dsn, root = own_postgres
    settings = _settings(dsn, root)
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "w")
        ids = [datasets.create_dataset(conn, ws, f"s{i}", SCHEMA) for i in range(3)]
        for d in ids:
            datasets.insert_rows(conn, d, [{"n": k, "s": f"r{k}"} for k in range(50)])
    env = {k: v for k, v in _env(settings, dsn).items() if k.startswith("LAKEHOUSE_") and k != "LAKEHOUSE_FAILPOINT"}
    results: list = []
    with dg.DagsterInstance.ephemeral() as instance:

        def run() -> None:
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)  # the resource reads the warehouse and home as a run worker would
            try:
                results.append(
                    mirror_stream.execute_in_process(
                        run_config={"ops": {"stream_shard_op": {"config": {"lifetime_seconds": 120}}}},
                        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
                        instance=instance,
                        raise_on_error=False,
                    )
                )
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        with connect(dsn) as conn:
            wait_caught_up(conn, ids)
            for d in ids:  # a write the stream is syncing (or about to) when Postgres goes
                datasets.insert_rows(conn, d, [{"n": 1000 + k, "s": "at the kill"} for k in range(2_000)])
        restart_postgres(root / "pg", mode="immediate")
        worker.join(30)  # its lifetime is 120 s: only the lost session ends it this soon
        assert not worker.is_alive(), "the stream run kept going without its shard's lock"
        [result] = results
        messages = [r.user_message or "" for r in instance.all_logs(result.run_id)]
        [stopped] = [m for m in messages if "stopping before the deadline" in m]
        assert "its session to Postgres was lost" in stopped or "lock" in stopped, stopped
        assert "mirror_poller sensor starts its successor" in stopped and "\n" not in stopped, stopped
        assert not any("Traceback" in m for m in messages), [m for m in messages if "Traceback" in m]
        if not result.success:  # a sync cut by the kill fails the run at its end, in the refusal's one message
            [failure] = [e for e in result.all_events if e.is_step_failure]
            assert "syncs failed" in (failure.message or "") + str(failure.event_specific_data), failure
    _wait_pg(dsn)
    with connect(dsn) as conn:
        for d in ids:
            datasets.insert_rows(conn, d, [{"n": 5000, "s": "after"}])
        assert not caught_up(conn, ids)
    with Stream(settings, dsn, run_id="stream-after") as second:
        assert second.held.wait(30)
        with connect(dsn) as conn:
            wait_caught_up(conn, ids)
    with connect(dsn) as conn:
        assert_nothing_twice(conn, ids)
        assert conn.execute("select count(*) from iceberg_sync_log where status = 'running'").fetchone()[0] == 0
    assert_parity(settings, dsn, ids)
    for d in ids:
        _assert_exactly_once(dsn, settings, d)


def test_postgres_killed_under_a_batch_run_fails_what_it_cut_and_the_next_batch_lands_all_once(own_postgres):
    """A batch (mirror_many: the mirror_batch_job's loop) with Postgres killed mid-way: what it had committed stays,
    the sync it was in fails in one line (or, Postgres back before its last pass, is retried), none is left
    'running' for good; the next batch of the same datasets lands the rest exactly once."""
    from lakehouse_dagster.mirror.batch import mirror_many

    dsn, root = own_postgres
    settings = _settings(dsn, root).replace(sync={"chunk_rows": CHUNK})
    with connect(dsn) as conn:
        ids = [_make(conn, 3_000) for _ in range(4)]
    catalog = load_catalog(settings, dsn)
    outcomes: list = []
    errors: list[BaseException] = []

    def batch():
        try:
            outcomes.extend(mirror_many(dsn, catalog, settings, ids, run_id="batch-killed", backoff_s=0.2, passes=2))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    worker = threading.Thread(target=batch, daemon=True)
    worker.start()
    with connect(dsn) as conn:  # kill it once the first dataset has landed
        deadline = time.monotonic() + 60
        while not conn.execute(
            "select count(*) from iceberg_sync_log where status = 'succeeded' and run_id = 'batch-killed'"
        ).fetchone()[0]:
            assert time.monotonic() < deadline and worker.is_alive(), (outcomes, errors)
            time.sleep(0.02)
    restart_postgres(root / "pg", mode="immediate")
    worker.join(120)
    assert not worker.is_alive()
    from lakehouse_dagster.mirror.batch import Failed

    for o in outcomes:  # each failure is one line naming its dataset
        if isinstance(o, Failed):
            assert "\n" not in str(o.error) and str(o.dataset_id) in str(o.error), o
    assert all(isinstance(e, psycopg.OperationalError | LakehouseError) for e in errors), errors
    _wait_pg(dsn)
    again = list(mirror_many(dsn, catalog, settings, ids, run_id="batch-after"))
    assert not [o for o in again if isinstance(o, Failed)], again
    for d in ids:
        _assert_exactly_once(dsn, settings, d)


# --- 6. Postgres killed under a rollout plan -------------------------------------------------------------


def test_postgres_killed_and_stopped_under_a_rollout_stage_then_the_plan_goes_on_and_abort_restores_every_flag(
    own_postgres, monkeypatch
):
    """The rollout controller (a sensor) and its stage's runs with Postgres killed between ticks and stopped during
    one: the tick while it is down is skipped in one line and changes nothing; once it answers the plan goes on
    from where it was (no stage twice, no flip lost), and an abort after it puts every flag back."""
    import dagster as dg

    from lakehouse_dagster.dagster.defs.plans.controller import rollout_controller
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.plans import actions, store

    from .rollout_helpers import Driver, effective_modes, seed_mix
    from .test_service_faults import _pg as pg_verb

    dsn, root = own_postgres
    settings = _settings(dsn, root).replace(rollout={"soak_seconds": 0})
    for key, value in _env(settings, dsn).items():  # the stage's runs read the warehouse as a run worker would
        if key.startswith("LAKEHOUSE_"):
            monkeypatch.setenv(key, value)
    with connect(dsn) as conn:
        s = seed_mix(conn, dsn, settings)
        before = effective_modes(conn)
        text = (
            f"reader: export.stream\nmode: iceberg\nstages:\n  - datasets: 2\n    soak: 1s\n"
            f"  - workspace: {s.ws}\n    soak: 1s\n  - global: true\n    soak: 30s\n"
        )
        plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    with dg.DagsterInstance.ephemeral() as instance:
        driver = Driver(instance, dsn)
        with connect(dsn) as conn:
            driver.until(conn, plan_id, lambda p: p.stage == 0 and p.phase in ("soaking", "analyzing"))
        restart_postgres(root / "pg", mode="immediate")  # between two ticks, the stage's flip done
        _wait_pg(dsn)
        with connect(dsn) as conn:
            p = driver.until(conn, plan_id, lambda p: p.stage >= 1 and p.phase in ("soaking", "analyzing"))
            assert p.state == "active", (p.state, p.reason)
            row_before = (p.state, p.stage, p.phase)
        assert pg_verb(root, "stop")["stopped"] is True  # during the next tick
        ctx = dg.build_sensor_context(
            instance=instance, cursor=driver.cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
        )
        skipped = rollout_controller(ctx)
        assert isinstance(skipped, dg.SkipReason), skipped
        line = skipped.skip_message or ""
        assert line.startswith("Postgres is unreachable or the session was lost") and "\n" not in line, line
        assert pg_verb(root, "start")["started"] is True
        _wait_pg(dsn)
        with connect(dsn) as conn:
            p = store.get(conn, plan_id)
            assert (p.state, p.stage, p.phase) == row_before  # the skipped tick changed nothing
            p = driver.until(conn, plan_id, lambda p: p.stage >= 2 and p.phase in ("soaking", "analyzing"))
            assert p.state == "active", (p.state, p.reason)
            flips = [st for st in store.steps(conn, plan_id, kind="flip")]
            assert len({st.step_key for st in flips}) == len(flips)  # no flip asked for twice
            assert all(st.status == "succeeded" for st in flips), [(st.step_key, st.status) for st in flips]
            assert effective_modes(conn) != before  # the plan moved flags
            actions.abort(conn, settings.project, plan_id, actor="ops", reason="after a restart")
            p = driver.until(conn, plan_id, lambda p: p.state != "active" and p.state != "aborting")
            assert p.state == "aborted", (p.state, p.reason)
            assert effective_modes(conn) == before  # every flag as before the plan
