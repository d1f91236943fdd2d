"""The flip gates: a write flip that would strand consumers is refused with the reason, through the real CLI.

A "ready" dataset is made the way the runbooks make it: mirrored by the real mirror, read-flipped
(every reader Iceberg can serve), and checked by the real canary.
"""

from __future__ import annotations

import uuid

import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.gates import set_flag
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, flag_tables

SCHEMA = [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}]
SERVABLE = [r.name for r in registry.SERVABLE_READERS]  # prerequisite #1: not the compute readers (proven first)


def _dataset(conn, ws, name: str, rows: int = 5) -> uuid.UUID:
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"a": i, "s": f"v{i}"} for i in range(rows)])
    return d


def _ready(conn, dsn, settings, d: uuid.UUID, *, readers=SERVABLE) -> None:
    """Mirrored, read-flipped, parity ok: what the Fase 4 runbook asks before a write flip."""
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    for r in readers:
        set_override(conn, "read", r, "iceberg", dataset=d, note="fase1", actor="pytest")
    report = run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)])
    assert [v.verdict for v in report.results] == ["ok"]


@pytest.fixture
def ws(conn):
    return datasets.create_workspace(conn, "ws")


def _refused(*args: str) -> str:
    proc = cli(*args)
    assert proc.returncode == 6, proc.stderr
    return proc.stderr


def test_a_bare_dataset_cannot_be_written_native_and_nothing_is_written(conn, settings, ws):
    d = _dataset(conn, ws, "bare")
    before = flag_tables(conn)
    err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d))
    assert "refused: set sync.full iceberg_native" in err and f"bare ({d})" in err
    assert f"never mirrored: sync it first (lakehouse sync --dataset {d})" in err
    assert "readers still on Postgres for it: export.stream (off)" in err and "prerequisite #1" in err
    assert f"no parity verdict recorded: run lakehouse canary --smoke --dataset {d}" in err
    assert flag_tables(conn) == before
    assert native_dataset_ids(conn) == set()


def test_a_ready_dataset_flips_and_then_its_readers_cannot_go_back_to_postgres(conn, dsn, settings, ws):
    d = _dataset(conn, ws, "ready")
    _ready(conn, dsn, settings, d)
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), "--note", "fase4 canary", check=True)
    assert native_dataset_ids(conn) == {d}
    # a reader rolled back to Postgres would read rows Postgres no longer receives
    err = _refused("flags", "set", "export.stream", "off", "--dataset", str(d))
    assert "written iceberg-native by sync.full" in err and "roll the writer back first" in err
    err = _refused("flags", "clear", "graph.kuzu", "--dataset", str(d))  # clearing falls back to the default: off
    assert "graph.kuzu" in err and "written iceberg-native" in err
    cli("flags", "set", "export.stream", "iceberg_only", "--dataset", str(d), check=True)  # further up is fine
    # the runbook's rollback order: the writer first, then the readers
    cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d), check=True)
    cli("flags", "set", "export.stream", "off", "--dataset", str(d), check=True)


def test_each_prerequisite_is_named(conn, dsn, settings, ws):
    # F3: a pipeline input with its reverse mirror off stays blocked however ready it is (on: test_reverse_gates.py)
    piped = _dataset(conn, ws, "piped")
    set_reverse(conn, False, dataset=piped, note="reverse off", actor="pytest")
    _ready(conn, dsn, settings, piped)
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'p', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(piped)}}]})),
    )
    assert "BLOCKED (pipeline input; reverse mirror off)" in _refused(
        "write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(piped)
    )
    # one reader left on Postgres
    half = _dataset(conn, ws, "half")
    _ready(conn, dsn, settings, half, readers=[r for r in SERVABLE if r != "studio.preview"])
    err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(half))
    assert "readers still on Postgres for it: studio.preview (off)" in err and "export.stream" not in err
    # rows written after the last sync: the mirror would never carry them over
    behind = _dataset(conn, ws, "behind")
    _ready(conn, dsn, settings, behind)
    datasets.insert_rows(conn, behind, [{"a": 99, "s": "late"}])
    err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(behind))
    assert "Iceberg is behind Postgres" in err and "let the mirror catch up" in err
    # a parity verdict that is not ok
    bad = _dataset(conn, ws, "bad")
    _ready(conn, dsn, settings, bad)
    conn.execute(
        "insert into lakehouse_read_parity (dataset_id, verdict, source) values (%s, 'MISMATCH', 'canary')", (bad,)
    )
    assert "latest parity verdict is MISMATCH" in _refused(
        "write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(bad)
    )


def test_a_global_flip_lists_only_the_datasets_it_would_move(conn, dsn, settings, ws):
    ready, bare = _dataset(conn, ws, "ready"), _dataset(conn, ws, "bare")
    _ready(conn, dsn, settings, ready)
    err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--note", "fase4 global")
    assert "would move 1 dataset(s)" in err and f"bare ({bare})" in err and f"ready ({ready})" not in err
    assert "write-flags set sync.full pg --dataset <id>" in err
    assert "no workspace-scope flip of sync.full to iceberg_native inside global" in err  # the order, soak 0 or not
    # pin the unready dataset where it is (most specific scope wins), flip in the runbook's order (dataset →
    # workspace → global), and the widen goes through around the pinned dataset
    cli("write-flags", "set", "sync.full", "pg", "--dataset", str(bare), check=True)
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(ready), check=True)
    cli("write-flags", "set", "sync.full", "iceberg_native", "--workspace", str(ws), check=True)
    cli("write-flags", "set", "sync.full", "iceberg_native", "--note", "fase4 global", check=True)
    assert native_dataset_ids(conn) == {ready}
    # clearing the pin would move the unready dataset: refused as well
    assert "never mirrored" in _refused("write-flags", "clear", "sync.full", "--dataset", str(bare))


