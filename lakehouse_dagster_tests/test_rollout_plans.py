"""The plan file and what it would do: validation (one line per problem, naming the key), durations and windows,
the dry-run, writer plans refused before they start when a stage would break the runbook's order or prerequisite #1
(naming the gate), a writer plan that passes and runs, and the `lakehouse rollout` verbs."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_dagster.cli.main import main
from lakehouse_dagster.core.errors import BadInput, FlipRefused
from lakehouse_dagster.flags.overrides import list_overrides, set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.plans import actions, store
from lakehouse_dagster.plans.schema import schema_text
from lakehouse_dagster.plans.spec import load_plan, parse_duration
from lakehouse_dagster.plans.window import parse_window

from .flag_helpers import cli, flag_tables, refusal
from .rollout_helpers import Driver, plan_audit, seed_mix

ROOT = Path(__file__).resolve().parents[1]
WS = "5f0c7a52-8d1e-4a57-9b7e-2b8e33a3c001"


def test_the_issue_s_plan_shape_loads_with_defaults():
    plan = load_plan(f"""
reader: export.stream        # or  writer: sync.full
mode: iceberg                # the target mode
stages:
  - datasets: 2              # N candidates
    soak: 1s
  - workspace: {WS}
    soak: 1s
    approval: true
  - global: true
    soak: 1s
""")
    assert (plan.kind, plan.name, plan.mode) == ("read", "export.stream", "iceberg")
    assert [(s.kind, s.soak, s.approval) for s in plan.stages] == [
        ("datasets", 1, False),
        ("workspace", 1, True),
        ("global", 1, False),
    ]
    assert plan.stages[0].count == 2 and str(plan.stages[1].workspaces[0]) == WS
    assert plan.stages[0].analysis.sample == 20 and plan.stages[0].max_datasets is None
    writer = load_plan("writer: sync.full\nstages: [{global: true, soak: 10m}]\ndefaults: {approval: true}")
    assert (writer.kind, writer.mode, writer.stages[0].soak, writer.stages[0].approval) == (
        "write",
        "iceberg_native",
        600,
        True,
    )


def test_every_problem_is_one_line_naming_the_key_and_what_to_do():
    with pytest.raises(BadInput) as exc:
        load_plan(
            """
reader: export.stream
writer: sync.full
colour: blue
stages:
  - datasets: 0
    soak: 10 minutes
  - workspace: not-a-uuid
    window: sometimes
    analysis: {max_fallbacks: -1, wait: 3}
  - global: true
    datasets: 3
