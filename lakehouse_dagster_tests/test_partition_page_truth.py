"""A dataset's partition page never shows an old mode or verdict as current (issue 33, item 1): every change of its
modes and verdict, whatever scope or path made it — the CLI, a job, a rollout stage — is on the page after one
recorder tick. The page is read back as the UI reads it: GraphQL's ``assetEventHistory`` of the partition (the
query of Dagster's partition detail, AssetPartitionDetailQuery), its newest event, on a real Dagster instance on
Postgres storage with the project's definitions loaded, the lakehouse_recorder sensor ticked as the daemon does."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest

from lakehouse_dagster.cli.main import main as cli_main
from lakehouse_dagster.dagster.defs.flags.flags import set_flag_job
from lakehouse_dagster.dagster.defs.parity.canary_batch import parity_canary_batch_job
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.flags.incidents import record_fallback
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.plans import actions, store
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.tracking import datasets

from .conftest import pg_dagster_instance
from .native_helpers import SCHEMA, SERVABLE, pg_source_table, row
from .rollout_helpers import Driver, seed_mix
from .test_recorder import Recorder

PAGE_Q = """
query Page($assetKey: AssetKeyInput!, $partitionKey: String!) {
  assetOrError(assetKey: $assetKey) {
    ... on Asset {
      assetEventHistory(partitions: [$partitionKey], limit: 1000,
                        eventTypeSelectors: [MATERIALIZATION, OBSERVATION, FAILED_TO_MATERIALIZE]) {
        results {
          __typename
          ... on MaterializationEvent { timestamp metadataEntries { ...Entry } }
          ... on ObservationEvent { timestamp metadataEntries { ...Entry } }
        }
      }
    }
  }
}
fragment Entry on MetadataEntry {
  label
  ... on TextMetadataEntry { text }
  ... on IntMetadataEntry { intValue }
  ... on TableMetadataEntry { table { records } }
}
"""


@pytest.fixture
def instance(pg_admin_dsn, tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with pg_dagster_instance(pg_admin_dsn, home) as (inst, _):
        yield inst


@contextlib.contextmanager
def _ui(instance):
    """GraphQL over the instance with the project's code location loaded in process (what the webserver serves)."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name="lakehouse_dagster.dagster.definitions"),
        location_name="lakehouse_dagster",
    )
    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process:
        yield process


