"""The writer runbook's concurrency bench, for real: writer processes released together through a barrier,
the real write router and native writer, G2 backpressure counted as the runbook's 503s, G3 serialising."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.runbooks import ingest_bench

from .flag_helpers import cli


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_burst_above_the_admission_bound_gets_503s_and_no_errors(dsn, settings):
    report = ingest_bench.run_ingest_bench(dsn, settings.replace(sync={"max_concurrent": 2}), jobs=4, rows=150_000)
    assert report.count(ingest_bench.ERROR) == 0, [o.error for o in report.outcomes]
    assert (
        report.count(ingest_bench.OK) >= 1 and report.count(ingest_bench.BACKPRESSURE) >= 1
    )  # G2 refused the jobs past 2
    assert report.count(ingest_bench.OK) + report.count(ingest_bench.BACKPRESSURE) == 4
    assert all("ingest slots are busy" in o.error for o in report.outcomes if o.status == ingest_bench.BACKPRESSURE)
    assert all(o.rows == 150_000 for o in report.outcomes if o.status == ingest_bench.OK)
    assert report.table_problems == [] and report.passed
    # within the bound: every job writes
    within = ingest_bench.run_ingest_bench(dsn, settings.replace(sync={"max_concurrent": 3}), jobs=3, rows=2_000)
    assert [o.status for o in within.outcomes] == [ingest_bench.OK] * 3 and within.passed


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_same_dataset_burst_serialises_replaces_and_purge_cleans_up(conn, dsn, settings):
    report = ingest_bench.run_ingest_bench(dsn, settings, jobs=3, rows=5_000, same_dataset=True)
    assert [o.status for o in report.outcomes] == [ingest_bench.OK] * 3, [
        o.error for o in report.outcomes
    ]  # G3 queues them
    assert report.table_problems == []  # one snapshot per replace and exactly 5,000 rows: no drop-race
    assert len({o.snapshot_id for o in report.outcomes}) == 3
    catalog = load_catalog(settings.replace(catalog={"namespace": "bench"}), dsn)
    assert len(catalog.list_tables("bench")) == 1
    out = ingest_bench.purge(dsn, settings, namespace="bench")
    assert (out["workspaces"], out["datasets"], out["tables_dropped"], out["namespace_dropped"]) == (1, 1, 1, True)
    # nothing of the bench is left: its namespace and its directory under the warehouse go too
    assert ("bench",) not in catalog.list_namespaces()
    assert not (Path(settings.catalog.warehouse.removeprefix("file://")) / "bench").exists()
    assert conn.execute("select count(*) from workspaces where name like 'lakehouse-ingest-bench%'").fetchone()[0] == 0


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_cli_runs_purges_and_refuses_bad_input(conn, dsn, settings):
    proc = cli("ingest-bench", "run", "--jobs", "2", "--rows", "1000", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["passed"] and data["counts"] == {"ok": 2, "503": 0, "error": 0}
    assert data["purged"]["tables_dropped"] == 2
    for args, message in (
        (["--jobs", "0"], "--jobs and --rows must be at least 1"),
        (["--namespace", "lakehouse"], "is the lakehouse's own namespace"),
    ):
        bad = cli("ingest-bench", "run", *args)
        assert bad.returncode == 2 and message in bad.stderr


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_failing_job_fails_the_gate(dsn, settings):
    """A writer that cannot write (the warehouse is not writable) is an error, not a 503: FAIL."""
    broken = settings.replace(catalog={"warehouse": "file:///proc/lakehouse-not-writable"})
    report = ingest_bench.run_ingest_bench(dsn, broken, jobs=2, rows=10)
    assert report.count(ingest_bench.ERROR) == 2 and not report.passed
    assert report.summary_line().startswith("FAIL: jobs=2 ok=0 503=0 error=2")
    assert all("iceberg_native write failed" in o.error for o in report.outcomes)


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_the_dagster_job_runs_the_bench_and_purges(conn, dsn, settings):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.rollout import ingest_bench_job

    result = ingest_bench_job.execute_in_process(
        run_config={"ops": {"ingest_bench_op": {"config": {"jobs": 2, "rows": 500, "same_dataset": True}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success and result.output_for_node("ingest_bench_op")["counts"] == {"ok": 2, "503": 0, "error": 0}
    assert conn.execute("select count(*) from workspaces where name like 'lakehouse-ingest-bench%'").fetchone()[0] == 0
