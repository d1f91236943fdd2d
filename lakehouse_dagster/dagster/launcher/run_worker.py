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
    from lakehouse_dagster.core.private_apis import (
        drop_inherited_forkserver_pipe,
    )  # lazy: imported in the worker after the fork

    drop_inherited_forkserver_pipe()  # so a forkserver the launcher replaced exits now, not when this run ends
    from dagster import (
        DagsterInstance,
    )  # lazy: imported in the worker after the fork: the code on disk, not the forkserver's

    from lakehouse_dagster.dagster import (
        private_apis,
    )  # lazy: imported in the worker after the fork: the code on disk, not the forkserver's
    from lakehouse_dagster.dagster.launcher.location import (
        preloaded_fingerprint,
    )  # lazy: imported in the worker after the fork: the code on disk, not the forkserver's

    ref = private_apis.dagster_instance_ref(serialized_instance_ref)
    loaded = preloaded_fingerprint()
    if code_fingerprint is not None and loaded is not None and loaded != code_fingerprint:
        _exec_fresh(run_id, ref)
    from lakehouse_dagster.dagster.launcher.event_writes import (
        pooled_event_writes,
    )  # after the fork: code of the location, on disk
    from lakehouse_dagster.dagster.launcher.start_gate import (
        WorkerGate,
    )  # after the fork: code of the location, on disk

    # SIGINT (the launcher's terminate) becomes an execution interrupt inside steps: the run ends CANCELED.
    # The run's events (start, steps, end, and every materialization and check) reuse their Postgres
    # connections instead of opening ~3 per event (launcher/event_writes.py). The gate (start_gate.py) keeps a
    # terminate from slipping between Dagster's read of the run and its start.
    gate = WorkerGate(run_id)
    gate.hold()
    try:
        with private_apis.dagster_capture_interrupts():
            with DagsterInstance.from_ref(ref) as instance, pooled_event_writes(instance):
                gate.watch(instance)
                code = private_apis.dagster_execute_run(run_id, instance)
    finally:
        gate.release()
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)


def _exec_fresh(run_id: str, ref) -> None:
    """Replace this process (same pid, so the run's worker tag stays true) by ``dagster api execute_run``."""
    from dagster import (
        DagsterInstance,
    )  # lazy: imported in the worker after the fork: the code on disk, not the forkserver's

    from lakehouse_dagster.dagster import (
        private_apis,
    )  # lazy: imported in the worker after the fork: the code on disk, not the forkserver's

    with DagsterInstance.from_ref(ref) as instance:
        run = instance.get_run_by_id(run_id)
        if run is None:  # deleted between its launch and this worker
            sys.exit(f"run {run_id} is not in the Dagster instance (deleted before it started?): nothing to execute")
        instance.report_engine_event(
            "The code location changed on disk after the warm forkserver loaded it: this run starts in a fresh "
            "interpreter instead (the next launch starts a new forkserver).",
            run,
        )
    # This interpreter: the launcher forks only for locations that run it (launcher.py, executable_path).
    cmd = private_apis.dagster_execute_run_argv(run.job_code_origin, run_id, ref)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)
