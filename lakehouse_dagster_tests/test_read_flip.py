"""The read-flip runbook as a command and a job: canary preflight, gated flip, verify through the router."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job
from lakehouse_dagster.flags.overrides import list_overrides, parse_scope, set_override
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.runbooks import flip
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, flag_tables, refusal

SCHEMA = [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}]


@pytest.fixture
def ws(conn):
    return datasets.create_workspace(conn, "ws")


def _dataset(conn, dsn, settings, ws, name: str, *, synced: bool = True) -> uuid.UUID:
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"a": i, "s": f"{name}-{i}"} for i in range(6)])
    if synced:
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    return d


def _behind_the_mirrors_back(conn, d: uuid.UUID) -> None:
    """Change a value without bumping the version: the mirror thinks Iceberg is caught up."""
    with conn.transaction():
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{a}', '-1') where dataset_id = %s and row_index = 2", (d,)
        )
        conn.execute("alter table dataset_rows enable trigger user")


def _flip(*args: str):
    proc = cli("flags", "flip", *args, "--json")
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def test_flip_one_dataset_checks_flips_and_verifies(conn, dsn, settings, ws):
    d = _dataset(conn, dsn, settings, ws, "good")
    code, out, err = _flip("export.stream", "--dataset", str(d), "--note", "fase1 canary")
    assert code == 0, err
    assert [(c["verdict"], c["reused"]) for c in out["preflight"]] == [("ok", False)]
    assert out["flipped"] and out["change"]["after"] == "iceberg"
    (v,) = out["verify"]
    assert (v["source"], v["reason"], v["fallback_error"]) == ("iceberg", "iceberg@eventual", None)
    assert "reason=iceberg@eventual" in err  # the router's own log line
    (o,) = list_overrides(conn)
    assert (o.name, o.scope, o.scope_id, o.mode, o.note) == ("export.stream", "dataset", d, "iceberg", "fase1 canary")
    # the verdict is recorded where the runbook's monitoring looks
    assert conn.execute("select verdict, source from lakehouse_read_parity where dataset_id = %s", (d,)).fetchall() == [
        ("ok", "rollout")
    ]


def test_a_mismatch_stops_the_flip_before_anything_is_written(conn, dsn, settings, ws):
    d = _dataset(conn, dsn, settings, ws, "drifted")
    _behind_the_mirrors_back(conn, d)
    before = flag_tables(conn)
    code, out, _ = _flip("graph.kuzu", "--dataset", str(d))
    assert code == 1 and out["flipped"] is False
    (c,) = out["preflight"]
    assert c["verdict"] == "MISMATCH" and "differing row indexes [2]" in c["detail"]
    assert flag_tables(conn) == before
    # and a flip is only ever upward: rollback is set/clear
    proc = cli("flags", "flip", "graph.kuzu", "off", "--dataset", str(d))
    assert proc.returncode == 2 and "a read flip raises graph.kuzu to iceberg or iceberg_only" in proc.stderr


def _run(config: dict, dsn: str):
    return read_flip_job.execute_in_process(
        run_config={"ops": {"read_flip_preflight": {"config": config}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_job_widens_to_a_workspace_reusing_fresh_verdicts_and_leaving_unsynced_datasets_inert(conn, dsn, settings, ws):
    good = _dataset(conn, dsn, settings, ws, "good")
    fresh = _dataset(conn, dsn, settings, ws, "unsynced", synced=False)
    assert _flip("studio.digest", "--dataset", str(good))[0] == 0  # step 3: one dataset first
    result = _run({"reader": "studio.digest", "workspace_id": str(ws), "note": "fase1 ws rollout"}, dsn)
    assert result.success
    pre = result.output_for_node("read_flip_preflight")["preflight"]
    got = {c.name: (c.verdict, c.reused) for c in pre.checked}
    # the dataset override already puts "good" on iceberg, so the workspace flip moves only "unsynced"
    assert got == {"unsynced": ("no-snapshot", False)}
    verified = {v["dataset_id"]: v["reason"] for v in result.output_for_node("read_flip_verify")}
    assert verified == {str(fresh): "pg@no-snapshot"}  # inert: Postgres serves until the mirror runs
    overrides = {(o.scope, o.scope_id): (o.mode, o.note) for o in list_overrides(conn)}
    assert overrides[("workspace", ws)] == ("iceberg", "fase1 ws rollout")
    assert overrides[("dataset", good)][0] == "iceberg"
    # a global flip: a dataset pinned by its own override is not moved; a recent ok verdict is reused
    # (sample 0: no spot check of recorded verdicts, test_widen_rules.py covers the sample)
    ws2 = datasets.create_workspace(conn, "ws2")
    twin = _dataset(conn, dsn, settings, ws2, "twin")
    assert _flip("graph.kuzu", "--dataset", str(twin))[0] == 0
    set_override(conn, "read", "graph.kuzu", "off", dataset=twin, actor="pytest")  # (back, by hand)
    set_override(conn, "read", "graph.kuzu", "iceberg_only", workspace=ws2, actor="pytest")  # the order: a workspace
    result = _run({"reader": "graph.kuzu", "mode": "iceberg_only", "note": "fase1 global", "sample": 0}, dsn)
    assert result.success
    got = {c.name: (c.verdict, c.reused) for c in result.output_for_node("read_flip_preflight")["preflight"].checked}
    assert got == {"good": ("ok", True), "unsynced": ("no-snapshot", False)}  # "twin" pinned off: not moved


def test_job_stops_on_mismatch_and_the_flip_op_never_runs(conn, dsn, settings, ws):
    good = _dataset(conn, dsn, settings, ws, "good")
    bad = _dataset(conn, dsn, settings, ws, "drifted")
    _behind_the_mirrors_back(conn, bad)
    set_override(conn, "read", "export.stream", "iceberg", dataset=good, actor="pytest")  # the order: a dataset first
    before = flag_tables(conn)
    result = _run({"reader": "export.stream", "workspace_id": str(ws)}, dsn)
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert failure.step_key == "read_flip_preflight"
    message = refusal(failure)
    assert message.startswith("STOP: do not flip export.stream to iceberg") and f"drifted ({bad}): MISMATCH" in message
    assert {e.step_key for e in result.all_events if e.is_step_success} == set()
    assert flag_tables(conn) == before


def test_verify_reports_a_fallback_with_the_rollback_command(conn, dsn, settings, ws):
    d = _dataset(conn, dsn, settings, ws, "broken")
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="pytest")
    for f in Path(settings.catalog.warehouse.removeprefix("file://")).rglob("*.parquet"):
        f.unlink()  # the snapshot's data files are gone: an Iceberg read fails
    (v,) = flip.verify(conn, load_catalog(settings, dsn), settings, "export.stream", [d])
    assert v.reason == "pg@fallback" and v.source == "pg" and v.fallback_error
    scope = parse_scope(d, None)
    assert f"lakehouse flags set export.stream off --dataset {d}" in flip.fallback_message("export.stream", scope, [v])


# --- the writer flip ---------------------------------------------------------------------------------------

SERVABLE = ["export.stream", "graph.kuzu", "studio.digest", "studio.training_pairs", "studio.preview"]


def _read_flipped(conn, d) -> None:
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, note="fase1", actor="pytest")


def test_write_flip_checks_parity_afresh_flips_and_verifies(conn, dsn, settings, ws):
    d = _dataset(conn, dsn, settings, ws, "ready")
    _read_flipped(conn, d)  # no canary has run yet: the preflight runs it, the gate then sees a fresh ok
    proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d), "--note", "fase4 canary", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert [(c["verdict"], c["reused"]) for c in out["preflight"]] == [("ok", False)]
    (v,) = out["verify"]
    assert (v["writer_mode"], v["mirror_skips"], v["row_count_matches"], v["problems"]) == (
        "iceberg_native",
        True,
        True,
        [],
    )
    assert v["latest_sync"].startswith("succeeded mirror rows=6")


def test_write_flip_stops_on_a_mismatch_and_the_gates_still_name_what_is_missing(conn, dsn, settings, ws):
    drifted = _dataset(conn, dsn, settings, ws, "drifted")
    _read_flipped(conn, drifted)
    _behind_the_mirrors_back(conn, drifted)
    before = flag_tables(conn)
    # (auto-rollback off: it would turn the drifted dataset's readers off; test_auto_rollback.py covers that)
    proc = cli(
        "write-flags", "flip", "sync.append", "--dataset", str(drifted), env={"LAKEHOUSE_AUTO_ROLLBACK": "false"}
    )
    assert proc.returncode == 1 and "STOP: do not flip sync.append to iceberg_native" in proc.stdout
    assert flag_tables(conn) == before
    unread = _dataset(conn, dsn, settings, ws, "unread")  # parity ok, but its readers are on Postgres
    proc = cli("write-flags", "flip", "sync.append", "--dataset", str(unread))
    assert proc.returncode == 6 and "readers still on Postgres for it" in proc.stderr
    assert flag_tables(conn) == before


def test_write_flip_job_for_one_dataset(conn, dsn, settings, ws):
    from lakehouse_dagster.dagster.defs.runbooks.rollout import write_flip_job

    d = _dataset(conn, dsn, settings, ws, "ready")
    _read_flipped(conn, d)
    result = write_flip_job.execute_in_process(
        run_config={
            "ops": {
                "write_flip_preflight": {
                    "config": {"writer": "cdc.append", "dataset_id": str(d), "note": "fase4 canary"}
                }
            }
        },
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    (v,) = result.output_for_node("write_flip_verify")
    assert v["writer_mode"] == "iceberg_native" and v["mirror_skips"] and v["problems"] == []
    (o,) = [o for o in list_overrides(conn) if o.kind == "write"]
    assert (o.name, o.scope_id, o.mode, o.note) == ("cdc.append", d, "iceberg_native", "fase4 canary")
    assert o.set_by.startswith("pytest (dagster run ")
