"""Issue 32, defect 6: a stage passes on strong evidence only. A shadow read whose Iceberg side failed counts against
the consistency rate (before, it was skipped: an Iceberg side failing 90% of sampled reads passed at 100%), and a
``native`` verdict is ok for a writer plan's analysis only (before, a reader plan passed on it)."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from lakehouse_dagster.plans import analysis
from lakehouse_dagster.plans.spec import Analysis
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}]


def _shadow_reads(conn, reader, d, outcome, n):
    conn.execute(
        "insert into lakehouse_shadow_reads (reader, dataset_id, outcome) select %s, %s, %s from generate_series(1, %s)",
        (reader, d, outcome, n),
    )


def test_an_iceberg_side_failing_most_shadow_reads_fails_the_stage(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    since = conn.execute("select now() - interval '1 minute'").fetchone()[0]
    _shadow_reads(conn, "export.stream", d, "match", 20)  # min_reads matches ...
    _shadow_reads(conn, "export.stream", d, "error", 180)  # ... and 90% of the sampled reads failed on Iceberg
    _shadow_reads(conn, "export.stream", d, "lagging", 5)  # not comparable: counted neither way
    found, c = analysis.shadow(conn, "export.stream", since, Analysis(min_reads=20))
    assert found is not None and found.outcome == analysis.FAIL  # before: a pass at "100.0%"
    assert (c.compared, c.matched, c.errors, c.counted, c.skipped) == (20, 20, 180, 200, {"lagging": 5})
    assert found.reason == (
        "shadow reads 10.0% consistent over 20 compared read(s) and 180 whose Iceberg side failed, below 100% "
        "(0 mismatch(es), 180 Iceberg-side error(s))"
    )


def test_a_few_shadow_errors_keep_a_stage_from_passing_until_the_rate_is_met(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "orders", SCHEMA)
    since = conn.execute("select now() - interval '1 minute'").fetchone()[0]
    _shadow_reads(conn, "graph.kuzu", d, "match", 99)
    _shadow_reads(conn, "graph.kuzu", d, "error", 1)
    found, c = analysis.shadow(conn, "graph.kuzu", since, Analysis(min_reads=20, min_consistency=99.0))
    assert found is not None and (found.outcome, c.rate) == (analysis.PASS, 99.0)  # at the threshold: passes
    found, _ = analysis.shadow(conn, "graph.kuzu", since, Analysis(min_reads=20))  # 100% needed: one error fails
    assert found is not None and found.outcome == analysis.FAIL


def test_a_native_verdict_is_ok_for_a_writer_plan_only(conn):
    ws = datasets.create_workspace(conn, "w")
    ids = [datasets.create_dataset(conn, ws, f"d{i}", SCHEMA) for i in range(3)]
    for d, verdict in zip(ids, ("ok", "ok", "native")):
        conn.execute(
            "insert into lakehouse_read_parity (dataset_id, verdict, source, run_id, pg_count, iceberg_count)"
            " values (%s, %s, 'rollout', 'run-1', 8, 8)",  # rows compared: evidence (an empty canary is none)
            (d, verdict),
        )
    reader = analysis.verdicts(conn, "run-1", "read", Analysis(), 3)
    assert reader.outcome == analysis.INCONCLUSIVE
    assert reader.reason == f"1 dataset(s) not ok (max_inconclusive 0): d2 ({ids[2]}): native"
    writer = analysis.verdicts(conn, "run-1", "write", Analysis(), 3)
    assert (writer.outcome, writer.reason) == (analysis.PASS, "3 of 3 canaried dataset(s) ok")


def _verdict(conn, d, verdict: str, *, reverse: dict | None = None, run_id: str = "run-r") -> None:
    detail = {"reason": f"{verdict} here"} | ({"reverse": reverse} if reverse is not None else {})
    conn.execute(
        "insert into lakehouse_read_parity (dataset_id, verdict, source, run_id, pg_count, iceberg_count, detail)"
        " values (%s, %s, 'rollout-analysis', %s, 8, 8, %s)",
        (d, verdict, run_id, Jsonb(detail)),
    )


def test_a_reverse_copy_holds_a_writer_stage_on_its_mismatch_or_its_lag_but_never_fails_it(conn):
    """Parity both ways in a writer plan's analysis: a MISMATCH of the reverse copy was repaired and rolls nothing
    back, so it holds the stage (inconclusive) instead of failing it (an abort is a writer rollback); an ok whose
    reverse had been further behind than max_reverse_lag_seconds is not ok for the stage either."""
    ws = datasets.create_workspace(conn, "w")
    a, b = (datasets.create_dataset(conn, ws, n, SCHEMA) for n in ("a", "b"))
    _verdict(conn, a, "ok", reverse={"position_before": 7, "position_after": 7, "lag_before_s": 0.4})
    _verdict(conn, b, "MISMATCH", reverse={"position_before": 9, "position_after": 9, "lag_before_s": 0.0})
    held = analysis.verdicts(conn, "run-r", "write", Analysis(), 2)
    assert held.outcome == analysis.INCONCLUSIVE
    assert held.reason == (
        f"1 dataset(s) not ok (max_inconclusive 0): b ({b}): MISMATCH of the reverse copy: repaired, no writer "
        "rolled back; the next analysis checks it again"
    )
    _verdict(conn, a, "ok", reverse={"position_before": 8, "position_after": 8, "lag_before_s": 95.0}, run_id="run-s")
    _verdict(conn, b, "ok", reverse={"position_before": 9, "position_after": 9, "lag_before_s": 1.0}, run_id="run-s")
    slow = analysis.verdicts(conn, "run-s", "write", Analysis(max_reverse_lag_seconds=60), 2)
    assert slow.outcome == analysis.INCONCLUSIVE
    assert f"a ({a}): ok: but the reverse mirror was 95 s behind (max_reverse_lag_seconds 60)" in slow.reason
    fine = analysis.verdicts(conn, "run-s", "write", Analysis(max_reverse_lag_seconds=120), 2)
    assert (fine.outcome, fine.reason) == (analysis.PASS, "2 of 2 canaried dataset(s) ok")
    # the same MISMATCH without the reverse's detail is the native writes' own: it fails the stage
    _verdict(conn, b, "MISMATCH", run_id="run-t")
    assert analysis.verdicts(conn, "run-t", "write", Analysis(), 1).outcome == analysis.FAIL