def test_an_empty_workspace_flips_and_the_core_call_refuses_like_the_cli(conn, settings, ws):
    empty = datasets.create_workspace(conn, "empty")
    change = set_flag(conn, "write", "sync.full", "iceberg_native", workspace=empty, actor="pytest")
    assert change.after == "iceberg_native"
    d = _dataset(conn, ws, "bare")
    with pytest.raises(FlipRefused, match="never mirrored"):
        set_flag(conn, "write", "cdc.append", "iceberg_native", dataset=d, actor="pytest")


def test_candidates_are_the_runbook_query_plus_what_each_dataset_still_lacks(conn, dsn, settings, ws):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.flags.flags import write_flip_candidates_job
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    from .flag_helpers import cli_json

    ready, synced, piped, never = (
        _dataset(conn, ws, n, rows) for n, rows in (("ready", 5), ("synced", 7), ("piped", 6), ("never", 2))
    )
    _ready(conn, dsn, settings, ready)
    _ready(conn, dsn, settings, piped)
    sync_dataset(dsn, load_catalog(settings, dsn), settings, synced, mode="full")  # mirrored, nothing else
    set_reverse(conn, False, dataset=piped, note="reverse off", actor="pytest")
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'p', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(piped)}}]})),
    )
    got = {c["name"]: c for c in cli_json("candidates", "--writer", "sync.append")}
    assert set(got) == {"ready", "synced", "piped"}  # "never" is not identity-ready: not a candidate at all
    assert (got["ready"]["verdict"], got["ready"]["ready"], got["ready"]["reasons"]) == ("SAFE", True, [])
    assert got["synced"]["verdict"] == "SAFE" and not got["synced"]["ready"]
    assert any("readers still on Postgres" in r for r in got["synced"]["reasons"])
    assert any("no parity verdict" in r for r in got["synced"]["reasons"])
    assert (
        got["piped"]["verdict"].startswith("BLOCKED (pipeline input; reverse mirror off") and not got["piped"]["ready"]
    )
    # "ready" means the gate lets it through; once flipped it is no longer a candidate to flip
    cli("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(ready), check=True)
    again = {c["name"]: c for c in cli_json("candidates", "--writer", "sync.append")}
    assert again["ready"]["reasons"] == ["already iceberg_native for sync.append"] and not again["ready"]["ready"]
    assert "row.edit" in cli("candidates", "--writer", "row.edit").stderr  # locked to pg: refused
    # the same in the Dagster UI, with the table as metadata
    result = write_flip_candidates_job.execute_in_process(
        run_config={"ops": {"write_flip_candidates_op": {"config": {"writer": "sync.full"}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    by_name = {c["name"]: c for c in result.output_for_node("write_flip_candidates_op")}
    assert by_name["ready"]["ready"] and not by_name["synced"]["ready"]  # sync.full: ready not flipped for it
    (out,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    meta = out.event_specific_data.metadata
    assert meta["ready_to_flip"].value == 1 and meta["blocked_pipeline_input"].value == 1
    rows = {r.data["name"]: r.data for r in meta["candidates"].records}
    assert rows["ready"]["ready"] is True and rows["ready"]["verdict"] == "SAFE"


def test_an_ok_verdict_from_an_older_version_is_not_enough(conn, dsn, settings, ws):
    d = _dataset(conn, ws, "moved-on")
    _ready(conn, dsn, settings, d)
    datasets.insert_rows(conn, d, [{"a": 99, "s": "late"}])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, d)  # caught up again, but never re-checked
    err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d))
    assert "parity was last checked at Postgres version" in err and "Iceberg is behind" not in err
    run_canary(conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(d)])
    cli("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d), check=True)


def test_in_capture_mode_after_commit_a_write_the_consumer_has_not_tracked_yet_still_blocks_the_flip(
    conn, dsn, settings, ws
):
    """The late row's version exists only in the WAL until the consumer writes it: the gate settles first."""
    from lakehouse_dagster.tracking import capture

    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs wal_level = logical")
    behind = _dataset(conn, ws, "behind-in-the-wal")
    _ready(conn, dsn, settings, behind)
    capture.enable(conn)
    try:
        datasets.insert_rows(conn, behind, [{"a": 99, "s": "late"}])
        stale = conn.execute("select rows_version from datasets where id = %s", (behind,)).fetchone()[0]
        err = _refused("write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(behind))
        assert "Iceberg is behind Postgres" in err and "let the mirror catch up" in err
        assert conn.execute("select rows_version from datasets where id = %s", (behind,)).fetchone()[0] > stale
        assert native_dataset_ids(conn) == set()
    finally:
        capture.disable(conn)
