"""The rollout_controller evaluated for real on a Dagster instance, every run it asks for executed in process: a
reader plan dataset → workspace → global with nobody touching it (and the dry-run's list equal to what it did); a
MISMATCH during the workspace stage aborts and restores every flag; an approval blocks; pause and resume; a closed
window keeps a stage waiting; an inconclusive stage pauses after its bound."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.shared.tags import PLAN, PLAN_STEP
from lakehouse_dagster.flags.overrides import list_overrides, set_override
from lakehouse_dagster.plans import actions, status, store

from .conftest import pg_dagster_instance
from .rollout_helpers import Driver, behind_the_mirrors_back, effective_modes, plan_audit, seed_mix


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _plan(s, *, approval: bool = False, stages: str | None = None) -> str:
    return f"""
reader: export.stream
mode: iceberg
note: fase1 by plan
stages:
  - datasets: 2
    soak: 1s
  - workspace: {s.ws}
    soak: 1s
    approval: {str(approval).lower()}
""" + (stages if stages is not None else "  - global: true\n    soak: 1s\n")


def _events(conn, plan_id) -> list[tuple]:
    return [(e["event"], e["stage"]) for e in store.events(conn, plan_id)]


def _done(conn, plan_id) -> list[tuple]:
    """What the run did, per flag change: (stage, scope, scope id, mode, the datasets it moved)."""
    return sorted(
        (s.stage, s.config["scope"], s.config["scope_id"], s.config["mode"], sorted(map(str, s.moved)))
        for s in store.steps(conn, plan_id, kind="flip")
        if s.status == "succeeded"
    )


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_reader_plan_runs_dataset_workspace_global_by_itself_as_the_dry_run_said(
    conn, dsn, settings, pg_admin_dsn, tmp_path
):
    s = seed_mix(conn, dsn, settings)
    text = _plan(s)
    dry = actions.dry_run(conn, settings, text)
    assert not dry.problems, dry.problems
    assert conn.execute("select count(*) from lakehouse_rollout_plans").fetchone()[0] == 0  # a dry-run writes nothing
    planned = sorted(
        (c.stage, c.scope, str(c.scope_id) if c.scope_id else None, c.mode, sorted(str(m.dataset_id) for m in c.moved))
        for c in dry.changes
    )
    # candidates: the two smallest datasets of the workspace the next stage widens to, with an ok verdict
    first = dry.stages[0].changes
    assert [c.label for c in first] == ["small", "mid"]
    assert [c.label for c in dry.stages[1].changes] == ["ws-main"]
    assert {m.name for m in dry.stages[1].changes[0].moved} == {"big", "wide"}  # small, mid moved already
    assert any("files" in x and "manifest" in x for x in dry.stages[1].changes[0].skipped)
    assert {m.name for m in dry.stages[2].changes[0].moved} == {"elsewhere"}
    assert "the larger of the plan's 1s and the project's 0s" in dry.stages[0].soak_text

    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    with pg_dagster_instance(pg_admin_dsn, tmp_path) as (inst, _):
        driver = Driver(inst, dsn)
        p = driver.until(conn, plan_id, lambda p: p.state != "active")
        runs = inst.get_runs(filters=dg.RunsFilter(tags={PLAN: str(plan_id)}))
        assert len(runs) == len(driver.launched) == 7 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        assert sorted(r.job_name for r in runs) == ["read_flip"] * 4 + ["rollout_analysis"] * 3
        assert {r.tags[PLAN_STEP] for r in runs} == {s_.step_key for s_ in store.steps(conn, plan_id)}
    assert p.state == "finished", (p.reason, p.blocking)
    assert _done(conn, plan_id) == planned  # the dry-run's list is what the run did
    events = _events(conn, plan_id)
    assert events[0] == ("started", 0) and events[-1] == ("finished", 2)
    assert [e for e in events if e[0] == "stage-passed"] == [
        ("stage-passed", 0),
        ("stage-passed", 1),
        ("stage-passed", 2),
    ]
    # every flag change audited with the plan id, once, in the plan's order
    audit = plan_audit(conn, plan_id)
    assert [(a[0], a[3], a[6]) for a in audit] == [("set", "dataset", "iceberg")] * 2 + [
        ("set", "workspace", "iceberg"),
        ("set", "global", "iceberg"),
    ]
    assert all(a[7].endswith(": fase1 by plan") for a in audit)
    modes = effective_modes(conn)
    assert all(modes[("read", "export.stream", d)] == "iceberg" for d in s.tabular.values())
    st = status.plan_status(conn, plan_id)
    assert (st.state, st.stage, st.next_action, st.datasets_moved) == ("finished", 3, "none: finished", 5)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_mismatch_in_the_workspace_stage_aborts_and_every_flag_is_as_before(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    # flags someone set before the plan, which it must leave (or put back) as they were
    set_override(conn, "read", "export.stream", "shadow", workspace=s.ws2, actor="ops")
    set_override(conn, "read", "graph.kuzu", "iceberg", dataset=s.tabular["small"], actor="ops")
    before_modes = effective_modes(conn)
    before_overrides = {(o.kind, o.name, o.scope, o.scope_id): o.mode for o in list_overrides(conn)}
    plan_id, _ = actions.start(conn, settings, _plan(s), actor="pytest")
    driver = Driver(instance, dsn)
    injected = []

    def tamper(p):
        if p.stage == 1 and p.phase == "soaking" and not injected:
            behind_the_mirrors_back(conn, s.tabular["big"])  # moved by the workspace stage
            injected.append(p.stage)

    p = driver.until(conn, plan_id, lambda p: p.state != "active", between=tamper)
    assert injected and p.state == "aborted"
    assert p.reason.startswith("stage 2: MISMATCH on 1 dataset(s) the plan moved or covers since it started: big (")
    assert "(rollout-analysis, " in p.reason  # found by the stage's analysis canary
    # every flag equals its value before the plan: the plan's keys restored, others untouched
    assert effective_modes(conn) == before_modes
    overrides = {(o.kind, o.name, o.scope, o.scope_id): o.mode for o in list_overrides(conn)}
    auto = {("read", "export.stream", "dataset", s.tabular["big"]): "off"}  # the canary's own auto-rollback
    assert overrides == before_overrides | auto
    restored = [a for a in plan_audit(conn, plan_id) if "aborted" in a[7]]
    assert sorted((a[0], a[3]) for a in restored) == [
        ("clear", "dataset"),
        ("clear", "dataset"),
        ("clear", "workspace"),
    ]
    assert all(a[7] == f"rollout {plan_id} aborted: {p.reason}" for a in restored)
    events = store.events(conn, plan_id)
    assert [(e["event"], e["severity"]) for e in events[-2:]] == [("aborting", "error"), ("aborted", "error")]
    assert "3 flag key(s) restored" in events[-1]["reason"]
    assert not [r for r in driver.launched if r.tags[PLAN_STEP].startswith("stage2")]  # global never started
    # aborting again is refused; an abort is over
    with pytest.raises(Exception, match="already"):
        actions.abort(conn, settings.project, plan_id, actor="pytest")


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_an_approval_stage_waits_for_approve(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    plan_id, _ = actions.start(conn, settings, _plan(s, approval=True, stages=""), actor="pytest")
    driver = Driver(instance, dsn)
    p = driver.until(conn, plan_id, lambda p: p.stage == 1 and (p.blocking or "").startswith("approval"))
    launched = len(driver.launched)
    for _ in range(3):
        driver.tick()
    assert len(driver.launched) == launched  # nothing moves without the approval
    assert store.get(conn, plan_id).phase == "waiting"
    assert not [o for o in list_overrides(conn) if o.scope == "workspace"]
    st = status.plan_status(conn, plan_id)
    assert st.next_action == f"lakehouse rollout approve {plan_id} (stage 2: workspace: {s.ws})"
    assert st.blocking == f"approval needed before stage 2: lakehouse rollout approve {plan_id}"
    assert [e["event"] for e in store.events(conn, plan_id)].count("approval-needed") == 1  # said once
    actions.approve(conn, plan_id, actor="lead", note="looks fine")
    with pytest.raises(Exception, match="not waiting for an approval"):
        actions.approve(conn, plan_id, actor="lead")
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished"
    row = store.stage_row(conn, plan_id, 1)
    assert (row.approved_by, row.approval_note) == ("lead", "looks fine") and row.approved_at < row.started_at


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_pause_holds_the_plan_and_resume_continues_it(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    plan_id, _ = actions.start(conn, settings, _plan(s, stages=""), actor="pytest")
    driver = Driver(instance, dsn)
    driver.until(conn, plan_id, lambda p: p.phase == "soaking")
    actions.pause(conn, plan_id, actor="ops", reason="lunch")
    launched = len(driver.launched)
    for _ in range(4):  # the 1 s soak ends meanwhile: a paused plan still does nothing
        driver.tick()
        driver.tick()
    assert len(driver.launched) == launched
    p = store.get(conn, plan_id)
    assert (p.state, p.phase, p.reason) == ("paused", "soaking", "paused by ops: lunch")
    assert status.plan_status(conn, plan_id).next_action == f"lakehouse rollout resume {plan_id} (or abort {plan_id})"
    with pytest.raises(Exception, match="not active"):
        actions.pause(conn, plan_id, actor="ops")
    actions.resume(conn, plan_id, actor="ops")
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished"
    assert [e["event"] for e in store.events(conn, plan_id) if e["event"] in ("paused", "resumed")] == [
        "paused",
        "resumed",
    ]


def test_a_closed_window_keeps_the_stage_waiting(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    now = dt.datetime.now(dt.UTC)
    opens, closes = now + dt.timedelta(hours=2), now + dt.timedelta(hours=3)
    window = f"daily {opens:%H:%M}-{closes:%H:%M} UTC"
    text = f"""
