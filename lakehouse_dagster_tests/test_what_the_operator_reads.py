"""What the operator reads matches what happened (issue 33): the Python the docs ask for is the one the scripts check,
the exit code the README and the operator guide name is the one a refused widen returns, candidates suggest the
runbook's own command, a flip's lines come out in the order its steps ran (one pipe of both streams), the lakehouse
home is resolved or refused in one line without starting a stray Postgres, a finished rollout says it is finished and
an empty canary is no evidence, the ingest bench says what its figure measures.

Every command through the CLI (its ``main`` or a real subprocess); real Postgres and Iceberg."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

from lakehouse_dagster.cli.main import main
from lakehouse_dagster.core import private_apis
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.cli import run_cli
from lakehouse_dagster.testing.pg import with_db
from lakehouse_dagster.tracking import datasets

from .flag_helpers import flag_tables
from .native_helpers import SCHEMA, row, runbook_ready
from .test_write_flip_first_sync import _fed

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OPERATOR_GUIDE = ROOT / "docs" / "operator-guide.md"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def exit_codes_documented() -> dict[int, str]:
    """The operator guide's exit-code table: code → meaning."""
    text = OPERATOR_GUIDE.read_text()
    section = text.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    found = {int(m[1]): m[2].strip() for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.M)}
    assert {0, 1, 2, 6} <= set(found), f"the exit-code table in {OPERATOR_GUIDE.name} no longer parses: {found}"
    return found


# --- item 3: one true sentence about the Python version ------------------------------------------------------------


def test_every_place_that_names_the_python_version_says_what_the_scripts_and_the_shim_do():
    minimum = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert minimum == ">=3.11"
    assert "sys.version_info >= (3, 11)" in (ROOT / "scripts" / "bootstrap").read_text()
    assert private_apis.TESTED_PYTHON == ("3.11",)  # on another, the warm launcher falls back (it does not refuse)
    places = {
        "README.md": README.read_text(),
        "docs/getting-started.md": (ROOT / "docs" / "getting-started.md").read_text(),
        "scripts/start": (ROOT / "scripts" / "start").read_text(),
    }
    for name, text in places.items():
        flat = " ".join(text.split())
        assert "Python 3.11 or newer" in flat, name
        assert "only Python 3.11 (" not in flat and "refuses others" not in flat, name
    assert "falls back to Dagster's own" in " ".join(places["README.md"].split())


# --- item 4: the widen refused by the gates, and the exit code the docs name -----------------------------------------


