"""Pipeline inputs and Postgres-locked readers with the reverse mirror (issue 31): step 2b's candidates say SAFE
with the reverse on and BLOCKED without it, naming why; the write-flip gates let such a dataset go native only with
its reverse on, and refuse it otherwise before anything is written, with the reason and the command.

Datasets are made ready the way test_gates.py makes them (the real mirror, read flips, the real canary); the flips
go through the gated ``set_flag`` in process, one through the CLI (what the operator reads).
"""

from __future__ import annotations

import json

import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.dagster.defs.status.overview import overview_metadata
from lakehouse_dagster.flags.candidates import SAFE, SAFE_REVERSE, write_flip_candidates
from lakehouse_dagster.flags.gates import NATIVE, set_flag
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.reader_datasets import declare
from lakehouse_dagster.flags.registry import WRITE
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.runbooks import flip
from lakehouse_dagster.runbooks.reverse_parity import check_reverse_parity
from lakehouse_dagster.status.overview import compute_overview
from lakehouse_dagster.status.overview_text import text_lines
from lakehouse_dagster.tracking.datasets import create_dataset, get_dataset, insert_rows

from .flag_helpers import cli, cli_json, flag_tables
from .native_helpers import SCHEMA, native_write, ready_native, row
from .test_gates import _dataset, _ready, ws  # noqa: F401  (ws: the fixture)


def _pipe(conn, ws_id, d) -> None:
    conn.execute(
        "insert into pipelines (workspace_id, name, spec) values (%s, 'nightly', %s)",
        (ws_id, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(d)}}]})),
    )


def _flip(conn, d=None, **scope):
    return set_flag(
        conn, "write", "sync.full", "iceberg_native", dataset=d, soak_seconds=0, actor="pytest", note="fase4", **scope
    )


def test_a_pipeline_input_is_blocked_with_the_reverse_off_and_safe_with_it_on(conn, dsn, settings, ws):  # noqa: F811
    piped, plain = _dataset(conn, ws, "piped", 6), _dataset(conn, ws, "plain", 5)
    for d in (piped, plain):
        _ready(conn, dsn, settings, d)
    _pipe(conn, ws, piped)
    set_reverse(conn, False, dataset=piped, note="keep Postgres as is", actor="pytest")

    turn_on = f"lakehouse reverse on --dataset {piped}"
    got = {c.name: c for c in write_flip_candidates(conn, "sync.full")}
    assert got["piped"].verdict == f"BLOCKED (pipeline input; reverse mirror off: turn it on with `{turn_on}`)"
    assert got["piped"].runbook_verdict == "BLOCKED (pipeline input)" and not got["piped"].ready
    assert got["piped"].reverse == "reverse off (dataset setting)"
    assert (got["plain"].verdict, got["plain"].ready, got["plain"].reverse) == (SAFE, True, None)

    before = flag_tables(conn)
    with pytest.raises(FlipRefused) as refused:
        _flip(conn, piped)
    text = str(refused.value)
    assert f"piped ({piped}), lifecycle read-flipped: BLOCKED (pipeline input; reverse mirror off)" in text
    assert "a pipeline reads it from dataset_rows (F3)" in text and f"turn it on with `{turn_on}`" in text
    assert "nothing written" in text and flag_tables(conn) == before and native_dataset_ids(conn) == set()
    # a workspace flip names each blocked dataset, and moves none of them
    with pytest.raises(FlipRefused) as refused:
        _flip(conn, workspace=ws)
    assert f"piped ({piped}), lifecycle read-flipped: BLOCKED (pipeline input; reverse mirror off)" in str(
        refused.value
    )
    assert f"plain ({plain})" not in str(refused.value) and flag_tables(conn) == before
    # the native flip (write-flags flip) refuses it in its preflight, before it canaries anything
    verdicts = conn.execute("select count(*) from lakehouse_read_parity").fetchone()
    with pytest.raises(FlipRefused, match=r"BLOCKED \(pipeline input; reverse mirror off\)"):
        flip.preflight(conn, dsn, load_catalog(settings, dsn), settings, "sync.full", NATIVE, dataset=piped, kind=WRITE)
    assert conn.execute("select count(*) from lakehouse_read_parity").fetchone() == verdicts
    assert flag_tables(conn) == before

    # the operator reads the same through the CLI: the verdict, and the JSON carries it
    proc = cli("candidates", "--writer", "sync.full", check=True)
    assert f"BLOCKED (pipeline input; reverse mirror off: turn it on with `{turn_on}`)" in proc.stdout
    assert "1 pipeline input(s): 0 SAFE with the reverse mirror on, 1 BLOCKED with it off" in proc.stdout

    set_reverse(conn, None, dataset=piped, note="the default: on", actor="pytest")
    got = {c["name"]: c for c in cli_json("candidates", "--writer", "sync.full")}
    assert (got["piped"]["verdict"], got["piped"]["ready"], got["piped"]["reasons"]) == (SAFE_REVERSE, True, [])
    assert got["piped"]["runbook_verdict"] == "BLOCKED (pipeline input)"
    assert got["piped"]["reverse"] == "reverse on (the default)"
    assert _flip(conn, piped).after == "iceberg_native" and native_dataset_ids(conn) == {piped}


