"""Issue 42, item 6: a rollout plan cannot widen past a MISMATCH. Before: a MISMATCH on a dataset of a reader plan,
recorded during stage 2 before the stage's flip ended, was rolled back by the canary's auto-rollback (the dataset
pinned ``off``), so the stage's analysis canaried only the remaining datasets (all ok) and its incidents looked only
after the stage's flip: the plan flipped global and finished. Now a MISMATCH on any dataset the plan moved or its
stages cover, recorded at any moment since the plan started, aborts it and restores its flags — whoever rolled the
dataset back first (auto-rollback, an operator)."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.shared.tags import PLAN_STEP
from lakehouse_dagster.flags.gates import set_flag
from lakehouse_dagster.flags.overrides import list_overrides, set_override
from lakehouse_dagster.flags.registry import SERVABLE_READERS
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.plans import actions, analysis, status, store
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back

from .rollout_helpers import Driver, behind_the_mirrors_back, effective_modes, plan_audit, seed_mix


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _plan(reader: str, ws) -> str:
    return f"""
reader: {reader}
stages:
  - datasets: 2
    soak: 1s
  - workspace: {ws}
    soak: 1s
  - global: true
    soak: 1s
"""


def _scheduled_canary_mismatch(conn, dsn, settings, d) -> None:
    """A value changed behind the mirror's back, then the scheduled canary (not the plan's) finds the MISMATCH and
    its auto-rollback pins the dataset off for every reader serving it from Iceberg."""
    behind_the_mirrors_back(conn, d)
    report = run_canary_and_roll_back(
        conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(d)], smoke=True, source="schedule"
    )
    assert [r.verdict for r in report.results] == ["MISMATCH"]


def _overrides(conn) -> dict:
    return {(o.kind, o.name, o.scope, o.scope_id): o.mode for o in list_overrides(conn)}


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_mismatch_rolled_back_during_stage_2_aborts_the_plan_before_it_widens(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    before_modes = effective_modes(conn)
    before_overrides = _overrides(conn)
    plan_id, rendered = actions.start(conn, settings, _plan("studio.digest", s.ws), actor="pytest")
    assert [c.label for c in rendered.stages[0].changes] == ["small", "mid"]
    small = s.tabular["small"]
    driver = Driver(instance, dsn)
    injected = []

    def mismatch_in_stage_2(p):
        # stage 2 started: its flip run ran, the controller has not seen it end yet (the stage's soak not begun)
        if p.stage == 1 and p.phase == "flipping" and not injected:
            _scheduled_canary_mismatch(conn, dsn, settings, small)  # small: moved by stage 1
            injected.append(p.stage)

    p = driver.until(conn, plan_id, lambda p: p.state != "active", between=mismatch_in_stage_2)
    assert injected
    # auto-rollback pinned small off for the plan's reader (it rolled the dataset back first)
    pin = ("read", "studio.digest", "dataset", small)
    assert p.state == "aborted", (p.state, p.reason)  # before: "finished", global flipped
    assert p.reason.startswith("stage 2: MISMATCH on 1 dataset(s) the plan moved or covers since it started: small (")
    assert "MISMATCH (schedule, " in p.reason and f"({small})" in p.reason
    assert not [r for r in driver.launched if r.tags[PLAN_STEP].startswith("stage2")]  # global never started
    # every flag as before the plan, except the auto-rollback's pin, which the abort leaves where it is
    assert effective_modes(conn) == before_modes
    assert _overrides(conn) == before_overrides | {pin: "off"}
    restored = [a for a in plan_audit(conn, plan_id) if "aborted" in a[7]]
    assert sorted((a[0], a[3], a[4]) for a in restored) == [
        ("clear", "dataset", s.tabular["mid"]),
        ("clear", "workspace", s.ws),
    ]
    aborted = store.events(conn, plan_id)[-1]
    assert aborted["event"] == "aborted"
    assert (
        "2 flag key(s) restored to their value before the plan; 1 rolled back since the plan set it, left as it is"
        in aborted["reason"]
    )
    assert any(
        f"dataset {small}: off, rolled back since the plan set it: left as it is" == x
        for x in aborted["detail"]["unchanged"]
    )
    # rollout status says why, in plain words
    lines = status.plan_status(conn, plan_id).lines()
    assert any(line.startswith("  why: stage 2: MISMATCH on 1 dataset(s)") and "small (" in line for line in lines)


def test_a_mismatch_during_a_soak_aborts_even_once_the_dataset_is_repaired(conn, dsn, settings, instance):
    """Between stages (stage 1's soak): an operator rolls a dataset stage 2 covers back to off and repairs it (a full
    re-sync: the canary is ok again); stage 2's flip does not move it, and its analysis sees only ok datasets. The
    MISMATCH recorded during the plan still aborts it."""
    s = seed_mix(conn, dsn, settings)
    before_modes = effective_modes(conn)
    big = s.tabular["big"]  # in the workspace of stage 2; not moved by stage 1
    plan_id, _ = actions.start(conn, settings, _plan("export.stream", s.ws), actor="pytest")
    driver = Driver(instance, dsn)
    injected = []

    def mismatch_in_the_soak(p):
        if p.stage == 0 and p.phase == "soaking" and not injected:
            _scheduled_canary_mismatch(conn, dsn, settings, big)
            set_flag(conn, "read", "export.stream", "off", dataset=big, actor="ops", note="MISMATCH: held back")
            sync_dataset(dsn, load_catalog(settings, dsn), settings, big, mode="full")  # repaired
            report = run_canary_and_roll_back(
                conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(big)], smoke=True
            )
            assert [r.verdict for r in report.results] == ["ok"]
            injected.append(p.stage)

    p = driver.until(conn, plan_id, lambda p: p.state != "active", between=mismatch_in_the_soak)
    assert injected
    assert p.state == "aborted", (p.state, p.reason)
    # found while stage 2 waited to start: the plan never widened to the workspace holding big
    assert p.reason.startswith("stage 2: MISMATCH on 1 dataset(s) the plan moved or covers since it started: big (")
    assert not [r for r in driver.launched if r.tags[PLAN_STEP].startswith(("stage1", "stage2"))]
    assert [(a[0], a[3]) for a in plan_audit(conn, plan_id)] == [("set", "dataset")] * 2 + [("clear", "dataset")] * 2
    assert effective_modes(conn) == before_modes


def test_a_writer_plan_waiting_for_approval_aborts_on_a_mismatch_an_operator_rolled_back_first(
    conn, dsn, settings, instance
):
    """The rule holds for writer plans: stage 2 waits for its approval; an operator rolls the writer of the dataset
    stage 1 moved back to pg, a canary finds it MISMATCH, and the stage is approved. Before: nothing looked while the
    stage waited, and the workspace stage's analysis canaried only the other datasets. Now the plan aborts before the
    workspace flip (it never widens), restores its flags, and leaves the operator's rollback as it is."""
    s = seed_mix(conn, dsn, settings)
    for r in SERVABLE_READERS:
        set_override(conn, "read", r.name, "iceberg", actor="ops")
    set_override(conn, "write", "sync.full", "pg", dataset=s.manifest, actor="ops")  # file-backed: the gates' advice
    text = f"writer: sync.full\nstages:\n  - datasets: 1\n    soak: 1s\n  - workspace: {s.ws}\n    approval: true\n"
    plan_id, rendered = actions.start(conn, settings, text, actor="pytest")
    (first,) = rendered.stages[0].changes
    small = s.tabular["small"]
    assert first.label == "small"
    driver = Driver(instance, dsn)
    driver.until(conn, plan_id, lambda p: p.stage == 1 and (p.blocking or "").startswith("approval"))
    before_workspace = _overrides(conn)
    set_flag(conn, "write", "sync.full", "pg", dataset=small, actor="ops", note="rolled back by hand")
    _scheduled_canary_mismatch(conn, dsn, settings, small)
    actions.approve(conn, plan_id, actor="lead")  # approved by someone who did not see the MISMATCH
    p = driver.until(conn, plan_id, lambda p: p.state != "active")
    assert p.state == "aborted", (p.state, p.reason)
    assert p.reason.startswith("stage 2: MISMATCH on 1 dataset(s) the plan moved or covers since it started: small (")
    assert [r.job_name for r in driver.launched] == ["write_flip", "rollout_analysis"]  # the workspace never flipped
    overrides = _overrides(conn)
    assert overrides[("write", "sync.full", "dataset", small)] == "pg"  # the operator's rollback stays
    assert not [k for k in overrides if k[:3] == ("write", "sync.full", "workspace")]
    assert {k: v for k, v in overrides.items() if k[0] == "write"} == {
        k: v for k, v in before_workspace.items() if k[0] == "write"
    } | {("write", "sync.full", "dataset", small): "pg"}
    aborted = store.events(conn, plan_id)[-1]
    assert aborted["event"] == "aborted" and "1 rolled back since the plan set it, left as it is" in aborted["reason"]
    assert aborted["detail"]["next"]  # what the writer's rollback leaves to do is still said


