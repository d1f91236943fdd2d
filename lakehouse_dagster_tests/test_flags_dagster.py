"""Flags in Dagster: the flag_state / set_flag / clear_flag jobs, run for real on an ephemeral instance."""

from __future__ import annotations

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.flags.flags import clear_flag_job, flag_state_job, set_flag_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.flags.overrides import history, list_overrides, set_override
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, flag_tables, refusal


@pytest.fixture
def world(conn):
    ws = datasets.create_workspace(conn, "ws")
    return {"ws": ws, "d": datasets.create_dataset(conn, ws, "d", [{"name": "a", "type": "int64"}])}


def _run(job, dsn, config: dict, *, raise_on_error=True):
    op_name = next(iter(job.graph.node_dict))
    return job.execute_in_process(
        run_config={"ops": {op_name: {"config": config}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=raise_on_error,
    )


def test_flag_state_job_shows_effective_modes_as_metadata(conn, dsn, settings, world):
    set_override(conn, "read", "export.stream", "iceberg", workspace=world["ws"], actor="t")
    set_override(conn, "write", "sync.full", "iceberg_native", dataset=world["d"], note="fase4 canary", actor="t")
    result = _run(flag_state_job, dsn, {"dataset_id": str(world["d"])})
    state = {(s["kind"], s["name"]): (s["mode"], s["reason"]) for s in result.output_for_node("flag_state_op")}
    assert state[("read", "export.stream")] == ("iceberg", "workspace override")
    assert state[("write", "sync.full")] == ("iceberg_native", "dataset override")
    assert state[("read", "graph.kuzu")] == ("off", "registry default")
    (mat,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    meta = mat.event_specific_data.metadata
    modes = {(r.data["kind"], r.data["name"]): r.data for r in meta["effective_modes"].records}
    assert modes[("read", "export.stream")] == {
        "kind": "read",
        "name": "export.stream",
        "class": "EVENTUAL",
        "mode": "iceberg",
        "reason": "workspace override",
        "ceiling": "iceberg_only",
    }
    assert meta["native_writers"].value == ["sync.full"]
    assert "fase4 canary" in [r.data.get("note") for r in meta["overrides"].records]

    glob = _run(flag_state_job, dsn, {})  # no dataset: the global view
    assert {s["reason"] for s in glob.output_for_node("flag_state_op")} == {"registry default"}


def test_set_and_clear_jobs_write_override_and_audit(conn, dsn, settings, world):
    result = _run(
        set_flag_job,
        dsn,
        {
            "kind": "read",
            "name": "export.stream",
            "mode": "shadow",  # not a widen: no dataset flip needed first (the order holds for iceberg and up)
            "workspace_id": str(world["ws"]),
            "note": "fase1 ws rollout",
        },
    )
    assert result.output_for_node("set_flag_op")["after"] == "shadow"
    (o,) = list_overrides(conn)
    assert (o.kind, o.name, o.scope, o.scope_id, o.mode, o.note) == (
        "read",
        "export.stream",
        "workspace",
        world["ws"],
        "shadow",
        "fase1 ws rollout",
    )
    assert o.set_by.startswith("pytest (dagster run ")
    _run(clear_flag_job, dsn, {"kind": "read", "name": "export.stream", "workspace_id": str(world["ws"])})
    assert list_overrides(conn) == []
    assert [(e.action, e.before_mode, e.after_mode) for e in history(conn)] == [
        ("clear", "shadow", None),
        ("set", None, "shadow"),
    ]


REFUSED = [
    (
        {"kind": "read", "name": "studio.digest", "mode": "iceberg_only"},
        ["flags", "set", "studio.digest", "iceberg_only"],
    ),
    (
        {"kind": "write", "name": "row.edit", "mode": "iceberg_native"},
        ["write-flags", "set", "row.edit", "iceberg_native"],
    ),
    (
        {"kind": "read", "name": "export.stream", "mode": "iceberg", "dataset_id": "nope"},
        ["flags", "set", "export.stream", "iceberg", "--dataset", "nope"],
    ),
    (
        {"kind": "read", "name": "export.stream", "mode": "iceberg", "dataset_id": "{d}", "workspace_id": "{ws}"},
        ["flags", "set", "export.stream", "iceberg", "--dataset", "{d}", "--workspace", "{ws}"],
    ),
    ({"kind": "read", "name": "sync.full", "mode": "iceberg"}, ["flags", "set", "sync.full", "iceberg"]),
    (
        {
            "kind": "write",
            "name": "sync.full",
            "mode": "iceberg_native",
            "dataset_id": "123e4567-e89b-12d3-a456-426614174000",
        },
        ["write-flags", "set", "sync.full", "iceberg_native", "--dataset", "123e4567-e89b-12d3-a456-426614174000"],
    ),
    # the flip gates (flags/gates.py): a dataset never mirrored, read from Postgres, unchecked
    (
        {"kind": "write", "name": "sync.full", "mode": "iceberg_native", "workspace_id": "{ws}"},
        ["write-flags", "set", "sync.full", "iceberg_native", "--workspace", "{ws}"],
    ),
]


@pytest.mark.parametrize("config,cli_args", REFUSED, ids=[c["name"] + f"#{i}" for i, (c, _) in enumerate(REFUSED)])
def test_set_flag_job_refuses_exactly_like_the_cli(conn, dsn, settings, world, config, cli_args):
    fill = {k: str(v) for k, v in world.items()}
    config = {k: v.format(**fill) for k, v in config.items()}
    cli_args = [a.format(**fill) for a in cli_args]
    before = flag_tables(conn)
    result = _run(set_flag_job, dsn, config, raise_on_error=False)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    description = refusal(failure)
    proc = cli(*cli_args)
    assert proc.returncode != 0
    said = proc.stderr.strip()
    # the same reason; the CLI's "refused: " is the step's own "Refused: " in the UI (said once there)
    assert said.replace(": error: refused: ", ": error: ", 1) == f"lakehouse {cli_args[0]}: error: {description}"
    assert flag_tables(conn) == before


def test_code_location_loads_the_flag_jobs(conn, dsn, settings, world):
    """The Definitions the webserver loads carry the jobs, with the lakehouse resource bound from the env."""
    from lakehouse_dagster.dagster.definitions import defs

    loaded = defs()
    dg.Definitions.validate_loadable(loaded)  # what the webserver does: names unique across the repository
    for name in (
        "flag_state",
        "set_flag",
        "clear_flag",
        "write_flip_candidates",
        "read_flip",
        "ingest_bench",
        "write_flip",
    ):
        assert loaded.resolve_job_def(name).name == name
    result = loaded.resolve_job_def("set_flag").execute_in_process(
        run_config={"ops": {"set_flag_op": {"config": {"name": "graph.kuzu", "mode": "shadow", "note": "ui"}}}},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    assert [(o.name, o.scope, o.mode) for o in list_overrides(conn)] == [("graph.kuzu", "global", "shadow")]
