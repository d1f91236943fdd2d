"""Issue 32, defect 3: a stage paused at its max_datasets, resumed, then aborted leaves every flag as before the plan.
Before: a step written "skipped" (its scope moved nothing and was already at the mode) stayed when the pause deleted
the stage's requested steps; on resume the same change needed a run, which was asked for under the stale row, so the
stage could pass with no analysis of what it moved, and the abort's restore skipped the key it had flipped."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.flags.overrides import clear_override, list_overrides, set_override
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity import canary
from lakehouse_dagster.plans import actions, store

from .rollout_helpers import Driver, dataset, seed_mix


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _plan_keys(conn, s) -> dict:
    """The overrides of the keys the plan sets (the workspaces' export.stream)."""
    return {
        (o.scope, o.scope_id): o.mode
        for o in list_overrides(conn)
        if o.name == "export.stream" and o.scope == "workspace" and o.scope_id in (s.ws, s.ws2)
    }


def test_pause_at_max_datasets_then_resume_then_abort_leaves_every_flag_as_before(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    more = dataset(conn, dsn, settings, s.ws2, "more", 4)  # ws2: "elsewhere" flipped by hand already, "more" not
    canary.run_canary(conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(more)])
    set_override(conn, "read", "export.stream", "iceberg", dataset=s.tabular["elsewhere"], actor="ops")
    held = [s.tabular[n] for n in ("mid", "big", "wide")]
    for d in held:  # so that, when the plan is written, its stage moves 2 datasets (more, small): under the cap
        set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="ops")
    text = f"reader: export.stream\nstages:\n  - workspace: [{s.ws2}, {s.ws}]\n    max_datasets: 3\n    soak: 1s\n"
    plan_id, rendered = actions.start(conn, settings, text, actor="pytest")
    assert [len(c.moved) for c in rendered.stages[0].changes] == [1, 1]
    before = _plan_keys(conn, s)
    assert before == {}
    # before the stage starts: ws2 already serves iceberg by an override of its own (its flip would move nothing and
    # raise nothing: "skipped"), and ws's datasets are no longer held, so the stage would move 4 > 3: it pauses
    set_override(conn, "read", "export.stream", "iceberg", workspace=s.ws2, actor="ops")
    for d in held:
        clear_override(conn, "read", "export.stream", dataset=d, actor="ops")
    driver = Driver(instance, dsn)
    driver.tick()
    p = store.get(conn, plan_id)
    assert p.state == "paused" and "above its max_datasets 3" in (p.reason or ""), p.reason
    assert driver.launched == []
    # while paused: ws2's own override is cleared again, and ws's datasets held again; resume
    clear_override(conn, "read", "export.stream", workspace=s.ws2, actor="ops")
    for d in held:
        set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="ops")
    actions.resume(conn, plan_id, actor="ops")
    p = driver.until(conn, plan_id, lambda p: p.phase in ("soaking", "analyzing") or p.state != "active")
    assert p.state == "active", (p.state, p.reason)
    assert ("workspace", s.ws2) in _plan_keys(conn, s)  # the resumed stage flipped ws2 itself
    flips = {st.config["scope_id"]: st for st in store.steps(conn, plan_id, kind="flip")}
    assert flips[str(s.ws2)].status == "succeeded" and not (flips[str(s.ws2)].detail or "").startswith("skipped")
    assert flips[str(s.ws2)].moved == [more]  # what the analysis covers
    out = actions.abort(conn, settings.project, plan_id, actor="ops", reason="pause, resume, abort")
    assert out is not None
    p = store.get(conn, plan_id)
    assert p.state == "aborted", (p.state, p.reason)
    assert _plan_keys(conn, s) == before  # every key the plan set is back to its value before the plan
