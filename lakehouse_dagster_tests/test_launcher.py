"""WarmRunLauncher: real runs launched through a DagsterInstance configured with it, workers forked from the real
forkserver, real signals (terminate, SIGKILL) and the run monitoring daemon's own check."""

from __future__ import annotations

import ast
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.launcher import WorkerStatus
from dagster._core.test_utils import in_process_test_workspace, poll_for_event, poll_for_finished_run
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from lakehouse_dagster.dagster.launcher.run_launcher import WORKER_TAG, WarmRunLauncher
from lakehouse_dagster.dagster.launcher.worker_process import Worker, start_time
from lakehouse_dagster_tests import launcher_jobs

pytestmark = pytest.mark.slow  # real forkservers, workers and signals

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = {
    "module": "lakehouse_dagster.dagster.launcher.run_launcher",
    "class": "WarmRunLauncher",
    "config": {"terminate_grace_seconds": 10.0},
}


@pytest.fixture
def instance():
    with dg.instance_for_test(overrides={"run_launcher": LAUNCHER}) as inst:
        assert isinstance(inst.run_launcher, WarmRunLauncher)
        yield inst


def _workspace(instance, module: str):
    return in_process_test_workspace(
        instance, LoadableTargetOrigin(executable_path=sys.executable, module_name=module, working_directory=str(ROOT))
    )


def _launch(instance, workspace, job_def: dg.JobDefinition, run_config=None) -> dg.DagsterRun:
    """Create the run the way the UI / the run queue does (origins from the loaded location) and launch it."""
    (location,) = [e.code_location for e in workspace.get_code_location_entries().values()]
    (repo,) = location.get_repositories().values()
    remote = repo.get_full_job(job_def.name)
    run = instance.create_run_for_job(
        job_def=job_def,
        run_config=run_config,
        remote_job_origin=remote.get_remote_origin(),
        job_code_origin=remote.get_python_origin(),
    )
    return instance.launch_run(run.run_id, workspace)


def _worker(instance, run_id) -> Worker:
    worker = Worker.loads(instance.get_run_by_id(run_id).tags.get(WORKER_TAG))
    assert worker is not None, "the launch records its worker in a run tag"
    return worker