def test_a_workspace_write_flip_over_unready_datasets_exits_with_the_code_the_readme_and_the_guide_name(
    conn, dsn, settings, capsys
):
    ws = datasets.create_workspace(conn, "demo")
    ready = datasets.create_dataset(conn, ws, "ready", SCHEMA)
    datasets.insert_rows(conn, ready, [row(i) for i in range(4)])
    runbook_ready(conn, dsn, settings, ready)
    # the runbook's step 3 first (a dataset-scope flip): the widening rules' order
    assert _cli(capsys, "write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(ready))[0] == 0
    # mirrored and canaried ok, but its readers are still on Postgres: the gates refuse the widen
    unready = datasets.create_dataset(conn, ws, "readers_on_pg", SCHEMA)
    datasets.insert_rows(conn, unready, [row(i) for i in range(4)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, unready, mode="full")
    before = flag_tables(conn)

    code, out, err = _cli(capsys, "write-flags", "flip", "sync.full", "--workspace", str(ws), "--note", "fase4 ws")
    assert flag_tables(conn) == before  # nothing written
    assert "would move 1 dataset(s) that are not ready; nothing written" in err
    assert f"readers_on_pg ({unready}), lifecycle mirrored: " in err  # every refusal names the lifecycle state
    documented = exit_codes_documented()
    assert code == 6 and "refused by a flip gate" in documented[code], (code, documented.get(code))

    readme = README.read_text()
    step4 = readme.split("write-flags flip sync.full --workspace $WS", 1)[1].split("\n```", 1)[0]
    assert f"refused (exit {code}" in step4, step4
    guide = " ".join(OPERATOR_GUIDE.read_text().split())
    assert (
        f"`refused: … would move N dataset(s) that are not ready; nothing written:` (exit {code}, a flip gate)" in guide
    )

    # a dataset never mirrored stops the same widen earlier, at the preflight canary: STOP, the code the table names
    datasets.create_dataset(conn, ws, "never_mirrored", SCHEMA)
    datasets.insert_rows(conn, datasets.create_dataset(conn, ws, "never_mirrored_2", SCHEMA), [row(0)])
    code, out, _ = _cli(capsys, "write-flags", "flip", "sync.full", "--workspace", str(ws))
    assert "STOP: do not flip sync.full" in out and "no-snapshot" in out
    assert code == 1 and "STOP" in documented[code]
    assert "(STOP, exit 1)" in step4 or "STOP (exit 1)" in step4, step4


# --- item 6: candidates suggest the runbook's command ---------------------------------------------------------------


def test_candidates_suggest_the_flip_the_runbook_steps_use(conn, dsn, settings, capsys):
    ws = datasets.create_workspace(conn, "demo")
    d = datasets.create_dataset(conn, ws, "ready", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    runbook_ready(conn, dsn, settings, d)
    code, out, _ = _cli(capsys, "candidates", "--writer", "sync.full")
    assert code == 0
    last = out.strip().splitlines()[-1]
    assert "1 ready to flip sync.full" in last
    assert 'lakehouse write-flags flip sync.full --dataset <id> --note "fase4 canary"' in last
    assert "write-flags set" not in last


# --- item 7: one ordered stream ------------------------------------------------------------------------------------


def _one_pipe(*args: str) -> tuple[int, str]:
    """`lakehouse ...` in a real subprocess with stdout and stderr on one pipe (``2>&1``), as a terminal or a log
    file sees it."""
    proc = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
    )
    return proc.returncode, proc.stdout


def _before(text: str, first: str, then: str) -> bool:
    return text.index(first) < text.index(then)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_read_flip_says_preflight_then_set_then_the_routers_lines_in_one_ordered_stream(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    code, text = _one_pipe("flags", "flip", "export.stream", "--dataset", str(d))
    assert code == 0, text
    assert text.count("[read-router]") == 1, text
    assert _before(text, "preflight covered 1 of 1", "export.stream: (no override) → iceberg"), text
    assert _before(text, "export.stream: (no override) → iceberg", "[read-router] export.stream"), text
    assert _before(text, "[read-router] export.stream", "reason"), text  # the verify table follows its read


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_write_flip_says_preflight_then_set_then_the_first_syncs_lines_in_one_ordered_stream(conn, dsn, settings):
    d, _ = _fed(conn, dsn, settings)
    code, text = _one_pipe("write-flags", "flip", "sync.full", "--dataset", str(d))
    assert code == 0, text
    assert "[write-router] sync.full" in text, text
    lines = text.splitlines()
    first_router = next(i for i, line in enumerate(lines) if "[write-router]" in line)
    header = next(i for i, line in enumerate(lines) if line.startswith("first native sync of sync.full"))
    preflight = next(i for i, line in enumerate(lines) if line.startswith("preflight covered"))
    assert preflight < header < first_router, text
    table = next(i for i, line in enumerate(lines) if line.startswith("dataset_id") and "snapshot_id" in line)
    assert first_router < table, text


def test_a_flip_with_json_keeps_stdout_one_document(conn, dsn, settings):
    import json

    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    proc = run_cli("flags", "flip", "export.stream", "--dataset", str(d), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["flipped"] is True
    assert "[read-router] export.stream" in proc.stderr


# --- item 2: the home resolved or refused in one line, no stray Postgres -------------------------------------------


def _bare_env(**extra: str) -> dict:
    """The test's environment without a DSN or a home: a second terminal that did not export the stack's."""
    env = {k: v for k, v in os.environ.items() if k not in ("LAKEHOUSE_PG_DSN", "LAKEHOUSE_HOME")}
    return {**env, **extra}


def test_status_in_a_home_with_no_running_stack_refuses_in_one_line_and_starts_no_postgres(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "status"],
        capture_output=True,
        text=True,
        env=_bare_env(),
        cwd=checkout,  # LAKEHOUSE_HOME unset: ./.lakehouse of the working directory
        timeout=120,
    )
    home = checkout / ".lakehouse"
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"lakehouse status: error: no lakehouse database at {home} (no embedded Postgres runs under {home / 'pg'} "
        "and LAKEHOUSE_PG_DSN is unset): start it with scripts/start, or set LAKEHOUSE_HOME to the home of the "
        "running stack"
    ]
    assert not (home / "pg").exists()  # no server was initialised, so none is left running
    documented = exit_codes_documented()
    assert "no lakehouse database" in documented[3], documented[3]
    five_minutes = README.read_text().split("## Five minutes on the demo", 1)[1].split("```", 1)[0]
    assert "same `LAKEHOUSE_HOME`" in five_minutes, five_minutes


def test_status_against_a_database_with_no_lakehouse_tables_says_so_in_one_line(pg_admin_dsn, tmp_path):
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute("drop database if exists lh_not_the_stack")
        admin.execute("create database lh_not_the_stack")
    proc = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "status"],
        capture_output=True,
        text=True,
        env=_bare_env(LAKEHOUSE_PG_DSN=with_db(pg_admin_dsn, "lh_not_the_stack"), LAKEHOUSE_HOME=str(tmp_path)),
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("lakehouse status: error: LAKEHOUSE_PG_DSN (postgresql://")
    assert 'has no lakehouse tables (relation "' in line and "does not exist)" in line
    assert "set LAKEHOUSE_HOME (or LAKEHOUSE_PG_DSN) to the running stack's, or run lakehouse db migrate" in line
    assert "Traceback" not in proc.stderr


def test_status_attaches_to_the_embedded_postgres_running_under_the_home_and_leaves_it_running(pg_admin_dsn):
    host = psycopg.conninfo.conninfo_to_dict(pg_admin_dsn).get("host") or ""
    if not str(host).endswith("/pg"):
        pytest.skip("the session's server is not an embedded one under <home>/pg (LAKEHOUSE_TEST_ADMIN_DSN)")
    home = Path(str(host)).parent
    proc = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "status"],
        capture_output=True,
        text=True,
        env=_bare_env(LAKEHOUSE_HOME=str(home)),
        timeout=120,
    )
    # it reached the running server (its `postgres` database holds no lakehouse tables: the tests' are elsewhere)
    assert proc.returncode == 3, proc.stderr
    assert f"the embedded Postgres of LAKEHOUSE_HOME={home} has no lakehouse tables" in proc.stderr
    with psycopg.connect(pg_admin_dsn) as still:  # and left it running
        assert still.execute("select 1").fetchone() == (1,)


