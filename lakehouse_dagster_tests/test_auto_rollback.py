"""Auto-rollback on MISMATCH (issue 10): a divergence injected behind the mirror's back (a row of
dataset_rows changed with the triggers off, so the Postgres version does not move and the dataset stays
caught up) found by the CLI canary (a real subprocess), the parity asset check in a real run, the
schedule's run, the flip preflight and a first native sync. Real Postgres, real Iceberg, real Dagster."""

from __future__ import annotations

import json
import threading
import time
import uuid

import dagster as dg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.dagster.defs.parity.canary_schedule import PARTITION_TAG
from lakehouse_dagster.dagster.defs.parity.checks import AUTO_ROLLBACK_TAG, parity
from lakehouse_dagster.flags.gates import set_flag
from lakehouse_dagster.flags.overrides import history, set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity import canary as canary_checks
from lakehouse_dagster.routing.read_router import resolve_read_source
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, flag_tables
from .test_canary import behind_the_mirrors_back, rows_for, sync
from .test_parity_dagster import _evaluations, _materialize, _run_canary_job

TAMPER = "update dataset_rows set data = jsonb_set(data, '{i}', '42') where dataset_id = %s and row_index = 3"


def _dataset(conn, settings, dsn, ws, name: str, n: int = 12) -> uuid.UUID:
    d = datasets.create_dataset(
        conn, ws, name, [{"name": "s", "type": "string"}, {"name": "i", "type": "int64"}, {"name": "j", "type": "json"}]
    )
    datasets.insert_rows(conn, d, [{k: r[k] for k in ("s", "i", "j")} for r in rows_for(n)])
    sync(settings, dsn, d)
    return d


def _diverge(conn, d) -> None:
    version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    behind_the_mirrors_back(conn, TAMPER, (d,))
    assert conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0] == version


def _dataset_overrides(conn, d) -> dict[str, tuple[str, str]]:
    return {
        name: (mode, note)
        for name, mode, note in conn.execute(
            "select name, mode, note from lakehouse_flag_overrides where kind = 'read' and scope = 'dataset'"
            " and scope_id = %s",
            (d,),
        ).fetchall()
    }


def _audit_notes(conn, d) -> list[tuple]:
    return conn.execute(
        "select name, before_mode, after_mode, note, actor from lakehouse_flag_audit"
        " where scope = 'dataset' and scope_id = %s and note like 'auto-rollback:%%' order by id",
        (d,),
    ).fetchall()


def _parity_ids(conn, d) -> list[int]:
    return [
        r[0]
        for r in conn.execute(
            "select id from lakehouse_read_parity where dataset_id = %s and verdict = 'MISMATCH' order by id", (d,)
        ).fetchall()
    ]


@pytest.fixture
def ws(conn):
    return datasets.create_workspace(conn, "ws")


@pytest.fixture
def flipped(conn, dsn, settings, ws):
    """A dataset read from Iceberg by three readers, through each scope, and a healthy neighbour."""
    d = _dataset(conn, settings, dsn, ws, "orders")
    other = _dataset(conn, settings, dsn, ws, "neighbour", 5)
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, note="fase1 canary", actor="pytest")
    set_override(conn, "read", "graph.kuzu", "iceberg_only", workspace=ws, note="fase1 ws", actor="pytest")
    set_override(conn, "read", "studio.preview", "iceberg", note="fase1 global", actor="pytest")  # STRICT
    return d, other


