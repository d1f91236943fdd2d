"""Every runbook step is a job (issue 22): the canary, read and backfill jobs run for real (execute_in_process against
real Postgres and real Iceberg tables) and call what their `lakehouse` commands call; every table a runbook job shows
is a TableMetadataValue with one log line per row, never markdown behind a button."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from lakehouse_dagster.dagster.defs.flags.flags import flag_state_job, write_flip_candidates_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.canary import canary_job, read_job
from lakehouse_dagster.dagster.defs.runbooks.rollback import backfill_job, write_rollback_job
from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, refusal
from .native_helpers import native_write, ready_native, row
from .test_read_flip import _behind_the_mirrors_back


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _run(job, dsn, instance, config: dict):
    op_name = next(iter(job.graph.node_dict))
    return job.execute_in_process(
        run_config={"ops": {op_name: {"config": config}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=instance,
        raise_on_error=False,
    )


def _synced(conn, dsn, settings, ws, name: str, rows: int = 3):
    d = datasets.create_dataset(conn, ws, name, [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}])
    datasets.insert_rows(conn, d, [{"a": i, "s": f"v{i}"} for i in range(rows)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    return d


def _meta(result, op: str) -> dict:
    (mat,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT" and e.step_key == op]
    return mat.event_specific_data.metadata


def _logs(instance, result) -> list[str]:
    return [r.user_message for r in instance.all_logs(result.run_id) if r.user_message]


def _records(value) -> list[dict]:
    assert isinstance(value, dg.TableMetadataValue), type(value)
    return [r.data for r in value.records]


def test_the_canary_job_records_verdicts_like_the_cli_and_stops_on_a_mismatch(conn, dsn, settings, instance):
    ws = datasets.create_workspace(conn, "sales")
    a, b = _synced(conn, dsn, settings, ws, "orders"), _synced(conn, dsn, settings, ws, "customers")
    result = _run(canary_job, dsn, instance, {"datasets": [str(a), str(b)], "smoke": True})
    assert result.success
    meta = _meta(result, "canary_op")
    rows = {r["name"]: r for r in _records(meta["verdicts"])}
    assert {n: (r["verdict"], r["smoke"], r["pg_rows"]) for n, r in rows.items()} == {
        "orders": ("ok", "match", 3),
        "customers": ("ok", "match", 3),
    }
    logs = _logs(instance, result)
    assert sum(m.startswith("canary: name=orders, ") for m in logs) == 1  # one log line per row
    assert meta["verdict_ok"].value == 2
    recorded = conn.execute("select count(*) from lakehouse_read_parity where run_id = %s", (result.run_id,))
    assert recorded.fetchone()[0] == 2

    # a caught-up dataset that disagrees, read from Iceberg: the job fails with the reason, auto-rollback turns the
    # reader off (the CLI's own function: run_canary_and_roll_back)
    set_override(conn, "read", "export.stream", "iceberg", dataset=b, actor="pytest")
    _behind_the_mirrors_back(conn, b)
    result = _run(canary_job, dsn, instance, {"datasets": [str(b)]})
    assert not result.success
    (failure,) = result.get_step_failure_events()
    assert refusal(failure).startswith("MISMATCH on a caught-up dataset: STOP, do not flip") and "customers" in refusal(
        failure
    )
    assert any("auto-rollback: reader export.stream iceberg → off" in m for m in _logs(instance, result))
    assert FlagResolver(conn, ttl_seconds=0).resolve("read", "export.stream", b).mode == "off"
    assert cli("canary", "--smoke", "--dataset", str(b)).returncode == 1  # the CLI says the same


def test_the_read_job_shows_the_routers_decision_once_and_the_rows_as_a_table(conn, dsn, settings, instance):
    ws = datasets.create_workspace(conn, "sales")
    d = _synced(conn, dsn, settings, ws, "orders")
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="pytest")
    result = _run(read_job, dsn, instance, {"reader": "export.stream", "dataset_id": str(d), "limit": 2})
    assert result.success
    meta = _meta(result, "read_op")
    assert (meta["source"].value, meta["reason"].value, meta["rows_read"].value) == ("iceberg", "iceberg@eventual", 2)
    rows = _records(meta["rows"])
    assert len(rows) == 2 and set(rows[0]) == {"__row_index", "__row_id", "__created_at", "a", "s"}
    assert isinstance(rows[0]["a"], int)
    assert sum("[read-router]" in m for m in _logs(instance, result)) == 1
    tags = instance.get_run_by_id(result.run_id).tags
    assert (tags["lakehouse/reader"], tags["lakehouse/dataset_name"]) == ("export.stream", "orders")
    # an unknown dataset: refused in one line
    bad = _run(read_job, dsn, instance, {"reader": "export.stream", "dataset_id": "nope"})
    assert not bad.success and "is not a valid UUID" in refusal(bad.get_step_failure_events()[0])


def test_the_backfill_job_copies_the_iceberg_only_rows_like_the_cli(conn, dsn, settings, instance):
    d = ready_native(conn, dsn, settings, "sync.append")
    set_reverse(conn, False, dataset=d, note="the backfill's path", actor="pytest")  # (on: no backfill needed)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 12)], start=6)
    refused = _run(backfill_job, dsn, instance, {"dataset_id": str(d)})  # the writer is still native
    assert not refused.success and "roll the writer back first" in refusal(refused.get_step_failure_events()[0])
    rolled = _run(write_rollback_job, dsn, instance, {"writer": "sync.append", "dataset_id": str(d)})
    assert rolled.success
    (only,) = _records(_meta(rolled, "write_rollback_op")["iceberg_only"])
    assert (only["name"], only["rows_only_in_iceberg"], only["native_snapshots"]) == ("orders", 6, 1)
    result = _run(backfill_job, dsn, instance, {"dataset_id": str(d)})
    assert result.success
    meta = _meta(result, "backfill_op")
    assert (meta["copied"].value, meta["pg_rows"].value) == (6, 12)
    assert any("6 row(s) copied into dataset_rows (identity preserved)" in m for m in _logs(instance, result))
    again = json.loads(cli("backfill", "--dataset", str(d), "--json", check=True).stdout)
    assert again["nothing_to_do"] is True


def test_the_flip_state_and_candidate_jobs_show_tables_not_markdown(conn, dsn, settings, instance):
    ws = datasets.create_workspace(conn, "sales")
    a, _b = _synced(conn, dsn, settings, ws, "a"), _synced(conn, dsn, settings, ws, "b")
    set_override(conn, "read", "export.stream", "iceberg", dataset=a, actor="pytest")
    flip = _run(read_flip_job, dsn, instance, {"reader": "export.stream", "workspace_id": str(ws), "sample": 0})
    assert flip.success
    meta = _meta(flip, "read_flip_preflight")
    assert [(r["name"], r["verdict"]) for r in _records(meta["preflight"])] == [("b", "ok")]
    assert {(r["group"], r["name"]) for r in _records(meta["scope"])} == {("moves", "b"), ("already", "a")}
    logs = _logs(instance, flip)
    assert any(m.startswith("preflight: verdict=ok, reused=False, name=b") for m in logs)
    assert any(m.startswith("scope: group=already, name=a") for m in logs)
    assert [r["reason"] for r in _records(_meta(flip, "read_flip_verify")["verify"])] == ["iceberg@eventual"]

    state = _run(flag_state_job, dsn, instance, {"dataset_id": str(a)})
    smeta = _meta(state, "flag_state_op")
    assert ("read", "export.stream", "iceberg") in {
        (r["kind"], r["name"], r["mode"]) for r in _records(smeta["effective_modes"])
    }
    assert {(r["scope"], r["mode"]) for r in _records(smeta["overrides"])} == {
        ("dataset", "iceberg"),
        ("workspace", "iceberg"),
    }

    cands = _run(write_flip_candidates_job, dsn, instance, {})
    rows = _records(_meta(cands, "write_flip_candidates_op")["candidates"])
    assert {r["name"] for r in rows} == {"a", "b"} and all(isinstance(r["ready"], bool) for r in rows)
    assert sum(m.startswith("candidate: verdict=SAFE") for m in _logs(instance, cands)) == 2
