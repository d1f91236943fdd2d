"""`lakehouse complete` (runbooks/complete/, issue 31): each refusal, the batched no-echo delete of only
that dataset's rows, the resume after a kill, the Parquet export, the refused rollback and the way back (a backfill).

Real Postgres and real Iceberg tables, native writes through the real write router (native_helpers.py); the CLI in
this process, in a subprocess where it must die (a kill between two batches)."""

from __future__ import annotations

import json
import threading
import time
import uuid

import dagster as dg
import pyarrow.parquet as pq
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, FlipRefused
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.complete import complete_job
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.reader_datasets import declare
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.lifecycle import LifecycleRefused
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, flag_tables, refusal
from .native_helpers import SCHEMA, native_write, row, runbook_ready, table_rows


def _native(conn, dsn, settings, lh, rows: int = 6, name: str = "orders", ws=None) -> uuid.UUID:
    """Mirrored, read-flipped, canary ok, sync.append flipped to iceberg_native through the gated CLI."""
    ws = ws or datasets.create_workspace(conn, f"ws-{name}")
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(rows)])
    runbook_ready(conn, dsn, settings, d)
    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    return d


def _completable(conn, dsn, settings, lh, rows: int = 6, name: str = "orders", ws=None) -> uuid.UUID:
    """Native, a native append applied by the reverse mirror, and a canary verdict at that snapshot that agrees."""
    d = _native(conn, dsn, settings, lh, rows, name, ws)
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(rows, rows + 4)], start=rows)
    apply_reverse(dsn, catalog, settings, d)
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == [
        "ok"
    ]  # both ways
    return d


def _pg_rows(conn, d) -> list[tuple]:
    return conn.execute(
        "select row_index, row_id::text, created_at, data from dataset_rows where dataset_id = %s order by row_index",
        (d,),
    ).fetchall()


def _tracking(conn, d) -> tuple:
    return conn.execute(
        "select d.rows_version, d.rows_xid, d.rows_rewrite_version, d.mirrored_version,"
        " (select count(*) from lakehouse_row_changes c where c.dataset_id = d.id) from datasets d where d.id = %s",
        (d,),
    ).fetchone()


def _written(conn) -> tuple:
    """Everything complete writes, for "nothing was written"."""
    return (
        conn.execute("select * from lakehouse_completed").fetchall(),
        conn.execute("select count(*) from lakehouse_complete_audit").fetchone(),
        conn.execute("select count(*) from lakehouse_reverse_audit").fetchone(),
    )


def test_each_missing_condition_is_named_at_once_and_nothing_is_written(conn, dsn, settings, lh):
    d = _native(conn, dsn, settings, lh)
    ws = conn.execute("select workspace_id from datasets where id = %s", (d,)).fetchone()[0]
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)  # the reverse has not applied it
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(d)}}]})),
    )
    declare(conn, "objects.sync", dataset=d, note="the object sync", actor="pytest")
    before = _written(conn)

    with pytest.raises(FlipRefused) as refused:
        cp.complete(dsn, catalog, settings, d, actor="pytest", soak_seconds=3600)
    text = str(refused.value)
    assert (
        f"refused: complete of dataset orders ({d}), lifecycle native (reverse on): 4 condition(s) not met; nothing written:"
        in text
    )
    for says in (
        "under the soak of 3600 s: its soak ends at",
        "the reverse mirror is behind (its position is snapshot none",
        f"lakehouse reverse sync --dataset {d}",
        "BLOCKED (pipeline input): a pipeline reads it from dataset_rows",
        "read from dataset_rows by objects.sync",
        "lakehouse pg-readers remove",
    ):
        assert says in text, (says, text)
    assert _written(conn) == before and len(_pg_rows(conn, d)) == 6

    # the CLI says the same, exits 6, and writes nothing; then parity: caught up but no verdict at that snapshot
    conn.execute("delete from pipelines")
    conn.execute("delete from lakehouse_reader_datasets")
    apply_reverse(dsn, catalog, settings, d)
    code, _, err = lh("complete", "--dataset", str(d))
    assert code == 6 and "1 condition(s) not met" in err, err
    assert "reverse parity not checked at the current snapshot" in err and "lakehouse canary --smoke" in err
    lh("reverse", "off", "--dataset", str(d), "--note", "test", check=True)
    before = _written(conn)
    code, _, err = lh("complete", "--dataset", str(d))
    assert code == 6 and "the reverse mirror is off for it (dataset setting)" in err, err
    assert _written(conn) == before

    # not native: Postgres is its truth
    lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    code, _, err = lh("complete", "--dataset", str(d))
    assert code == 6 and "not written iceberg-native" in err and "write-flags flip <writer>" in err, err

    # bad input: one line each, nothing written
    for args, says, exit_code in (
        (("--dataset", "nope"), "dataset id", 2),
        (("--dataset", "00000000-0000-0000-0000-000000000001"), "does not exist", 3),
        (("--dataset", str(d), "--workspace", str(ws)), "not both", 2),
    ):
        code, _, err = lh("complete", *args)
        assert code == exit_code and says in err and len(err.strip().splitlines()) == 1, err
    assert _written(conn) == before


