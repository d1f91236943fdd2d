"""testing/cli.py: the CLI run in-process answers as the subprocess it replaces (exit code, stdout, stderr), with the
environment of each call, and a failpoint-armed run stays a real process."""

from __future__ import annotations

import os
import uuid

import pytest

from lakehouse_dagster.testing.cli import run_cli, run_cli_process


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],  # SystemExit(0) from argparse
        ["flgas", "list"],  # SystemExit(2): a usage error, did-you-mean
        ["flags", "set", "export.stream", "iceberg", "--worksapce", "w"],  # an unknown option of a subparser
        ["sync", "--dataset", "12345"],  # BadInput: one line, exit 2
        ["datasets", "--json"],  # a verb against the test's database
    ],
    ids=" ".join,
)
def test_in_process_and_subprocess_give_the_same_exit_code_stdout_and_stderr(settings, argv):
    here, there = run_cli(*argv), run_cli_process(*argv)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)


def test_a_missing_dataset_exits_3_in_one_line_as_in_a_process(settings):
    missing = str(uuid.uuid4())
    here, there = run_cli("sync", "--dataset", missing), run_cli_process("sync", "--dataset", missing)
    assert here.returncode == there.returncode == 3
    assert here.stderr == there.stderr and here.stderr.count("\n") == 1 and "does not exist" in here.stderr


def test_env_applies_to_the_one_call_and_the_settings_are_read_again(settings, tmp_path, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_TEST_ONLY", raising=False)
    broken = run_cli("datasets", env={"LAKEHOUSE_PG_DSN": "postgresql://nobody@127.0.0.1:1/none"})
    assert broken.returncode == 75 and "Postgres is unreachable" in broken.stderr, broken.stderr
    assert os.environ["LAKEHOUSE_PG_DSN"] == settings.postgres.dsn  # put back
    again = run_cli("datasets", "--json")
    assert again.returncode == 0 and again.stdout.strip().startswith(("[", "{")), again.stderr


def test_an_uncaught_error_is_exit_1_with_its_traceback_as_the_interpreter_gives(settings, monkeypatch):
    import lakehouse_dagster.cli.main as cli_main

    def boom(argv):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli_main, "main", boom)
    out = run_cli("datasets")
    assert out.returncode == 1 and out.stderr.startswith("Traceback") and "RuntimeError: boom" in out.stderr


def test_a_failpoint_armed_run_is_a_real_process(settings):
    # "kill" SIGKILLs the process at the point: in-process it would take pytest down with it
    out = run_cli("sync", "--dataset", str(uuid.uuid4()), env={"LAKEHOUSE_FAILPOINT": "after-first-file:kill"})
    assert out.args[0] != "lakehouse"  # the argv of a real interpreter, not the in-process record
    assert out.returncode == 3 and "does not exist" in out.stderr  # refused before any failpoint


def test_a_warning_of_a_verbs_machinery_is_one_line_in_the_clis_format(capsys):
    """Without a handler, a module's warning reached Python's last-resort handler: a bare line beside the CLI's own
    `lakehouse <verb>: error: …` (a refused reverse printed its refusal twice). A fresh process has no handler on
    the root logger; this test removes pytest's for the call to be that process."""
    import logging

    from lakehouse_dagster.cli.common import relay_warnings

    root = logging.getLogger()
    kept = list(root.handlers)
    for h in kept:
        root.removeHandler(h)
    try:
        relay_warnings("sync")
        relay_warnings("sync")  # a second call (in-process callers) adds no second line
        logging.getLogger("lakehouse_dagster.lake.writer").warning(
            "2 data file(s) of a failed write could not be deleted"
        )
        logging.getLogger("lakehouse_dagster.mirror.sync").info("not shown: below WARNING")
        relay_warnings("serve")  # the service keeps its own format: the relay is left as it was
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in kept:
            root.addHandler(h)
    err = capsys.readouterr().err
    assert err == "lakehouse sync: warning: 2 data file(s) of a failed write could not be deleted\n", err
