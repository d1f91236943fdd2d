"""Flags: registry, scoped overrides + audit, the TTL-cached resolver, refusals, native datasets."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import uuid

import psycopg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.flags import registry
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import clear_override, history, list_overrides, set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.tracking import datasets as app_tables

from .flag_helpers import cli, cli_json, flag_tables

SCHEMA = [{"name": "a", "type": "int64"}]


@pytest.fixture
def world(conn):
    """Two workspaces; ws1 holds d1 and d2, ws2 holds d3."""
    ws1, ws2 = app_tables.create_workspace(conn, "ws1"), app_tables.create_workspace(conn, "ws2")
    return {
        "ws1": ws1,
        "ws2": ws2,
        "d1": app_tables.create_dataset(conn, ws1, "d1", SCHEMA),
        "d2": app_tables.create_dataset(conn, ws1, "d2", SCHEMA),
        "d3": app_tables.create_dataset(conn, ws2, "d3", SCHEMA),
    }


# --- registry --------------------------------------------------------------------------------------


def test_registry_names_every_runbook_reader_and_writer():
    eventual = {
        "export.stream": "iceberg_only",
        "graph.kuzu": "iceberg_only",
        "studio.digest": "iceberg",
        "studio.training_pairs": "iceberg",
    }
    for name, ceiling in eventual.items():
        f = registry.READERS[name]
        assert (f.consistency, f.ceiling, f.default) == (registry.EVENTUAL, ceiling, "off")
    for name in ("sdk.files.list", "mediaset.item"):
        f = registry.READERS[name]
        assert f.ceiling == "off" and f.ceiling_reason and not f.proof
    # the compute readers (issue 43): servable by the structured-read executors, flipped only once proven
    compute = {"objects.sync": "iceberg_only", "dashboards.aggregate": "iceberg", "pipeline.expectations": "iceberg"}
    for name, ceiling in compute.items():
        f = registry.READERS[name]
        assert (f.ceiling, f.default, f.proof) == (ceiling, "off", True)
    assert registry.READERS["pipeline.expectations"].consistency == registry.STRICT
    assert {r.name for r in registry.PROVEN_READERS} == set(compute)
    assert not set(compute) & {r.name for r in registry.SERVABLE_READERS}  # not prerequisite #1 of a write flip
    assert any(f.consistency == registry.STRICT and f.ceiling != "off" for f in registry.READERS.values())
    for name in ("sync.full", "sync.append", "sync.incremental", "cdc.append"):
        assert (registry.WRITERS[name].ceiling, registry.WRITERS[name].default) == ("iceberg_native", "pg")
    for name in ("ingest.stream", "row.edit", "dataset.manifest", "pipeline.output"):
        assert registry.WRITERS[name].ceiling == "pg" and registry.WRITERS[name].ceiling_reason
    assert registry.READ_MODES == ("off", "shadow", "iceberg", "iceberg_only")
    assert registry.WRITE_MODES == ("pg", "iceberg_native")


# --- precedence --------------------------------------------------------------------------------------


def _modes(resolver, name, *datasets):
    return [(resolver.read_mode(name, d).mode, resolver.read_mode(name, d).reason) for d in datasets]


def test_precedence_dataset_over_workspace_over_global_over_default(conn, world):
    r = FlagResolver(conn, ttl_seconds=60)
    d1, d2, d3, ws1 = world["d1"], world["d2"], world["d3"], world["ws1"]
    assert _modes(r, "export.stream", d1, d2, d3) == [("off", "registry default")] * 3
    assert r.read_mode("export.stream").reason == "registry default"  # global view

    set_override(conn, "read", "export.stream", "shadow", note="fase1 global", actor="t")
    assert _modes(r, "export.stream", d1, d2, d3) == [("shadow", "global override")] * 3

    set_override(conn, "read", "export.stream", "iceberg", workspace=ws1, actor="t")
    assert _modes(r, "export.stream", d1, d2, d3) == [
        ("iceberg", "workspace override"),
        ("iceberg", "workspace override"),
        ("shadow", "global override"),
    ]

    set_override(conn, "read", "export.stream", "off", dataset=d1, actor="t")  # rollback one dataset
    set_override(conn, "read", "export.stream", "iceberg_only", dataset=d3, actor="t")
    assert _modes(r, "export.stream", d1, d2, d3) == [
        ("off", "dataset override"),
        ("iceberg", "workspace override"),
        ("iceberg_only", "dataset override"),
    ]
    # A wider flip still respects the narrower overrides.
    set_override(conn, "read", "export.stream", "iceberg_only", actor="t")
    assert _modes(r, "export.stream", d1, d2, d3) == [
        ("off", "dataset override"),
        ("iceberg", "workspace override"),
        ("iceberg_only", "dataset override"),
    ]
    # Other readers and the writers are untouched.
    assert r.read_mode("graph.kuzu", d1).reason == "registry default"
    assert r.write_mode("sync.full", d1).mode == "pg"

    clear_override(conn, "read", "export.stream", dataset=d1, actor="t")
    assert _modes(r, "export.stream", d1) == [("iceberg", "workspace override")]
    clear_override(conn, "read", "export.stream", workspace=ws1, actor="t")
    assert _modes(r, "export.stream", d1, d2) == [("iceberg_only", "global override")] * 2
    clear_override(conn, "read", "export.stream", actor="t")
    assert _modes(r, "export.stream", d1, d2, d3) == [
        ("off", "registry default"),
        ("off", "registry default"),
        ("iceberg_only", "dataset override"),
    ]


def test_workspace_is_looked_up_from_datasets(conn, world):
    """Moving a dataset to another workspace moves it under that workspace's override."""
    set_override(conn, "write", "sync.full", "iceberg_native", workspace=world["ws2"], actor="t")
    assert FlagResolver(conn, 0).write_mode("sync.full", world["d1"]).mode == "pg"
    conn.execute("update datasets set workspace_id = %s where id = %s", (world["ws2"], world["d1"]))
    res = FlagResolver(conn, 0).write_mode("sync.full", world["d1"])
    assert (res.mode, res.reason) == ("iceberg_native", "workspace override")


