"""The body of a run worker forked from the warm forkserver: what ``dagster api execute_run`` does in a fresh
interpreter (dagster/_cli/api.py), minus the interpreter start and the third-party imports the forkserver
already holds. The code location itself (lakehouse_dagster) is imported here, after the fork, so each run uses
the code on disk at its start."""

from __future__ import annotations

import sys


def run_worker(run_id: str, serialized_instance_ref: str, environ: dict[str, str]) -> None:
    """``environ``: the launching process' environment at launch time (the forkserver's dates from its start),
    as a fresh worker of the default launcher would inherit it from the code server."""
    import os

    os.environ.clear()
    os.environ.update(environ)
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance import DagsterInstance
    from dagster._core.instance.ref import InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts

    # SIGINT (the launcher's terminate) becomes an execution interrupt inside steps: the run ends CANCELED.
    with capture_interrupts():
        with DagsterInstance.from_ref(deserialize_value(serialized_instance_ref, InstanceRef)) as instance:
            code = _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        sys.exit(code)
