"""The code server of deploy/ (``python -m lakehouse_dagster.dagster.code_server`` + ``dagster code-server start``'s
arguments): that command, stopped cleanly and at once by one SIGTERM.

Why: with Dagster's DefaultRunLauncher a run is a process of the code server (a child of its gRPC server), and
``dagster code-server start`` answers SIGTERM by waiting for its runs to finish — a mirror_stream run lives 15 min,
so the code server ignored SIGTERM for minutes (issue 44: over 70 s, then SIGKILL from the supervisor or a pod's
grace period, and the run ended as a failure). Here the command runs in a process group of its own, and a SIGTERM
or SIGINT is passed to the whole group: the code server shuts down as Dagster does it, and each run gets the
signal too, so a stream run hands its shard over (SUCCESS, dagster/defs/mirror/stream_job.py) and any other run
stops as an interrupted run does. Once its runs are gone, Dagster's two servers get ``SERVERS_GRACE_S`` to end on
their own (they take seconds more: heartbeat threads joined, the RPC grace) before they are killed; a second signal,
or the group still alive ``KILL_AFTER_S`` after the first, kills the group. Exit 0 after a requested stop, else
the command's code. ``_default_signals`` is the second reason the code server ignored SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from lakehouse_dagster.core.process_group import group_members, is_log_tail, terminate_group

KILL_AFTER_S = 30.0  # after the first signal: then SIGKILL to what is left (under a pod's default grace of 30 s + ε)
SERVERS_GRACE_S = 1.5  # once its runs are gone: Dagster's two servers' own shutdown, then SIGKILL (they hold nothing)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _default_signals() -> None:
    """In the child, before exec: SIGINT and SIGTERM at their defaults. A process started in the background by a
    shell (``cmd &``, an init script) inherits SIGINT *ignored*; Python then installs no KeyboardInterrupt handler,
    and Dagster's ``setup_interrupt_handlers`` copies SIGINT's disposition onto SIGTERM: the code server ignored
    both signals (issue 44's "over 70 s")."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "code-server", "start", *args],
        start_new_session=True,
        preexec_fn=_default_signals,
    )
    state = {"signals": 0, "first": 0.0}

    def on_signal(signum, frame) -> None:
        state["signals"] += 1
        if state["signals"] == 1:
            state["first"] = time.monotonic()
            terminate_group(proc.pid)  # the code server, its gRPC server, their runs (not their log tails)
        else:
            _signal_group(proc.pid, signal.SIGKILL)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    runs_gone_at = None
    while proc.poll() is None or (state["signals"] and _group_alive(proc.pid)):
        time.sleep(0.2)
        if not state["signals"]:
            continue
        now = time.monotonic()
        if runs_gone_at is None and _runs_left(proc.pid) == 0:
            runs_gone_at = now
        # Dagster's servers take seconds more after their runs (heartbeat threads joined, RPC grace): not waited out
        if now - state["first"] > KILL_AFTER_S or (runs_gone_at is not None and now - runs_gone_at > SERVERS_GRACE_S):
            _signal_group(proc.pid, signal.SIGKILL)
    _signal_group(proc.pid, signal.SIGKILL)  # nothing of it outlives it
    if state["signals"]:
        return 0  # stopped as asked
    return proc.returncode if proc.returncode is not None else 1


def _runs_left(pgid: int) -> int:
    """Processes of the group below the code server's own two (``dagster code-server start``, the group's leader,
    and its gRPC server child): its runs, multiprocessing's resource tracker and the steps' log tails aside."""
    members = group_members(pgid)
    servers = {pgid} | {pid for pid, (ppid, _) in members.items() if ppid == pgid}
    return sum(
        1
        for pid, (_, cmd) in members.items()
        if pid not in servers and "resource_tracker" not in cmd and not is_log_tail(cmd)
    )


if __name__ == "__main__":
    sys.exit(main())