def _wait_gone(worker: Worker, timeout=30.0) -> None:
    """The worker exited and was reaped: no /proc entry left (a zombie keeps one)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{worker.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{worker.pid}").exists(), f"worker {worker.pid} still running or not reaped"
    assert not worker.alive()


def _event_types(instance, run_id) -> list[str]:
    return [r.dagster_event.event_type_value for r in instance.all_logs(run_id) if r.dagster_event]


def _forkserver_facts() -> tuple[str, int]:
    pid = WarmRunLauncher.forkserver_pid()
    assert pid
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    threads = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("Threads:")
        )
    )
    return cmdline, threads


def test_a_run_succeeds_in_a_worker_forked_from_the_warm_forkserver(instance):
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.ok_job)
        done = poll_for_finished_run(instance, run.run_id, timeout=120)
    assert done.status == dg.DagsterRunStatus.SUCCESS
    types = _event_types(instance, run.run_id)
    assert {"PIPELINE_START", "STEP_SUCCESS", "PIPELINE_SUCCESS"} <= set(types)
    worker = _worker(instance, run.run_id)
    messages = [r.message for r in instance.all_logs(run.run_id)]
    assert f"Started process for run (pid: {worker.pid})." in messages  # the tagged pid is the run's worker
    assert any(f"Forked run worker (pid {worker.pid})" in m for m in messages)
    _wait_gone(worker)
    # The forkserver holds the third-party imports only, and no thread beyond the native pools their import
    # starts (OpenBLAS, jemalloc: both re-initialise after fork): no more than a bare import of them has.
    cmdline, threads = _forkserver_facts()
    # the modules the forkserver preloads: main(fd, fd, [modules], **{'sys_path': [...]}) (sys_path may name the
    # package too: an editable install's path hook)
    preloaded = ast.literal_eval(re.search(r"main\(\d+, \d+, (\[.*?\])", cmdline).group(1))
    assert "pyiceberg.table" in preloaded
    # Of ours, the launcher's warm-up and this project's code location (built once, launcher/location.py).
    assert [m for m in preloaded if m.startswith("lakehouse_dagster")] == [
        "lakehouse_dagster.dagster.launcher.warm",
        "lakehouse_dagster.dagster.preload_location",
    ]
    bare = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]];"
            " print(open('/proc/self/status').read().split('Threads:')[1].split()[0])",
            *instance.run_launcher.preload_modules,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert threads <= int(bare.stdout)


def test_a_failing_run_ends_failure(instance):
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.fail_job)
        done = poll_for_finished_run(instance, run.run_id, timeout=120)
    assert done.status == dg.DagsterRunStatus.FAILURE
    assert "STEP_FAILURE" in _event_types(instance, run.run_id)


def test_terminate_cancels_the_run_and_the_worker_is_gone(instance):
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.sleep_job)
        poll_for_event(
            instance, run.run_id, event_type="STEP_START", message='Started execution of step "sleep_op"', timeout=120
        )
        worker = _worker(instance, run.run_id)
        assert worker.alive()
        assert instance.run_launcher.terminate(run.run_id)
        done = poll_for_finished_run(instance, run.run_id, timeout=60)
    assert done.status == dg.DagsterRunStatus.CANCELED
    _wait_gone(worker)
    assert not instance.run_launcher.terminate(run.run_id)  # a finished run: nothing to do


def test_terminate_right_after_the_launch_still_ends_the_run_canceled(instance):
    """Terminate lands on one side of the worker's start (launcher/start_gate.py): before it, the run is CANCELED
    at once and the worker stops before the first step (a SIGINT then would leave the run CANCELING, which dagster's
    worker turns into FAILURE at start); after it, the started run is interrupted. Never what CI once saw: a run
    marked CANCELED before its start whose worker, having read it as STARTING, then started it and ran its steps."""
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.sleep_job)
        worker = _worker(instance, run.run_id)
        assert instance.run_launcher.terminate(run.run_id)
        done = poll_for_finished_run(instance, run.run_id, timeout=60)
    assert done.status == dg.DagsterRunStatus.CANCELED
    _wait_gone(worker)
    types = _event_types(instance, run.run_id)
    assert "STEP_SUCCESS" not in types, types
    if "PIPELINE_START" in types:  # terminate came after the start: the run was interrupted, not canceled before
        assert types.index("PIPELINE_CANCELED") > types.index("PIPELINE_START"), types
    else:
        assert "STEP_START" not in types, types


def test_a_sigkilled_worker_is_reported_failed_and_the_monitor_fails_its_run(instance):
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.sleep_job)
        poll_for_event(
            instance, run.run_id, event_type="STEP_START", message='Started execution of step "sleep_op"', timeout=120
        )
        started = instance.get_run_by_id(run.run_id)
        assert instance.run_launcher.check_run_worker_health(started).status == WorkerStatus.RUNNING
        worker = _worker(instance, run.run_id)
        os.kill(worker.pid, signal.SIGKILL)
        _wait_gone(worker)
        health = instance.run_launcher.check_run_worker_health(started)
        assert health.status == WorkerStatus.FAILED and str(worker.pid) in health.msg
        # A fresh launcher object (a restarted daemon) finds the worker from the run's tag alone.
        fresh = WarmRunLauncher(warm_at_start=False)
        fresh.register_instance(instance)
        assert fresh.check_run_worker_health(started).status == WorkerStatus.FAILED
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED  # left STARTED so far
        (record,) = instance.get_run_records(dg.RunsFilter(run_ids=[run.run_id]))
        monitor_started_run(instance, ws, record, logging.getLogger("test"))
    assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE


def test_a_code_change_reaches_the_next_run_and_a_dead_forkserver_is_replaced(instance, tmp_path, monkeypatch):
    probe = tmp_path / "launcher_probe.py"
    probe.write_text("PROBE_VALUE = 'first'\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get this process' sys.path

    def probe_value(run_id) -> str:
        (obs,) = [
            r.dagster_event.event_specific_data.asset_observation
            for r in instance.all_logs(run_id)
            if r.dagster_event and r.dagster_event.event_type_value == "ASSET_OBSERVATION"
        ]
        return obs.metadata["probe"].value

    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        first = _launch(instance, ws, launcher_jobs.probe_job)
        assert poll_for_finished_run(instance, first.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
        assert probe_value(first.run_id) == "first"
        assert "launcher_probe" not in sys.modules  # only the worker imported it

        probe.write_text("PROBE_VALUE = 'second'\n")
        old = WarmRunLauncher.forkserver_pid()
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while start_time(old) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        second = _launch(instance, ws, launcher_jobs.probe_job)
        assert poll_for_finished_run(instance, second.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
    assert probe_value(second.run_id) == "second"
    assert WarmRunLauncher.forkserver_pid() not in (None, old)


@pytest.fixture
def forkserver_started_before_env(instance):
    """The forkserver running before the ``settings`` fixture exports this test's database to the environment."""
    instance.run_launcher._forkserver_up()


