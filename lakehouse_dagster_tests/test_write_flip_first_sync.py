"""The write flip runs the writer's first native sync and the canary on it (runbook step 3), from the CLI
and from the write_flip job: ok for an unchanged source, MISMATCH (→ rollback command) when the source
changed under it. Real Postgres source table, real run_writer, real Iceberg, real Dagster run."""

from __future__ import annotations

import json
import uuid

import dagster as dg

from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.runbooks.rollout import write_flip_job
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking import datasets

from .flag_helpers import cli, refusal
from .native_helpers import SCHEMA, SERVABLE, add_source_rows, pg_source_table, row


def _fed(conn, dsn, settings, rows: int = 6) -> tuple[uuid.UUID, str]:
    """A dataset fed by a Postgres table on the pg path, mirrored, its readers on Iceberg (canary not run:
    the flip's preflight runs it)."""
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "fed", SCHEMA)
    src = pg_source_table(conn, [row(i) for i in range(rows)])
    set_source(conn, d, {"type": "postgres", "table": src, "cursor_column": None, "dsn_env": None})
    catalog = load_catalog(settings, dsn)
    assert run_writer(dsn, catalog, settings, FlagResolver(conn, ttl_seconds=0), d, "sync.full").path == "pg"
    sync_dataset(dsn, catalog, settings, d)
    for r in SERVABLE:
        set_override(conn, "read", r, "iceberg", dataset=d, actor="pytest")
    return d, src


def _recorded(conn, d):
    return conn.execute(
        "select verdict, pg_count, iceberg_count from lakehouse_read_parity where dataset_id = %s"
        " and source = 'first-native-sync'",
        (d,),
    ).fetchall()


def test_write_flags_flip_runs_the_first_native_sync_and_its_canary(conn, dsn, settings):
    d, _ = _fed(conn, dsn, settings)
    proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (f,) = json.loads(proc.stdout)["first_native_sync"]
    assert (f["verdict"], f["path"], f["rows"], f["problem"]) == ("ok", "native", 6, None)
    assert "holds the 6 row(s) Postgres held (content" in f["detail"]
    assert _recorded(conn, d) == [("ok", 6, 6)]
    assert f"iceberg_native: {d} (6 rows → snapshot {f['snapshot_id']})" in proc.stderr  # the runbook's log line


def test_a_flip_of_a_dataset_without_a_source_says_its_first_native_write_goes_unchecked(conn, dsn, settings):
    """No source: nothing to sync natively now; the flip says what that leaves (no first-native canary later, the
    reverse copies that write as it lands) and the way to have it checked, not a canary that would not check it."""
    from .native_helpers import runbook_ready

    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "sourceless", SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(4)])
    runbook_ready(conn, dsn, settings, d)
    proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (f,) = json.loads(proc.stdout)["first_native_sync"]
    assert (f["verdict"], f["path"], f["problem"]) == (None, None, None)
    assert f["detail"].startswith("no source set: skipped; its first native write"), f["detail"]
    assert "gets no first-native canary" in f["detail"] and "set the source before the flip" in f["detail"]
    assert _recorded(conn, d) == []