""",
            "plan.yaml",
        )
    lines = str(exc.value).splitlines()
    assert lines == [
        "plan.yaml: colour: unknown key; a plan has reader, writer, mode, stages, note, defaults, arm_reverse",
        "plan.yaml: reader: give exactly one of reader: <name> or writer: <name>",
        "plan.yaml: stages[0].datasets: 0 is not a count; write datasets: N with N of 1 or more",
        "plan.yaml: stages[0].soak: '10 minutes' is not a duration; write a duration like 30s, 10m, 1h or 1h30m",
        "plan.yaml: stages[1].workspace: 'not-a-uuid' is not a uuid; copy the id from lakehouse datasets",
        "plan.yaml: stages[1].window: 'sometimes' is not a window; write e.g. 'weekdays 09:00-17:00 UTC' "
        "(days: daily, weekdays, weekends, mon-fri, sat,sun; a time zone)",
        "plan.yaml: stages[1].analysis.max_fallbacks: -1 is not a count; write a whole number of 0 or more",
        "plan.yaml: stages[1].analysis.wait: unknown key; analysis has sample, max_fallbacks, max_failed_syncs, "
        "max_inconclusive, pause_after, retry_every, min_reads, min_consistency, max_reverse_lag_seconds",
        "plan.yaml: stages[2]: give exactly one of shadow, datasets, workspace, global, complete (found datasets, "
        "global)",
    ]
    cases = {
        "reader: sdk.files.list\nstages: [{global: true}]": "sdk.files.list is locked at off",
        "reader: studio.digest\nmode: iceberg_only\nstages: [{global: true}]": "use iceberg",
        "writer: ingest.stream\nstages: [{global: true}]": "ingest.stream is locked at pg",
        "writer: sync.full\nstages: [{shadow: true}]": "writer plans have none",
        "reader: export.stream\nstages: [{global: true}, {datasets: 1}]": "stages widen",
        "reader: export.stream\nstages: [{datasets: 1}, {shadow: true}]": "a shadow stage comes first",
        "reader: export.stream\nstages: []": "give a list of stages",
        "reader: export.stream\nstages: [{datasets: 1, within: 3}]": "is not a uuid",
        "reader: [": "not valid YAML at line",
        "reader: export.stream\narm_reverse: true\nstages: [{global: true}]": "only a writer plan arms the reverse",
        "writer: sync.full\narm_reverse: maybe\nstages: [{global: true}]": "'maybe' is not true or false",
    }
    for text, expected in cases.items():
        with pytest.raises(BadInput, match=expected):
            load_plan(text)


def test_a_complete_stage_ends_a_writer_plan_always_approved_and_takes_only_its_own_keys():
    plan = load_plan(
        "writer: sync.full\ndefaults: {soak: 10m, approval: false, window: 'daily 01:00-05:00 UTC'}\n"
        "stages: [{datasets: 1}, {complete: true, export_to: /srv/exports, max_datasets: 5}]"
    )
    first, last = plan.stages
    assert (first.soak, first.approval, first.export_to) == (600, False, None)
    # the defaults' soak and approval: false are not a complete stage's; its window and its own keys are
    assert (last.kind, last.approval, last.soak, last.export_to, last.max_datasets) == (
        "complete",
        True,
        0,
        "/srv/exports",
        5,
    )
    assert last.window is not None and last.window.text == "daily 01:00-05:00 UTC"
    assert store.plan_from_stored(plan.as_dict()) == plan  # what is stored reads back the same
    cases = {
        "reader: export.stream\nstages: [{datasets: 1}, {complete: true}]": "only writer plans have it",
        "writer: sync.full\nstages: [{complete: true}, {datasets: 1}]": "a complete stage comes last",
        "writer: sync.full\nstages: [{complete: true}]": "needs a stage before it that moves datasets",
        "writer: sync.full\nstages: [{datasets: 1}, {complete: true, approval: false}]": "always waits for an approval",
        "writer: sync.full\nstages: [{datasets: 1}, {complete: true, soak: 1h}]": "a complete stage has no soak",
        "writer: sync.full\nstages: [{datasets: 1}, {complete: true, analysis: {sample: 1}}]": "has no analysis",
        "writer: sync.full\nstages: [{datasets: 1}, {complete: yes please}]": "write complete: true",
        "writer: sync.full\nstages: [{datasets: 1, export_to: /x}]": "only a complete stage exports",
        "writer: sync.full\nstages: [{datasets: 1}, {complete: true, export_to: ''}]": "is not a directory",
    }
    for text, expected in cases.items():
        with pytest.raises(BadInput, match=expected):
            load_plan(text)


def test_durations_and_windows():
    assert [parse_duration(x) for x in ("1s", "10m", "1h", "1h30m", "2d", 0)] == [1, 600, 3600, 5400, 172800, 0]
    for bad in ("10", 10, "1x", "", "m", True):
        with pytest.raises(BadInput, match="is not a duration"):
            parse_duration(bad)
    w = parse_window("weekdays 09:00-17:00 UTC")
    monday_10 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.UTC)  # a Monday
    assert w.is_open(monday_10) and not w.is_open(monday_10.replace(hour=17))
    saturday = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
    assert not w.is_open(saturday) and w.next_open(saturday) == dt.datetime(2026, 12, 7, 9, 0, tzinfo=dt.UTC)
    night = parse_window("daily 22:00-06:00 UTC")  # past midnight
    assert night.is_open(monday_10.replace(hour=23)) and night.is_open(monday_10.replace(hour=5))
    assert not night.is_open(monday_10) and night.next_open(monday_10) == monday_10.replace(hour=22)
    ams = parse_window("mon-fri 09:00-10:00 Europe/Amsterdam")  # 08:00-09:00 UTC in winter
    assert ams.is_open(monday_10.replace(hour=8, minute=30)) and not ams.is_open(monday_10.replace(hour=9, minute=30))
    assert parse_window("sat,sun 00:00-24:00 UTC").is_open(saturday)
    for bad in ("weekdays 9-17 UTC", "funday 09:00-17:00 UTC", "daily 09:00-17:00 Mars/Base", "daily 25:00-26:00 UTC"):
        with pytest.raises(BadInput):
            parse_window(bad)


def test_the_json_schema_in_the_docs_is_the_one_the_code_generates():
    assert (ROOT / "docs" / "rollout-plan.schema.json").read_text() == schema_text()


def test_the_dry_run_writes_nothing_and_a_stage_without_enough_candidates_is_refused(conn, dsn, settings):
    s = seed_mix(conn, dsn, settings)
    before = flag_tables(conn)
    text = f"reader: graph.kuzu\nstages:\n  - datasets: 9\n    within: {s.ws}\n  - workspace: {s.ws}\n"
    dry = actions.dry_run(conn, settings, text)
    assert dry.problems == [
        f"stages[0].datasets: 9 wanted, 4 candidate(s) in workspace {s.ws}: datasets with an ok verdict at their "
        "current version in the last 1d; canary more (lakehouse canary --smoke --limit 50), or lower N"
    ]
    with pytest.raises(FlipRefused, match="would break a gate"):
        actions.start(conn, settings, text, actor="pytest")
    assert flag_tables(conn) == before
    assert conn.execute("select count(*) from lakehouse_rollout_plans").fetchone()[0] == 0
    # a stage that would move more than its max_datasets is refused too
    dry = actions.dry_run(conn, settings, "reader: graph.kuzu\nstages: [{global: true, max_datasets: 2}]")
    assert dry.problems == [
        "stages[0] (flags set graph.kuzu iceberg): order (dataset → workspace → global): no workspace-scope flip to "
        "iceberg inside global before it; add a workspace stage first",
        "stages[0]: moves 5 datasets, above its max_datasets 2; add a narrower stage first or raise max_datasets",
    ]


def test_writer_plans_that_break_the_order_or_prerequisite_1_are_refused_naming_the_gate(conn, dsn, settings):
    s = seed_mix(conn, dsn, settings)
    before = flag_tables(conn)
    with pytest.raises(FlipRefused) as exc:
        actions.start(conn, settings, f"writer: sync.full\nstages: [{{workspace: {s.ws}}}]", actor="pytest")
    text = str(exc.value)
    assert text.startswith(
        "refused: the plan for writer sync.full → iceberg_native would break a gate; nothing written:"
    )
    assert "read-flip them first (prerequisite #1)" in text and "big (" in text
    for r in SERVABLE_READERS:  # prerequisite #1 met: every reader Iceberg can serve reads Iceberg
        set_override(conn, "read", r.name, "iceberg", actor="ops")
    with pytest.raises(FlipRefused) as exc:
        actions.start(conn, settings, f"writer: sync.append\nstages: [{{workspace: {s.ws}}}]", actor="pytest")
    assert (
        f"stages[0] (write-flags set sync.append iceberg_native --workspace {s.ws}): writer order (sync.full → "
        f"sync.append → sync.incremental / cdc.append): sync.full is still pg at workspace {s.ws}; widen it first"
    ) in str(exc.value)
    assert "prerequisite #1" not in str(exc.value)
    assert not [o for o in list_overrides(conn) if o.kind == "write"]
    assert len(flag_tables(conn)[1]) == len(before[1]) + len(SERVABLE_READERS)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_writer_plan_in_the_runbook_s_order_runs(conn, dsn, settings):
    s = seed_mix(conn, dsn, settings)
    for r in SERVABLE_READERS:
        set_override(conn, "read", r.name, "iceberg", actor="ops")
    text = f"writer: sync.full\nstages:\n  - datasets: 1\n    soak: 1s\n  - workspace: {s.ws}\n    soak: 1s\n"
    dry = actions.dry_run(conn, settings, text)  # the manifest dataset in the workspace: the gates refuse it
    (problem,) = dry.problems
    assert problem.startswith(
        f"stages[1] (write-flags set sync.full iceberg_native --workspace {s.ws}): the flip gates"
    )
    assert f"files ({s.manifest}): a manifest dataset is file-backed, not Iceberg-tabular" in problem
    set_override(conn, "write", "sync.full", "pg", dataset=s.manifest, actor="ops")  # the gate's own advice
    dry = actions.dry_run(conn, settings, text)
    assert not dry.problems and [c.label for c in dry.stages[0].changes] == ["small"]
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    with dg.DagsterInstance.ephemeral() as inst:
        driver = Driver(inst, dsn)
        p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished", (p.reason, p.blocking)
    assert [r.job_name for r in driver.launched] == ["write_flip", "rollout_analysis"] * 2
    assert [(a[1], a[2], a[3], a[6]) for a in plan_audit(conn, plan_id)] == [
        ("write", "sync.full", "dataset", "iceberg_native"),
        ("write", "sync.full", "workspace", "iceberg_native"),
    ]
    # the next writer may now widen at that workspace (order), and the dry-run says so
    set_override(conn, "write", "sync.append", "pg", dataset=s.manifest, actor="ops")
    dry = actions.dry_run(conn, settings, f"writer: sync.append\nstages: [{{datasets: 1}}, {{workspace: {s.ws}}}]")
    assert not dry.problems, dry.problems


def _write(tmp_path, text: str, name: str = "plan.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_rollout_verbs(conn, dsn, settings, tmp_path, capsys):
    """Two verbs as a real process (the console script a user types), the rest through the same entry point in
    process (cli.main.main: the same parser, output and exit codes, without a start-up each)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    s = seed_mix(conn, dsn, settings)
    path = _write(
        tmp_path, f"reader: studio.digest\nstages:\n  - datasets: 1\n  - workspace: {s.ws}\n    approval: true\n"
    )
    proc = cli("rollout", "plan", path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[0] == "rollout plan: reader studio.digest → iceberg, 2 stage(s), 2 flag change(s) in this order:"
    assert out[1] == (
        "stage 1: datasets: 1 — soak 0s (the larger of the plan's 0s and the project's 0s, LAKEHOUSE_SOAK_SECONDS); "
        "no approval; any time"
    )
    assert out[2].startswith("  1. flags set studio.digest iceberg --dataset ")
    assert out[2].endswith("(small): moves 1 dataset(s)")
    assert out[-1] == "dry-run: nothing written"
    assert "approval needed before it" in proc.stdout and "files (" in proc.stdout  # the manifest, named as skipped
    code, text, _ = run("rollout", "plan", path, "--json")
    assert code == 0 and [c["label"] for st in json.loads(text)["stages"] for c in st["changes"]] == [
        "small",
        "ws-main",
    ]
    # the same plan from flags
    code, text, _ = run(
        "rollout",
        "plan",
        "--reader",
        "studio.digest",
        "--stage",
        "datasets: 1",
        "--stage",
        f"workspace: {s.ws}, approval: true",
    )
    assert code == 0 and text.splitlines()[:4] == out[:4]
    code, _, err = run(
        "rollout", "plan", _write(tmp_path, "reader: studio.digest\nstages: [{global: yes, soak: 5}]", "bad.yaml")
    )
    assert code == 2
    assert err.strip().endswith("stages[0].soak: 5 is not a duration; write a duration like 30s, 10m, 1h or 1h30m")
    assert run("rollout", "plan")[0] == 2

    started = cli("rollout", "start", path, "--json", check=True)
    plan_id = json.loads(started.stdout)["plan_id"]
    code, _, err = run("rollout", "start", path)
    assert code == 2 and f"plan {plan_id} for reader studio.digest is still active" in err
    table = run("rollout", "status")[1].splitlines()
    assert table[0].split() == ["id", "flag", "mode", "state", "stage", "phase", "next"]
    assert table[1].startswith(f"{plan_id[:8]}  studio.digest  iceberg  active  1/2 datasets: 1")
    st = json.loads(run("rollout", "status", plan_id[:8], "--json")[1])
    assert (st["state"], st["stage"], st["history"][0]["event"]) == ("active", 1, "started")
    code, text, _ = run("rollout", "pause", plan_id[:8], "--reason", "wait")
    assert code == 0 and text.startswith(f"plan {plan_id}: reader studio.digest → iceberg: paused, stage 1 of 2")
    code, _, err = run("rollout", "approve", plan_id[:8])
    assert code == 2 and err.strip().endswith(
        f"plan {plan_id} is not waiting for an approval (its stage needs no approval); nothing approved"
    )
    assert run("rollout", "resume", plan_id)[0] == 0
    code, text, _ = run("rollout", "abort", plan_id, "--reason", "changed my mind")
    assert code == 0 and text.startswith("aborted: 0 flag key(s) restored")  # nothing set yet: nothing to restore
    assert store.get(conn, store.resolve_id(conn, plan_id)).state == "aborted"
    assert run("rollout", "status", "ffff0000")[0] == 3
    assert run("rollout", "abort", plan_id)[0] == 2


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_rollout_jobs_from_the_launchpad(conn, dsn, settings):
    """The code location carries a job per verb and the controller; each runs with typed config and refuses like the
    CLI (the reason, no stack)."""
    from lakehouse_dagster.dagster.definitions import defs

    loaded = defs()
    dg.Definitions.validate_loadable(loaded)
    assert loaded.resolve_sensor_def("rollout_controller") is not None
    s = seed_mix(conn, dsn, settings)
    text = f"reader: graph.kuzu\nstages:\n  - datasets: 1\n    approval: true\n  - workspace: {s.ws}\n"
    instance = dg.DagsterInstance.ephemeral()

    def run(job: str, op: str, config: dict):
        return loaded.resolve_job_def(job).execute_in_process(
            run_config={"ops": {op: {"config": config}}}, instance=instance, raise_on_error=False
        )

    dry = run("rollout_plan", "rollout_plan_op", {"plan": text})
    assert dry.success and dry.output_for_node("rollout_plan_op")["changes"] == 2
    assert conn.execute("select count(*) from lakehouse_rollout_plans").fetchone()[0] == 0
    refused = run("rollout_plan", "rollout_plan_op", {"plan": "reader: graph.kuzu\nstages: [{datasets: 99}]"})
    assert not refused.success
    assert refusal(refused.get_step_failure_events()[0]).startswith(
        "the plan for reader graph.kuzu → iceberg would break a gate; nothing written:\n"
        "  stages[0].datasets: 99 wanted, 5 candidate(s)"
    )
    started = run("rollout_start", "rollout_start_op", {"plan": text})
    plan_id = started.output_for_node("rollout_start_op")
    assert store.get(conn, store.resolve_id(conn, plan_id)).created_by.startswith("pytest (dagster run ")
    Driver(instance, dsn).tick()  # the controller: the first stage waits for its approval
    approved = run("rollout_approve", "rollout_approve_op", {"plan_id": plan_id[:8], "note": "go"})
    assert approved.success and approved.output_for_node("rollout_approve_op")["history"] == []
    st = run("rollout_status", "rollout_status_op", {"plan_id": plan_id}).output_for_node("rollout_status_op")
    assert [e["event"] for e in st[0]["history"]] == ["started", "approval-needed", "approved"]
    paused = run("rollout_pause", "rollout_pause_op", {"plan_id": plan_id, "note": "hold"})
    assert paused.output_for_node("rollout_pause_op")["state"] == "paused"
    again = run("rollout_pause", "rollout_pause_op", {"plan_id": plan_id})
    assert refusal(again.get_step_failure_events()[0]) == f"plan {plan_id} is paused, not active; nothing to pause"
    assert run("rollout_resume", "rollout_resume_op", {"plan_id": plan_id}).success
    aborted = run("rollout_abort", "rollout_abort_op", {"plan_id": plan_id, "note": "test over"})
    assert aborted.output_for_node("rollout_abort_op")["state"] == "aborted"
    assert not list_overrides(conn)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_readmes_example_plan_dry_runs_on_the_demo_as_it_says(conn, dsn, settings):
    """examples/rollout-graph-kuzu.yaml is what the README tells a newcomer to run on the demo: it must validate, and
    its dry-run must move the demo's datasets in the order the file's comment says, writing nothing."""
    from lakehouse_dagster.demo.workspace import DEMO_WORKSPACE_ID, seed_demo
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back

    text = (Path(__file__).resolve().parents[1] / "examples" / "rollout-graph-kuzu.yaml").read_text()
    plan = load_plan(text)
    assert (plan.kind, plan.name, plan.mode) == ("read", "graph.kuzu", "iceberg")
    assert [s.kind for s in plan.stages] == ["datasets", "workspace", "global"] and plan.stages[1].approval
    seed_demo(conn, big_rows=200, home=settings.project.home)
    catalog = load_catalog(settings, dsn)
    tabular = [r[0] for r in conn.execute("select id from datasets where kind = 'tabular'").fetchall()]
    for d in tabular:
        sync_dataset(dsn, catalog, settings, d)
    run_canary_and_roll_back(conn, dsn, catalog, settings, dataset_ids=[str(d) for d in tabular], source="canary")
    before = flag_tables(conn)
    dry = actions.dry_run(conn, settings, text)
    assert not dry.problems, dry.problems
    assert [len(s.changes) for s in dry.stages] == [2, 1, 1]
    assert dry.stages[1].changes[0].scope_id == DEMO_WORKSPACE_ID
    # the demo has one workspace: the global step moves no dataset, and still raises the global mode
    assert dry.stages[2].changes[0].moved == [] and any(
        "raises the global scope's own mode" in n for n in dry.stages[2].notes
    )
    assert flag_tables(conn) == before


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_writer_plan_arms_the_reverse_checks_parity_both_ways_and_aborts_losslessly(conn, dsn, settings):
    """Issue 31: the plan turns the reverse mirror on before the flip (its workspace had it off), the analysis
    compares the copy both ways, and an abort after native writes the reverse applied needs no backfill."""
    from lakehouse_dagster.flags.native import native_dataset_ids
    from lakehouse_dagster.flags.reverse_setting import reverse_enabled, set_reverse
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.reverse import apply_reverse
    from lakehouse_dagster.tracking import datasets

    from .native_helpers import SCHEMA, native_write, row, runbook_ready, table_rows

    ws = datasets.create_workspace(conn, "ws-reverse")
    d = datasets.create_dataset(conn, ws, "ledger", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(5)])
    runbook_ready(conn, dsn, settings, d)
    set_reverse(conn, False, workspace=ws, note="off for the workspace", actor="ops")
    text = f"writer: sync.full\nstages:\n  - datasets: 1\n    soak: 1s\n  - workspace: {ws}\n    approval: true\n"
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    with dg.DagsterInstance.ephemeral() as inst:
        driver = Driver(inst, dsn)
        driver.until(conn, plan_id, lambda p: p.stage == 1 and (p.blocking or "").startswith("approval"))
        assert native_dataset_ids(conn) == {d}
        # armed before the flip, at dataset scope, audited with the plan's id
        assert reverse_enabled(conn, d).enabled
        (armed,) = conn.execute(
            "select scope, scope_id, after_enabled, note from lakehouse_reverse_audit where note like %s",
            (f"rollout {plan_id}%",),
        ).fetchall()
        assert armed == ("dataset", d, True, f"rollout {plan_id} stage 1: reverse armed before the flip")
        started = next(e for e in store.events(conn, plan_id) if e["event"] == "stage-started")
        assert "the reverse mirror armed for 1 dataset(s) whose reverse was off" in started["reason"]
        # the analysis compared the copy both ways: ok at the table's snapshot
        verdict, reverse = conn.execute(
            "select verdict, detail->'reverse' from lakehouse_read_parity where dataset_id = %s"
            " and source = 'rollout-analysis' order by id desc limit 1",
            (d,),
        ).fetchone()
        assert verdict == "ok" and reverse["position_after"] is not None and reverse["lag_before_s"] == 0

        # native writes the reverse mirror applies (the stream does it in a deployment), then the abort
        native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(20, 27)], start=0)
        apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
        out = actions.abort(conn, settings.project, plan_id, actor="ops", reason="stop here")
    assert out.restored is not None and out.restored.restored
    aborted = next(e for e in store.events(conn, plan_id) if e["event"] == "aborted")
    assert aborted["detail"]["next"].startswith(
        "nothing: the reverse mirror kept Postgres up to the last native commit of every dataset the plan moved (1)"
    )
    assert native_dataset_ids(conn) == set()  # the writer is back on pg ...
    pg = conn.execute(
        "select row_index, row_id::text, data->>'a' from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()
    iceberg = [(r["__row_index"], str(r["__row_id"]), str(r["a"])) for r in table_rows(settings, dsn, d)]
    assert pg == iceberg and len(pg) == 7  # ... and Postgres lost nothing
    proc = cli("sync", "--dataset", str(d), "--json")  # the forward mirror resumes at once: no backfill first
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_writer_plan_ending_in_complete_waits_for_approval_pauses_on_a_refusal_and_retires_the_rows(
    conn, dsn, settings
):
    """Issue 31: the plan's last stage completes the datasets it moved, only once approved; a refusal (here: native
    writes since the canary checked parity) pauses the plan naming the condition and deletes nothing; resumed once
    the canary agrees, the stage retires the Postgres rows and the plan finishes."""
    from lakehouse_dagster.flags.completed import completed_mark
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.reverse import apply_reverse
    from lakehouse_dagster.plans.status import plan_status
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back
    from lakehouse_dagster.tracking import datasets

    from .native_helpers import SCHEMA, native_write, row, runbook_ready

    ws = datasets.create_workspace(conn, "ws-complete")
    d = datasets.create_dataset(conn, ws, "ledger", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(5)])
    runbook_ready(conn, dsn, settings, d)
    other = datasets.create_dataset(conn, ws, "other", SCHEMA)  # not moved by the plan: complete leaves it alone
    datasets.insert_rows(conn, other, [row(i) for i in range(3)])
    text = f"writer: sync.full\nstages:\n  - datasets: 1\n    within: {ws}\n    soak: 1s\n  - complete: true\n"
    dry = actions.dry_run(conn, settings, text)
    lines = dry.lines()
    assert "stage 2: complete — approval needed before it; any time" in lines
    i = lines.index("stage 2: complete — approval needed before it; any time")
    assert lines[i + 1].startswith("  retires the Postgres rows of the 1 dataset(s) the stages above move")
    assert lines[i + 2] == f"       ledger ({d})"
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    catalog = load_catalog(settings, dsn)

    def pg_count(ds) -> int:
        return conn.execute("select count(*) from dataset_rows where dataset_id = %s", (ds,)).fetchone()[0]

    with dg.DagsterInstance.ephemeral() as inst:
        driver = Driver(inst, dsn)
        p = driver.until(conn, plan_id, lambda p: p.stage == 1 and (p.blocking or "").startswith("approval"))
        status = plan_status(conn, plan_id)
        assert status.next_action.startswith(f"lakehouse rollout approve {plan_id} (stage 2: complete — retires")
        # native writes the reverse mirror applies (the stream does it in a deployment): Postgres holds them, but no
        # canary has compared the copy at this snapshot yet
        native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in range(20, 29)], start=0)
        apply_reverse(dsn, catalog, settings, d)
        assert pg_count(d) == 9
        actions.approve(conn, plan_id, actor="ops", note="retire the ledger's rows")
        p = driver.until(conn, plan_id, lambda p: p.state != "active")
        assert p.state == "paused", (p.state, p.reason)
        assert p.reason.startswith("stage 2 (complete): 1 of 1 dataset(s) not complete after run ")
        assert "reverse parity not checked at the current snapshot" in p.reason, p.reason
        assert f"lakehouse rollout resume {plan_id}" in p.reason
        assert pg_count(d) == 9 and completed_mark(conn, d) is None  # refused: nothing deleted, nothing marked

        # the operator settles it: the canary compares the copy both ways at the current snapshot, then resume
        verdicts = run_canary_and_roll_back(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results
        assert [v.verdict for v in verdicts] == ["ok"]
        actions.resume(conn, plan_id, actor="ops")
        p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished", (p.state, p.reason, p.blocking)
    assert [r.job_name for r in driver.launched] == ["write_flip", "rollout_analysis", "complete", "complete"]
    assert pg_count(d) == 0 and pg_count(other) == 3
    mark = completed_mark(conn, d)
    assert mark is not None and mark.status == "complete" and mark.rows_deleted == 9
    events = {e["event"]: e for e in store.events(conn, plan_id)}
    assert events["stage-passed"]["reason"].startswith(
        "stage 2 (complete) passed: every dataset the plan moved (1) is complete"
    )
    assert (
        events["finished"]["reason"]
        == "sync.full is iceberg_native at every stage of the plan, and every dataset it moved is complete"
    )
    steps = store.steps(conn, plan_id, 1, "complete")
    assert [(s.status, s.moved) for s in steps] == [("failed", [d]), ("succeeded", [d])]
    # after complete a rollback to pg is refused with the way back, and so the abort of a finished plan is moot:
    # the writer stays native
    assert cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d)).returncode != 0


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_complete_stage_refused_for_one_dataset_completes_the_other_and_an_abort_then_keeps_both_lossless(
    conn, dsn, settings
):
    """A declared Postgres-locked reader holds one dataset back (its rows stay); the other is completed. The abort
    that follows restores the held one's writer to pg with Postgres equal to Iceberg, and leaves the completed one
    native, the gate naming why (its Postgres rows are gone: the way back is a backfill from Iceberg)."""
    from lakehouse_dagster.flags.completed import completed_mark
    from lakehouse_dagster.flags.native import native_dataset_ids
    from lakehouse_dagster.flags.reader_datasets import declare
    from lakehouse_dagster.tracking import datasets

    from .native_helpers import SCHEMA, row, runbook_ready, table_rows

    ws = datasets.create_workspace(conn, "ws-complete-two")
    a = datasets.create_dataset(conn, ws, "a-small", SCHEMA)
    datasets.insert_rows(conn, a, [row(i) for i in range(3)])
    b = datasets.create_dataset(conn, ws, "b-read-by-objects", SCHEMA)
    datasets.insert_rows(conn, b, [row(i) for i in range(6)])
    for d in (a, b):
        runbook_ready(conn, dsn, settings, d)
    text = f"writer: sync.full\nstages:\n  - datasets: 2\n    within: {ws}\n    soak: 1s\n  - complete: true\n"
    # the reverse is on by default, so the flip may move b; its complete is what the locked reader holds back
    declare(conn, "objects.sync", dataset=b, note="the object sync reads it", actor="pytest")
    dry = actions.dry_run(conn, settings, text)  # the dry-run says so before the plan starts
    assert any("complete would refuse 1 of them" in n and "objects.sync" in n for n in dry.stages[1].notes)
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    with dg.DagsterInstance.ephemeral() as inst:
        driver = Driver(inst, dsn)
        driver.until(conn, plan_id, lambda p: p.stage == 1 and (p.blocking or "").startswith("approval"))
        actions.approve(conn, plan_id, actor="ops")
        p = driver.until(conn, plan_id, lambda p: p.state != "active")
        assert p.state == "paused" and p.reason.startswith("stage 2 (complete): 1 of 2 dataset(s) not complete")
        assert "objects.sync" in p.reason, p.reason
        assert completed_mark(conn, a).status == "complete" and completed_mark(conn, b) is None
        out = actions.abort(conn, settings.project, plan_id, actor="ops", reason="keep b on Postgres")
    assert out.restored is not None
    assert [r.split(":")[0] for r in out.restored.restored] == [f"dataset {b}"]
    (refused,) = out.restored.refused
    # the plan set a dataset override where none was: the restore clears it, and the gate refuses that for a
    # completed dataset, naming the way back
    assert refused.startswith(f"dataset {a}: stays iceberg_native: refused: clear sync.full: dataset {a}"), refused
    assert f"lakehouse backfill --dataset {a}; nothing written" in refused, refused
    assert native_dataset_ids(conn, [a, b]) == {a}
    pg = conn.execute(
        "select row_index, row_id::text, data->>'a' from dataset_rows where dataset_id = %s order by row_index", (b,)
    ).fetchall()
    iceberg = [(r["__row_index"], str(r["__row_id"]), str(r["a"])) for r in table_rows(settings, dsn, b)]
    assert pg == iceberg and len(pg) == 6