def test_cli_canary_turns_every_reader_serving_iceberg_off_once(conn, dsn, settings, flipped):
    d, other = flipped
    _diverge(conn, d)
    proc = cli("canary", "--dataset", str(d))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (pid,) = _parity_ids(conn, d)
    note = f"auto-rollback: MISMATCH (canary, parity {pid})"
    audit = _audit_notes(conn, d)
    assert [(n, b, a, t) for n, b, a, t, _ in audit] == [
        ("export.stream", "iceberg", "off", note),
        ("graph.kuzu", None, "off", note),
        ("studio.preview", None, "off", note),
    ]
    assert {actor for *_, actor in audit} == {"pytest (auto-rollback)"}
    assert _dataset_overrides(conn, d) == {r: ("off", note) for r in ("export.stream", "graph.kuzu", "studio.preview")}
    ids = {n: i for n, i in conn.execute("select name, id from lakehouse_flag_audit where note = %s", (note,))}
    for reader, before in (("export.stream", "iceberg"), ("graph.kuzu", "iceberg_only"), ("studio.preview", "iceberg")):
        assert (
            f"auto-rollback: reader {reader} {before} → off for orders ({d}) at dataset scope (audit #{ids[reader]})"
        ) in proc.stdout
    # the read router serves Postgres for it now; the neighbour still reads Iceberg through the workspace scope
    flags = FlagResolver(conn, ttl_seconds=0)
    for reader in ("export.stream", "graph.kuzu", "studio.preview"):
        assert resolve_read_source(conn, flags, reader, d).decision.reason == "pg@off"
    assert resolve_read_source(conn, flags, "graph.kuzu", other).decision.reason == "iceberg@eventual"
    # what was rolled back is part of the recorded verdict too
    recorded = conn.execute(
        "select detail -> 'auto_rollback' from lakehouse_read_parity where id = %s", (pid,)
    ).fetchone()[0]
    assert sorted(a["flag"] for a in recorded["rolled_back"]) == ["export.stream", "graph.kuzu", "studio.preview"]

    # a second canary on the same MISMATCH: still exit 1, nothing more written
    before = flag_tables(conn)
    proc = cli("canary", "--dataset", str(d), "--json")
    assert proc.returncode == 1
    (outcome,) = json.loads(proc.stdout)["auto_rollback"]
    assert outcome["rolled_back"] == []
    assert outcome["note"] == f"auto-rollback: MISMATCH (canary, parity {_parity_ids(conn, d)[-1]})"
    assert sorted((a["flag"], a["status"]) for a in outcome["actions"]) == [
        ("export.stream", "already"),
        ("graph.kuzu", "already"),
        ("studio.preview", "already"),
    ]
    assert flag_tables(conn) == before


def test_auto_rollback_off_only_reports(conn, dsn, settings, flipped):
    d, _ = flipped
    _diverge(conn, d)
    before = flag_tables(conn)
    proc = cli("canary", "--dataset", str(d), env={"LAKEHOUSE_AUTO_ROLLBACK": "false"})
    assert proc.returncode == 1
    assert flag_tables(conn) == before
    assert (
        f"AUTO-ROLLBACK OFF (LAKEHOUSE_AUTO_ROLLBACK=false): reader export.stream still iceberg for orders ({d}); "
        f"roll back by hand: lakehouse flags set export.stream off --dataset {d}"
    ) in proc.stdout
    assert resolve_read_source(conn, FlagResolver(conn, ttl_seconds=0), "export.stream", d).decision.source == "iceberg"
    proc = cli("canary", "--dataset", str(d), env={"LAKEHOUSE_AUTO_ROLLBACK": "maybe"})
    assert proc.returncode == 2 and "LAKEHOUSE_AUTO_ROLLBACK='maybe' is not a boolean" in proc.stderr
    assert flag_tables(conn) == before


def test_no_reader_on_iceberg_means_nothing_written(conn, dsn, settings, ws):
    d = _dataset(conn, settings, dsn, ws, "unflipped")
    set_override(conn, "read", "studio.digest", "shadow", dataset=d, actor="pytest")  # shadow serves Postgres
    _diverge(conn, d)
    before = flag_tables(conn)
    report = auto_rollback.run_canary_and_roll_back(
        conn, dsn, load_catalog(settings, dsn), settings, dataset_ids=[str(d)]
    )
    assert report.exit_code == canary_checks.EXIT_MISMATCH
    assert report.results[0].detail["auto_rollback"]["actions"] == []
    assert flag_tables(conn) == before