def page(ui, dataset_id) -> dict:
    """The partition page's newest event (what the UI shows under the partition), its metadata by label."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(
        ui.create_request_context(),
        PAGE_Q,
        {"assetKey": {"path": ["iceberg", "dataset_table"]}, "partitionKey": str(dataset_id)},
    )
    events = result.data["assetOrError"]["assetEventHistory"]["results"]
    assert events, f"no event on the partition page of {dataset_id}"
    latest = max(events, key=lambda e: float(e["timestamp"]))
    out: dict = {"__typename": latest["__typename"]}
    for m in latest["metadataEntries"]:
        if "table" in m:
            out[m["label"]] = [json.loads(r) for r in m["table"]["records"]]
        else:
            out[m["label"]] = m.get("text", m.get("intValue"))
    return out


def modes(p: dict) -> dict[str, tuple[str, str]]:
    return {r["name"]: (r["mode"], r["reason"]) for r in p["flags"]}


def _cli(*args: str) -> None:
    assert cli_main([*args]) == 0, args


def _verdict_at(conn, d) -> str:
    at = conn.execute(
        "select checked_at from lakehouse_read_parity where dataset_id = %s order by checked_at desc, id desc limit 1",
        (d,),
    ).fetchone()[0]
    return at.isoformat(timespec="seconds")


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_writer_rolled_back_backfilled_synced_and_canaried_from_the_cli_shows_the_canary_s_verdict(
    conn, dsn, settings, instance, capsys
):
    """The issue's crm_accounts: write-flags set sync.full pg → backfill → sync → canary --smoke; the page said
    latest_verdict native twelve minutes later (a verdict was not a change the recorder read)."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "crm_accounts", SCHEMA)
    src = pg_source_table(conn, [row(i) for i in range(6)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": None, "dsn_env": None})
    rec = Recorder(instance, dsn)
    _cli("ingest", "--dataset", str(d), "--writer", "sync.full")
    _cli("sync", "--dataset", str(d))
    for r in SERVABLE:
        _cli("flags", "set", r, "iceberg", "--dataset", str(d))
    _cli("write-flags", "flip", "sync.full", "--dataset", str(d))
    _cli("ingest", "--dataset", str(d), "--writer", "sync.full")  # a native write
    _cli("canary", "--dataset", str(d))  # both ways (the reverse on): lagging until the reverse applies the write
    rec.tick()
    with _ui(instance) as ui:
        p = page(ui, d)
        assert p["latest_verdict"] == "lagging" and p["writers_native"] == "sync.full"

        set_reverse(conn, False, dataset=d, note="the backfill's path", actor="pytest")  # (on: no backfill needed)
        _cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d), "--note", "rollback")
        _cli("backfill", "--dataset", str(d))
        _cli("sync", "--dataset", str(d))
        rec.tick()
        p = page(ui, d)
        assert p["writers_native"] == "none (every writer lands in Postgres)"
        assert modes(p)["sync.full"] == ("pg", "dataset override")

        _cli("canary", "--dataset", str(d), "--smoke")
        capsys.readouterr()
        rec.tick()
        p = page(ui, d)
        assert p["latest_verdict"] == "ok", p["latest_verdict_detail"]
        assert p["__typename"] == "ObservationEvent"  # the verdict alone: one observation of the dataset's state
        assert p["latest_verdict_as_of"] == _verdict_at(conn, d)
        assert p["latest_verdict_detail"].startswith("ok (canary, ")
        assert p["changed"].startswith("verdict ok (canary, ")
        assert p["dagster/row_count"] == 6 and p["snapshot_id"]  # the table as it is, on the same event
        assert rec.tick() == []


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_rollout_s_workspace_stage_shows_on_every_page_of_the_workspace(
    conn, dsn, settings, instance, pg_admin_dsn, tmp_path
):
    """The issue's customers: a rollout's workspace stage flipped graph.kuzu for the workspace; the page still
    said 'graph.kuzu off registry default' (a workspace change was recorded on the overview only)."""
    s = seed_mix(conn, dsn, settings)
    rec = Recorder(instance, dsn)
    rec.tick()
    plan = f"""
reader: graph.kuzu
mode: iceberg
note: graph by plan
stages:
  - datasets: 1
    soak: 1s
  - workspace: {s.ws}
    soak: 1s
"""
    plan_id, _ = actions.start(conn, settings, plan, actor="pytest")
    driver = Driver(instance, dsn)

    def recorded(_p) -> None:  # the daemon runs the recorder beside the controller
        rec.tick()

    p_ = driver.until(conn, plan_id, lambda p: p.state != "active", between=recorded)
    assert p_.state == "finished", (p_.reason, p_.blocking)
    rec.tick()
    in_ws = [s.tabular[n] for n in ("small", "mid", "big", "wide")]
    with _ui(instance) as ui:
        pages = {d: page(ui, d) for d in in_ws}
        # the datasets stage's one dataset keeps its own override; the workspace stage moved the other three
        assert (
            sorted(modes(p)["graph.kuzu"] for p in pages.values())
            == [("iceberg", "dataset override")] + [("iceberg", "workspace override")] * 3
        )
        for d, p in pages.items():
            assert "graph.kuzu" in p["readers_on_iceberg"], d
            assert p["latest_verdict"] == "ok" and p["latest_verdict_as_of"] == _verdict_at(conn, d)
            assert p["modes_as_of"] >= p["latest_verdict_as_of"]
        other = page(ui, s.tabular["elsewhere"])  # another workspace: not moved
        assert modes(other)["graph.kuzu"] == ("off", "registry default")
        assert other["readers_on_iceberg"] == "none (every reader serves Postgres)"
    assert store.get(conn, plan_id).state == "finished"


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_global_change_from_a_job_fans_out_one_event_per_dataset_a_page_a_tick(
    conn, dsn, settings, instance, monkeypatch
):
    """A global flip changes every dataset's modes: each page shows it, at most LAKEHOUSE_RECORDER_MAX_EVENTS
    datasets a tick and one event per dataset whatever the number of changes; a verdict from the canary job and
    a read fallback are on the page too."""
    monkeypatch.setenv("LAKEHOUSE_RECORDER_MAX_EVENTS", "3")
    ws = datasets.create_workspace(conn, "w")
    ids = []
    for i in range(6):
        d = datasets.create_dataset(conn, ws, f"d{i}", SCHEMA)
        datasets.insert_rows(conn, d, [row(k) for k in range(3)])
        _cli("sync", "--dataset", str(d))
        ids.append(d)
    rec = Recorder(instance, dsn)
    for _ in range(10):  # the syncs and the first pass show every table, a page of three a tick
        if rec.tick() == []:
            break
    resources = {"lakehouse": LakehouseResource(pg_dsn=dsn)}
    for reader in ("graph.kuzu", "export.stream", "studio.digest"):  # three global changes, one tick
        result = set_flag_job.execute_in_process(
            run_config={"ops": {"set_flag_op": {"config": {"name": reader, "mode": "shadow", "note": "global"}}}},
            resources=resources,
            instance=instance,
        )
        assert result.success
    shown: list[str] = []
    for _ in range(2):
        events = [e for e in rec.tick() if e.partition]
        assert len(events) == 3 and len({e.partition for e in events}) == len(events)  # bounded, coalesced
        shown += [e.partition for e in events]
    assert sorted(shown) == sorted(map(str, ids)) and json.loads(rec.cursor)["fanout"] == {}
    assert rec.tick() == []

    # a change while the pass is under way: the pass restarts where it stands and wraps around
    set_flag_job.execute_in_process(
        run_config={"ops": {"set_flag_op": {"config": {"name": "graph.kuzu", "mode": "off"}}}},
        resources=resources,
        instance=instance,
    )
    first = [e.partition for e in rec.tick() if e.partition]
    set_flag_job.execute_in_process(
        run_config={"ops": {"set_flag_op": {"config": {"name": "graph.kuzu", "mode": "shadow"}}}},
        resources=resources,
        instance=instance,
    )
    after = []
    for _ in range(4):
        after += [e.partition for e in rec.tick() if e.partition]
    assert sorted(after) == sorted(map(str, ids)) and len(first) == 3  # every dataset once after the last change
    canary = parity_canary_batch_job.execute_in_process(
        run_config={"ops": {"check_datasets": {"config": {"datasets": [str(ids[0])]}}}},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    record_fallback(conn, "export.stream", ids[1], "ml-runner timeout")
    rec.tick()
    with _ui(instance) as ui:
        for d in ids:
            p = page(ui, d)
            assert modes(p)["graph.kuzu"] == ("shadow", "global override")
            assert modes(p)["export.stream"] == ("shadow", "global override")
        p = page(ui, ids[0])
        assert canary.success and p["latest_verdict"] == "ok"
        assert p["latest_verdict_as_of"] == _verdict_at(conn, ids[0])
        p = page(ui, ids[1])
        assert p["latest_fallback"].startswith("export.stream fell back to Postgres at ")
        assert p["latest_fallback"].endswith(": ml-runner timeout")