def test_write_flip_job_stops_with_the_rollback_command_when_the_source_changed(conn, dsn, settings):
    d, src = _fed(conn, dsn, settings)
    add_source_rows(conn, src, [row(6)])  # the source moved on since Postgres was last written
    result = write_flip_job.execute_in_process(
        run_config={"ops": {"write_flip_preflight": {"config": {"writer": "sync.full", "dataset_id": str(d)}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    assert result.output_for_node("write_flip_verify")[0]["problems"] == []
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.step_key == "write_flip_first_sync"
    text = refusal(failure)  # the reason the step shows, without a stack (dagster/defs/shared/refusals.py)
    assert "canary MISMATCH" in text and "Postgres 6 rows" in text and "Iceberg 7 rows" in text
    assert not failure.event_specific_data.error.stack and failure.event_specific_data.error.cause is None
    assert _recorded(conn, d) == [("MISMATCH", 6, 7)]
    # auto-rollback already sent the writer back to pg (audited with the run id), and the step says what
    # that leaves: Iceberg holds the 7 rows Postgres lacks, and the two ways forward
    (audit_id,) = conn.execute(
        "select id from lakehouse_flag_audit where kind = 'write' and after_mode = 'pg' and note = %s",
        (f"auto-rollback: MISMATCH (first-native-sync, {result.run_id})",),
    ).fetchone()
    assert f"writer sync.full iceberg_native → pg for fed ({d}) at dataset scope (audit #{audit_id})" in text
    assert "7 row(s) in 1 native snapshot(s) exist only in Iceberg" in text
    assert f"lakehouse backfill --dataset {d}" in text


def test_with_auto_rollback_off_the_stop_names_the_rollback_command(conn, dsn, settings, monkeypatch):
    d, src = _fed(conn, dsn, settings)
    add_source_rows(conn, src, [row(6)])
    monkeypatch.setenv("LAKEHOUSE_AUTO_ROLLBACK", "false")
    proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d))
    assert proc.returncode == 1
    assert f"lakehouse write-flags set sync.full pg --dataset {d}" in proc.stdout
    assert "AUTO-ROLLBACK OFF (LAKEHOUSE_AUTO_ROLLBACK=false): writer sync.full still iceberg_native" in proc.stdout
    # the rollback it names: Iceberg now holds the 7 rows Postgres lacks
    proc = cli("write-flags", "set", "sync.full", "pg", "--dataset", str(d), check=True)
    assert "7 row(s) in 1 native snapshot(s) exist only in Iceberg" in proc.stdout


def test_the_reverse_mirror_waits_for_the_first_native_syncs_canary_so_a_mismatch_is_seen_and_postgres_kept(
    conn, dsn, settings
):
    """The first native canary compares the new snapshot with what Postgres held. The reverse mirror (the stream
    applies a native commit within a second) must not copy that snapshot into dataset_rows before the verdict: the
    canary would compare Iceberg with its own copy (always ok), and after a MISMATCH's auto-rollback Postgres would be
    left holding the doubtful native rows as the truth. Here a reverse driver races the flip as fast as it can."""
    import threading
    import time

    from lakehouse_dagster.core.errors import LakehouseError
    from lakehouse_dagster.mirror.reverse import apply_reverse, position

    d, src = _fed(conn, dsn, settings)
    add_source_rows(conn, src, [row(6)])  # the source moved on since Postgres was last written: MISMATCH expected
    before = conn.execute(
        "select row_index, row_id, data from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()
    stop, applied, busy = threading.Event(), [], []
    catalog = load_catalog(settings, dsn)

    def reverse_driver():  # what a mirror_stream does for a native dataset, without its poll interval
        while not stop.is_set():
            try:
                r = apply_reverse(dsn, catalog, settings, d, lock_timeout_s=0.05)
                if r.how != "noop":
                    applied.append(r.snapshot_id)
            except LakehouseError as exc:  # not native yet / any more, or its lock busy
                busy.append(str(exc))
            time.sleep(0.01)

    t = threading.Thread(target=reverse_driver, daemon=True)
    t.start()
    try:
        proc = cli("write-flags", "flip", "sync.full", "--dataset", str(d), "--json")
    finally:
        stop.set()
        t.join(timeout=30)
    assert proc.returncode != 0, proc.stdout
    (f,) = json.loads(proc.stdout)["first_native_sync"]
    assert f["verdict"] == "MISMATCH" and f["rolled_back"], f
    assert _recorded(conn, d) == [("MISMATCH", 6, 7)]
    assert f["snapshot_id"] not in applied  # the doubtful snapshot never reached dataset_rows ...
    after = conn.execute(
        "select row_index, row_id, data from dataset_rows where dataset_id = %s order by row_index", (d,)
    ).fetchall()
    assert after == before  # ... which still holds what Postgres held before the flip: the truth again
    at = position(conn, d)
    assert at is None or at.snapshot_id != f["snapshot_id"]
    assert any("first native sync" in b for b in busy), busy[-5:]  # the driver was there, and waited