def test_mirror_batch_job_of_the_code_location_mirrors_a_dataset(
    forkserver_started_before_env, instance, conn, settings
):
    """The real location (lakehouse_dagster.dagster.definitions) and its mirror_batch_job over a real dataset: the worker
    sees the launching process' environment (this test's database and warehouse), not the forkserver's."""
    from lakehouse_dagster.dagster.definitions import defs
    from lakehouse_dagster.tracking import datasets

    ws_id = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(
        conn, ws_id, "launched", [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
    )
    datasets.insert_rows(conn, d, [{"n": k, "s": str(k)} for k in range(50)])
    job = defs().get_job_def("mirror_batch_job")
    with _workspace(instance, "lakehouse_dagster.dagster.definitions") as ws:
        run = _launch(instance, ws, job, run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(d)]}}}})
        done = poll_for_finished_run(instance, run.run_id, timeout=300)
    assert done.status == dg.DagsterRunStatus.SUCCESS, [r.message for r in instance.all_logs(run.run_id)][-5:]
    version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    row = conn.execute(
        "select status, rows, source_version from iceberg_sync_log where dataset_id = %s"
        " order by finished_at desc limit 1",
        (d,),
    ).fetchone()
    assert row == ("succeeded", 50, version)


def test_a_location_on_another_python_falls_back_to_the_code_server_and_says_so(instance):
    """The worker would run the daemon's interpreter, not the location's: the launch goes to DefaultRunLauncher,
    which needs a code server (this in-process location has none), so the launch fails loudly, with both reasons."""
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        (location,) = [e.code_location for e in ws.get_code_location_entries().values()]
        (repo,) = location.get_repositories().values()
        remote = repo.get_full_job("ok_job")
        origin = remote.get_python_origin()
        other = origin._replace(
            repository_origin=origin.repository_origin._replace(executable_path="/opt/other/python")
        )
        run = instance.create_run_for_job(
            job_def=launcher_jobs.ok_job, remote_job_origin=remote.get_remote_origin(), job_code_origin=other
        )
        with pytest.raises(Exception, match="GRPC"):
            instance.launch_run(run.run_id, ws)
    messages = [r.message for r in instance.all_logs(run.run_id)]
    assert any("DefaultRunLauncher" in m and "/opt/other/python" in m for m in messages)
    assert WORKER_TAG not in instance.get_run_by_id(run.run_id).tags  # nothing was forked


def test_workers_get_the_code_location_the_forkserver_built_once(instance):
    """preload_location: a forked worker's ``defs()`` is the forkserver's Definitions (not built again); in this
    process (like the code server) nothing was preloaded, so it builds them."""
    from lakehouse_dagster.dagster.launcher import location

    instance.run_launcher._forkserver_up()
    proc = instance.run_launcher._context().Process(target=launcher_jobs.exit_3_unless_definitions_are_preloaded)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert location.preloaded() is None


def _touch_later(path: Path) -> tuple[int, int]:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    return st.st_atime_ns, st.st_mtime_ns