# --- item 5: a finished plan says so; an empty canary is no evidence -----------------------------------------------


def _reader_plan(stages: str) -> str:
    return f"reader: export.stream\nmode: iceberg\nnote: fase1 by plan\nstages:\n{stages}"


def test_a_stage_canaried_over_an_empty_dataset_counts_it_apart_and_the_finished_plan_says_finished(
    conn, dsn, settings, capsys
):
    import dagster as dg

    from lakehouse_dagster.plans import actions, status, store

    from .rollout_helpers import Driver, dataset

    ws = datasets.create_workspace(conn, "demo")
    empty = dataset(conn, dsn, settings, ws, "empty", 0)
    eight = dataset(conn, dsn, settings, ws, "eight", 8)
    catalog = load_catalog(settings, dsn)
    from lakehouse_dagster.parity import canary

    canary.run_canary(conn, dsn, catalog, settings, dataset_ids=[str(empty), str(eight)], smoke=True)
    plan_id, _ = actions.start(conn, settings, _reader_plan("  - datasets: 2\n    soak: 1s\n"), actor="pytest")
    with dg.DagsterInstance.ephemeral() as inst:
        p = Driver(inst, dsn).until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished", (p.reason, p.blocking)
    passed = [e for e in store.events(conn, plan_id) if e["event"] == "stage-passed"]
    assert len(passed) == 1
    assert "1 of 2 canaried dataset(s) ok; 1 had no rows (no evidence)" in passed[0]["reason"], passed[0]["reason"]
    assert "2 of 2" not in passed[0]["reason"]

    code, out, _ = _cli(capsys, "rollout", "status", str(plan_id))
    assert code == 0
    head = out.splitlines()[0]
    assert re.search(
        r": finished \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, all 1 stage\(s\) passed; 2 dataset\(s\) moved$", head
    )
    assert "waiting" not in head and "stage 1 of 1" not in head, head
    assert status.plan_status(conn, plan_id).stage_text() == "all 1 stage(s) passed"


def test_a_stage_whose_only_ok_verdicts_had_no_rows_is_inconclusive_not_passed(conn, dsn, settings):
    import dagster as dg

    from lakehouse_dagster.parity import canary
    from lakehouse_dagster.plans import actions, store

    from .rollout_helpers import Driver, dataset

    ws = datasets.create_workspace(conn, "demo")
    empty = dataset(conn, dsn, settings, ws, "empty", 0)
    canary.run_canary(conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(empty)], smoke=True)
    stages = "  - datasets: 1\n    soak: 1s\n    analysis: {pause_after: 1h, retry_every: 1h}\n"
    plan_id, _ = actions.start(conn, settings, _reader_plan(stages), actor="pytest")
    with dg.DagsterInstance.ephemeral() as inst:
        p = Driver(inst, dsn).until(conn, plan_id, lambda p: (p.blocking or "").startswith("inconclusive"))
    assert p.state == "active" and p.stage == 0
    assert "no evidence: none of the 1 canaried dataset(s) is ok with rows to compare" in p.blocking
    assert f"1 had no rows: empty ({empty}): no rows" in p.blocking
    assert not [e for e in store.events(conn, plan_id) if e["event"] == "stage-passed"]