# --- clamp ---------------------------------------------------------------------------------------------


def test_hand_written_row_above_ceiling_is_clamped(conn, world):
    d1 = world["d1"]
    with conn.transaction():
        conn.execute(
            "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by) values"
            " ('read', 'studio.digest', 'dataset', %s, 'iceberg_only', 'psql'),"
            " ('read', 'sdk.files.list', 'global', null, 'iceberg', 'psql'),"
            " ('write', 'row.edit', 'dataset', %s, 'iceberg_native', 'psql')",
            (d1, d1),
        )
    r = FlagResolver(conn, 60)
    digest = r.read_mode("studio.digest", d1)
    assert (digest.mode, digest.reason, digest.source, digest.stored_mode) == (
        "iceberg",
        "clamped to ceiling",
        "dataset override",
        "iceberg_only",
    )
    assert (r.read_mode("sdk.files.list", d1).mode, r.read_mode("sdk.files.list", d1).reason) == (
        "off",
        "clamped to ceiling",
    )
    edit = r.write_mode("row.edit", d1)
    assert (edit.mode, edit.reason) == ("pg", "clamped to ceiling")
    # A locked writer never makes a dataset native, however its row reads.
    assert native_dataset_ids(conn) == set()
    # Within the ceiling, no clamp.
    assert r.read_mode("studio.digest", world["d2"]).reason == "registry default"


def test_a_mode_that_does_not_exist_cannot_be_stored(conn):
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "insert into lakehouse_flag_overrides (kind, name, scope, mode, set_by)"
            " values ('write', 'sync.full', 'global', 'iceberg', 'psql')"
        )


# --- refusals: clear one-line error, non-zero exit, nothing written -------------------------------------

_NO_SUCH = "123e4567-e89b-12d3-a456-426614174000"

