"""Issue 43, the part after the executors: structured reads compared in shadow mode, the compute readers' ceilings
raised with their flips gated on proven shadow consistency, and ``complete`` reachable once they read Iceberg.

Real Postgres, real Iceberg tables; the Iceberg side of a comparison is the real Iceberg executor. A mismatch is made
the way test_shadow_reads.py makes one: a value changed in Iceberg only, recorded as caught up."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.gates import set_flag
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.proof import proofs
from lakehouse_dagster.flags.reader_datasets import declare
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.routing.exercise import read_through_router
from lakehouse_dagster.routing.request import parse_query
from lakehouse_dagster.routing.shadow import ShadowPool
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
from lakehouse_dagster.tracking import datasets

from .native_helpers import SCHEMA, native_write, row, runbook_ready

AGGREGATE = {
    "where": {"op": "ge", "column": "a", "value": 1},
    "aggregate": {
        "group_by": ["s"],
        "measures": [{"fn": "count"}, {"fn": "sum", "column": "x"}, {"fn": "avg", "column": "a"}],
    },
}
ROWS = {"columns": ["__row_index", "a", "x"], "where": {"op": "lt", "column": "a", "value": 5}, "order": "row_index"}
PAGE = {"columns": ["a", "s"], "after_row_index": 2, "limit": 3}


def _dataset(conn, dsn, settings, rows: int = 8, name: str = "orders"):
    d = datasets.create_dataset(conn, datasets.create_workspace(conn, f"ws-{name}"), name, SCHEMA)
    datasets.insert_rows(conn, d, [row(i) for i in range(rows)])
    runbook_ready(conn, dsn, settings, d)  # mirrored, the servable readers flipped, canary ok
    return d


def _ask(conn, dsn, settings, pool, reader, d, query: dict):
    result, _, _ = read_through_router(
        conn,
        load_catalog(settings, dsn),
        settings,
        reader,
        d,
        resolver=FlagResolver(conn, ttl_seconds=0),
        shadow_pool=pool,
        query=parse_query(query),
    )
    return result


def _recorded(conn, d):
    return conn.execute(
        "select reader, outcome, query, schema_digest is not null, pg_row, iceberg_row, detail"
        " from lakehouse_shadow_reads where dataset_id = %s order by id",
        (d,),
    ).fetchall()


def _tamper(conn, settings, dsn, d, row_index: int = 3, value: int = 999) -> None:
    """Change column ``a`` of one row in Iceberg only, recorded as the latest sync at the same Postgres version."""
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


def test_structured_reads_in_shadow_mode_are_compared_and_a_difference_names_its_group(conn, dsn, settings, lh):
    """Seen failing on main: structured reads were skipped by the shadow (nothing recorded)."""
    d = _dataset(conn, dsn, settings)
    set_override(conn, "read", "dashboards.aggregate", "shadow", dataset=d, actor="pytest")
    pool = ShadowPool(dsn, workers=1, queue_size=16, sample=1.0)
    for query in (AGGREGATE, ROWS, PAGE):
        result = _ask(conn, dsn, settings, pool, "dashboards.aggregate", d, query)
        assert (result.decision.source, result.decision.reason) == ("pg", "pg@shadow")
    assert pool.drain(120)
    got = _recorded(conn, d)
    assert [(r[0], r[1], r[3]) for r in got] == [("dashboards.aggregate", "match", True)] * 3
    assert got[0][2] == parse_query(AGGREGATE).model_dump(mode="json", exclude_none=True)  # the request, recorded
    assert proofs(conn, ["dashboards.aggregate"], [d])[("dashboards.aggregate", d)].in_a_row == 3

    # a value changed in Iceberg only: the aggregate's group that holds it differs, and is named
    _tamper(conn, settings, dsn, d)
    _ask(conn, dsn, settings, pool, "dashboards.aggregate", d, AGGREGATE)
    assert pool.drain(120)
    reader, outcome, _, _, pg_row, ice_row, detail = _recorded(conn, d)[-1]
    assert (reader, outcome) == ("dashboards.aggregate", "mismatch")
    assert (pg_row["s"], pg_row["avg_a"], ice_row["s"], ice_row["avg_a"]) == ("v3 ü", 3.0, "v3 ü", 999.0)
    assert detail.startswith("Postgres vs Iceberg: row 2 differs")
    p = proofs(conn, ["dashboards.aggregate"], [d])[("dashboards.aggregate", d)]
    assert (p.matched, p.failed, p.in_a_row, p.rate) == (3, 1, 0, 75.0)

    # lakehouse flags list shows the rate per reader and dataset
    code, out, _ = lh("flags", "list", "--dataset", str(d), "--json")
    assert code == 0
    shown = json.loads(out)["shadow_consistency"]
    assert [(r["reader"], r["matched"], r["failed"], r["in_a_row"]) for r in shown if r["matched"]] == [
        ("dashboards.aggregate", 3, 1, 0)
    ]
    code, out, _ = lh("flags", "list")
    assert code == 0 and "75.0% consistent over 4 comparison(s), 0 of 300 in a row" in out, out


def test_a_flip_of_a_compute_reader_is_refused_until_shadow_reads_prove_it(conn, dsn, settings, monkeypatch):
    """Seen failing on main: dashboards.aggregate's ceiling was off (every flip refused, whatever was proven)."""
    monkeypatch.setenv("LAKEHOUSE_SHADOW_PROOF_READS", "3")
    d = _dataset(conn, dsn, settings)
    pool = ShadowPool(dsn, workers=1, queue_size=16, sample=1.0)

    def flip():
        return set_flag(conn, "read", "dashboards.aggregate", "iceberg", dataset=d, actor="pytest", soak_seconds=0)

    with pytest.raises(FlipRefused) as refused:
        flip()
    assert "dashboards.aggregate is not proven on it: shadow reads no shadow read compared yet (0 of 3)" in str(
        refused.value
    )
    set_flag(conn, "read", "dashboards.aggregate", "shadow", dataset=d, actor="pytest", soak_seconds=0)
    for _ in range(2):
        _ask(conn, dsn, settings, pool, "dashboards.aggregate", d, AGGREGATE)
    assert pool.drain(120)
    with pytest.raises(FlipRefused, match="100.0% consistent over 2 comparison"):
        flip()
    _ask(conn, dsn, settings, pool, "dashboards.aggregate", d, ROWS)
    assert pool.drain(120)
    # a change of schema restarts the count: what was proven was proven of other columns
    schema = conn.execute("select schema from datasets where id = %s", (d,)).fetchone()[0]
    datasets.set_schema(conn, d, [*schema, {"name": "extra", "type": "string"}])
    assert proofs(conn, ["dashboards.aggregate"], [d])[("dashboards.aggregate", d)].matched == 0
    datasets.set_schema(conn, d, schema)  # back to the schema the comparisons ran against: they count again
    assert proofs(conn, ["dashboards.aggregate"], [d])[("dashboards.aggregate", d)].in_a_row == 3
    change = flip()
    assert (change.before, change.after) == ("shadow", "iceberg")
    result = _ask(conn, dsn, settings, pool, "dashboards.aggregate", d, AGGREGATE)
    assert result.decision.source == "iceberg"