# --- item 8: the bench says what its figure measures, and the whole -------------------------------------------------


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_ingest_bench_says_what_its_figure_measures_and_the_commands_whole_wall_time(dsn, settings, capsys):
    import time

    t = time.perf_counter()
    code, out, err = _cli(capsys, "ingest-bench", "run", "--jobs", "3", "--rows", "2000")
    measured = time.perf_counter() - t
    assert code == 0, out + err
    summary = next(line for line in out.splitlines() if line.startswith("PASS: jobs=3"))
    m = re.search(
        r"the ingests took ([\d.]+) s from their common start, [\d,]+ rows/s \(wall ([\d.]+) s, of which "
        r"setting up the workspace and datasets ([\d.]+) s, starting the 3 writer process\(es\) ([\d.]+) s, "
        r"the writers' exit ([\d.]+) s, checking the tables ([\d.]+) s, the purge ([\d.]+) s\)$",
        summary,
    )
    assert m, summary
    ingests, wall, setup, starting, exiting, checking, purge = (float(g) for g in m.groups())
    # the whole command, not only the burst: the wall is the sum of its phases (each shown to 0.1 s) and lies
    # within the test's own measure of the command (no bound on how long anything takes: a loaded machine is fine)
    assert abs(wall - (ingests + setup + starting + exiting + checking + purge)) <= 0.05 * 7, summary
    assert wall > ingests and starting > 0 and wall <= measured + 0.05, (wall, measured)


# --- item 9: a calm console, a word during the first install ------------------------------------------------------

_A_RUN = """
import warnings
import dagster as dg

@dg.op
def hello(context):
    context.log.info("hello from the op")
    return 1

@dg.job
def calm():
    hello()

warnings.warn("Class `Thing` is currently in beta, and may have breaking changes", dg.BetaWarning)
calm.execute_in_process()
"""


def test_the_foreground_console_relays_info_and_above_and_drops_debug_events_and_beta_warnings(tmp_path):
    """Dagster's real console output of a real run, through the filter `lakehouse up` relays it with."""
    from lakehouse_dagster.cli.console import ConsoleFilter, relay

    script = tmp_path / "run.py"
    script.write_text(_A_RUN)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, env={**os.environ}
    )
    assert proc.returncode == 0, proc.stderr
    raw = proc.stderr.splitlines(keepends=True)
    assert any(" - DEBUG - calm - " in line for line in raw)  # what Dagster prints by default: every DEBUG event
    assert any("BetaWarning" in line for line in raw)
    raw += [
        "2026-12-03 12:00:00 +0000 - dagster.daemon.SensorDaemon - INFO - Checking for new runs for sensor: "
        "mirror_poller\n",
        "2026-12-03 12:00:00 +0000 - dagster.daemon.SensorDaemon - INFO - No run requests returned for "
        "mirror_poller, skipping\n",
        "2026-12-03 12:00:00 +0000 - dagster.daemon.SensorDaemon - INFO - Sensor lakehouse_alerts skipped: idle\n",
        "2026-12-03 12:00:01 +0000 - dagster.daemon.SensorDaemon - INFO - Launching run for mirror_poller\n",
    ]

    import io

    out = io.StringIO()
    source = io.StringIO("".join(raw))
    relay(source, out, ConsoleFilter()).join(10)
    calm = out.getvalue()
    assert " - DEBUG - " not in calm and "BetaWarning" not in calm and "warnings.warn" not in calm, calm
    assert "hello from the op" in calm  # the op's INFO line
    assert "RUN_SUCCESS" not in calm  # Dagster logs its run events at DEBUG: the UI's event log has them
    assert "Checking for new runs" not in calm and "No run requests" not in calm and "skipped: idle" not in calm
    assert "Launching run for mirror_poller" in calm
    assert len(calm.splitlines()) < len(raw) / 2, calm

    everything = io.StringIO()
    relay(io.StringIO("".join(raw)), everything, ConsoleFilter(debug=True)).join(10)
    assert everything.getvalue() == "".join(raw)  # lakehouse up --debug


def test_bootstrap_says_what_the_first_install_waits_for_before_pip_runs(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    (checkout / "scripts" / "bootstrap").write_bytes((ROOT / "scripts" / "bootstrap").read_bytes())
    (checkout / "scripts" / "bootstrap").chmod(0o755)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bin_ = checkout / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text('#!/bin/sh\necho "pip ran: $*" >&2\n')  # a stand-in venv: pip is not run
    (bin_ / "python").chmod(0o755)
    proc = subprocess.run(
        [str(checkout / "scripts" / "bootstrap")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == "bootstrap: installing the pinned dependencies into .venv (first run: a minute or two)...", lines
    assert lines[1].startswith("pip ran: -m pip install") and lines[-1] == "bootstrap: dependencies installed"
    again = subprocess.run(
        [str(checkout / "scripts" / "bootstrap")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=60,
    )
    assert again.returncode == 0 and again.stderr == ""  # installed and unchanged: nothing to say, nothing run