REFUSALS = [
    (["flags", "set", "export.streem", "iceberg"], "unknown reader 'export.streem'"),
    (["write-flags", "set", "sync.fulll", "iceberg_native"], "unknown writer 'sync.fulll'"),
    (["flags", "set", "sync.full", "iceberg"], "sync.full is a writer: use lakehouse write-flags"),
    (["flags", "set", "export.stream", "on"], "unknown mode 'on' for reader export.stream"),
    (["write-flags", "set", "sync.full", "iceberg"], "unknown mode 'iceberg' for writer sync.full"),
    (["flags", "set", "studio.digest", "iceberg_only"], "above the ceiling of studio.digest (maxMode=iceberg)"),
    (["flags", "set", "sdk.files.list", "shadow"], "above the ceiling of sdk.files.list (maxMode=off)"),
    (["flags", "set", "dashboards.aggregate", "iceberg_only"], "above the ceiling of dashboards.aggregate"),
    (["write-flags", "set", "row.edit", "iceberg_native"], "above the ceiling of row.edit (maxMode=pg)"),
    (["write-flags", "set", "ingest.stream", "iceberg_native"], "above the ceiling of ingest.stream"),
    (
        ["flags", "set", "export.stream", "iceberg", "--dataset", "not-a-uuid"],
        "dataset id 'not-a-uuid' is not a valid UUID",
    ),
    (["flags", "set", "export.stream", "iceberg", "--workspace", "12345"], "workspace id '12345' is not a valid UUID"),
    (["flags", "set", "export.stream", "iceberg", "--dataset", _NO_SUCH], f"dataset {_NO_SUCH} does not exist"),
    (
        ["write-flags", "set", "sync.full", "iceberg_native", "--workspace", _NO_SUCH],
        f"workspace {_NO_SUCH} does not exist",
    ),
    (["flags", "set", "export.stream", "iceberg", "--dataset", "{d1}", "--workspace", "{ws1}"], "not both"),
    (["flags", "clear", "export.streem"], "unknown reader 'export.streem'"),
    (["flags", "clear", "export.stream", "--dataset", "{d1}", "--workspace", "{ws1}"], "not both"),
    (["write-flags", "clear", "sync.full", "--dataset", "xyz"], "dataset id 'xyz' is not a valid UUID"),
]


@pytest.mark.parametrize("args,message", REFUSALS, ids=[" ".join(a[:4]) + f"#{i}" for i, (a, _) in enumerate(REFUSALS)])
def test_refusal_is_one_line_nonzero_and_writes_nothing(conn, settings, world, args, message):
    set_override(conn, "read", "export.stream", "iceberg", dataset=world["d1"], note="existing", actor="t")
    before = flag_tables(conn)
    args = [a.format(**{k: str(v) for k, v in world.items()}) for a in args]
    proc = cli(*args)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0], lines[0]
    assert lines[0].startswith(f"lakehouse {args[0]}: error: ")
    assert flag_tables(conn) == before


def test_core_refusals_write_nothing(conn, world):
    """The core functions (shared by the CLI and the Dagster jobs) refuse before writing."""
    before = flag_tables(conn)
    with pytest.raises(BadInput, match="above the ceiling"):
        set_override(conn, "write", "pipeline.output", "iceberg_native", dataset=world["d1"], actor="t")
    with pytest.raises(NotFound):
        set_override(conn, "read", "graph.kuzu", "iceberg", dataset=uuid.uuid4(), actor="t")
    with pytest.raises(BadInput, match="unknown flag kind"):
        set_override(conn, "readers", "graph.kuzu", "iceberg", actor="t")
    with pytest.raises(BadInput, match="LAKEHOUSE_ACTOR"):
        set_override(conn, "read", "graph.kuzu", "iceberg", actor="  ")
    with pytest.raises(BadInput, match="unknown reader"):
        FlagResolver(conn).read_mode("nope", world["d1"])
    assert flag_tables(conn) == before


# --- audit ------------------------------------------------------------------------------------------------