def test_a_declared_postgres_locked_reader_needs_the_reverse_on(conn, dsn, settings, ws):  # noqa: F811
    d = _dataset(conn, ws, "dashed", 4)
    _ready(conn, dsn, settings, d)
    declare(conn, "dashboards.aggregate", dataset=d, note="the KPI board", actor="pytest")
    set_reverse(conn, False, workspace=ws, note="workspace off", actor="pytest")

    (c,) = write_flip_candidates(conn, "sync.full")
    assert c.verdict == SAFE and not c.ready  # not a pipeline input: the runbook's SAFE, but the gate says no
    assert any("read from dataset_rows by dashboards.aggregate" in r for r in c.reasons)

    before = flag_tables(conn)
    with pytest.raises(FlipRefused) as refused:
        _flip(conn, d)
    text = str(refused.value)
    assert (
        f"dashed ({d}), lifecycle read-flipped: read from dataset_rows by dashboards.aggregate (mode off: on Postgres until flipped, once its "
        "shadow reads prove it), locked to Postgres" in text
    )
    assert f"reverse off (workspace setting): turn it on with `lakehouse reverse on --dataset {d}`" in text
    assert flag_tables(conn) == before and native_dataset_ids(conn) == set()

    set_reverse(conn, True, dataset=d, note="keep dataset_rows for the board", actor="pytest")  # most specific wins
    (c,) = write_flip_candidates(conn, "sync.full")
    assert c.ready and c.reasons == ()
    assert _flip(conn, d).after == "iceberg_native" and native_dataset_ids(conn) == {d}


def test_in_capture_mode_after_commit_the_reverse_keeps_pipeline_inputs_and_locked_readers_unblocked(
    conn,
    dsn,
    settings,
    ws,  # noqa: F811
):
    """The reverse mirror runs in capture mode after-commit too (its transaction marked for the WAL consumer,
    mirror/reverse.py), so the candidates, the gates and the overview treat it there as in triggers."""
    from lakehouse_dagster.tracking import capture

    if conn.execute("show wal_level").fetchone()[0] != "logical":
        pytest.skip("capture mode after-commit needs wal_level = logical")
    piped, dashed = (create_dataset(conn, ws, name, SCHEMA) for name in ("piped", "dashed"))
    for d in (piped, dashed):
        insert_rows(conn, d, [row(i) for i in range(5)])
        _ready(conn, dsn, settings, d)
    _pipe(conn, ws, piped)
    declare(conn, "dashboards.aggregate", dataset=dashed, note="the KPI board", actor="pytest")
    capture.enable(conn)
    try:
        assert capture.reverse_blocked(conn) is None
        got = {c.name: c for c in write_flip_candidates(conn, "sync.full")}
        assert (got["piped"].verdict, got["piped"].ready, got["piped"].reasons) == (SAFE_REVERSE, True, ())
        assert (got["dashed"].verdict, got["dashed"].ready, got["dashed"].reasons) == (SAFE, True, ())
        ov = compute_overview(conn, settings)
        assert (ov.blocked, ov.piped_reverse_on, ov.problems["blocked"]) == (0, 1, 0)
        # the reverse turned off is what blocks here, as in capture mode triggers
        set_reverse(conn, False, dataset=dashed, note="off", actor="pytest")
        with pytest.raises(FlipRefused, match=r"reverse off \(dataset setting\): turn it on") as refused:
            _flip(conn, dashed)
        assert "capture mode" not in str(refused.value)
        set_reverse(conn, None, dataset=dashed, note="the default: on", actor="pytest")
        assert _flip(conn, piped).after == "iceberg_native" and _flip(conn, dashed).after == "iceberg_native"
        assert native_dataset_ids(conn) == {piped, dashed}
        # and it keeps them: a native overwrite is in dataset_rows after the apply, the WAL consumer tracked none of it
        before = conn.execute("select rows_version from datasets where id = %s", (piped,)).fetchone()
        native_write(conn, dsn, settings, piped, "sync.full", [row(i) for i in range(40, 43)], start=0)
        applied = apply_reverse(dsn, load_catalog(settings, dsn), settings, piped)
        assert (applied.how, applied.pg_rows) == ("full", 3)
        capture.catch_up(conn)
        assert conn.execute("select rows_version from datasets where id = %s", (piped,)).fetchone() == before
    finally:
        capture.disable(conn)


