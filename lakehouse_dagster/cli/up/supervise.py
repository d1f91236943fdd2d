"""Step 5 of `lakehouse up`: ``dagster dev`` and ``lakehouse serve`` supervised in their own sessions until one exits or
we are asked to stop; the ready line; the clean stop, the escalation to SIGKILL, the sweep of both process groups.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lakehouse_dagster.cli.console import ConsoleFilter, relay
from lakehouse_dagster.cli.up.shared import _say
from lakehouse_dagster.core.process_group import terminate_group

CLEAN_SHUTDOWN_SECONDS = 60
STREAMS_READY_WAIT_S = 60  # ready waits this long at most for the mirror stream to hold every shard


def _child_setup() -> None:
    """In the child, before exec: default signal dispositions, and SIGINT when `lakehouse up` dies.

    A process started in the background by a shell inherits SIGINT as *ignored*, and Python then never raises
    KeyboardInterrupt: dagster dev would not hear our stop request. Resetting to the default fixes that.
    PR_SET_PDEATHSIG makes the kernel send SIGINT if `lakehouse up` dies (even by SIGKILL), so Dagster
    never outlives it.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _load_libc():
    # Loaded in the parent: nothing should be imported between fork and exec.
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux/glibc: the signal handlers in supervise() still cover Ctrl-C and SIGTERM
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclasses.dataclass
class Child:
    """A second supervised process beside Dagster (``lakehouse serve``): its command, environment, health URL."""

    name: str
    cmd: list[str]
    env: dict
    ready_url: str
    proc: subprocess.Popen | None = None


def _start(
    cmd: list[str], env: dict, cwd: Path, as_json: bool, console: ConsoleFilter | None = None
) -> subprocess.Popen:
    """``console``: relay the child's output (both streams, in order) through that filter (cli/console.py), to
    stderr, where `lakehouse up:`'s own lines go (and with --json stdout carries only our JSON)."""
    if console is None:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup,
            stdout=sys.stderr if as_json else None,
        )
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_child_setup,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    )
    assert proc.stdout is not None
    _RELAYS[proc.pid] = relay(proc.stdout, sys.stderr, console)
    return proc


_RELAYS: dict[int, threading.Thread] = {}  # a child's pid -> the thread relaying its console (joined at the end)