def test_every_set_and_clear_is_audited(conn, settings, world):
    d1 = str(world["d1"])
    cli("flags", "set", "export.stream", "iceberg", "--dataset", d1, "--note", "fase1 canary", check=True)
    cli("flags", "set", "export.stream", "iceberg_only", "--dataset", d1, "--note", "no-fallback", check=True)
    ws1 = str(world["ws1"])
    cli("flags", "set", "export.stream", "iceberg", "--workspace", ws1, "--note", "fase1 ws", check=True)
    out = cli("flags", "clear", "export.stream", "--dataset", d1, "--note", "rollback", check=True).stdout
    assert "cleared iceberg_only" in out
    entries = cli_json("flags", "history")
    assert [
        (e["action"], e["scope"], e["scope_id"], e["before"], e["after"], e["note"], e["actor"]) for e in entries
    ] == [
        ("clear", "dataset", d1, "iceberg_only", None, "rollback", "pytest"),
        ("set", "workspace", ws1, None, "iceberg", "fase1 ws", "pytest"),
        ("set", "dataset", d1, "iceberg", "iceberg_only", "no-fallback", "pytest"),
        ("set", "dataset", d1, None, "iceberg", "fase1 canary", "pytest"),
    ]
    assert [e["action"] for e in cli_json("flags", "history", "export.stream", "--dataset", d1)] == [
        "clear",
        "set",
        "set",
    ]
    assert cli_json("write-flags", "history") == []
    # The override keeps who set it, when and why.
    (o,) = list_overrides(conn, "read")
    assert (o.scope, o.mode, o.note, o.set_by) == ("workspace", "iceberg", "fase1 ws", "pytest")
    # Append-only, even for the table's owner.
    for stmt in (
        "update lakehouse_flag_audit set actor = 'x'",
        "delete from lakehouse_flag_audit",
        "truncate lakehouse_flag_audit",
    ):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(stmt)
    assert len(history(conn)) == 4


def test_actor_is_the_os_user_without_lakehouse_actor(conn, settings, world, monkeypatch):
    import getpass

    monkeypatch.delenv("LAKEHOUSE_ACTOR")
    cli("flags", "set", "export.stream", "iceberg", "--dataset", str(world["d1"]), check=True)
    assert history(conn)[0].actor == getpass.getuser()


def test_clearing_nothing_is_a_noop(conn, settings):
    proc = cli("flags", "clear", "graph.kuzu", check=True)
    assert "no override globally to clear" in proc.stdout
    assert flag_tables(conn) == ([], [])


def test_list_shows_registry_overrides_and_effective_modes(conn, settings, world):
    # (raw: the flip gates would refuse these bare datasets; test_gates.py covers the gates)
    set_override(conn, "write", "sync.full", "iceberg_native", workspace=world["ws1"], note="fase4 ws", actor="pytest")
    data = cli_json("write-flags", "list", "--dataset", str(world["d2"]))
    reg_rows = {r["name"]: r for r in data["registry"]}
    assert set(reg_rows) == set(registry.WRITERS)
    assert reg_rows["row.edit"]["ceiling"] == "pg" and "Karma" in reg_rows["row.edit"]["ceiling_reason"]
    assert [(o["name"], o["scope"], o["mode"], o["note"], o["set_by"]) for o in data["overrides"]] == [
        ("sync.full", "workspace", "iceberg_native", "fase4 ws", "pytest")
    ]
    eff = {e["name"]: (e["mode"], e["reason"]) for e in data["effective"]}
    assert eff["sync.full"] == ("iceberg_native", "workspace override")
    assert eff["sync.append"] == ("pg", "registry default")
    text = cli("flags", "list", check=True).stdout
    assert "export.stream" in text and "EVENTUAL" in text and "runtime overrides" in text


# --- TTL cache ---------------------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_cached_value_holds_until_ttl_then_refreshes(conn, dsn, world):
    """Another writer's flip (here: a second connection writing the row, as another process would), with the
    NOTIFY listener off: the TTL fallback (test_freshness.py covers the listener)."""
    clock = Clock()
    r = FlagResolver(conn, ttl_seconds=10, clock=clock, listen=False)
    d1 = world["d1"]
    assert r.read_mode("graph.kuzu", d1).mode == "off"  # cached at t=1000
    with connect(dsn) as other:
        other.execute(
            "insert into lakehouse_flag_overrides (kind, name, scope, mode, set_by)"
            " values ('read', 'graph.kuzu', 'global', 'iceberg', 'other')"
        )
    clock.now = 1009.99
    assert r.read_mode("graph.kuzu", d1).mode == "off"  # never before the TTL for a cached value
    assert r.read_mode("graph.kuzu", world["d2"]).mode == "iceberg"  # an uncached dataset reads fresh
    clock.now = 1010.0
    assert r.read_mode("graph.kuzu", d1).mode == "iceberg"  # at the TTL, refreshed


