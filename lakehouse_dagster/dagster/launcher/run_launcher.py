"""WarmRunLauncher: each run in a child forked from a long-lived forkserver that already imported the heavy
third-party modules (dagster, pyiceberg, pyarrow, pandas, numba, ...).

Why: dagster's DefaultRunLauncher asks the code server to start every run in a *fresh* interpreter
(multiprocessing "spawn") that imports dagster and the whole code location before the first step: seconds per run,
most of a small mirror's lag. A fork of a warm process starts in milliseconds. With ``preload_location`` (default)
the forkserver also builds this project's code location once (location.py: ~1 s of every launch otherwise); before
each fork the launcher compares the package's files with those the forkserver loaded and starts a new forkserver
when they changed, so a code change is used by the next run. Other code locations are imported after the fork.

What operators keep from the default launcher: terminate (SIGINT to the worker → the run ends CANCELED; SIGKILL
after ``terminate_grace_seconds`` if it is stuck), run monitoring (``check_run_worker_health``: a worker that died
leaves its run to be failed by the monitoring daemon), workers reaped (by the forkserver, their parent), the
forkserver started again when it died (multiprocessing's ``ensure_running`` on the next launch / health check).
Everything needed to find a worker lives in its run's hidden tag ``.dagster/lakehouse_run_worker`` (host, pid, start time), not in
this object: terminate from the webserver process and health checks after a daemon restart work the same.

Fallback: a run whose code location runs another Python (``executable_path``), or a forkserver that cannot start,
is launched by dagster's DefaultRunLauncher (through the code server), and an engine event on the run says why.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg

from lakehouse_dagster.core import private_apis
from lakehouse_dagster.dagster import private_apis as dagster_private
from lakehouse_dagster.dagster.launcher import location
from lakehouse_dagster.dagster.launcher.run_worker import run_worker
from lakehouse_dagster.dagster.launcher.start_gate import terminate_gate
from lakehouse_dagster.dagster.launcher.worker_process import Worker
from lakehouse_dagster.dagster.private_apis import (  # what a launcher plugin is built from: Dagster keeps it private
    GRPC_INFO_TAG,
    CheckRunHealthResult,
    ConfigurableClass,
    ConfigurableClassData,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)

# Hidden in the UI: Dagster's GraphQL leaves out run tags whose key starts with ".dagster/" (its HIDDEN_TAG_PREFIX,
# dagster/_core/storage/tags.py; dagster_graphql's run `tags`), as it does for its own `.dagster/run_worker` and
# `.dagster/grpc_info`. The key is ours (a name Dagster does not use); the runs list keeps only the useful tags.
WORKER_TAG = ".dagster/lakehouse_run_worker"
# Where runs launched before the rename keep it: read as a fallback, so terminate and the health check still find
# a worker started by the previous version.
OLD_WORKER_TAG = "lakehouse/run_worker"


def _worker_tag(run: dg.DagsterRun) -> str | None:
    return run.tags.get(WORKER_TAG) or run.tags.get(OLD_WORKER_TAG)


# Imported once by the forkserver. Third-party only: never lakehouse_dagster (a code change must reach the next
# run). Modules a run imports anyway (DagsterInstance on Postgres, the catalog, Parquet, the parity kernel's numba).
DEFAULT_PRELOAD = [
    "dagster",
    *dagster_private.dagster_run_modules(),
    "dagster_postgres",
    "psycopg",
    "psycopg.types.json",
    "sqlalchemy",
    "numpy",
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.csv",
    "pyarrow.parquet",
    "numba",
    "pyiceberg.catalog",
    "pyiceberg.catalog.sql",
    "pyiceberg.expressions",
    "pyiceberg.io.pyarrow",
    "pyiceberg.schema",
    "pyiceberg.table",
    "pyiceberg.types",
]

# Imported after DEFAULT_PRELOAD when ``warm_up`` (the launcher's own package comes with it, nothing else of ours).
WARM_UP = "lakehouse_dagster.dagster.launcher.warm"
# Imported last when ``preload_location``: this project's code location, built once (location.py).
PRELOAD_LOCATION = "lakehouse_dagster.dagster.preload_location"

_CTX_LOCK = threading.Lock()
_FORK_LOCK = threading.Lock()  # forks and a forkserver restart never interleave
# The forkserver is one per process (multiprocessing's): the code location's files as they were when it was
# started, by its pid.
_FORKSERVER_CODE: dict[int, str | None] = {}


def _reap(pid: int) -> None:
    """Wait for a detached forkserver to exit (it is this process' child: no zombie left)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _in_daemon_process() -> bool:
    """The dagster daemon (``dagster-daemon run`` or ``python -m dagster._daemon`` under ``dagster dev``) is the
    process that launches queued runs: the one worth warming up at start."""
    return dagster_private.dagster_is_daemon(sys.argv[0] if sys.argv else "")


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches runs in children of a warm forkserver (this machine only); see the module docstring."""

    def __init__(
        self,
        inst_data: ConfigurableClassData | None = None,
        preload_modules: list[str] | None = None,
        warm_at_start: bool = True,
        terminate_grace_seconds: float = 30.0,
        warm_up: bool = True,
        preload_location: bool = True,
    ):
        self._inst_data = inst_data
        self.preload_modules = list(DEFAULT_PRELOAD if preload_modules is None else preload_modules)
        if warm_up:
            self.preload_modules.append(WARM_UP)
        self.preload_location = bool(preload_location)
        if self.preload_location:
            self.preload_modules.append(PRELOAD_LOCATION)
        self.terminate_grace_seconds = float(terminate_grace_seconds)
        self._ctx: multiprocessing.context.ForkServerContext | None = None
        self._workers: dict[str, multiprocessing.process.BaseProcess] = {}
        self._lock = threading.Lock()
        self._fallback: dg.DefaultRunLauncher | None = None
        super().__init__()
        if warm_at_start and _in_daemon_process():
            # Start importing now, in the background of the forkserver, so the first run finds it warm.
            try:
                self._forkserver_up()
            except Exception:  # the first launch tries again and falls back loudly
                pass

    # --- ConfigurableClass ------------------------------------------------------------------------------------
    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {
            "preload_modules": dg.Field(
                [str], is_required=False, description="modules the forkserver imports once (third-party only)"
            ),
            "warm_at_start": dg.Field(
                bool,
                is_required=False,
                default_value=True,
                description="start the forkserver when the daemon starts, not at the first run",
            ),
            "terminate_grace_seconds": dg.Field(
                float,
                is_required=False,
                default_value=30.0,
                description="SIGKILL a terminated worker still alive after this",
            ),
            "warm_up": dg.Field(
                bool,
                is_required=False,
                default_value=True,
                description="numba's compiler initialised once in the forkserver (warm.py)",
            ),
            "preload_location": dg.Field(
                bool,
                is_required=False,
                default_value=True,
                description="the forkserver builds this project's code location once; a "
                "change of its files starts a new forkserver (location.py)",
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, **config_value)

    @property
    def _registered_instance(self) -> dg.DagsterInstance:
        """The instance this launcher was registered with (Dagster keeps it in a private attribute)."""
        return dagster_private.dagster_registered_instance(self)

    # --- the forkserver ---------------------------------------------------------------------------------------
    def _context(self):
        with _CTX_LOCK:
            if self._ctx is None:
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(self.preload_modules)
                self._ctx = ctx
            return self._ctx

    def _forkserver_up(self) -> None:
        """Start the forkserver, or start it again if it died (multiprocessing reaps the dead one)."""
        self._context()
        before = self.forkserver_pid()
        code = location.fingerprint() if self.preload_location else None  # taken before the forkserver's own
        multiprocessing.forkserver.ensure_running()
        pid = self.forkserver_pid()
        if pid != before and pid is not None:
            _FORKSERVER_CODE.clear()
            _FORKSERVER_CODE[pid] = code

    def _forkserver_current(self) -> tuple[str | None, str]:
        """The forkserver up, and holding the code on disk now: (its fingerprint, what was done to get there)."""
        self._forkserver_up()
        if not self.preload_location:
            return None, ""
        code = location.fingerprint()
        pid = self.forkserver_pid()
        if pid is not None and code == _FORKSERVER_CODE.get(pid):
            return code, ""
        started = time.monotonic()
        old = private_apis.detach_forkserver()  # its running workers go on; it exits without them (run_worker)
        if old is not None:  # reaped in the background: waiting here would hold the run queue
            threading.Thread(target=_reap, args=(old,), name=f"reap-forkserver-{old}", daemon=True).start()
        self._forkserver_up()
        return code, (
            f"; the code location had changed since the previous forkserver loaded it, so a new one "
            f"was started ({time.monotonic() - started:.1f} s)"
        )

    @staticmethod
    def forkserver_pid() -> int | None:
        return private_apis.forkserver_pid()

    def _sweep(self) -> None:
        """Forget workers that exited (closing their sentinel pipes); their parent, the forkserver, reaped them."""
        with self._lock:
            for run_id, proc in list(self._workers.items()):
                if proc.exitcode is not None:
                    proc.close()
                    del self._workers[run_id]

    def _default(self):
        if self._fallback is None:
            self._fallback = dg.DefaultRunLauncher()
            self._fallback.register_instance(self._registered_instance)
        return self._fallback

    # --- RunLauncher ------------------------------------------------------------------------------------------
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin
        exe = origin.executable_path if origin is not None else None
        if exe and os.path.realpath(exe) != os.path.realpath(sys.executable):
            return self._launch_default(context, f"its code location runs another Python ({exe})")
        self._sweep()
        try:
            with _FORK_LOCK:
                code, restarted = self._forkserver_current()
                proc = self._context().Process(
                    target=run_worker,
                    args=(run.run_id, dg.serialize_value(self._registered_instance.get_ref()), dict(os.environ), code),
                    name=f"dagster-run-{run.run_id}",
                )
                proc.start()
        except Exception as exc:
            return self._launch_default(
                context, f"the warm forkserver could not start a worker ({type(exc).__name__}: {exc})"
            )
        # Not joined at this process' exit (multiprocessing joins its non-daemonic children): a daemon restart
        # must neither wait for runs nor end them; the worker reports its own end to the run storage.
        private_apis.do_not_join_at_exit(proc)
        with self._lock:
            self._workers[run.run_id] = proc
        worker = Worker.of(proc.pid)
        self._registered_instance.add_run_tags(run.run_id, {WORKER_TAG: worker.dumps()})
        self._registered_instance.report_engine_event(
            f"Forked run worker (pid {proc.pid}) from the warm forkserver (pid {self.forkserver_pid()}"
            f"{', code location preloaded' if code else ''}){restarted}.",
            run,
            cls=self.__class__,
        )

    def _launch_default(self, context: LaunchRunContext, why: str) -> None:
        self._registered_instance.report_engine_event(
            f"Launching through the code server (DefaultRunLauncher) because {why}.",
            context.dagster_run,
            cls=self.__class__,
        )
        self._default().launch_run(context)

    def terminate(self, run_id: str) -> bool:
        run = self._registered_instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        worker = Worker.loads(_worker_tag(run))
        if worker is None:
            if GRPC_INFO_TAG in run.tags:  # launched by the fallback
                return self._default().terminate(run_id)
            self._registered_instance.report_engine_event(
                "No run worker recorded for this run; nothing to terminate.", run, cls=self.__class__
            )
            return False
        if not worker.local:
            self._registered_instance.report_engine_event(
                f"The run worker runs on host {worker.host}, not here; cannot terminate it.", run, cls=self.__class__
            )
            return False
        if run.status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING):
            # Not executing yet: CANCELED now, and the worker finds it so and stops before the first step
            # ("Not starting execution"); a SIGINT here would leave it CANCELING, which dagster fails at start.
            # Read again under the worker's start gate: the worker may have read STARTING and be starting now.
            with terminate_gate(run_id):
                run = self._registered_instance.get_run_by_id(run_id)
                if not run or run.is_finished:
                    return False
                if run.status in (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING):
                    self._registered_instance.report_run_canceled(
                        run, message="Run canceled before its worker started executing it."
                    )
                    threading.Thread(
                        target=self._kill_if_stuck,
                        args=(run_id, worker),
                        daemon=True,
                        name=f"kill-if-stuck-{run_id[:8]}",
                    ).start()
                    return True
        self._registered_instance.report_run_canceling(run)
        if not worker.alive():
            self._registered_instance.report_run_canceled(
                run, message=f"Run worker (pid {worker.pid}) was already gone."
            )
            return True
        self._registered_instance.report_engine_event(
            f"Sending SIGINT to run worker (pid {worker.pid}).", run, cls=self.__class__
        )
        try:
            os.kill(worker.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        threading.Thread(
            target=self._kill_if_stuck, args=(run_id, worker), daemon=True, name=f"kill-if-stuck-{run_id[:8]}"
        ).start()
        return True

    def _kill_if_stuck(self, run_id: str, worker: Worker) -> None:
        """Terminate always ends the run: a worker still alive after the grace period (stuck in C code, a lost
        interrupt) is SIGKILLed; one that exited without reporting the end (interrupted while still importing) too
        leaves its run CANCELED here rather than CANCELING until the monitor's cancel timeout."""
        deadline = time.monotonic() + self.terminate_grace_seconds
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if worker.alive():
            try:
                os.kill(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            why = f"killed: still running {self.terminate_grace_seconds:g} s after SIGINT"
        else:
            time.sleep(0.5)  # a worker that ended the run itself has written it just before exiting
            why = "exited without ending the run"
        run = self._registered_instance.get_run_by_id(run_id)
        if run and not run.is_finished:
            self._registered_instance.report_run_canceled(run, message=f"Run worker (pid {worker.pid}) {why}.")

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        self._sweep()
        if _in_daemon_process():
            try:
                self._forkserver_up()  # restarted here if it died (reaps the dead one)
            except Exception:
                pass
        worker = Worker.loads(_worker_tag(run))
        if worker is None or not worker.local:
            # Launched by the fallback (the code server owns it) or elsewhere: not ours to judge.
            return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker not started by this launcher here")
        if worker.alive():
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(worker.pid))
        fresh = self._registered_instance.get_run_by_id(run.run_id)
        if fresh is not None and fresh.status == dg.DagsterRunStatus.SUCCESS:
            return CheckRunHealthResult(WorkerStatus.SUCCESS, run_worker_id=str(worker.pid))
        with self._lock:
            proc = self._workers.get(run.run_id)
        code = f" with exit code {proc.exitcode}" if proc is not None and proc.exitcode is not None else ""
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"run worker (pid {worker.pid}) exited{code} before the run finished",
            run_worker_id=str(worker.pid),
        )

    def dispose(self) -> None:
        self._sweep()
        if self._fallback is not None:
            self._fallback.dispose()
