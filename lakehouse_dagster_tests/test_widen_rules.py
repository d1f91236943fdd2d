"""Widening rules: soak, the writers' order, prerequisite #1 with soak, Postgres-locked readers.

Every refusal goes through the real CLI (exit 6) and writes nothing (overrides and audit unchanged).
A soak that has passed is made either by waiting out a short LAKEHOUSE_SOAK_SECONDS, or by
back-dated rows inserted into the override and audit tables (the audit refuses UPDATE, not INSERT).
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from lakehouse_dagster.core.errors import BadInput, FlipRefused
from lakehouse_dagster.flags.gates import check_change, set_flag
from lakehouse_dagster.flags.overrides import Scope
from lakehouse_dagster.flags.reader_datasets import declare, remove
from lakehouse_dagster.flags.registry import get_flag
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, cli_json, flag_tables, refusal
from .test_gates import SERVABLE, _dataset, _ready

HOUR = timedelta(hours=1)


@pytest.fixture
def ws(conn):
    return datasets.create_workspace(conn, "ws")


def _set(conn, kind: str, name: str, mode: str, *, soak: int = 3600, **kw):
    """The gated set the CLI and the jobs call, for the steps that pass (the refusals go through the CLI)."""
    return set_flag(conn, kind, name, mode, soak_seconds=soak, actor="pytest", **kw)


def _soak(monkeypatch, seconds: int) -> None:
    monkeypatch.setenv("LAKEHOUSE_SOAK_SECONDS", str(seconds))  # the CLI subprocesses inherit it


def _refused(conn, *args: str) -> str:
    """The CLI refuses with exit 6 and writes nothing."""
    before = flag_tables(conn)
    proc = cli(*args)
    assert proc.returncode == 6, (proc.returncode, proc.stdout, proc.stderr)
    assert flag_tables(conn) == before
    return proc.stderr


def _refused_core(conn, kind: str, name: str, mode: str, soak: int = 3600, **scope) -> str:
    """The same gate called as the Dagster jobs call it: FlipRefused, nothing written."""
    before = flag_tables(conn)
    with pytest.raises(FlipRefused) as refused:
        set_flag(conn, kind, name, mode, soak_seconds=soak, actor="pytest", **scope)
    assert flag_tables(conn) == before
    return str(refused.value)


def _backdated(conn, kind: str, name: str, mode: str | None, ago: timedelta, *, dataset=None, workspace=None) -> None:
    """An override set (or cleared, mode None) ``ago`` in the past: the override row and its audit row."""
    scope, scope_id = ("dataset", dataset) if dataset else ("workspace", workspace) if workspace else ("global", None)
    key = (kind, name, scope, scope_id)
    match = "kind = %s and name = %s and scope = %s and scope_id is not distinct from %s"
    before = conn.execute("select mode from lakehouse_flag_overrides where " + match, key).fetchone()
    conn.execute("delete from lakehouse_flag_overrides where " + match, key)
    if mode is not None:
        conn.execute(
            "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by, set_at)"
            " values (%s, %s, %s, %s, %s, 'pytest', now() - %s)",
            (*key, mode, ago),
        )
    conn.execute(
        "insert into lakehouse_flag_audit (at, action, kind, name, scope, scope_id, before_mode, after_mode,"
        " actor) values (now() - %s, %s, %s, %s, %s, %s, %s, %s, 'pytest')",
        (ago, "set" if mode else "clear", *key, before[0] if before else None, mode),
    )


def _ends_in(message: str) -> tuple[datetime, int]:
    m = re.search(r"ends at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC \(in (\d+) min\)", message)
    assert m, message
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC), int(m.group(2))


def _audit_at(conn, name: str, scope_id) -> datetime:
    return conn.execute(
        "select max(at) from lakehouse_flag_audit where name = %s and scope_id = %s", (name, scope_id)
    ).fetchone()[0]


# --- soak before a widen ----------------------------------------------------------------------------


def test_a_workspace_widen_waits_until_a_dataset_flip_has_soaked(conn, settings, ws, monkeypatch):
    a, _b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    _soak(monkeypatch, 3600)
    err = _refused_core(conn, "read", "export.stream", "iceberg", workspace=ws)
    assert "no dataset-scope flip of export.stream to iceberg" in err and "--dataset <id in workspace" in err
    _set(conn, "read", "export.stream", "iceberg", dataset=a, note="fase1 canary")
    err = _refused(conn, "flags", "set", "export.stream", "iceberg", "--workspace", str(ws))
    ends, minutes = _ends_in(err)
    flipped = _audit_at(conn, "export.stream", a)
    assert ends == (flipped + HOUR).replace(microsecond=0) and minutes == 60, err
    assert f"export.stream iceberg at dataset a ({a})" in err  # by name and id
    # a flip elsewhere does not count: only flips inside the workspace soak for it
    other = datasets.create_workspace(conn, "other")
    _backdated(conn, "read", "export.stream", "iceberg", 2 * HOUR, dataset=_dataset(conn, other, "c"))
    _refused_core(conn, "read", "export.stream", "iceberg", workspace=ws)
    # once LAKEHOUSE_SOAK_SECONDS have passed since the dataset flip, the widen goes through
    time.sleep(2)
    _set(conn, "read", "export.stream", "iceberg", workspace=ws, soak=2)
    assert conn.execute("select mode from lakehouse_flag_overrides where scope = 'workspace'").fetchone() == (
        "iceberg",
    )


def test_iceberg_only_widens_only_after_iceberg_only_soaked_narrower(conn, settings, ws, monkeypatch):
    a, _b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    _soak(monkeypatch, 3600)
    _backdated(conn, "read", "graph.kuzu", "iceberg", 2 * HOUR, dataset=a)
    _set(conn, "read", "graph.kuzu", "iceberg", workspace=ws)
    # iceberg soaked, iceberg_only (no fallback) has not been tried on any dataset of the workspace
    assert "no dataset-scope flip of graph.kuzu to iceberg_only" in _refused(
        conn, "flags", "set", "graph.kuzu", "iceberg_only", "--workspace", str(ws)
    )
    # lowering, shadow and dataset-scope flips are never widens
    _set(conn, "read", "graph.kuzu", "iceberg_only", dataset=a)
    _set(conn, "read", "studio.digest", "shadow", workspace=ws)
    _set(conn, "read", "graph.kuzu", "off", workspace=ws)


@pytest.mark.parametrize("incident", ["MISMATCH", "failed sync"])
def test_an_incident_on_the_soaked_datasets_restarts_the_soak(conn, settings, ws, monkeypatch, incident):
    a, _b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    _backdated(conn, "read", "export.stream", "iceberg", 2 * HOUR, dataset=a)
    flag, scope = get_flag("read", "export.stream"), Scope("workspace", ws)
    check_change(conn, flag, scope, "iceberg", soak_seconds=3600)  # soaked: would pass (check_change writes nothing)
    if incident == "MISMATCH":
        conn.execute(
            "insert into lakehouse_read_parity (dataset_id, verdict, source, checked_at)"
            " values (%s, 'MISMATCH', 'canary', now() - interval '10 minutes')",
            (a,),
        )
    else:
        conn.execute(
            "insert into iceberg_sync_log (dataset_id, sync_id, status, error, started_at, finished_at)"
            " values (%s, %s, 'failed', 'disk full', now() - interval '11 minutes',"
            " now() - interval '10 minutes')",
            (a, uuid.uuid4()),
        )
    _soak(monkeypatch, 3600)
    err = _refused(conn, "flags", "set", "export.stream", "iceberg", "--workspace", str(ws))
    assert f"restarted by a {incident}" in err and "had an incident within the last 3600s" in err
    assert _ends_in(err)[1] == 50, err
    # an incident older than the soak window does not block
    check_change(conn, flag, scope, "iceberg", soak_seconds=300)


def test_a_read_fallback_is_recorded_by_the_router_and_restarts_the_soak(conn, dsn, settings, ws, monkeypatch):
    from lakehouse_dagster.mirror.sync import sync_dataset

    a, _b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, a, mode="full")
    _backdated(conn, "read", "studio.digest", "iceberg", 2 * HOUR, dataset=a)
    flag, scope = get_flag("read", "studio.digest"), Scope("workspace", ws)
    check_change(conn, flag, scope, "iceberg", soak_seconds=3600)
    # break Iceberg for the dataset: its data files are gone, so the read falls back to Postgres
    for path in _data_files(catalog, settings, a):
        path.unlink()
    proc = cli("read", "--reader", "studio.digest", "--dataset", str(a), "--limit", "2", check=True)
    assert "PG fallback" in proc.stderr
    ((reader, ds_id, error),) = conn.execute(
        "select reader, dataset_id, error from lakehouse_read_fallbacks"
    ).fetchall()
    assert (reader, ds_id) == ("studio.digest", a) and error
    _soak(monkeypatch, 3600)
    err = _refused_core(conn, "read", "studio.digest", "iceberg", workspace=ws)
    assert "restarted by a read fallback of studio.digest" in err and _ends_in(err)[1] == 60


def _data_files(catalog, settings, dataset_id):
    from pathlib import Path
    from urllib.parse import urlparse

    from lakehouse_dagster.lake.catalog import table_identifier

    table = catalog.load_table(table_identifier(settings, dataset_id))
    files = [Path(urlparse(t.file.file_path).path) for t in table.scan().plan_files()]
    assert files
    return files


def test_a_global_widen_needs_a_soaked_workspace_flip(conn, settings, ws, monkeypatch):
    a, _b = _dataset(conn, ws, "a"), _dataset(conn, datasets.create_workspace(conn, "ws2"), "b")
    flag = get_flag("read", "export.stream")
    _backdated(conn, "read", "export.stream", "iceberg", 3 * HOUR, dataset=a)
    _soak(monkeypatch, 3600)
    err = _refused_core(conn, "read", "export.stream", "iceberg")
    assert "no workspace-scope flip of export.stream to iceberg inside global" in err
    _backdated(conn, "read", "export.stream", "iceberg", timedelta(minutes=10), workspace=ws)
    err = _refused(conn, "flags", "set", "export.stream", "iceberg", "--note", "fase1 global")
    assert f"export.stream iceberg at workspace ws ({ws})" in err and _ends_in(err)[1] == 50
    with pytest.raises(FlipRefused):
        check_change(conn, flag, Scope("global", None), "iceberg", soak_seconds=3600)
    check_change(conn, flag, Scope("global", None), "iceberg", soak_seconds=0)  # 0 disables the soak
    _set(conn, "read", "export.stream", "iceberg", note="fase1 global", soak=540)  # 10 minutes soaked > 9


# --- writers one at a time ---------------------------------------------------------------------------


def test_writers_widen_in_the_runbook_order(conn, dsn, settings, ws, monkeypatch):
    a, b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    for d in (a, b):
        _ready(conn, dsn, settings, d)
    _soak(monkeypatch, 0)  # the order holds without a soak
    err = _refused(conn, "write-flags", "set", "sync.append", "iceberg_native", "--workspace", str(ws))
    assert "writer order (sync.full → sync.append → sync.incremental / cdc.append): sync.full is still pg" in err
    assert f"lakehouse write-flags set sync.full iceberg_native --workspace {ws}" in err
    err = _refused_core(conn, "write", "cdc.append", "iceberg_native", soak=0, workspace=ws)
    assert "sync.full is still pg" in err and "sync.append is still pg" in err
    # a dataset-scope flip of a later writer does not need the earlier one (its canary step is per dataset)
    _set(conn, "write", "sync.append", "iceberg_native", dataset=a, soak=0)
    # with a soak of 0 the order still holds: a dataset flip inside the workspace before the workspace
    err = _refused_core(conn, "write", "sync.full", "iceberg_native", soak=0, workspace=ws)
    assert "order (dataset → workspace → global): no dataset-scope flip of sync.full to iceberg_native" in err
    assert "the soak is 0 s, which drops the waiting, not the order" in err
    _set(conn, "write", "sync.full", "iceberg_native", dataset=a, soak=0)
    _set(conn, "write", "sync.full", "iceberg_native", workspace=ws, soak=0)
    _set(conn, "write", "sync.append", "iceberg_native", workspace=ws, soak=0)
    # sync.incremental and cdc.append share the last step: either goes once both earlier writers are there
    _set(conn, "write", "cdc.append", "iceberg_native", dataset=a, soak=0)
    _set(conn, "write", "cdc.append", "iceberg_native", workspace=ws, soak=0)
    # globally, the earlier writers must be native globally, not only in one workspace
    _dataset(conn, datasets.create_workspace(conn, "ws2"), "c")
    err = _refused_core(conn, "write", "sync.append", "iceberg_native", soak=0)
    assert "sync.full is still pg globally" in err and "never mirrored" in err


def test_the_next_writer_waits_for_the_earlier_writers_soak(conn, dsn, settings, ws, monkeypatch):
    a, b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    for d in (a, b):
        _ready(conn, dsn, settings, d, readers=[])
    for r in SERVABLE:  # the readers soaked long ago, so only the writers' soak is in question
        _backdated(conn, "read", r, "iceberg", 3 * HOUR, workspace=ws)
    _backdated(conn, "write", "sync.full", "iceberg_native", 3 * HOUR, dataset=a)
    _backdated(conn, "write", "sync.full", "iceberg_native", timedelta(minutes=20), workspace=ws)
    _backdated(conn, "write", "sync.append", "iceberg_native", 3 * HOUR, dataset=a)
    _soak(monkeypatch, 3600)
    err = _refused(conn, "write-flags", "set", "sync.append", "iceberg_native", "--workspace", str(ws))
    assert "soak between writers" in err and f"sync.full iceberg_native at workspace ws ({ws})" in err
    assert _ends_in(err)[1] == 40 and "sync.full is still" not in err
    _set(conn, "write", "sync.append", "iceberg_native", workspace=ws, soak=1100)  # 20 minutes > 1100 s


# --- prerequisite #1 with soak -------------------------------------------------------------------------


def test_a_write_flip_waits_until_the_readers_have_soaked_on_iceberg(conn, dsn, settings, ws, monkeypatch):
    d = _dataset(conn, ws, "d")
    _ready(conn, dsn, settings, d)  # read-flipped just now
    _soak(monkeypatch, 3600)
    err = _refused(conn, "write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d))
    assert "readers not yet soaked on Iceberg (prerequisite #1: read-flip → soak → write-flip)" in err
    assert all(f"{r} on Iceberg since" in err for r in SERVABLE), err
    assert _ends_in(err)[1] == 60
    assert "never mirrored" not in err and "parity" not in err  # everything else is ready
    time.sleep(2)
    _set(conn, "write", "sync.full", "iceberg_native", dataset=d, soak=2)


def test_the_reader_soak_follows_the_effective_mode_through_every_scope(conn, dsn, settings, ws, monkeypatch):
    d = _dataset(conn, ws, "d")
    _ready(conn, dsn, settings, d, readers=[])
    for r in SERVABLE:  # the workspace has read Iceberg for 3 hours ...
        _backdated(conn, "read", r, "iceberg", 3 * HOUR, workspace=ws)
    flag, scope = get_flag("write", "sync.full"), Scope("dataset", d)
    check_change(conn, flag, scope, "iceberg_native", soak_seconds=3600)
    # ... but this dataset was pinned to Postgres for export.stream and un-pinned 30 minutes ago
    _backdated(conn, "read", "export.stream", "off", 2 * HOUR, dataset=d)
    _backdated(conn, "read", "export.stream", None, timedelta(minutes=30), dataset=d)
    with pytest.raises(FlipRefused) as refused:
        check_change(conn, flag, scope, "iceberg_native", soak_seconds=3600)
    assert "export.stream on Iceberg since" in str(refused.value) and _ends_in(str(refused.value))[1] == 30
    assert "graph.kuzu on Iceberg" not in str(refused.value)
    check_change(conn, flag, scope, "iceberg_native", soak_seconds=1200)
    # a fallback of a reader on the dataset restarts that reader's soak, and only its own
    conn.execute(
        "insert into lakehouse_read_fallbacks (reader, dataset_id, error, at)"
        " values ('graph.kuzu', %s, 'IOError: gone', now() - interval '1 minute')",
        (d,),
    )
    with pytest.raises(FlipRefused) as refused:
        check_change(conn, flag, scope, "iceberg_native", soak_seconds=1200)
    msg = str(refused.value)
    assert "graph.kuzu on Iceberg since" in msg and "restarted by a read fallback of graph.kuzu" in msg
    assert "export.stream on Iceberg" not in msg and _ends_in(msg)[1] == 19


# --- Postgres-locked readers ---------------------------------------------------------------------------


def test_a_declared_postgres_locked_reader_blocks_the_write_flip(conn, dsn, settings, ws):
    set_reverse(
        conn, False, note="reverse off everywhere: a locked reader blocks", actor="pytest"
    )  # test_reverse_gates.py: on
    d = _dataset(conn, ws, "d")
    _ready(conn, dsn, settings, d)
    out = cli_json("pg-readers", "add", "objects.sync", "--dataset", str(d), "--note", "nightly object sync")
    assert out["reader"] == "objects.sync" and out["native_dataset_ids"] == []
    err = _refused(conn, "write-flags", "set", "sync.full", "iceberg_native", "--dataset", str(d))
    assert "read from dataset_rows by objects.sync (mode off: on Postgres until flipped" in err and "locked to" in err
    # a workspace declaration covers every dataset of the workspace, also one created later
    declare(conn, "dashboards.aggregate", workspace=ws, actor="pytest")
    later = _dataset(conn, ws, "later")
    _ready(conn, dsn, settings, later)
    err = _refused_core(conn, "write", "sync.full", "iceberg_native", soak=0, dataset=later)
    assert f"dashboards.aggregate (declared for its workspace {ws})" in err and "objects.sync" not in err
    listed = cli_json("pg-readers", "list")
    assert {(r["reader"], r["scope"]) for r in listed} == {
        ("objects.sync", "dataset"),
        ("dashboards.aggregate", "workspace"),
    }
    # a reader Iceberg can serve is read-flipped, not declared; a declaration needs a scope
    with pytest.raises(BadInput, match="read-flip it instead"):
        declare(conn, "export.stream", dataset=d, actor="pytest")
    with pytest.raises(BadInput, match="give --dataset <id> or --workspace <id>"):
        declare(conn, "objects.sync", actor="pytest")
    # once the readers no longer read them, the flips go through
    assert remove(conn, "objects.sync", dataset=d)
    assert remove(conn, "dashboards.aggregate", workspace=ws) and not remove(conn, "dashboards.aggregate", workspace=ws)
    _set(conn, "write", "sync.full", "iceberg_native", dataset=d, soak=0)
    # declaring a reader of a dataset already native records it and says Postgres is stale for it
    out = cli_json("pg-readers", "add", "pipeline.expectations", "--dataset", str(d))
    assert out["native_dataset_ids"] == [str(d)]
    with pytest.raises(FlipRefused, match="pipeline.expectations"):
        set_flag(conn, "write", "sync.append", "iceberg_native", dataset=d, actor="pytest", soak_seconds=0)


# --- a widen's preflight canaries a sample ---------------------------------------------------------------


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_widen_canaries_a_sample_plus_every_dataset_without_a_recent_ok(conn, dsn, settings, ws):
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.runbooks import flip
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary

    ids = [_dataset(conn, ws, f"d{i}", rows=3) for i in range(5)]
    _set(conn, "read", "export.stream", "iceberg", dataset=_dataset(conn, ws, "first"), soak=0)  # the order: first
    catalog = load_catalog(settings, dsn)
    for d in ids:
        sync_dataset(dsn, catalog, settings, d, mode="full")
    run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d) for d in ids[:4]])  # the fifth has no verdict
    verdicts = lambda: conn.execute("select count(*) from lakehouse_read_parity").fetchone()[0]  # noqa: E731
    before = verdicts()
    pre = flip.preflight(conn, dsn, catalog, settings, "export.stream", "iceberg", workspace=ws, sample=2, smoke=False)
    fresh = {c.dataset_id for c in pre.checked if not c.reused}
    assert len(pre.checked) == 5 and ids[4] in fresh and len(fresh) in (2, 3) and pre.go
    assert verdicts() - before == len(fresh)  # every canary run now is recorded
    assert pre.coverage() == (
        f"preflight covered 5 of 5 moved dataset(s): {len(fresh)} canaried now (a random sample of 2 plus every one "
        f"with no recent ok verdict), {5 - len(fresh)} by a recent ok verdict at their current version"
    )
    # max_datasets bounds the canaries, not the datasets moved: all five have a recent ok verdict now
    with pytest.raises(BadInput, match=r"would canary 2 of them \(0 with no recent ok verdict\)"):
        flip.preflight(conn, dsn, catalog, settings, "export.stream", "iceberg", workspace=ws, sample=2, max_datasets=1)
    assert (
        flip.preflight(conn, dsn, catalog, settings, "export.stream", "iceberg", workspace=ws, sample=0, max_datasets=0)
        .coverage()
        .startswith("preflight covered 5 of 5 moved dataset(s): 0 canaried now")
    )
    # the operator sees it: the flip verb prints the coverage line
    proc = cli("flags", "flip", "export.stream", "--workspace", str(ws), "--sample", "1", "--no-smoke", check=True)
    assert "preflight covered 5 of 5 moved dataset(s): 1 canaried now (a random sample of 1" in proc.stdout


def test_the_read_flip_job_refuses_an_unsoaked_widen_before_it_canaries(conn, dsn, settings, ws, monkeypatch):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.rollout import read_flip_job

    a, _b = _dataset(conn, ws, "a"), _dataset(conn, ws, "b")
    _set(conn, "read", "export.stream", "iceberg", dataset=a, soak=0)
    _soak(monkeypatch, 3600)  # the job's resource reads the environment
    before, verdicts = flag_tables(conn), conn.execute("select count(*) from lakehouse_read_parity").fetchone()
    result = read_flip_job.execute_in_process(
        run_config={"ops": {"read_flip_preflight": {"config": {"reader": "export.stream", "workspace_id": str(ws)}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = result.get_step_failure_events()
    message = refusal(failure)
    assert failure.step_key == "read_flip_preflight" and "soak: the narrower flip has not soaked yet" in message
    assert _ends_in(message)[1] == 60
    assert flag_tables(conn) == before
    assert conn.execute("select count(*) from lakehouse_read_parity").fetchone() == verdicts  # no canary ran