def test_parity_check_rolls_back_in_a_real_run(conn, dsn, settings, flipped):
    d, _ = flipped
    _diverge(conn, d)
    with dg.DagsterInstance.ephemeral() as instance:
        result = _materialize(instance, dsn, d, checks=(parity,))
        ev = _evaluations(result)["parity"]
        tags = instance.get_run_by_id(result.run_id).tags
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    note = f"auto-rollback: MISMATCH (check, {result.run_id})"
    assert [n for n, *_ in _audit_notes(conn, d)] == ["export.stream", "graph.kuzu", "studio.preview"]
    assert {t for _, _, _, t, _ in _audit_notes(conn, d)} == {note}
    ids = dict(conn.execute("select name, id from lakehouse_flag_audit where note = %s", (note,)).fetchall())
    text = ev.metadata["auto_rollback"].value
    assert (
        f"reader export.stream iceberg → off for orders ({d}) at dataset scope (audit #{ids['export.stream']})"
    ) in text
    assert f"(audit #{ids['graph.kuzu']})" in ev.description
    assert {a["flag"] for a in ev.metadata["detail"].value["auto_rollback"]["rolled_back"]} == set(ids)
    assert tags[AUTO_ROLLBACK_TAG] == "export.stream,graph.kuzu,studio.preview"


def test_schedule_run_rolls_back_with_its_run_id(conn, dsn, settings, flipped):
    d, _ = flipped
    _diverge(conn, d)
    with dg.DagsterInstance.ephemeral() as instance:
        ev, result = _run_canary_job(instance, dsn, d, tags={"lakehouse/canary": "schedule", PARTITION_TAG: str(d)})
    assert not ev["parity"].passed
    assert {t for _, _, _, t, _ in _audit_notes(conn, d)} == {f"auto-rollback: MISMATCH (schedule, {result.run_id})"}
    assert "auto-rollback: reader studio.preview iceberg → off" in ev["parity"].metadata["auto_rollback"].value


def test_gate_refusal_is_loud_and_claims_nothing(conn, dsn, settings, ws, caplog):
    """Writer flipped native (ungated, as a script could) before its first native sync: the snapshot is still
    the mirror's, so the canary says MISMATCH, but a reader may not go below iceberg for a native dataset."""
    d = _dataset(conn, settings, dsn, ws, "native-bound")
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="pytest")
    set_override(conn, "write", "sync.append", "iceberg_native", dataset=d, actor="pytest")
    # the reverse off: the canary's own comparison (with it on, Iceberg is the truth and the copy is repaired)
    set_reverse(conn, False, dataset=d, note="no copy", actor="pytest")
    _diverge(conn, d)
    before = flag_tables(conn)
    proc = cli("canary", "--dataset", str(d), "--json")
    assert proc.returncode == 1
    assert flag_tables(conn) == before
    (outcome,) = json.loads(proc.stdout)["auto_rollback"]
    assert outcome["rolled_back"] == []
    (action,) = outcome["actions"]
    assert (action["flag"], action["status"], action["audit_id"]) == ("export.stream", "refused", None)
    assert "not a reader problem" in action["detail"] and "written iceberg-native by sync.append" in action["detail"]
    proc = cli("canary", "--dataset", str(d))
    assert f"AUTO-ROLLBACK REFUSED: reader export.stream stays iceberg for native-bound ({d})" in proc.stdout
    # logged as an error too (in a process of its own, the CLI prints it on stderr: `lakehouse canary: error: …`)
    assert any(r.levelname == "ERROR" and "AUTO-ROLLBACK REFUSED" in r.getMessage() for r in caplog.records)


