"""A mirror_stream run's end by a signal (issue 44, "clean stops"): the real job of the code location, run in a process
of its own on a real Dagster instance, interrupted the two ways it is in production.

* Its stack stopping (`lakehouse up`'s Ctrl-C, a code server or a pod going away: SIGTERM, no termination asked):
  the run ends SUCCESS, a hand-over logged in one line, its shard's lock released (the heartbeat row ended) — on main
  it ended FAILURE ("Execution was interrupted unexpectedly") with a stack trace on the console.
* A user's Terminate (the launcher marks the run CANCELING, then signals it): the run ends CANCELED, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from lakehouse_dagster.tracking import datasets

_RUN = """
import sys
import dagster as dg
from lakehouse_dagster.dagster.definitions import build

job = build().get_job_def("mirror_stream")
with dg.DagsterInstance.get() as instance:
    job.execute_in_process(
        instance=instance,
        run_id=sys.argv[1],
        run_config={"ops": {"stream_shard_op": {"config": {"shard": 0, "shards": 1, "lifetime_seconds": 300}}}},
        raise_on_error=False,
    )
"""


# The run of _RUN, but its checks are a library that swallows the interrupt: a DuckDB query (which turns the signal
# into RuntimeError('Query interrupted')) inside an `except Exception` — what the canary's digest did (issue 44).
_RUN_SWALLOWING = (
    """
import pathlib
import sys
import duckdb
from lakehouse_dagster.dagster.defs.mirror import stream_job

def swallowing_checks(*args, **kwargs):
    pathlib.Path(sys.argv[2]).write_text("checking")
    try:
        duckdb.connect(config={"threads": 1}).execute("select sum(i % 7) from range(20000000000) t(i)")
    except Exception:
        pass
    return []

stream_job.check_evaluations = swallowing_checks
"""
    + _RUN
)


def _start(tmp_path: Path, run_id: str, script_text: str = _RUN, *args: str) -> subprocess.Popen:
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    script = tmp_path / "stream_run.py"
    script.write_text(script_text)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    return subprocess.Popen(
        [sys.executable, str(script), run_id, *args],
        env=env,
        stdout=open(tmp_path / f"{run_id}.log", "w"),  # noqa: SIM115 - the child's, closed with the process
        stderr=subprocess.STDOUT,
    )


def _wait_holding(conn: psycopg.Connection, proc: subprocess.Popen, run_id: str, log: Path) -> None:
    """Until the run holds shard 0's lock (its heartbeat row, beaten after the lock is taken)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        row = conn.execute(
            "select 1 from lakehouse_mirror_streams where run_id = %s and ended_at is null", (run_id,)
        ).fetchone()
        if row:
            return
        time.sleep(0.3)
    pytest.fail(f"the stream run never held its shard:\n{log.read_text()[-3000:]}")


def _instance(tmp_path: Path):
    return dg.DagsterInstance.from_config(str(tmp_path / "dagster_home"))


@pytest.mark.slow
def test_a_signal_ends_the_stream_run_as_a_hand_over_and_a_terminate_as_a_cancel(settings, conn, tmp_path):
    # the stack stopping: SIGTERM with no termination asked
    run_id = str(uuid.uuid4())
    proc = _start(tmp_path, run_id)
    log = tmp_path / f"{run_id}.log"
    _wait_holding(conn, proc, run_id, log)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    text = log.read_text()
    with _instance(tmp_path) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS, text[-3000:]
    handed = [line for line in text.splitlines() if "stopped with its process" in line and "handed over" in line]
    assert len(handed) == 1, text[-3000:]
    assert "DagsterExecutionInterruptedError" not in text and "RUN_FAILURE" not in text
    ended = conn.execute("select ended_at is not null from lakehouse_mirror_streams where run_id = %s", (run_id,))
    assert ended.fetchone() == (True,), "the lock let go as at the deadline: the heartbeat row says ended"

    # a user's Terminate: CANCELING first (what every launcher's terminate does), then the signal
    run_id = str(uuid.uuid4())
    proc = _start(tmp_path, run_id)
    log = tmp_path / f"{run_id}.log"
    _wait_holding(conn, proc, run_id, log)
    with _instance(tmp_path) as instance:
        instance.report_run_canceling(instance.get_run_by_id(run_id))
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    with _instance(tmp_path) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.CANCELED, log.read_text()[-3000:]
    assert "handed over" not in log.read_text()


@pytest.mark.slow
def test_a_signal_whose_exception_a_library_swallows_still_ends_the_stream_as_a_hand_over(settings, conn, tmp_path):
    """SIGTERM while the run's checks are inside a library that turns the interrupt into an ordinary error it then
    catches: on main the stream ran on to its lifetime (300 s here; the code server's SIGKILL came 30 s after its
    SIGTERM in test_deploy_topology). The run's own handler records the signal, so the loop stops all the same."""
    run_id = str(uuid.uuid4())
    checking = tmp_path / "checking"
    proc = _start(tmp_path, run_id, _RUN_SWALLOWING, str(checking))
    log = tmp_path / f"{run_id}.log"
    try:
        _wait_holding(conn, proc, run_id, log)
        ws = datasets.create_workspace(conn, "stop")
        ds = datasets.create_dataset(conn, ws, "clicks", [{"name": "n", "type": "int64"}])
        datasets.insert_rows(conn, ds, [{"n": k} for k in range(3)])  # synced, then checked when the loop is idle
        deadline = time.monotonic() + 180
        while not checking.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # inside the query (it runs for minutes)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    with _instance(tmp_path) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS, text[-3000:]
    handed = [line for line in text.splitlines() if "stopped with its process" in line and "handed over" in line]
    assert len(handed) == 1, text[-3000:]
    assert "checks of " in text and "not recorded: the run is stopping" in text, text[-3000:]
    ended = conn.execute("select ended_at is not null from lakehouse_mirror_streams where run_id = %s", (run_id,))
    assert ended.fetchone() == (True,)
