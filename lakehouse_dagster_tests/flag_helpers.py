"""Helpers shared by the flag and router tests: the real CLI (in-process), table snapshots."""

from __future__ import annotations

import json
import subprocess

from lakehouse_dagster.testing.cli import run_cli


def cli(*args: str, check: bool = False, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `lakehouse ...` with the test's environment, in this process (testing/cli.py: a subprocess where the
    process is the point)."""
    proc = run_cli(*args, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"lakehouse {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def cli_json(*args: str):
    return json.loads(cli(*args, "--json", check=True).stdout)


def flag_tables(conn) -> tuple[list, list]:
    """Everything in the override and audit tables, for "nothing was written" assertions."""
    overrides = conn.execute(
        "select kind, name, scope, scope_id, mode, note, set_by, set_at from lakehouse_flag_overrides"
        " order by kind, name, scope, scope_id"
    ).fetchall()
    audit = conn.execute("select * from lakehouse_flag_audit order by id").fetchall()
    return overrides, audit


def refusal(failure_event) -> str:
    """The reason a refused Dagster step shows (dagster/defs/shared/refusals.py: one message, no stack, no cause)."""
    error = failure_event.step_failure_data.error
    prefix = "Refused: "
    assert error.message.startswith(prefix) and not error.stack and error.cause is None, error.to_string()
    return error.message[len(prefix) :].rstrip("\n")
