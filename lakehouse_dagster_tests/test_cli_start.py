"""The CLI answers at once (issue 44): `lakehouse --help`, a usage error and the light verbs import none of the heavy
libraries (pyiceberg, pyarrow, pandas, numba, DuckDB, Dagster: ~2 s of start-up before anything printed), the verb
table of cli/main.py says what the verb modules register, and a mistyped verb or option gets the nearest valid one
with the usage of the verb it was given to. Start-up times: bench/bench_cli_start.py (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import lakehouse_dagster.cli as cli_package
from lakehouse_dagster.cli.main import VERBS, build_parser, main

HEAVY = ("pyiceberg", "pyarrow", "pandas", "numba", "duckdb", "dagster")
LIGHT_VERBS = (["datasets"], ["status"], ["flags", "list"], ["write-flags", "list"], ["soak", "show"])

# Run in a fresh interpreter: prints the heavy modules loaded once `code` ran (whatever it exits with).
PROBE = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(h for h in {heavy!r} if h in sys.modules))))
{code}
"""


def _heavy_after(code: str, heavy: tuple[str, ...] = HEAVY, **env: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=heavy, code=code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip(), done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_help_and_every_verbs_parser_import_nothing_heavy():
    code = (
        "from lakehouse_dagster.cli.main import build_parser, main\n"
        "build_parser()  # every verb's module, as a docs check walking the tree builds them\n"
        "main(['--help'])"
    )
    assert _heavy_after(code) == []


@pytest.mark.parametrize(
    "argv", [["flgas"], ["flags", "set", "x", "iceberg", "--worksapce", "w"], ["sync", "--mode", "fast"], ["up", "-x"]]
)
def test_a_usage_error_imports_nothing_heavy(argv):
    assert _heavy_after(f"from lakehouse_dagster.cli.main import main\nmain({argv!r})") == []


@pytest.mark.parametrize("argv", [["--help"], ["flgas"], ["flags", "list", "--datset", "x"], ["write-flags", "-h"]])
def test_help_and_usage_errors_of_the_flag_verbs_do_not_even_import_psycopg(argv):
    """The operator's most typed verbs answer --help and a typo in the time Python starts (psycopg: ~0.1 s)."""
    code = f"from lakehouse_dagster.cli.main import main\nmain({argv!r})"
    assert _heavy_after(code, heavy=(*HEAVY, "psycopg")) == []


@pytest.mark.parametrize("argv", LIGHT_VERBS, ids=" ".join)
def test_the_light_verbs_run_without_the_heavy_libraries(dsn, argv):
    code = f"from lakehouse_dagster.cli.main import main\nassert main({[*argv, '--json']!r}) == 0"
    assert _heavy_after(code, LAKEHOUSE_PG_DSN=dsn) == []


def test_the_verb_table_is_what_the_verb_modules_register():
    choices = _subparsers(build_parser())
    registered = {a.dest: a.help for a in choices._choices_actions}
    assert list(registered) == list(VERBS)  # the same verbs, in the order `lakehouse --help` lists them
    assert registered == {verb: help_line for verb, (_, help_line) in VERBS.items()}
    helpers = {"main", "common", "console", "dsn", "moved"}  # the modules without verbs
    with_register = {m.name for m in pkgutil.iter_modules(cli_package.__path__)} - helpers
    assert with_register == {module for module, _ in VERBS.values()}


def test_a_verb_built_alone_has_the_same_help_as_in_the_whole_tree():
    """main() builds only the verb it is given; its help and usage are exactly those of the whole tree."""

    def walk(path: list[str], whole: argparse.ArgumentParser):
        alone = build_parser(path)
        for name in path:
            alone = _subparsers(alone).choices[name]
        assert alone.format_help() == whole.format_help(), path
        sub = _subparsers(whole)
        for name, child in sub.choices.items() if sub is not None else ():
            walk([*path, name], child)

    walk([], build_parser())


def test_a_mistyped_verb_gets_the_nearest_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["flgas", "list"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'flgas'" in err and "did you mean flags?" in err
    assert err.splitlines()[1].startswith("usage: lakehouse [-h] COMMAND")


def test_a_mistyped_option_is_blamed_on_its_verb_with_the_nearest_option_and_the_verbs_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["flags", "set", "export.stream", "iceberg", "--worksapce", "w1"])
    assert exit_.value.code == 2
    first, *usage = capsys.readouterr().err.splitlines()
    assert first == (
        "lakehouse flags set: error: unrecognized arguments: --worksapce w1; did you mean --workspace? "
        "(see lakehouse flags set --help)"
    )
    assert usage[0].startswith("usage: lakehouse flags set [-h] [--json]") and "--workspace" in " ".join(usage)


def test_a_mistyped_action_gets_the_nearest_action(capsys):
    with pytest.raises(SystemExit):
        main(["write-flags", "flp"])
    err = capsys.readouterr().err
    assert err.startswith("lakehouse write-flags: error: argument ACTION: invalid choice: 'flp'")
    assert "did you mean flip?" in err and "(see lakehouse write-flags --help)" in err


def test_an_unknown_option_with_nothing_near_says_so_without_a_guess(capsys):
    with pytest.raises(SystemExit):
        main(["datasets", "--zzz"])
    first = capsys.readouterr().err.splitlines()[0]
    assert first == "lakehouse datasets: error: unrecognized arguments: --zzz (see lakehouse datasets --help)"


def _subparsers(parser: argparse.ArgumentParser):
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
