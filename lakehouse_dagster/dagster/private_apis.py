"""The Dagster half of the private-API shim (core/private_apis.py is the rest): every private name of Dagster that
lakehouse_dagster uses, behind named functions, in the Dagster glue's layer. Only the glue and the launcher (both in
this package) can import it, which the layer contracts in pyproject.toml check; the rest of the package calls these,
never a private name itself (lakehouse_dagster_tests/test_private_apis.py checks that).

Importing core/private_apis.py first refuses Dagster versions these uses were not tested with (``TESTED`` there).
The classes a run launcher plugin is built from are names of this module, so that a class can derive from them and
annotations name them. GRPC_INFO_TAG: the tag of a run launched through a code server.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult as CheckRunHealthResult
from dagster._core.launcher import LaunchRunContext as LaunchRunContext
from dagster._core.launcher import RunLauncher as RunLauncher
from dagster._core.launcher import WorkerStatus as WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG as GRPC_INFO_TAG
from dagster._serdes import ConfigurableClass as ConfigurableClass
from dagster._serdes import ConfigurableClassData as ConfigurableClassData

import lakehouse_dagster.core.private_apis  # noqa: F401  - importing it refuses Dagster versions not in its TESTED


def dagster_run_modules() -> list[str]:
    """The modules ``dagster api execute_run`` imports to execute a run (worth preloading in a forkserver)."""
    return ["dagster._cli.api", "dagster._core.execution.api", "dagster._core.execution.plan.execute_plan"]


def dagster_log_now(context: dg.OpExecutionContext, events) -> None:
    """Each AssetMaterialization / AssetCheckEvaluation in the run's event log at once, exactly as the step's
    executor logs one it is yielded (``DagsterEvent.asset_materialization`` / ``asset_check_evaluation`` write it on
    creation), but not kept by the step: Dagster's ``execute_plan`` keeps every event a step yields, for the step's
    hooks at its end, so a stream run's one step (thousands of syncs over its lifetime) grew by ~25 KB a sync
    (bench/bench_stream_rss.py: 376 → 478 MB over 30 minutes). For a step that declares no outputs and no checks."""
    step = context.get_step_execution_context()
    for event in events:
        if isinstance(event, dg.AssetMaterialization):
            dg.DagsterEvent.asset_materialization(step, event)
        elif isinstance(event, dg.AssetCheckEvaluation):
            dg.DagsterEvent.asset_check_evaluation(step, event)
        else:
            raise TypeError(f"not an event logged at once: {type(event).__name__}")


def dagster_is_daemon(argv0: str) -> bool:
    """Whether ``argv0`` is the dagster daemon's: ``dagster-daemon run``, or ``python -m dagster._daemon`` (what
    ``dagster dev`` starts)."""
    return os.path.basename(argv0) == "dagster-daemon" or argv0.endswith(
        os.path.join("dagster", "_daemon", "__main__.py")
    )


def dagster_registered_instance(launcher):
    """The DagsterInstance a run launcher (any of Dagster's MayHaveInstanceWeakref) was registered with."""
    return launcher._instance


def dagster_instance_ref(serialized: str):
    """The InstanceRef serialized in ``serialized`` (``serialize_value(instance.get_ref())``)."""
    from dagster import (
        deserialize_value,
    )  # lazy: Dagster's internals load only when this is called
    from dagster._core.instance.ref import (
        InstanceRef,
    )  # lazy: Dagster's internals load only when this is called

    return deserialize_value(serialized, InstanceRef)


def dagster_report_check_result(instance, evaluation) -> str:
    """Record an asset check result (``AssetCheckEvaluation``) that belongs to no run; the run id it is filed under.

    Dagster's runless path (``report_runless_asset_event``) files every runless result under run id "" and inserts it
    into ``asset_check_executions``, whose unique index (asset key, check, run id, partition) then refuses a second
    runless result on the same partition of a partitioned check (an IntegrityError; test_red_without_a_run.py shows
    it). Filed here under a run id of its own, ``runless-<uuid>`` (no such run: the UI's Run column reads
    "runless"), the storage inserts each result as a new row, the partition's latest."""

    run_id = f"runless-{uuid.uuid4()}"
    instance.report_dagster_event(
        dg.DagsterEvent(
            event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION.value,
            event_specific_data=evaluation,
            job_name="",
        ),
        run_id=run_id,
    )
    return run_id


def dagster_report_runless_materializations(instance, materializations: list) -> None:
    """Store asset materializations that belong to no run — what ``report_runless_asset_event`` stores for each (run
    id and job name "") — in one batch write, the way ``handle_new_event`` stores a batch
    (``event_log_storage.store_event_batch``). One at a time, dagster-postgres opens connections for every event:
    100 took 36–46× the batch's time (5.9–6.3 s against 0.13–0.18 s under load, docs/overview.md)."""
    from dagster._core.events import (
        StepMaterializationData,
    )  # lazy: Dagster's internals load only when this is called

    if not materializations:
        return
    now = time.time()
    instance.event_log_storage.store_event_batch(
        [
            dg.EventLogEntry(
                user_message="",
                level=logging.INFO,
                job_name="",
                run_id="",
                error_info=None,
                timestamp=now,
                step_key=None,
                dagster_event=dg.DagsterEvent(
                    event_type_value=dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                    event_specific_data=StepMaterializationData(m),
                    job_name="",
                ),
            )
            for m in materializations
        ]
    )


def dagster_capture_interrupts():
    """Within the block, SIGINT becomes an execution interrupt inside steps (the run ends CANCELED)."""
    from dagster._utils.interrupts import (
        capture_interrupts,
    )  # lazy: Dagster's internals load only when this is called

    return capture_interrupts()


def dagster_execute_run(run_id: str, instance) -> int:
    """Execute the run in this process, as ``dagster api execute_run`` does once started; its exit code."""
    from dagster._cli.api import (
        _execute_run_command_body,
    )  # lazy: Dagster's internals load only when this is called

    return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)


def dagster_step_error(message: str, cls_name: str) -> Exception:
    """An exception a step raises to fail with exactly one error line, ``message``, and no stack anywhere Dagster
    shows it: the step's row, the run-level RUN_FAILURE event (built from the first failed step's error) and the
    console. Dagster forwards the error of a user code process as it was serialised there
    (``DagsterUserCodeProcessError``: ``serializable_error_info_from_exc_info`` hoists its one error info instead of
    serialising the raise), and lets it through the op's error boundary unwrapped and unretried (a ``DagsterError``)."""
    from dagster._core.errors import (
        DagsterUserCodeProcessError,
    )  # lazy: Dagster's internals load only when this is called
    from dagster._utils.error import (
        SerializableErrorInfo,
    )  # lazy: Dagster's internals load only when this is called

    info = SerializableErrorInfo(message=message, stack=[], cls_name=cls_name)
    return DagsterUserCodeProcessError(message, user_code_process_error_infos=[info])


def dagster_execute_run_argv(job_origin, run_id: str, ref) -> list[str]:
    """The command line of ``dagster api execute_run`` for the run ``run_id`` of ``job_origin`` on the instance
    ``ref``, in this interpreter."""
    from dagster import (
        serialize_value,
    )  # lazy: Dagster's internals load only when this is called
    from dagster._grpc.types import (
        ExecuteRunArgs,
    )  # lazy: Dagster's internals load only when this is called

    args = ExecuteRunArgs(job_origin=job_origin, run_id=run_id, instance_ref=ref, set_exit_code_on_failure=True)
    return [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)]
