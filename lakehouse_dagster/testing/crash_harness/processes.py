"""The syncs and reverse applies as real processes, frozen, failed or broken under them, and their outcome read back."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.crash_harness.schedule import (
    _ARROW_S3_LOG,
    _LIBPQ_GOODBYE,
    INFRA_ACTIONS,
    REVERSE_ACTIONS,
    STORE_ACTIONS,
    Infrastructure,
    Report,
)
from lakehouse_dagster.testing.faults import (
    cli_env,
    cli_popen,
    cli_sync_popen,
    terminate_lock_session,
    wait_stopped,
)

_SYNC_ENV = ("LAKEHOUSE_INGEST_CHUNK_ROWS", "LAKEHOUSE_PG_DSN", "LAKEHOUSE_SNAPSHOTS_KEEP")


def _sync_popen(d, env: dict) -> subprocess.Popen:
    return cli_sync_popen(d, env=env)


def _reverse_popen(d, env: dict) -> subprocess.Popen:
    """The operator's reverse apply of one dataset, ``lakehouse reverse sync``: its exit code and
    stderr are what the guide names."""
    return cli_popen("reverse", "sync", "--dataset", str(d), "--json", env=env)


def _reverse_actions(actions, infra: Infrastructure | None) -> list[tuple[str, int]]:
    """What a reverse cycle is armed from: REVERSE_ACTIONS, plus INFRA_ACTIONS given the infrastructure (and
    STORE_ACTIONS given an object store: for the whole apply, as its reads are what the store serves); of
    ``actions`` when given, those a reverse cycle takes (INFRA_ACTIONS alone: the infrastructure's faults only)."""
    takes = REVERSE_ACTIONS + (INFRA_ACTIONS if infra else []) + (STORE_ACTIONS if infra and infra.store else [])
    names = {a for a, _ in takes}
    chosen = [(a, w) for a, w in actions or () if a in names]
    return chosen or takes


def _run_script(script: str, arg: str, env: dict, report: Report, op: str) -> tuple[int, str]:
    """One cycle's process (a ``-c`` script with its one argument), waited for and counted: (exit code, stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, arg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    _, stderr = proc.communicate(timeout=180)
    report.outcomes[proc.returncode] += 1
    report.ops[op] += 1
    return proc.returncode, stderr


def _infra_cycle(
    infra: Infrastructure,
    spec: str,
    launch: Callable[[dict], subprocess.Popen],
    env: dict,
    rng: random.Random,
    window: tuple[float, float] = (0.3, 3.5),
) -> tuple[int, str, bool]:
    """One process (``launch(env)``: a sync, a reverse apply) and one infrastructure fault: at its failpoint (frozen
    there, broken, resumed), for ``anytime:`` at a random moment while it runs (``window``: seconds after its
    start, drawn uniformly), for ``whole:store-down`` and ``store-flaky`` all along. Returns its exit code, its
    stderr and whether the fault hit it (it had not ended yet)."""
    point, action = spec.split(":")
    if action == "store-flaky" or (point == "whole" and action == "store-down"):
        assert infra.store is not None
        if action == "store-down":  # down from before the process starts to its end
            infra.store.fail(503)
        else:
            infra.store.fail(503, share=0.33, seed=rng.randrange(1 << 30))
        proc = launch(env)
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            infra.store.pass_through()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, stderr, True
    if point == "anytime":
        proc = launch(env)
        time.sleep(rng.uniform(*window))  # a sync's start-up is ~1.5-3 s of imports: some land before, most during
        fired = proc.poll() is None
        if fired:
            infra.restart()
    else:
        proc = launch({**env, "LAKEHOUSE_FAILPOINT": f"{point}:stop"})
        fired = wait_stopped(proc, 120, must=False)
        if fired:
            if action == "pg-restart":
                infra.restart()
            elif action == "store-down":
                assert infra.store is not None
                infra.store.fail(503)
            else:
                infra.proxy.reset()
            os.kill(proc.pid, signal.SIGCONT)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        if infra.store is not None:
            infra.store.pass_through()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stderr, fired


def _infra_outcome(rc: int, stderr: str, fired: bool) -> list[str]:
    """What the operator reads after an infrastructure fault: an exit the guide names and one line."""
    bad = []
    if rc not in (0, 1, 4, 75):
        bad.append(f"the sync exited {rc} after an infrastructure fault")
    if "Traceback" in stderr:
        bad.append(f"a traceback on stderr: {stderr.strip()[-400:]}")
    lines = [
        ln for ln in stderr.strip().splitlines() if ln.strip() and ln != _LIBPQ_GOODBYE and not _ARROW_S3_LOG.match(ln)
    ]
    if len(lines) > 1:
        bad.append(f"{len(lines)} lines on stderr, not one: {lines[:3]}")
    if not fired and rc != 0:
        bad.append(f"the sync ended before the fault yet exited {rc}: {stderr.strip()[-300:]}")
    return bad


def _reconnect(conn, dsn: str, timeout: float = 60):
    """The harness's own session, again once Postgres is back (a restart ended it)."""
    try:
        conn.execute("select 1")
        return conn
    except Exception:  # noqa: BLE001 - ended by the restart: open another below
        conn.close()
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect(dsn, connect_timeout=2)
        except Exception:  # noqa: BLE001 - still in crash recovery
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _clean_sync(dsn, oracle, settings, d) -> str | None:
    try:
        sync_dataset(dsn, oracle.catalog, settings, d, readers=1)
    except Exception as exc:  # noqa: BLE001 - a violation, reported with the cycle
        return f"{type(exc).__name__}: {exc}"
    return None


def _frozen_cycle(conn, dsn, oracle, settings, d, spec, chunk, report) -> tuple[int, str | None]:
    """The sync freezes at its failpoint; its lock session dies; the clean sync runs; the frozen one
    resumes and finishes (or fails) on its own. The oracle then runs with both done."""
    proc = cli_sync_popen(d, env=cli_env(spec, LAKEHOUSE_INGEST_CHUNK_ROWS=str(chunk), LAKEHOUSE_SNAPSHOTS_KEEP="0"))
    clean_error = None
    try:
        if wait_stopped(proc, 120, must=False):
            report.fired[spec] += 1
            terminate_lock_session(conn, d)
            clean_error = _clean_sync(dsn, oracle, settings, d)
            os.kill(proc.pid, signal.SIGCONT)
            proc.communicate(timeout=120)
        else:
            proc.communicate(timeout=120)
            clean_error = _clean_sync(dsn, oracle, settings, d)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    report.outcomes[proc.returncode] += 1
    return proc.returncode, clean_error
