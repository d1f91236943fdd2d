"""One lock per run between its worker's start and a terminate that comes before it.

Why: Dagster's worker reads the run once, then decides to execute it unless it is CANCELED and reports the run's
start a moment later. A terminate that read the run as STARTING and marked it CANCELED inside that moment lost the
race: the worker, having read STARTING, went on and executed every step of a run the UI showed as canceled (the
launcher test's flake). The worker holds this lock from before that read until its start (or its end) is stored;
terminate holds it while it reads the status and cancels. So the worker sees the cancel, or terminate sees the run
started and interrupts it: never both missed. A ``flock`` on a file per run: the worker is on this host
(terminate refuses a worker elsewhere), and the kernel drops the lock when a holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator

# Events after which the worker no longer reads the run's status to decide whether to start.
STARTED_OR_ENDED = frozenset({"PIPELINE_START", "PIPELINE_SUCCESS", "PIPELINE_FAILURE", "PIPELINE_CANCELED"})


def _path(run_id: str) -> str:
    folder = os.path.join(tempfile.gettempdir(), "lakehouse-run-start")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{run_id}.lock")


class WorkerGate:
    """Held by a run worker from before Dagster reads its run until the run's start is stored."""

    def __init__(self, run_id: str) -> None:
        self._run_id = run_id
        self._fd: int | None = None

    def hold(self) -> None:
        try:
            self._fd = os.open(_path(self._run_id), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:  # no writable temp dir: the worker starts as before, without the gate
            self.release()

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(_path(self._run_id))  # terminate re-reads the run under the lock: a late opener is fine
            os.close(fd)  # closing drops the lock

    def watch(self, instance) -> None:
        """Release once the instance stores the run's start or end (the worker's status read is behind it)."""
        handle = instance.handle_new_event

        def handle_then_release(event, *args, **kwargs):
            handle(event, *args, **kwargs)
            dagster_event = getattr(event, "dagster_event", None)
            if dagster_event is not None and dagster_event.event_type_value in STARTED_OR_ENDED:
                self.release()

        instance.handle_new_event = handle_then_release


@contextlib.contextmanager
def terminate_gate(run_id: str, timeout: float = 30.0) -> Iterator[bool]:
    """Held while terminate reads and cancels a run that has not started; yields whether it holds the lock
    (False after ``timeout``, or without a writable temp dir: terminate then goes on as before the gate)."""
    try:
        fd = os.open(_path(run_id), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.05)
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(_path(run_id))  # no file left behind; a worker that opened it re-reads the run anyway
    finally:
        os.close(fd)