def test_flip_preflight_mismatch_rolls_back_the_readers_already_on_iceberg(conn, dsn, settings, ws):
    d = _dataset(conn, settings, dsn, ws, "half-flipped")
    set_override(conn, "read", "export.stream", "iceberg", dataset=d, actor="pytest")
    _diverge(conn, d)
    proc = cli("flags", "flip", "graph.kuzu", "--dataset", str(d), "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["flipped"] is False
    (c,) = out["preflight"]
    assert c["verdict"] == "MISMATCH" and "auto-rollback: reader export.stream iceberg → off" in c["detail"]
    (pid,) = _parity_ids(conn, d)
    assert _dataset_overrides(conn, d) == {"export.stream": ("off", f"auto-rollback: MISMATCH (rollout, parity {pid})")}


def test_an_operator_change_holding_the_gate_lock_is_waited_for_not_doubled(conn, dsn, settings, flipped):
    d, _ = flipped
    _diverge(conn, d)
    catalog = load_catalog(settings, dsn)
    done: dict = {}

    def canary():
        with connect(dsn) as c:
            done["report"] = auto_rollback.run_canary_and_roll_back(
                c, dsn, catalog, settings, dataset_ids=[str(d)], run_id="race"
            )

    with connect(dsn) as operator:
        with operator.transaction():
            set_flag(operator, "read", "export.stream", "off", dataset=d, note="operator rollback", actor="oncall")
            t = threading.Thread(target=canary)
            t.start()
            deadline = time.monotonic() + 120
            while not conn.execute("select 1 from pg_locks where locktype = 'advisory' and not granted").fetchone():
                assert t.is_alive() and time.monotonic() < deadline, "the auto-rollback did not wait for the gate lock"
                time.sleep(0.05)
        t.join(120)
    outcome = done["report"].results[0].detail["auto_rollback"]
    statuses = {a["flag"]: a["status"] for a in outcome["actions"]}
    assert statuses == {"export.stream": "already", "graph.kuzu": "rolled-back", "studio.preview": "rolled-back"}
    assert [(e.note, e.actor) for e in history(conn, "read", "export.stream", dataset=d)] == [
        ("operator rollback", "oncall"),
        ("fase1 canary", "pytest"),
    ]


def test_first_native_sync_mismatch_sends_the_writer_back_to_pg(conn, dsn, settings):
    from .native_helpers import add_source_rows, row
    from .test_write_flip_first_sync import _fed

    d, src = _fed(conn, dsn, settings)
    add_source_rows(conn, src, [row(6)])  # the source moved on since Postgres was last written
    proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (pid,) = conn.execute(
        "select id from lakehouse_read_parity where dataset_id = %s and source = 'first-native-sync'"
        " and verdict = 'MISMATCH'",
        (d,),
    ).fetchone()
    note = f"auto-rollback: MISMATCH (first-native-sync, parity {pid})"
    audit = conn.execute(
        "select id, kind, name, before_mode, after_mode from lakehouse_flag_audit where note = %s", (note,)
    ).fetchall()
    ((audit_id, kind, name, before, after),) = audit
    assert (kind, name, before, after) == ("write", "sync.full", "iceberg_native", "pg")
    assert FlagResolver(conn, ttl_seconds=0).resolve("write", "sync.full", d).mode == "pg"
    out = proc.stdout
    assert (
        f"auto-rollback: writer sync.full iceberg_native → pg for fed ({d}) at dataset scope (audit #{audit_id})"
    ) in out
    assert "7 row(s) in 1 native snapshot(s) exist only in Iceberg" in out  # the rollback report
    assert "  next: now lifecycle read-flipped; the rows sync.full wrote natively" in out  # the state it left
    assert f"lakehouse backfill --dataset {d}" in out
    assert f"lakehouse write-flags set sync.full pg --dataset {d}" not in out  # done already: not asked of the operator
    # the readers stay on Iceberg (it holds the rows Postgres lacks); a second record of it changes nothing
    before = flag_tables(conn)
    v = canary_checks.evaluate(dsn, load_catalog(settings, dsn), settings, d)
    assert v.verdict == "native"
    assert all(
        FlagResolver(conn, ttl_seconds=0).resolve("read", r, d).mode == "iceberg"
        for r in ("export.stream", "graph.kuzu")
    )
    from lakehouse_dagster.runbooks.first_native_canary import evaluate_first_native

    again = evaluate_first_native(dsn, load_catalog(settings, dsn), settings, d, "sync.full")
    assert again.verdict == "MISMATCH"
    auto_rollback.record_and_roll_back(conn, again, source="first-native-sync", run_id="again", settings=settings)
    assert again.detail["auto_rollback"]["actions"][0]["status"] == "already"
    assert flag_tables(conn) == before