def supervise(  # noqa: C901
    cmd: list[str],
    *,
    env: dict,
    cwd: Path,
    ready_url: str,
    ready_info: dict[str, Any],
    as_json: bool,
    t_start: float,
    service: Child | None = None,
    debug: bool = False,
    streams: Callable[[], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` (Dagster) and ``service`` in their own sessions until one exits or we are asked to stop; then
    stop the other and sweep both process groups. ``streams``: () -> (shards held, shards); ready waits for all of
    them, at most STREAMS_READY_WAIT_S after Dagster answers (then the line says the rest goes through batch runs
    meanwhile). Long on purpose: the supervision loop — ready line, the two
    stop signals, the escalation to SIGKILL, the sweep — reads as one sequence."""
    if service is not None:
        service.proc = _start(service.cmd, service.env, cwd, as_json)
    proc = _start(cmd, env, cwd, as_json, ConsoleFilter(debug=debug))
    children = [proc] + ([service.proc] if service is not None and service.proc is not None else [])
    ready_info = {**ready_info, "dagster_pid": proc.pid}
    if service is not None and service.proc is not None:
        ready_info["api_pid"] = service.proc.pid
    state: dict[str, float | None] = {"signals": 0, "first_signal_at": None}

    def stop_children() -> None:
        for child in children:
            try:
                # dagster dev's clean shutdown of webserver, daemon, code server; uvicorn's graceful one
                child.send_signal(signal.SIGINT if child is proc else signal.SIGTERM)
            except ProcessLookupError:
                pass

    def on_signal(signum, frame):
        state["signals"] = (state["signals"] or 0) + 1
        if state["signals"] == 1:
            state["first_signal_at"] = time.monotonic()
            _say(f"{signal.Signals(signum).name}: stopping Dagster and the API (Ctrl-C again to kill them at once)...")
            stop_children()
        else:
            for child in children:
                _kill_group(child.pid, signal.SIGKILL)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    ready_at = None
    serving_at: float | None = None  # Dagster and the API answer; the streams may still be starting
    died_first: subprocess.Popen | None = None
    try:
        while any(c.poll() is None for c in children):
            time.sleep(0.5)
            if died_first is None and state["signals"] == 0:
                died_first = next((c for c in children if c.poll() is not None), None)
                if died_first is not None:  # one died on its own: the other goes too
                    state["first_signal_at"] = time.monotonic()
                    stop_children()
            urls = [ready_url + "/server_info"] + ([service.ready_url] if service is not None else [])
            held, shards = 0, 0
            if ready_at is None and state["signals"] == 0 and died_first is None and serving_at is None:
                if all(map(_is_ready, urls)):
                    serving_at = time.perf_counter()
            if ready_at is None and state["signals"] == 0 and died_first is None and serving_at is not None:
                if streams is not None:
                    held, shards = streams()
                    if held < shards and time.perf_counter() - serving_at < STREAMS_READY_WAIT_S:
                        continue
                ready_at = time.perf_counter()
                seconds = round(ready_at - t_start, 1)
                streaming = None if streams is None else {"shards": shards, "held": held}
                if as_json:
                    event = {**ready_info, "seconds_to_ready": seconds, "streams": streaming}
                    print(json.dumps(event, default=str), flush=True)
                else:
                    api = ""
                    if service is not None:
                        token = ready_info.get("api_token_file") or "LAKEHOUSE_API_TOKEN"
                        api = f"; the live app's API on {ready_info.get('api_url')} (token: {token})"
                    late = ""
                    if streams is not None and held < shards:
                        late = (
                            f"; the mirror stream holds {held} of {shards} shards yet: until it does, their changes"
                            " reach Iceberg through batch runs (seconds, not about one)"
                        )
                    print(
                        f"lakehouse up: ready in {seconds:.1f} s — open {ready_url}{api}{late}  "
                        "(Ctrl-C stops everything)",
                        flush=True,
                    )
            if (
                state["first_signal_at"] is not None
                and time.monotonic() - state["first_signal_at"] > CLEAN_SHUTDOWN_SECONDS
            ):
                _say(f"Dagster and the API did not stop within {CLEAN_SHUTDOWN_SECONDS} s; killing them")
                for child in children:
                    _kill_group(child.pid, signal.SIGKILL)
                state["first_signal_at"] = float("inf")
        # Whatever is left in the process groups (run workers, a stuck code server) goes too.
        for child in children:
            if _group_alive(child.pid):  # not the steps' log tails: a run's last lines still reach the console
                terminate_group(child.pid)
        deadline = time.monotonic() + 10
        while any(_group_alive(c.pid) for c in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        for child in children:
            _kill_group(child.pid, signal.SIGKILL)
        for child in children:  # what the last processes printed as they stopped (a stream run's hand-over line)
            thread = _RELAYS.pop(child.pid, None)
            if thread is not None:
                thread.join(5)
    finally:
        for child in children:
            if child.poll() is None:  # an exception in this loop: never leave a child behind
                _kill_group(child.pid, signal.SIGKILL)
                child.wait()
        for s, h in previous.items():
            signal.signal(s, h)
    svc_proc = service.proc if service is not None else None
    return {
        "requested_stop": bool(state["signals"]),
        "dagster_exit_code": proc.returncode if died_first in (None, proc) else None,
        "service_exit_code": None if svc_proc is None or died_first not in (None, svc_proc) else svc_proc.returncode,
        "seconds_to_ready": None if ready_at is None else round(ready_at - t_start, 1),
    }


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