def test_the_overview_counts_only_what_is_blocked_now_and_shows_the_reverse_lag(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")  # native, reverse on (the default), nothing written yet
    ws_id = get_dataset(conn, d).workspace_id
    piped = _dataset(conn, ws_id, "piped", 3)
    sync_dataset(dsn, load_catalog(settings, dsn), settings, piped, mode="full")  # identity-ready
    _pipe(conn, ws_id, piped)

    ov = compute_overview(conn, settings)
    assert (ov.blocked, ov.piped_reverse_on, ov.problems["blocked"]) == (0, 1, 0)
    assert ov.flag_stages[("write", "sync.full")]["blocked"] == 0
    assert (ov.native, ov.reverse_on, ov.reverse_off, ov.reverse_behind) == (1, 1, 0, 0)  # Postgres holds it all

    snap = native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    ov = compute_overview(conn, settings)
    (lag,) = ov.reverse_lags
    assert (ov.reverse_behind, lag.dataset_id, lag.pending, lag.latest_snapshot) == (1, d, 1, snap)
    assert lag.applied_snapshot is None and 0 <= lag.lag_seconds < 60 and ov.reverse_max_lag_seconds == lag.lag_seconds
    lines = text_lines(ov)
    assert any(
        line.startswith("reverse mirror (Iceberg -> dataset_rows): 1 native dataset(s) with it on, 1 behind")
        for line in lines
    )
    assert f"  orders ({d}): reverse behind by 1 commit(s)" in "\n".join(lines)
    assert f"lakehouse reverse sync --dataset {d}" in "\n".join(lines)
    meta = overview_metadata(ov)
    assert (meta["reverse/on"].value, meta["reverse/behind"].value, meta["piped_reverse_on"].value) == (1, 1, 1)
    assert f"partition={d}" in meta["reverse_lag"].value

    apply_reverse(dsn, load_catalog(settings, dsn), settings, d)
    set_reverse(conn, False, dataset=piped, note="reverse off", actor="pytest")
    # turning the reverse off for a native dataset a pipeline reads: said at once (its next native write is refused)
    _pipe(conn, ws_id, d)
    out = cli_json("reverse", "off", "--dataset", str(d), "--note", "try")
    assert out["stranded"] == [{"dataset_id": str(d), "name": "orders"}]
    cli("reverse", "clear", "--dataset", str(d), "--note", "back on", check=True)
    conn.execute("delete from pipelines where spec->'nodes'->0->'data'->>'datasetId' = %s", (str(d),))
    ov = compute_overview(conn, settings)
    assert (ov.reverse_on, ov.reverse_behind, ov.reverse_max_lag_seconds, ov.reverse_lags) == (1, 0, None, [])
    assert (ov.blocked, ov.piped_reverse_on, ov.flag_stages[("write", "sync.full")]["blocked"]) == (1, 0, 1)
    (a,) = [a for a in ov.attention if a.dataset_id == piped]
    assert a.problem == "blocked" and "BLOCKED (pipeline input; reverse mirror off)" in a.reason
    out = cli_json("status", "--json")  # `lakehouse status` is the same computation
    assert out["reverse"]["on"] == 1 and out["reverse"]["behind"] == 0 and out["blocked"] == 1


def test_parity_both_ways_lagging_ok_and_a_mismatch_repaired_without_a_writer_rollback(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")
    catalog = load_catalog(settings, dsn)
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)

    lagging = check_reverse_parity(conn, dsn, catalog, settings, d)
    assert lagging.verdict.verdict == "lagging" and lagging.repair is None
    assert f"reverse behind: it never applied a snapshot, Iceberg is at {snap}" in lagging.line()

    apply_reverse(dsn, catalog, settings, d)
    ok = check_reverse_parity(conn, dsn, catalog, settings, d)
    assert ok.verdict.verdict == "ok" and f"reverse caught up at snapshot {snap}" in ok.line()

    # the copy goes wrong (a write to dataset_rows behind the reverse mirror's back): MISMATCH, repaired in full
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "wrong"}\' where dataset_id = %s and row_index = 7', (d,)
    )
    flags_before = flag_tables(conn)
    bad = check_reverse_parity(conn, dsn, catalog, settings, d)
    assert bad.verdict.verdict == "MISMATCH" and "the copy is wrong, Iceberg is the truth" in bad.line()
    assert bad.repair is not None and bad.repair.how == "full" and "repaired, no writer rolled back" in bad.line()
    assert flag_tables(conn) == flags_before and native_dataset_ids(conn) == {d}  # nothing rolled back
    assert conn.execute(
        "select verdict, source from lakehouse_read_parity where dataset_id = %s order by id desc limit 1", (d,)
    ).fetchone() == ("MISMATCH", "reverse canary")  # recorded: what the alerts read
    proc = cli("reverse", "check", "--dataset", str(d))  # the operator's way: ok again, exit 0
    assert proc.returncode == 0 and f"dataset {d}: ok: reverse caught up at snapshot {snap}" in proc.stdout, proc.stderr