def test_flip_in_this_process_is_immediate(conn, dsn, world):
    r1 = FlagResolver(conn, ttl_seconds=3600)
    with connect(dsn) as c2:
        r2 = FlagResolver(c2, ttl_seconds=3600)  # another resolver in the same process
        assert r1.write_mode("sync.full", world["d1"]).mode == r2.write_mode("sync.full", world["d1"]).mode == "pg"
        set_override(conn, "write", "sync.full", "iceberg_native", dataset=world["d1"], actor="t")
        assert r1.write_mode("sync.full", world["d1"]).mode == "iceberg_native"
        assert r2.write_mode("sync.full", world["d1"]).mode == "iceberg_native"
        clear_override(c2, "write", "sync.full", dataset=world["d1"], actor="t")
        assert r1.write_mode("sync.full", world["d1"]).mode == "pg"


_WATCHER = textwrap.dedent(
    """
    import json, sys, time, uuid
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.core.db import connect

    dsn, ds, ttl, horizon = sys.argv[1], uuid.UUID(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    r = FlagResolver(connect(dsn), ttl, listen=False)  # the TTL fallback (NOTIFY: test_freshness.py)
    filled_at = time.time()                      # before the filling query starts
    first = r.read_mode("export.stream", ds).mode
    print(json.dumps({"filled_at": filled_at, "mode": first}), flush=True)
    seen = []
    end = time.time() + horizon
    while time.time() < end:
        t = time.time()
        seen.append((t, r.read_mode("export.stream", ds).mode))
        time.sleep(0.005)
    print(json.dumps(seen), flush=True)
    """
)


def test_flip_reaches_another_process_within_ttl_never_before(conn, dsn, settings, world):
    ttl = 2.0
    d1 = world["d1"]
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, dsn, str(d1), str(ttl), str(ttl + 2.0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        start = json.loads(watcher.stdout.readline())
        assert start["mode"] == "off"
        local = FlagResolver(conn, ttl_seconds=ttl)
        assert local.read_mode("export.stream", d1).mode == "off"
        flipped_at = time.time()
        set_override(conn, "read", "export.stream", "iceberg", dataset=d1, note="fase1 canary", actor="t")
        assert local.read_mode("export.stream", d1).mode == "iceberg"  # at once in the setting process
        seen = json.loads(watcher.stdout.readline())
    finally:
        watcher.wait(timeout=30)
    assert watcher.returncode == 0, watcher.stderr.read()
    after_flip = [(t, m) for t, m in seen if t > flipped_at]
    first_new = next(t for t, m in seen if m == "iceberg")
    # Never before the TTL for the value cached at filled_at ...
    assert first_new >= start["filled_at"] + ttl
    assert all(m == "off" for t, m in seen if t < start["filled_at"] + ttl)
    # ... the other process did serve the cached value after the flip (so the test saw caching) ...
    assert any(m == "off" for t, m in after_flip)
    # ... and it saw the flip within the TTL of the flip (plus scheduling slack), and kept seeing it.
    assert first_new - flipped_at <= ttl + 0.5
    assert all(m == "iceberg" for t, m in seen if t >= first_new)


# --- native datasets (the mirror poller's skip list) -------------------------------------------------------


def test_native_dataset_ids_follows_precedence_in_one_query(conn, world):
    d1, d2, d3 = world["d1"], world["d2"], world["d3"]
    assert native_dataset_ids(conn) == set()
    set_override(conn, "write", "sync.append", "iceberg_native", workspace=world["ws1"], actor="t")
    assert native_dataset_ids(conn) == {d1, d2}
    set_override(conn, "write", "sync.append", "pg", dataset=d2, actor="t")  # narrower rollback wins
    assert native_dataset_ids(conn) == {d1}
    set_override(conn, "write", "cdc.append", "iceberg_native", actor="t")  # global: every dataset ...
    set_override(conn, "write", "cdc.append", "pg", workspace=world["ws2"], actor="t")  # ... but ws2
    assert native_dataset_ids(conn) == {d1, d2}
    assert native_dataset_ids(conn, [d2, d3]) == {d2}
    assert native_dataset_ids(conn, []) == set()
    # It agrees with the resolver for every dataset.
    r = FlagResolver(conn, 0)
    for d in (d1, d2, d3):
        is_native = any(r.write_mode(w.name, d).mode == "iceberg_native" for w in registry.FLIPPABLE_WRITERS)
        assert is_native == (d in native_dataset_ids(conn))
