"""A writer plan's stage whose reverse mirror cannot be armed (found by the lifecycle model, issue 42, seed of the CI
run): the plan rendered a read-flipped dataset as its candidate; before the stage started, another writer went
native on it and ``complete`` began (the reverse off, kept off by the lifecycle until a restore). Arming the reverse
before the flip was refused by the lifecycle, and the refusal escaped the controller's step: the plan was retried
every tick for ever, neither paused nor aborted, with nothing said on the plan."""

from __future__ import annotations

from lakehouse_dagster.flags.lifecycle_facts import derive
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.registry import WRITE
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lifecycle import COMPLETE_VERB, transition
from lakehouse_dagster.plans import actions, controller, store
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.tracking import datasets

from .native_helpers import SCHEMA, row, runbook_ready


def test_a_writer_stage_whose_reverse_the_lifecycle_keeps_off_pauses_the_plan_saying_why(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "ws-arm")
    d = datasets.create_dataset(conn, ws, "ledger", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(3)])
    runbook_ready(conn, dsn, settings, d)
    plan_id, _ = actions.start(conn, settings, "writer: sync.full\nstages:\n  - datasets: 1\n", actor="pytest")
    # meanwhile: another writer native on it, and complete started (the reverse off at dataset scope)
    set_override(conn, WRITE, "sync.append", "iceberg_native", dataset=d, actor="pytest")
    with transition(conn, COMPLETE_VERB, dataset_ids=[d], derive=derive, actor="pytest", what="complete"):
        cp._start(conn, d, cp.Checked(d, "ledger", (), None, 0, None), None, "pytest", None)

    asks, _ = controller.advance(conn, settings, plan_id, lambda _: {})

    assert asks == []
    p = store.get(conn, plan_id)
    assert p.state == "paused", p
    assert "reverse" in p.reason and str(d) in p.reason and "completing" in p.reason, p.reason
    assert FlagResolver(conn, ttl_seconds=0).resolve(WRITE, "sync.full", d).mode == "pg"  # nothing flipped
    armed = conn.execute("select count(*) from lakehouse_reverse_audit where note like %s", (f"rollout {plan_id}%",))
    assert armed.fetchone()[0] == 0  # nothing armed either
    assert store.steps(conn, plan_id, 0, "flip", with_moved=False) == []  # nothing of the stage stays asked
