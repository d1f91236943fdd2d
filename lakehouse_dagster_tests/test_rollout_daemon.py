"""A daemon killed mid-stage resumes without double-applying: the real `dagster-daemon` runs the rollout_controller
on a Postgres-backed instance; the failpoint `rollout-after-step` SIGKILLs the code server right after a stage's
step rows commit and before its runs are asked for (the worst moment); the whole daemon is then killed, a new one
started, and the plan must finish with each flag change made once and each step run once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from lakehouse_dagster.dagster.defs.shared.tags import PLAN, PLAN_STEP
from lakehouse_dagster.plans import actions, store

from .conftest import pg_dagster_instance
from .rollout_helpers import plan_audit, seed_mix

pytestmark = pytest.mark.slow  # a real dagster-daemon killed mid-stage

DAEMON = Path(sys.executable).with_name("dagster-daemon")


def _start_daemon(home: Path, workspace: Path, failpoint: str | None) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(home), "LAKEHOUSE_ROLLOUT_TICK_SECONDS": "1"}
    env.pop("LAKEHOUSE_FAILPOINT", None)
    if failpoint:
        env["LAKEHOUSE_FAILPOINT"] = failpoint
    log = open(home / f"daemon-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [str(DAEMON), "run", "-w", str(workspace)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill_all(proc: subprocess.Popen, home: Path) -> None:
    """SIGKILL the daemon's group and every process with this test's DAGSTER_HOME (its code server, runs)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("DAGSTER_HOME") == str(home):
                p.kill()
        except (psutil.Error, PermissionError):
            continue
    proc.wait(timeout=30)


def _wait(what: str, check, timeout: float, home: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(home.glob("daemon-*.log")))
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


@pytest.mark.skipif(not DAEMON.exists(), reason="dagster-daemon is not installed beside this Python")
def test_a_daemon_killed_mid_stage_resumes_without_double_applying(conn, dsn, settings, pg_admin_dsn, tmp_path):
    s = seed_mix(conn, dsn, settings)
    text = f"reader: export.stream\nstages:\n  - datasets: 1\n    soak: 1s\n  - workspace: {s.ws}\n    soak: 1s\n"
    plan_id, rendered = actions.start(conn, settings, text, actor="pytest")
    home = tmp_path / "dagster_home"
    home.mkdir()
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: lakehouse_dagster.dagster.definitions\n"
        "      location_name: lakehouse_dagster\n"
    )
    # runs launched at once, forked from the warm forkserver (the project's dagster.yaml launcher)
    extra = (
        "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"
        "run_launcher:\n  module: lakehouse_dagster.dagster.launcher.run_launcher\n  class: WarmRunLauncher\n"
    )
    with pg_dagster_instance(pg_admin_dsn, home, extra) as (inst, _):

        def plan_runs():
            return inst.get_runs(filters=dg.RunsFilter(tags={PLAN: str(plan_id)}))

        first = _start_daemon(home, workspace, "rollout-after-step")
        try:
            # the first stage's step is written, then the code server dies before asking for its run
            _wait("the first step row", lambda: store.steps(conn, plan_id), 120, home)
            time.sleep(2)  # the daemon retries (and dies again at the same point): no run ever gets asked for
        finally:
            _kill_all(first, home)
        p = store.get(conn, plan_id)
        assert (p.state, p.stage, p.phase) == ("active", 0, "flipping")
        assert [x.status for x in store.steps(conn, plan_id)] == ["requested"]
        assert plan_runs() == [] and plan_audit(conn, plan_id) == []  # nothing applied yet

        second = _start_daemon(home, workspace, None)
        try:
            p = _wait(
                "the plan to end",
                lambda: (q := store.get(conn, plan_id)).state not in ("active", "aborting") and q,
                240,
                home,
            )
        finally:
            _kill_all(second, home)
        assert p.state == "finished", (p.reason, p.blocking)
        runs = plan_runs()
        steps = {x.step_key for x in store.steps(conn, plan_id)}
        assert sorted(r.tags[PLAN_STEP] for r in runs) == sorted(steps)  # one run per step, none twice
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    audit = plan_audit(conn, plan_id)
    assert [(a[0], a[3], a[6]) for a in audit] == [("set", "dataset", "iceberg"), ("set", "workspace", "iceberg")]
    assert len(audit) == len(rendered.changes)  # each flag change applied once
