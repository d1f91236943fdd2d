"""The rollout_controller on a real Dagster instance: a reader plan dataset → workspace → global with nobody
touching it; a MISMATCH during the workspace stage aborts and restores every flag; approvals, pause/resume,
windows; the dry-run's list equals what the run did."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.plans import actions, store

from .rollout_helpers import Driver, effective_modes, plan_audit, seed_mix


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _plan(s, *, approval: bool = False) -> str:
    return f"""
reader: export.stream
mode: iceberg
stages:
  - datasets: 2
    soak: 1s
  - workspace: {s.ws}
    soak: 1s
    approval: {str(approval).lower()}
  - global: true
    soak: 1s
"""


def test_reader_plan_runs_dataset_workspace_global_by_itself(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    text = _plan(s)
    dry = actions.dry_run(conn, settings, text)
    assert not dry.problems, dry.problems
    plan_id, _ = actions.start(conn, settings, text, actor="pytest")
    driver = Driver(instance, dsn)
    p = driver.until(conn, plan_id, lambda p: p.state not in ("active",))
    assert p.state == "finished", (p.reason, p.blocking)
    print(plan_audit(conn, plan_id))
    print([r.job_name for r in driver.launched])