def test_complete_is_refused_while_rows_hold_keys_the_schema_does_not_declare(conn, dsn, settings, lh, tmp_path):
    """Issue 42 item 5: Iceberg and the export hold declared columns only; complete deleted the rest with the rows."""
    d = _completable(conn, dsn, settings, lh, rows=6)
    with conn.transaction():  # as an older release's mirror left them: unseen by change tracking, the verdict stands
        conn.execute("set local session_replication_role = replica")
        conn.execute(
            'update dataset_rows set data = data || \'{"memo": "only here"}\' where dataset_id = %s'
            " and row_index in (1, 4)",
            (d,),
        )
    rows, before = _pg_rows(conn, d), _written(conn)
    code, _, err = lh("complete", "--dataset", str(d), "--export-to", str(tmp_path / "x"))
    assert code != 0, err
    assert (
        f"refused: complete of dataset orders ({d}), lifecycle native (reverse on): 1 condition(s) not met; nothing written:"
        in err
    )
    assert "2 row(s) of dataset_rows hold 1 key(s) its schema does not declare: 'memo' (2 rows)" in err
    assert "--export-to would not keep them" in err
    assert _pg_rows(conn, d) == rows and _written(conn) == before
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_complete_deletes_only_its_rows_without_echo_exports_them_refuses_the_rollback_and_a_backfill_restores(
    conn, dsn, settings, lh, tmp_path, monkeypatch
):
    monkeypatch.setenv("LAKEHOUSE_COMPLETE_BATCH_ROWS", "3")
    d = _completable(conn, dsn, settings, lh, rows=6)
    other = datasets.create_dataset(conn, datasets.create_workspace(conn, "other"), "kept", SCHEMA)
    datasets.insert_rows(conn, other, [row(i) for i in range(5)])
    kept, rows, ice = _pg_rows(conn, other), _pg_rows(conn, d), table_rows(settings, dsn, d)
    tracked, other_tracked = _tracking(conn, d), _tracking(conn, other)
    xid = conn.execute("select pg_current_xact_id()::text::bigint").fetchone()[0]

    full = tmp_path / "full"
    full.mkdir()
    (full / "x.txt").write_text("someone's file")
    before = _written(conn)
    code, _, err = lh("complete", "--dataset", str(d), "--export-to", str(full))
    assert code == 2 and "is not empty" in err and len(err.strip().splitlines()) == 1, err
    assert _written(conn) == before

    out = tmp_path / "export"
    done = json.loads(lh("complete", "--dataset", str(d), "--export-to", str(out), "--note", "done", "--json")[1])[
        "completed"
    ][0]
    assert (done["status"], done["rows_deleted"], done["batches"], done["exported_rows"]) == ("complete", 10, 4, 10)
    assert _pg_rows(conn, d) == [] and _pg_rows(conn, other) == kept
    # its maintained digest unregistered at the start (no batch hashed the rows it deleted), the other's kept
    registered = "select count(*) from lakehouse_pg_digest_state where dataset_id = %s"
    assert conn.execute(registered, (d,)).fetchone() == (0,)
    # no echo: change tracking of neither dataset moved, the poller's change query finds nothing
    assert _tracking(conn, d) == tracked and _tracking(conn, other) == other_tracked
    assert conn.execute("select count(*) from datasets where rows_xid::text::bigint > %s", (xid,)).fetchone()[0] == 0

    # the export: every row with its identity, typed as the table
    files = sorted(out.iterdir())
    assert [f.name for f in files] == [f"lakehouse-complete-{d}-00000.parquet"]
    exported = pq.read_table(files[0]).to_pylist()
    assert [(r["__row_index"], r["__row_id"], r["__created_at"]) for r in exported] == [r[:3] for r in rows]
    # the values as the table holds them (jsonb has no -0: Postgres, so the export, holds 0.0 where Iceberg has -0.0)
    assert [{**r, "x": repr(r["x"])} for r in exported] == [{**r, "x": r["x"].replace("-0.0", "0.0")} for r in ice]

    # audited: start, export, each batch, finish; the reverse off at dataset scope with note "complete"
    status = json.loads(lh("complete", "--status", "--dataset", str(d), "--json")[1])
    assert [a["event"] for a in reversed(status["audit"])] == ["start", "export", *["batch"] * 4, "finish"]
    assert status["marks"][0]["status"] == "complete" and status["marks"][0]["rows_deleted"] == 10
    assert conn.execute(
        "select after_enabled, note from lakehouse_reverse_audit where scope_id = %s order by id desc limit 1", (d,)
    ).fetchone() == (False, "complete")
    again = json.loads(lh("complete", "--dataset", str(d), "--json")[1])["completed"][0]
    assert again["started"] == "already complete"

    # the rollback to pg is refused, with the reason and the way back, before anything is written
    flags = flag_tables(conn)
    code, _, err = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d))
    day = conn.execute("select finished_at from lakehouse_completed").fetchone()[0]
    assert code == 6, err
    assert (
        f"dataset {d} was completed on {day:%Y-%m-%d}: its Postgres rows were deleted; to return it to Postgres, "
        f"backfill it from Iceberg first: lakehouse backfill --dataset {d}"
    ) in err
    assert flag_tables(conn) == flags
    # ... a widen would be too, and the forward mirror refuses it whatever its flags say
    code, _, err = lh("write-flags", "clear", "sync.append", "--dataset", str(d))
    assert code == 6 and "was completed on" in err
    # ... and so is a change past the gates: the lifecycle refuses every way out of complete but a restore
    with pytest.raises(LifecycleRefused, match="is complete .*no writer may leave iceberg_native before a restore"):
        set_override(conn, "write", "sync.append", "pg", dataset=d, note="ungated", actor="pytest")
    assert flag_tables(conn) == flags
    with pytest.raises(BadInput, match="was completed on.*the mirror refuses it"):
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d)

    # the way back: a backfill restores every row from Iceberg, lifts the mark; the rollback then needs nothing
    restored = json.loads(lh("backfill", "--dataset", str(d), "--json", check=True)[1])
    assert restored["restored"] is True and restored["copied"] == 10
    assert _pg_rows(conn, d) == rows
    assert conn.execute("select status from lakehouse_completed").fetchone() == ("restored",)
    out_text = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)[1]
    assert "no backfill needed" in out_text, out_text
    assert sync_dataset(dsn, load_catalog(settings, dsn), settings, d).mode == "noop"
    # the canary registers and fills the digest again over the rows restored, and they agree with the table: ok, the
    # writer is back on pg and Postgres holds that very snapshot (issue 42, item 4: it said "native")
    checked = evaluate(dsn, load_catalog(settings, dsn), settings, d)
    assert checked.verdict == "ok", checked.detail
    assert conn.execute(registered, (d,)).fetchone() == (1,)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_complete_killed_between_batches_resumes_where_it_stopped(conn, dsn, settings, lh):
    d = _completable(conn, dsn, settings, lh, rows=6)
    env = {"LAKEHOUSE_COMPLETE_BATCH_ROWS": "4", "LAKEHOUSE_FAILPOINT": "complete-after-batch"}
    proc = cli("complete", "--dataset", str(d), env=env)
    assert proc.returncode == -9, proc.stderr
    mark = conn.execute("select status, rows_deleted, batches, next_row_index from lakehouse_completed").fetchone()
    assert mark[:3] == ("in_progress", 4, 1) and len(_pg_rows(conn, d)) == 6
    assert [r[0] for r in _pg_rows(conn, d)] == list(range(mark[3], mark[3] + 6))

    # the mark stands: a rollback is refused meanwhile, and re-running continues without checking again
    code, _, err = lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d))
    assert code == 6 and "is being completed since" in err and "4 Postgres row(s) deleted so far" in err, err
    # launched again from the UI (the complete job): it continues
    with dg.DagsterInstance.ephemeral() as instance:
        result = complete_job.execute_in_process(
            run_config={"ops": {"complete_op": {"config": {"dataset_id": str(d)}}}},
            resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
            instance=instance,
        )
    (r,) = result.output_for_node("complete_op")["completed"]
    assert (r["started"], r["status"], r["rows_deleted"], r["total_deleted"]) == ("resumed", "complete", 6, 10)
    assert _pg_rows(conn, d) == []
    events = [e for (e,) in conn.execute("select event from lakehouse_complete_audit order by id").fetchall()]
    assert events == ["start", "batch", "resume", "batch", "finish"]  # (the job's batches: 10,000 rows)

    # the job refuses as the CLI does: the reason only, no stack
    other = datasets.create_dataset(conn, datasets.create_workspace(conn, "pg"), "on pg", SCHEMA)
    with dg.DagsterInstance.ephemeral() as instance:
        result = complete_job.execute_in_process(
            run_config={"ops": {"complete_op": {"config": {"dataset_id": str(other)}}}},
            resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
            instance=instance,
            raise_on_error=False,
        )
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert "not written iceberg-native" in refusal(failure) and "condition(s) not met" in refusal(failure)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_workspace_complete_completes_the_ready_datasets_and_names_why_the_others_are_not(
    conn, dsn, settings, lh, tmp_path
):
    ws = datasets.create_workspace(conn, "both")
    ready = _completable(conn, dsn, settings, lh, rows=3, name="ready", ws=ws)
    behind = _native(conn, dsn, settings, lh, rows=3, name="behind", ws=ws)
    native_write(conn, dsn, settings, behind, "sync.append", [row(3)], start=3)  # not applied by the reverse yet
    out = tmp_path / "export"
    code, text, _ = lh("complete", "--workspace", str(ws), "--export-to", str(out))
    assert code == 6, text
    assert f"dataset {ready}: complete started; 7 row(s) exported as Parquet to {out / str(ready)}" in text
    assert (
        f"refused: complete of dataset behind ({behind}), lifecycle native (reverse on): 1 condition(s) not met" in text
    )
    assert _pg_rows(conn, ready) == [] and len(_pg_rows(conn, behind)) == 3
    assert pq.read_table(out / str(ready)).num_rows == 7
    assert [m["dataset_id"] for m in json.loads(lh("complete", "--status", "--json")[1])["marks"]] == [str(ready)]


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_workspace_complete_with_an_export_cut_short_resumes_when_run_again(conn, dsn, settings, lh, tmp_path):
    """Issue 42 item 8: a first run over a workspace completes the one ready dataset (its export whole); a second,
    once the others are ready, is killed in the middle of an export. Run again with the same --export-to it skips
    the complete one, starts the cut-short export over and completes the rest. Anything the runs did not write
    still refuses the directory."""
    ws = datasets.create_workspace(conn, "several")
    catalog = load_catalog(settings, dsn)
    ready = _completable(conn, dsn, settings, lh, rows=3, name="ready", ws=ws)
    late = sorted((_native(conn, dsn, settings, lh, rows=3, name=f"late{i}", ws=ws) for i in range(2)), key=str)
    for d in late:  # not applied by the reverse yet: refused by the first run
        native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(3, 7)], start=3)
    out = tmp_path / "export"
    code, text, _ = lh("complete", "--workspace", str(ws), "--export-to", str(out))
    assert code == 6 and f"dataset {ready}: complete started; 7 row(s) exported" in text, text
    for d in late:
        apply_reverse(dsn, catalog, settings, d)
        assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]

    # the first late dataset's export dies after its first chunk: a .partial file, its mark in progress
    env = {"LAKEHOUSE_COMPLETE_BATCH_ROWS": "2", "LAKEHOUSE_FAILPOINT": "complete-export-after-chunk"}
    killed = cli("complete", "--workspace", str(ws), "--export-to", str(out), env=env)
    assert killed.returncode == -9, killed.stderr
    marks = dict(conn.execute("select dataset_id, status from lakehouse_completed").fetchall())
    assert marks == {ready: "complete", late[0]: "in_progress"}
    assert [p.name for p in (out / str(late[0])).iterdir()] == [f"{cp.EXPORT_PREFIX}{late[0]}-00000.parquet.partial"]
    assert len(_pg_rows(conn, late[0])) == 7

    code, text, err = lh("complete", "--workspace", str(ws), "--export-to", str(out))
    assert code == 0, text + err
    assert f"dataset {late[0]}: resumed; 7 row(s) exported as Parquet to {out / str(late[0])}" in text, text
    assert f"dataset {late[1]}: complete started; 7 row(s) exported" in text and str(ready) not in text, text
    for d in (ready, *late):
        assert _pg_rows(conn, d) == []
        files = sorted(p.name for p in (out / str(d)).iterdir())
        assert files == [f"{cp.EXPORT_PREFIX}{d}-00000.parquet"], files
        assert sorted(r["__row_index"] for r in pq.read_table(out / str(d)).to_pylist()) == list(range(7))

    # a directory holding anything no complete exported is still refused, before anything is written
    (out / "notes.txt").write_text("mine")
    other = _completable(conn, dsn, settings, lh, rows=3, name="later", ws=ws)
    code, _, err = lh("complete", "--workspace", str(ws), "--export-to", str(out))
    assert code != 0 and "is not empty (1 entry that no earlier complete exported, e.g. notes.txt)" in err, err
    assert len(_pg_rows(conn, other)) == 7 and not (out / str(other)).exists()