def test_what_the_mismatch_rule_counts(conn, dsn, settings):
    """``analysis.mismatches`` over the plan's history: a MISMATCH from before the plan is not counted; one since
    counts once a started stage covers its dataset (or the stage about to start does), not before; a reverse copy's
    never (it was repaired and rolls nothing back)."""
    s = seed_mix(conn, dsn, settings)
    small, mid, big, elsewhere = (s.tabular[n] for n in ("small", "mid", "big", "elsewhere"))
    text = f"reader: export.stream\nstages:\n  - datasets: 1\n  - workspace: {s.ws}\n  - global: true\n"
    plan_id, rendered = actions.start(conn, settings, text, actor="pytest")
    assert [c.label for c in rendered.stages[0].changes] == ["small"]

    def verdict(d, *, ago: str = "0 seconds", detail: str = "{}") -> None:
        conn.execute(
            "insert into lakehouse_read_parity (dataset_id, verdict, source, checked_at, detail)"
            " values (%s, 'MISMATCH', 'schedule', now() - %s::interval, %s::jsonb)",
            (d, ago, detail),
        )

    verdict(small, ago="1 hour")  # before the plan started
    verdict(big)  # since: in the workspace of stage 2, not started yet
    verdict(elsewhere)  # since: only the global stage covers it
    verdict(mid, detail='{"reverse": {"position_before": 3}}')  # a reverse copy's
    assert analysis.mismatches(conn, plan_id) is None
    assert analysis.mismatches(conn, plan_id, [("dataset", small)]) is None  # stage 1 about to start
    found = analysis.mismatches(conn, plan_id, [("workspace", s.ws)])  # stage 2 about to start
    assert found is not None and found.outcome == analysis.FAIL
    assert found.reason.startswith(f"MISMATCH on 1 dataset(s) the plan moved or covers since it started: big ({big}):")
    wide = analysis.mismatches(conn, plan_id, [("global", None)])  # stage 3 about to start
    assert wide is not None and wide.reason.startswith("MISMATCH on 2 dataset(s)") and "elsewhere (" in wide.reason
    # stage 2 started (its flip step written): covered from now on, whether it moved big or not (big rolled back)
    config = {"scope": "workspace", "scope_id": str(s.ws)}
    store.add_step(conn, plan_id, "stage1:flip:x", 1, "flip", "read_flip", config, [])
    assert analysis.mismatches(conn, plan_id) == found


