"""Shadow reads: in mode shadow the router serves Postgres and a sample of reads is compared with Iceberg off the
request path. Matching reads give 100 % (and a shadow stage passes on it); a tampered Iceberg value is caught as a
mismatch with the row (and the plan aborts); a slow Iceberg side does not slow the served read (a full queue drops,
and counts)."""

from __future__ import annotations

import time

import dagster as dg
import psycopg
import pyarrow as pa
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.flags.overrides import list_overrides, set_override
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.plans import actions, analysis, store
from lakehouse_dagster.routing.exercise import read_through_router
from lakehouse_dagster.routing.shadow import ShadowPool, compare_tables
from lakehouse_dagster.tracking import datasets

from .rollout_helpers import Driver, dataset, seed_mix


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _read(conn, settings, dsn, pool, reader, d, **kw):
    started = time.perf_counter()
    result, _, _ = read_through_router(
        conn,
        load_catalog(settings, dsn),
        settings,
        reader,
        d,
        resolver=FlagResolver(conn, ttl_seconds=0),
        shadow_pool=pool,
        **kw,
    )
    return result, time.perf_counter() - started


def _reads(conn, settings, dsn, pool, reader, ids):
    """The shapes a reader asks for: everything, a limited read in no order (paired by __row_index), ordered."""
    for d in ids:
        _read(conn, settings, dsn, pool, reader, d, limit=None)
        _read(conn, settings, dsn, pool, reader, d, limit=2)
        _read(conn, settings, dsn, pool, reader, d, limit=3, order_by_row_index=True)


def _tamper(conn, settings, dsn, d, row_index: int = 2, value: int = 999) -> None:
    """Change one value in Iceberg only: a new snapshot with the value changed, recorded as the dataset's latest
    succeeded sync at the same Postgres version (so it reads as caught up)."""
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    data = table.scan().to_arrow()
    a = data.column("a").to_pylist()
    a[data.column("__row_index").to_pylist().index(row_index)] = value
    data = data.set_column(data.schema.get_field_index("a"), data.schema.field("a"), pa.array(a, pa.int64()))
    table.overwrite(data)
    conn.execute(
        "update iceberg_sync_log set snapshot_id = %s where id = (select id from iceberg_sync_log where dataset_id = %s"
        " and status = 'succeeded' order by finished_at desc limit 1)",
        (table.refresh().current_snapshot().snapshot_id, d),
    )


def test_compare_is_order_independent_and_names_the_first_differing_row():
    cols = (("__row_index", "int64"), ("a", "int64"), ("j", "json"), ("f", "float64"))
    pg = pa.table({"__row_index": [0, 1, 2], "a": [1, 2, 3], "j": ['{"k": 1}', None, "[1]"], "f": [0.1, -0.0, None]})
    same = pa.table({"__row_index": [2, 0, 1], "a": [3, 1, 2], "j": ["[1]", '{"k": 1}', None], "f": [None, 0.1, 0.0]})
    assert compare_tables(pg, same, cols).outcome == "match"
    other = pa.table({"__row_index": [2, 0, 1], "a": [3, 1, 7], "j": ["[1]", '{"k": 1}', None], "f": [None, 0.1, 0.0]})
    c = compare_tables(pg, other, cols)
    assert (c.outcome, c.pg_row, c.iceberg_row) == (
        "mismatch",
        {"__row_index": 1, "a": 2, "j": None, "f": -0.0},
        {"__row_index": 1, "a": 7, "j": None, "f": 0.0},
    )
    dup = pa.table(
        {
            "__row_index": [0, 0, 1, 2],
            "a": [1, 1, 2, 3],
            "j": ['{"k": 1}'] * 2 + [None, "[1]"],
            "f": [0.1, 0.1, 0.0, None],
        }
    )
    assert compare_tables(pg, dup, cols).outcome == "mismatch"  # a duplicated row is a difference (a multiset)


