"""The body of a run worker forked from the warm forkserver: what ``dagster api execute_run`` does in a fresh
interpreter (dagster/_cli/api.py), minus the interpreter start, the third-party imports and the code location the
forkserver already holds (location.py). A worker whose forkserver preloaded code that is no longer the code on disk
(a file changed between the launcher's check and the fork) becomes that fresh interpreter instead (exec), so a
run never uses stale code."""

from __future__ import annotations

import os
import sys


def run_worker(
    run_id: str, serialized_instance_ref: str, environ: dict[str, str], code_fingerprint: str | None = None
) -> None:
    """``environ``: the launching process' environment at launch time (the forkserver's dates from its start),
    as a fresh worker of the default launcher would inherit it from the code server. ``code_fingerprint``: the
    code location's files as the launcher saw them just before the fork (None: no preload to check)."""
    os.environ.clear()
    os.environ.update(environ)
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance import DagsterInstance
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts

    from lakehouse_dagster.launcher.location import preloaded_fingerprint

    ref = deserialize_value(serialized_instance_ref, InstanceRef)
    loaded = preloaded_fingerprint()
    if code_fingerprint is not None and loaded is not None and loaded != code_fingerprint:
        _exec_fresh(run_id, ref)
    from lakehouse_dagster.launcher.event_writes import (
        pooled_event_writes,
    )  # after the fork: code of the location, on disk

    # SIGINT (the launcher's terminate) becomes an execution interrupt inside steps: the run ends CANCELED.
    # The run's events (start, steps, end, and every materialization and check) reuse their Postgres
    # connections instead of opening ~3 per event (launcher/event_writes.py).
    with capture_interrupts():
        with DagsterInstance.from_ref(ref) as instance, pooled_event_writes(instance):
            code = _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)


def _exec_fresh(run_id: str, ref) -> None:
    """Replace this process (same pid, so the run's worker tag stays true) by ``dagster api execute_run``."""
    from dagster._core.instance import DagsterInstance
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import serialize_value

    with DagsterInstance.from_ref(ref) as instance:
        run = instance.get_run_by_id(run_id)
        instance.report_engine_event(
            "The code location changed on disk after the warm forkserver loaded it: this run starts in a fresh "
            "interpreter instead (the next launch starts a new forkserver).",
            run,
        )
        args = ExecuteRunArgs(
            job_origin=run.job_code_origin, run_id=run_id, instance_ref=ref, set_exit_code_on_failure=True
        )
    # This interpreter: the launcher forks only for locations that run it (launcher.py, executable_path).
    cmd = [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)