def test_a_mismatch_recorded_while_a_crashed_tick_left_its_flips_unasked_aborts_before_they_run(
    conn, dsn, settings, monkeypatch
):
    """Found by the lifecycle model (plans as moves, the controller interrupted at ``rollout-after-step``): a tick
    commits stage 1's step rows and dies before asking for the flip runs; a MISMATCH is then recorded on the dataset
    the stage moves (auto-rollback pins it off). Before: the next tick found the flips 'asked before, not launched'
    and asked for them again — the plan widened past the MISMATCH (the flipping phase never looked). Now it aborts
    and asks for nothing."""
    from lakehouse_dagster.core.failpoints import FailpointError
    from lakehouse_dagster.plans import controller

    s = seed_mix(conn, dsn, settings)
    plan_id, rendered = actions.start(conn, settings, _plan("export.stream", s.ws), actor="pytest")
    (first, *_) = rendered.stages[0].changes
    small = s.tabular[first.label]
    monkeypatch.setenv("LAKEHOUSE_FAILPOINT", "rollout-after-step:raise")
    with pytest.raises(FailpointError):
        controller.advance(conn, settings, plan_id, lambda _: {})
    monkeypatch.delenv("LAKEHOUSE_FAILPOINT")
    assert store.get(conn, plan_id).phase == "flipping"
    _scheduled_canary_mismatch(conn, dsn, settings, small)
    asks, _ = controller.advance(conn, settings, plan_id, lambda _: {})
    assert [a.job for a in asks] == []  # before: the stage's read_flip asked again
    p = store.get(conn, plan_id)
    assert p.state == "aborted", (p.state, p.reason)
    assert p.reason.startswith("stage 1: MISMATCH on 1 dataset(s) the plan moved or covers since it started")
