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
from lakehouse_dagster.flags.overrides import list_overrides
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.plans import actions, status, store
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
    assert "1 left as rolled back since the plan set it" in aborted["reason"]
    assert any(f"dataset {small}: off, rolled back since the plan set it" in x for x in aborted["detail"]["unchanged"])
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
    assert p.reason.startswith("stage ")
    assert "MISMATCH on 1 dataset(s) the plan moved or covers since it started: big (" in p.reason
    assert not [r for r in driver.launched if r.tags[PLAN_STEP].startswith("stage2")]  # global never started
    assert effective_modes(conn) == before_modes