def test_matching_shadow_reads_give_100_percent_and_the_shadow_stage_passes(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    pool = ShadowPool(dsn, workers=2, queue_size=100, sample=1.0)
    text = """
reader: export.stream
stages:
  - shadow: true
    soak: 1s
    analysis: {min_reads: 12}
  - datasets: 1
"""
    plan_id, rendered = actions.start(conn, settings, text, actor="pytest")
    assert [(c.scope, c.mode) for c in rendered.stages[0].changes] == [("global", "shadow")]
    driver = Driver(instance, dsn)
    read = []

    def shadow_reads(p):
        if p.stage == 0 and p.phase == "soaking" and not read:
            _reads(conn, settings, dsn, pool, "export.stream", list(s.tabular.values()))
            assert pool.drain(60)
            read.append(True)

    p = driver.until(conn, plan_id, lambda p: p.state != "active" or p.stage == 1, between=shadow_reads)
    assert (p.state, p.stage) == ("active", 1), (p.reason, p.blocking)
    assert driver.launched[0].job_name == "set_flag"
    outcomes = dict(conn.execute("select outcome, count(*) from lakehouse_shadow_reads group by outcome").fetchall())
    assert outcomes == {"match": 15}  # 5 datasets × 3 reads, every one compared at a caught-up version
    c = analysis.consistency(conn, "export.stream", store.stage_row(conn, plan_id, 0).flipped_at)
    assert (c.compared, c.rate) == (15, 100.0)
    passed = [e for e in store.events(conn, plan_id) if e["event"] == "stage-passed"][0]
    assert passed["reason"] == "stage 1 (shadow) passed: shadow reads 100.0% consistent over 15 compared read(s)"
    rows = conn.execute("select pg_version, iceberg_version, snapshot_id from lakehouse_shadow_reads").fetchall()
    assert all(pg == ice and snap is not None for pg, ice, snap in rows)  # both versions recorded


def test_a_tampered_iceberg_value_is_caught_with_the_row_and_the_plan_aborts(conn, dsn, settings, instance):
    s = seed_mix(conn, dsn, settings)
    big = s.tabular["big"]
    pool = ShadowPool(dsn, workers=1, queue_size=100, sample=1.0)
    plan_id, _ = actions.start(
        conn,
        settings,
        "reader: graph.kuzu\nstages:\n  - shadow: true\n    analysis: {min_reads: 5}\n  - datasets: 1\n",
        actor="pytest",
    )
    driver = Driver(instance, dsn)

    def tampered_reads(p):
        if p.phase == "soaking" and not conn.execute("select 1 from lakehouse_shadow_reads limit 1").fetchone():
            _tamper(conn, settings, dsn, big)
            result, _ = _read(conn, settings, dsn, pool, "graph.kuzu", big, limit=None)
            assert result.decision.reason == "pg@shadow" and -1 not in result.value.column("a").to_pylist()
            assert pool.drain(60)

    p = driver.until(conn, plan_id, lambda p: p.state != "active", between=tampered_reads)
    row = conn.execute(
        "select outcome, dataset_id, pg_row, iceberg_row, detail from lakehouse_shadow_reads where reader = 'graph.kuzu'"
    ).fetchone()
    assert row[:2] == ("mismatch", big)
    assert (row[2]["__row_index"], row[2]["a"], row[3]["__row_index"], row[3]["a"]) == (2, 2, 2, 999)
    assert row[4] == "1 row(s) only in Postgres, 1 only in Iceberg (of 12 and 12)"
    assert p.state == "aborted"
    assert p.reason.startswith(
        "stage 1: shadow reads 0.0% consistent over 1 compared read(s), below 100% (1 mismatch(es))"
    )
    assert f"first: dataset {big} Postgres" in p.reason and "'a': 999" in p.reason
    assert not list_overrides(conn)  # the global shadow override it set is gone again


def test_a_slow_iceberg_side_never_slows_the_served_read(conn, dsn, settings):
    ws = datasets.create_workspace(conn, "w")
    d = dataset(conn, dsn, settings, ws, "orders", 20)
    set_override(conn, "read", "export.stream", "shadow", actor="pytest")
    pool = ShadowPool(dsn, workers=1, queue_size=2, sample=1.0)
    off = ShadowPool(dsn, sample=0.0)  # shadow mode, nothing sampled: the served read alone
    _read(conn, settings, dsn, off, "export.stream", d, limit=None)  # warm: caches, catalog engine
    baseline = min(_read(conn, settings, dsn, off, "export.stream", d)[1] for _ in range(5))
    with psycopg.connect(dsn) as blocker:  # the catalog's table locked: every Iceberg-side read waits on it
        blocker.execute("lock table iceberg_tables in access exclusive mode")
        times = [_read(conn, settings, dsn, pool, "export.stream", d, limit=None)[1] for _ in range(10)]
        time.sleep(0.3)
        assert conn.execute("select count(*) from lakehouse_shadow_reads").fetchone()[0] == 0  # still waiting
        assert pool.counts["dropped"] >= 7  # one in the worker, two queued, the rest dropped and counted
        served_while_blocked = max(times)
    assert pool.drain(60)
    assert served_while_blocked < max(10 * baseline, 0.5), (served_while_blocked, baseline)
    with connect(dsn) as c:
        outcomes = dict(
            c.execute(
                "select outcome, sum(coalesce(pg_rows, 0)) from lakehouse_shadow_reads"
                " where outcome <> 'match' group by outcome"
            ).fetchall()
        )
        matched = c.execute("select count(*) from lakehouse_shadow_reads where outcome = 'match'").fetchone()[0]
    assert matched == 10 - pool.counts["dropped"] and outcomes == {"dropped": pool.counts["dropped"]}