def test_a_changed_code_location_gets_a_new_forkserver_before_the_next_fork(instance):
    """A file of the package changed after the forkserver loaded it: the next launch starts a new forkserver
    (which loads the code on disk) and says so; the launch after that uses it as is."""
    from lakehouse_dagster.dagster.launcher import location

    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        first = _launch(instance, ws, launcher_jobs.ok_job)
        assert poll_for_finished_run(instance, first.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
        old = WarmRunLauncher.forkserver_pid()
        target = location.PACKAGE_DIR / "dagster" / "preload_location.py"
        saved = _touch_later(target)
        try:
            second = _launch(instance, ws, launcher_jobs.ok_job)
            assert poll_for_finished_run(instance, second.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
            new = WarmRunLauncher.forkserver_pid()
            third = _launch(instance, ws, launcher_jobs.ok_job)
            assert poll_for_finished_run(instance, third.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
        finally:
            os.utime(target, ns=saved)
    assert new not in (None, old) and _exited(old)  # the old one stopped
    said = [r.message for r in instance.all_logs(second.run_id) if "Forked run worker" in r.message]
    assert len(said) == 1 and "code location preloaded" in said[0] and "a new one was started" in said[0], said
    assert WarmRunLauncher.forkserver_pid() == new  # unchanged code: no restart
    assert not any("a new one was started" in r.message for r in instance.all_logs(third.run_id))


def _exited(pid: int, timeout: float = 20.0) -> bool:
    """The process is gone (exited and reaped) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return start_time(pid) is None


def test_a_code_change_while_a_long_run_goes_on_holds_no_launch_and_the_old_forkserver_exits_at_once(instance):
    """A mirror stream run lives up to 15 minutes. A file of the package changed while one ran: the next launch
    waited for the old forkserver to exit, which it did only when that run ended (multiprocessing hands the
    forkserver's alive pipe to every child it forks), and the run queue stood still meanwhile (seen under
    scripts/start). Now the launcher lets the old forkserver go, the worker drops its copy of the pipe, and the old
    forkserver exits at once while the long run goes on."""
    from lakehouse_dagster.dagster.launcher import location

    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        long = _launch(instance, ws, launcher_jobs.sleep_job)  # up to 2 minutes
        poll_for_event(
            instance, long.run_id, event_type="STEP_START", message='Started execution of step "sleep_op"', timeout=120
        )
        old = WarmRunLauncher.forkserver_pid()
        assert old is not None
        target = location.PACKAGE_DIR / "dagster" / "preload_location.py"
        saved = _touch_later(target)
        try:
            started = time.monotonic()
            second = _launch(instance, ws, launcher_jobs.ok_job)
            launching = time.monotonic() - started
            assert poll_for_finished_run(instance, second.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
        finally:
            os.utime(target, ns=saved)
        assert launching < 30, f"the launch waited {launching:.0f} s for the old forkserver"
        assert WarmRunLauncher.forkserver_pid() not in (None, old)
        assert _exited(old), "the old forkserver outlived the launch: a worker still holds its alive pipe"
        worker = _worker(instance, long.run_id)
        assert worker.alive()  # the long run goes on, an orphan of the old forkserver
        assert instance.run_launcher.terminate(long.run_id)
        assert poll_for_finished_run(instance, long.run_id, timeout=60).status == dg.DagsterRunStatus.CANCELED


def test_a_worker_whose_forkserver_loaded_other_code_runs_in_a_fresh_interpreter(instance, monkeypatch):
    """The race the launcher's check cannot close (a file written between its check and the fork): the worker
    finds its forkserver's code differs from what the launcher saw and execs ``dagster api execute_run`` (same pid,
    so the run's worker tag stays true); the run still succeeds and its log says why."""
    from lakehouse_dagster.dagster.launcher import location
    from lakehouse_dagster.dagster.launcher import run_launcher as launcher_module

    instance.run_launcher._forkserver_up()
    pid = WarmRunLauncher.forkserver_pid()
    # The launcher "sees" code on disk that is neither what the forkserver loaded nor a reason to restart it.
    monkeypatch.setitem(launcher_module._FORKSERVER_CODE, pid, "written-after-the-check")
    monkeypatch.setattr(location, "fingerprint", lambda root=location.PACKAGE_DIR: "written-after-the-check")
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        run = _launch(instance, ws, launcher_jobs.ok_job)
        done = poll_for_finished_run(instance, run.run_id, timeout=180)
    assert done.status == dg.DagsterRunStatus.SUCCESS
    assert WarmRunLauncher.forkserver_pid() == pid
    messages = [r.message for r in instance.all_logs(run.run_id)]
    assert any("starts in a fresh interpreter" in m for m in messages), messages
    worker = _worker(instance, run.run_id)
    assert f"Started process for run (pid: {worker.pid})." in messages  # exec kept the pid


@pytest.fixture
def pg_warm_instance(pg_admin_dsn, tmp_path):
    """The instance `lakehouse up` runs: Dagster storage on Postgres and the warm launcher."""
    from lakehouse_dagster_tests.conftest import pg_dagster_instance

    with pg_dagster_instance(
        pg_admin_dsn,
        tmp_path,
        "run_launcher:\n  module: lakehouse_dagster.dagster.launcher.run_launcher\n  class: WarmRunLauncher\n",
    ) as got:
        yield got


def _sessions(pg_admin_dsn, db: str) -> int:
    """Connections ever opened to ``db`` (pg_stat_database.sessions: counted when each one ends)."""
    import psycopg

    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        return admin.execute("select sessions from pg_stat_database where datname = %s", (db,)).fetchone()[0]


def test_a_warm_worker_stores_its_events_on_kept_connections(pg_warm_instance, pg_admin_dsn):
    """dagster-postgres opens ~3 connections per stored event (NullPool); the warm worker keeps them for the run
    (launcher/event_writes.py): a run that logs CHATTY more events opens fewer than CHATTY more connections, and every
    event is stored."""
    instance, db = pg_warm_instance
    opened = {}
    with _workspace(instance, "lakehouse_dagster_tests.launcher_jobs") as ws:
        for job in (launcher_jobs.ok_job, launcher_jobs.chatty_job):
            before = _sessions(pg_admin_dsn, db)
            run = _launch(instance, ws, job)
            assert poll_for_finished_run(instance, run.run_id, timeout=120).status == dg.DagsterRunStatus.SUCCESS
            _wait_gone(_worker(instance, run.run_id))  # its connections closed, so counted
            time.sleep(1.0)
            opened[job.name] = _sessions(pg_admin_dsn, db) - before
            if job is launcher_jobs.chatty_job:
                lines = [r.message for r in instance.all_logs(run.run_id) if r.message.startswith("line ")]
                assert len(lines) == launcher_jobs.CHATTY
    assert opened["ok_job"] > 0
    assert opened["chatty_job"] - opened["ok_job"] < launcher_jobs.CHATTY, opened