def test_a_batch_that_meets_a_row_lock_of_the_live_app_backs_off_and_the_app_never_waits_on_it(conn, dsn, settings, lh):
    d = _completable(conn, dsn, settings, lh, rows=6)
    other = datasets.create_dataset(conn, datasets.create_workspace(conn, "live"), "live", SCHEMA)
    app = connect(dsn, autocommit=False)
    app.execute("select 1 from dataset_rows where dataset_id = %s and row_index = 0 for update", (d,))  # held
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(r=cp.complete(dsn, load_catalog(settings, dsn), settings, d, actor="pytest"))
    )
    worker.start()
    time.sleep(0.6)
    assert worker.is_alive() and "r" not in result  # its batch gave up on the lock and waits to retry
    assert len(_pg_rows(conn, d)) == 10
    # meanwhile the live app writes other datasets without waiting (no table lock): a wait on any lock would end in
    # this lock_timeout, well under the batch's; a statement that takes no lock never meets it, however loaded
    app.execute("set lock_timeout = '400ms'")
    datasets.insert_rows(app, other, [row(0)])
    app.commit()  # ... and its row lock goes
    worker.join(timeout=30)
    assert result["r"].status == "complete" and _pg_rows(conn, d) == [] and len(_pg_rows(conn, other)) == 1
    app.close()