def test_complete_waits_for_a_compute_reader_until_it_is_flipped_for_the_dataset(conn, dsn, settings, lh, monkeypatch):
    """Seen failing on main: objects.sync declared for a dataset refused its complete for good (ceiling off).

    The dataset is native already (its reverse mirror keeps dataset_rows for objects.sync, as before issue 43): in
    mode shadow the reader is served the reverse copy and compared with the snapshot that copy holds — equal even
    while the copy is behind the table —, proven, flipped, and then complete goes through."""
    monkeypatch.setenv("LAKEHOUSE_SHADOW_PROOF_READS", "3")
    d = _dataset(conn, dsn, settings, rows=6)
    declare(conn, "objects.sync", dataset=d, note="the object sync", actor="pytest")
    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)  # the reverse keeps it
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 9)], start=6)
    apply_reverse(dsn, catalog, settings, d)
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]

    with pytest.raises(FlipRefused) as refused:
        cp.complete(dsn, catalog, settings, d, actor="pytest", soak_seconds=0)
    text = str(refused.value)
    assert "1 condition(s) not met" in text
    assert "read from dataset_rows by objects.sync (mode off: on Postgres until flipped" in text
    assert (
        f"flip objects.sync for it once its shadow reads prove it (lakehouse flags flip <reader> --dataset {d})" in text
    )
    with pytest.raises(FlipRefused, match="objects.sync is not proven on it"):
        set_flag(conn, "read", "objects.sync", "iceberg_only", dataset=d, actor="pytest", soak_seconds=0)

    set_flag(conn, "read", "objects.sync", "shadow", dataset=d, actor="pytest", soak_seconds=0)
    pool = ShadowPool(dsn, workers=1, queue_size=16, sample=1.0)
    first = conn.execute("select row_id::text from dataset_rows where dataset_id = %s and row_index = 7", (d,))
    by_id = {"row_ids": [first.fetchone()[0]], "columns": ["__row_index", "a"]}
    for query in (by_id, PAGE):
        assert _ask(conn, dsn, settings, pool, "objects.sync", d, query).decision.reason == "pg@reverse"
    # a native commit the reverse has not applied yet: the copy is compared with the snapshot it holds, still equal
    native_write(conn, dsn, settings, d, "sync.append", [row(9)], start=9)
    behind = _ask(conn, dsn, settings, pool, "objects.sync", d, {"columns": ["a"], "order": "row_index"})
    assert behind.value.column("a").to_pylist() == list(range(9))  # the copy: row 9 not in it yet
    assert pool.drain(120)
    assert [r[1] for r in _recorded(conn, d)] == ["match", "match", "match"]
    apply_reverse(dsn, catalog, settings, d)
    assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]

    set_flag(conn, "read", "objects.sync", "iceberg_only", dataset=d, actor="pytest", soak_seconds=0)
    done = cp.complete(dsn, catalog, settings, d, actor="pytest", soak_seconds=0)
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 0, done
    got = _ask(conn, dsn, settings, pool, "objects.sync", d, by_id)
    assert (got.decision.source, got.value.column("a").to_pylist()) == ("iceberg", [7])  # its rows now: Iceberg