reader: graph.kuzu
stages:
  - datasets: 1
    window: {window}
  - workspace: {s.ws}
  - global: true
"""
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    driver = Driver(instance, dsn)
    for _ in range(3):
        driver.tick()
    assert driver.launched == []
    p = store.get(conn, plan_id)
    assert (p.state, p.stage, p.phase) == ("active", 0, "waiting")
    assert p.blocking == f"outside its window ({window}): stage 1 starts at {opens:%Y-%m-%d %H:%M} UTC"
    assert not list_overrides(conn)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_an_inconclusive_stage_pauses_after_its_bound_and_says_why(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings, unsynced=True)  # "late": never mirrored, no snapshot
    text = f"""
reader: studio.digest
stages:
  - datasets: 1
    soak: 1s
  - workspace: {s.ws}
    soak: 1s
    analysis: {{pause_after: 2s, retry_every: 1s}}
"""
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    driver = Driver(instance, dsn)
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "paused"
    assert p.reason.startswith("stage 2 inconclusive for ") and "late (" in p.reason and "no-snapshot" in p.reason
    ev = store.events(conn, plan_id)[-1]
    assert (ev["event"], ev["severity"], ev["actor"]) == ("paused", "warning", "rollout_controller")
    # the flag stays where the stage put it (inconclusive is not a failure): the operator decides
    assert any(o.scope == "workspace" and o.mode == "iceberg" for o in list_overrides(conn))
    # abort from a paused plan restores at once (no run in flight)
    out = actions.abort(conn, settings.project, plan_id, actor="ops", reason="no snapshot for late")
    assert out.restored is not None and len(out.restored.restored) == 2  # the dataset flip and the workspace's
    assert not list_overrides(conn)
    assert store.get(conn, plan_id).state == "aborted"


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_tick_that_dies_after_its_step_is_written_asks_again_under_the_same_run_key(
    conn, dsn, settings, instance, monkeypatch
):
    s = seed_mix(conn, dsn, settings)
    plan_id, _ = actions.start(conn, settings, _plan(s, stages=""), actor="pytest")
    driver = Driver(instance, dsn)
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "rollout-after-step:raise*1")
    res = driver.tick()  # the step rows commit, then the tick dies before the runs are asked for
    assert res.run_requests == [] and driver.launched == []
    steps = store.steps(conn, plan_id)
    assert [(x.status, x.run_id) for x in steps] == [("requested", None)] * 2
    assert store.get(conn, plan_id).phase == "flipping"
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    again = driver.tick(launch=False).run_requests
    assert sorted(r.run_key for r in again) == sorted(f"rollout:{plan_id}:{x.step_key}" for x in steps)
    assert store.steps(conn, plan_id) == steps  # nothing new written: the same steps, asked for again
    for req in again:
        driver.launch(req)
    second = driver.launch(again[0])  # the daemon never launches a run key twice; a re-execution from the UI might
    assert not second.success  # "nothing to flip": it changed nothing, and the step stays succeeded
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished"
    audit = plan_audit(conn, plan_id)
    assert [(a[0], a[3]) for a in audit] == [("set", "dataset"), ("set", "dataset"), ("set", "workspace")]


def test_a_stage_that_moves_no_dataset_still_raises_its_scope_like_flags_flip(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    text = f"reader: studio.training_pairs\nstages:\n  - datasets: 1\n    within: {s.ws2}\n  - workspace: {s.ws2}\n"
    dry = actions.dry_run(conn, settings, text)
    (change,) = dry.stages[1].changes  # ws2's one tabular dataset is moved by the first stage already ...
    assert change.moved == [] and (change.scope, change.scope_id) == ("workspace", s.ws2)
    assert dry.stages[1].notes == [  # ... and the workspace's own mode still rises, as `flags flip` does
        f"flags set studio.training_pairs iceberg --workspace {s.ws2} moves no existing dataset (each already "
        "resolves to iceberg); it raises the workspace scope's own mode from off, which datasets created there later get"
    ]
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    driver = Driver(instance, dsn)
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "finished", (p.reason, p.blocking)
    assert [r.job_name for r in driver.launched] == ["read_flip", "rollout_analysis", "read_flip"]
    assert ("workspace", s.ws2, "iceberg") in {(o.scope, o.scope_id, o.mode) for o in list_overrides(conn)}
    passed = [e["reason"] for e in store.events(conn, plan_id) if e["event"] == "stage-passed"]
    assert passed[1] == f"stage 2 (workspace: {s.ws2}) passed: it moved no Iceberg-tabular dataset"