def test_the_canary_compares_a_reverse_synced_dataset_both_ways_and_repairs_it_without_a_rollback(conn, dsn, settings):
    """``lakehouse canary`` (and the canary job and schedule, through the same run_canary_and_roll_back): a native
    dataset with the reverse on gets the reverse verdict, not ``native``; a MISMATCH repairs the copy, exit 1."""
    d = ready_native(conn, dsn, settings, "sync.append")
    catalog = load_catalog(settings, dsn)
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)

    def canary(*args):
        proc = cli("canary", "--dataset", str(d), "--json", *args)
        (r,) = json.loads(proc.stdout)["results"]
        return proc.returncode, r

    code, r = canary()
    assert (code, r["verdict"]) == (0, "lagging") and f"Iceberg is at {snap}" in r["detail"]["reason"]
    assert f"lakehouse reverse sync --dataset {d}" in r["detail"]["reason"]
    apply_reverse(dsn, catalog, settings, d)
    code, r = canary("--smoke")
    assert (code, r["verdict"], r["pg_count"], r["iceberg_count"]) == (0, "ok", 9, 9)
    assert r["detail"]["reason"].startswith(f"reverse caught up at snapshot {snap}")

    conn.execute(
        'update dataset_rows set data = data || \'{"s": "wrong"}\' where dataset_id = %s and row_index = 8', (d,)
    )
    flags_before = flag_tables(conn)
    code, r = canary()
    assert (code, r["verdict"]) == (1, "MISMATCH") and "the copy is wrong, Iceberg is the truth" in r["detail"][
        "reason"
    ]
    assert r["detail"]["reverse_repair"].startswith("repaired by a full reverse re-sync, no writer rolled back")
    assert "auto_rollback" not in r["detail"]
    assert flag_tables(conn) == flags_before and native_dataset_ids(conn) == {d}  # the writer stays native
    recorded = conn.execute(
        "select verdict, detail->>'reverse_repair' from lakehouse_read_parity where dataset_id = %s"
        " order by id desc limit 1",
        (d,),
    ).fetchone()
    assert recorded[0] == "MISMATCH" and recorded[1].startswith("repaired by a full reverse re-sync")
    code, r = canary()  # the copy repaired: ok again
    assert (code, r["verdict"]) == (0, "ok")
