"""`lakehouse up` as an operator leaves it running and stops it (issue 44, "clean stops" and "a calm console"):

* ``ready`` comes once every shard's mirror stream holds its lock (a change made after it goes through the stream);
* an idle stack's console carries at most ``MAX_IDLE_LINES`` lines in ``IDLE_SECONDS`` after ``ready``: no per-tick
  "0 …" lines from the sensors, none of Dagster's own per-second daemon lines, no colours, no beta warning;
* Ctrl-C ends the stream run as a hand-over (SUCCESS, one line on the console), not a RUN_FAILURE with a stack
  trace, and leaves no failed run in Dagster's storage.

One stack for all three (its start costs ~10-60 s on 2 cores): ``--no-demo``, an idle stack — the demo's first start
ingests its four sources and mirrors eleven datasets, real changes that are on the console by design. The issue's
bound is 10 lines in two minutes; the suite waits 45 s with the same rate (at most 3 lines): the sensors tick every
1-30 s and Dagster's run monitoring every 30 s, so each of them ticks inside the window, and a per-tick line fails
the chatter checks below whatever the count. The full two minutes (a worker idle for an eighth of the suite's
15-minute budget) run in `bench/bench_suite_long.py` (``LAKEHOUSE_SUITE_LONG=1``): docs/benchmarks.md, "The suite".
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from lakehouse_dagster.cli.pg import embedded_info
from lakehouse_dagster.cli.up import stop_postgres
from lakehouse_dagster.core import locks
from lakehouse_dagster.core.embedded import start_embedded
from lakehouse_dagster_tests.test_e2e import LAKEHOUSE, Stack, _clean_env, _free_port, stack_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ISSUE_SECONDS, ISSUE_LINES = 120, 10  # issue 44: at most 10 console lines in 2 minutes idle after ready
IDLE_SECONDS = ISSUE_SECONDS if os.environ.get("LAKEHOUSE_SUITE_LONG") == "1" else 45
MAX_IDLE_LINES = ISSUE_LINES * IDLE_SECONDS // ISSUE_SECONDS  # the same rate, rounded down: never more lenient


class IdleStack(Stack):
    """test_e2e's Stack (its sweep, its JSON events), started with ``--no-demo``; its stderr is the console."""

    def __init__(self, tmp: Path):  # noqa: D107 - Stack's, with other arguments
        self.tmp = tmp
        self.home = tmp / "home"
        self.port = _free_port()
        self.api_port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = tmp / "up.stdout.jsonl"
        self.stderr_path = tmp / "up.stderr.log"
        self.ready = None
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [*LAKEHOUSE, "up", "--json", "--no-demo", "--port", str(self.port), "--api-port", str(self.api_port)],
                env=_clean_env(self.home),
                cwd=tmp,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def console(self) -> list[str]:
        return self.stderr_path.read_text(errors="replace").splitlines()


def _shard_locks_held(dsn: str) -> int:
    """Stream shard locks granted right now (pg_locks), whoever holds them: the lock itself, not the heartbeat row."""
    with psycopg.connect(dsn) as c:
        return c.execute(
            "select count(*) from pg_locks where locktype = 'advisory' and granted and objsubid = 2"
            " and classid = %s::bigint::oid",
            (locks.STREAM_SHARD,),
        ).fetchone()[0]


@pytest.fixture(scope="module")
def idle_stack():
    s = IdleStack(stack_dir("lh-calm-"))
    try:
        yield s
    finally:
        s.sweep()


def test_ready_idle_console_and_ctrl_c(idle_stack):
    """Each check notes what it found and the test fails at the end with all of them: one stack start answers for
    the three properties, and a failure of the first does not hide the others."""
    stack = idle_stack
    problems: list[str] = []
    ready = stack.wait_ready(timeout=300)
    at_ready = len(stack.console())
    # ready: every shard's stream holds its lock (one shard: LAKEHOUSE_MIRROR_SHARDS' default)
    if ready.get("streams") != {"shards": 1, "held": 1}:
        problems.append(f"the ready event does not say every shard's stream holds its lock: {ready.get('streams')}")
    held = _shard_locks_held(stack.dsn())
    if held != 1:
        problems.append(f"ready was printed with {held} of 1 shard locks held")

    # idle: waited on the clock by design (what is measured is what an idle stack prints in that time)
    deadline = time.monotonic() + IDLE_SECONDS
    while time.monotonic() < deadline:
        assert stack.proc.poll() is None, stack.log_tail()
        time.sleep(2)
    idle = stack.console()[at_ready:]
    print(f"calm: ready after {ready.get('seconds_to_ready')} s; {len(idle)} console lines in {IDLE_SECONDS} s idle")
    if len(idle) > MAX_IDLE_LINES:
        problems.append(f"{len(idle)} console lines in {IDLE_SECONDS} s idle:\n" + "\n".join(idle[:40]))
    whole = "\n".join(stack.console())
    if "\x1b[" in whole:
        problems.append("coloured and plain lines mixed")
    if "BetaWarning" in whole:
        problems.append("a BetaWarning on the console")
    for chatter in ("recorded 0 table change", "scanned 0 changed datasets", "runs are currently in progress"):
        if chatter in whole:
            problems.append(f"per-tick chatter on the console: {chatter!r} x{whole.count(chatter)}")

    # Ctrl-C: what a terminal sends the foreground process group
    before_stop = len(stack.console())
    os.killpg(stack.proc.pid, signal.SIGINT)
    assert stack.proc.wait(120) == 0, stack.log_tail()
    assert stack.events()[-1]["event"] == "stopped"
    stop = stack.console()[before_stop:]
    text = "\n".join(stop)
    for bad in ("RUN_FAILURE", "Traceback", "Stack Trace", "DagsterExecutionInterruptedError", " - ERROR - "):
        if bad in text:
            problems.append(f"{bad!r} on the console after Ctrl-C")
    handed = [line for line in stop if "stopped with its process" in line and "handed over" in line]
    if len(handed) != 1:
        problems.append(f"the stream run's hand-over line {len(handed)} times, not once")
    assert embedded_info(stack.home / "pg") is None

    # what Runs shows afterwards: the stream run SUCCESS, no run failed
    pgdata = stack.home / "pg"
    start_embedded(pgdata)
    try:
        with psycopg.connect(embedded_info(pgdata).get_uri(database="dagster")) as c:
            runs = c.execute("select pipeline_name, status from runs order by create_timestamp").fetchall()
    finally:
        stop_postgres(pgdata, quiet=True)
    if ("mirror_stream", "SUCCESS") not in runs:
        problems.append(f"no mirror_stream run ended SUCCESS: {runs}")
    failed = [r for r in runs if r[1] == "FAILURE"]
    if failed:
        problems.append(f"failed runs after a normal stop: {failed}")
    assert not problems, "\n".join(problems) + "\n--- after Ctrl-C ---\n" + text
