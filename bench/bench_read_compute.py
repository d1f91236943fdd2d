"""Structured reads (issue 43): the Iceberg executor against the Postgres executor, same run, same request.

    nice .venv/bin/python bench/bench_read_compute.py [--rows 1000000] [--repeat 5]

Makes a dashboard-shaped dataset of --rows rows in Postgres (a string `category` of 100 values, a float64
`amount` with a NaN and ±Infinity now and then, an int64 `qty`, a date, a note), mirrors it to Iceberg with the real
mirror, then times, p50 of --repeat runs each, engines alternating:

  aggregate   a dashboards.aggregate-shaped request: group by category, count, sum and avg of amount, one where
  keyset      a page of 1,000 rows (after_row_index) at the start, the middle (halfway into a data file) and the end
  row_ids     100 random __row_ids
  shadow      the aggregate served through the router by dashboards.aggregate in read mode shadow: p50 of the served
              read with every read sampled (the Iceberg side computed by the shadow workers meanwhile) against none
              sampled, the request path's own cost of offering one (draw, request dump, queue put), and the outcomes

and prints the ratios (Postgres p50 / Iceberg p50) and that both executors gave the same answer. Starts its own
embedded Postgres when LAKEHOUSE_PG_DSN is unset. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, mirror_settings  # noqa: E402

SCHEMA = [
    {"name": "category", "type": "string"},
    {"name": "amount", "type": "float64"},
    {"name": "qty", "type": "int64"},
    {"name": "day", "type": "date"},
    {"name": "note", "type": "string"},
]
GENERATE = """
insert into dataset_rows (dataset_id, row_index, data)
select %(ds)s, g, jsonb_build_object(
  'category', 'category-' || (hashint4(g::int) & 127) %% 100,
  'amount', case g %% 5000 when 1 then to_jsonb('NaN'::text) when 2 then to_jsonb('Infinity'::text)
                 when 3 then to_jsonb('-Infinity'::text) else to_jsonb(((hashint4(g::int + 7) & 1048575) - 500000) / 100.0) end,
  'qty', hashint4(g::int + 13) & 1023,
  'day', to_char(date '2020-01-01' + (g %% 2000)::int, 'YYYY-MM-DD'),
  'note', 'row ' || g || ' ✓')
from generate_series(%(lo)s::bigint, %(hi)s::bigint) g
"""

AGGREGATE = {
    "where": {"op": "ge", "column": "qty", "value": 100},
    "aggregate": {
        "group_by": ["category"],
        "measures": [{"fn": "count"}, {"fn": "sum", "column": "amount"}, {"fn": "avg", "column": "amount"}],
    },
}


def _p50(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    ap.add_argument(
        "--cases",
        default="aggregate,keyset,row_ids,shadow",
        help="which of aggregate, keyset, row_ids, shadow to run (comma-separated)",
    )
    args = ap.parse_args(argv)

    import random

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake.reader import load_dataset_table
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.routing.compute import compare
    from lakehouse_dagster.routing.iceberg_compute import read_iceberg_compute
    from lakehouse_dagster.routing.pg_compute import read_postgres_compute
    from lakehouse_dagster.routing.request import bind, parse_query
    from lakehouse_dagster.tracking import datasets

    dsn = fresh_database(admin_dsn(), "bench_read_compute")
    settings, catalog = mirror_settings(dsn, "bench_read_compute")
    t = time.perf_counter()
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "bench")
        d = datasets.create_dataset(conn, ws, "dashboard", SCHEMA)
        for lo in range(0, args.rows, 500_000):
            conn.execute(GENERATE, {"ds": d, "lo": lo, "hi": min(args.rows, lo + 500_000) - 1})
        conn.execute(
            "update datasets set max_row_index = %s, row_count = %s where id = %s", (args.rows - 1, args.rows, d)
        )
        conn.execute("vacuum analyze dataset_rows")
    made = time.perf_counter() - t
    t = time.perf_counter()
    snapshot_id = sync_dataset(dsn, catalog, settings, d).snapshot_id
    mirrored = time.perf_counter() - t
    print(f"{args.rows:,} rows: made in {made:.1f} s, mirrored in {mirrored:.1f} s (snapshot {snapshot_id})")

    figures: dict[str, dict] = {}
    with connect(dsn) as conn:
        dataset = datasets.get_dataset(conn, d)
        table = load_dataset_table(catalog, settings, d)
        ids = [r[0] for r in conn.execute("select row_id::text from dataset_rows where dataset_id = %s", (d,))]
        rng = random.Random(43)
        cases = {"aggregate": AGGREGATE}
        # middle: halfway into a mirror file (250,000-row files), the most a sorted row group makes a page decode first
        for name, at in (("start", -1), ("middle", args.rows // 2 + 124_999), ("end", args.rows - 1_001)):
            cases[f"keyset@{name}"] = {"after_row_index": at, "limit": 1000}
        cases["row_ids(100)"] = {"row_ids": rng.sample(ids, 100)}
        del ids
        wanted = tuple(c.strip() for c in args.cases.split(",") if c.strip())
        for name, body in cases.items():
            if not name.startswith(wanted):
                continue
            plan = bind(parse_query(body), dataset)
            ice_p50, ice = _p50(lambda: read_iceberg_compute(table, snapshot_id, plan), args.repeat)
            pg_p50, pg = _p50(lambda: read_postgres_compute(conn, dataset, plan), args.repeat)
            same = compare(pg, ice, plan.ordered) is None  # type: ignore[arg-type]
            figures[name] = {
                "iceberg_p50_s": round(ice_p50, 4),
                "postgres_p50_s": round(pg_p50, 4),
                "ratio": round(pg_p50 / ice_p50, 1),
                "rows": ice.num_rows,  # type: ignore[attr-defined]
                "same_answer": same,
            }
            print(
                f"{name:16s} iceberg p50 {ice_p50 * 1000:8.1f} ms   postgres p50 {pg_p50 * 1000:8.1f} ms   "
                f"postgres/iceberg {pg_p50 / ice_p50:6.1f}×   {ice.num_rows} rows   same answer: {same}"  # type: ignore[attr-defined]
            )
        if "shadow" in wanted:
            figures["shadow"] = _shadow(conn, dsn, catalog, settings, d, args.repeat)
    if args.json:
        print(json.dumps({"rows": args.rows, "figures": figures}))
    return 0 if all(f.get("same_answer", True) for f in figures.values()) else 1


def _shadow(conn, dsn, catalog, settings, d, repeat: int) -> dict:
    """The served read in read mode shadow, every read sampled vs none; the offer's own cost; the outcomes."""
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.routing import shadow
    from lakehouse_dagster.routing.exercise import read_through_router
    from lakehouse_dagster.routing.request import parse_query

    set_override(conn, "read", "dashboards.aggregate", "shadow", dataset=d, actor="bench")
    query = parse_query(AGGREGATE)
    sampled = shadow.ShadowPool(dsn, workers=settings.shadow.workers, queue_size=settings.shadow.queue, sample=1.0)
    unsampled = shadow.ShadowPool(dsn, sample=0.0)
    resolver = FlagResolver(conn, ttl_seconds=60)

    def served(pool):
        return read_through_router(
            conn, catalog, settings, "dashboards.aggregate", d, resolver=resolver, shadow_pool=pool, query=query
        )[0]

    served(unsampled)  # warm
    on, off = [], []
    for _ in range(repeat):  # alternating, the workers of the sampled reads running meanwhile
        t = time.perf_counter()
        result = served(sampled)
        on.append(time.perf_counter() - t)
        t = time.perf_counter()
        served(unsampled)
        off.append(time.perf_counter() - t)
    sampled.drain(600)
    from lakehouse_dagster.routing.request import bind
    from lakehouse_dagster.tracking import datasets

    plan = bind(query, datasets.get_dataset(conn, d))
    quiet = shadow.ShadowPool(dsn, workers=1, queue_size=1_000_000, sample=1.0)
    quiet._start = lambda: None  # type: ignore[method-assign]  # no worker: the offer alone is timed
    offers = []
    for _ in range(1000):
        t = time.perf_counter()
        shadow.offer_query(quiet, result, plan, query, lambda snapshot: result.value)
        offers.append(time.perf_counter() - t)
    outcomes = dict(
        conn.execute(
            "select outcome, count(*) from lakehouse_shadow_reads where dataset_id = %s group by outcome", (d,)
        ).fetchall()
    )
    fig = {
        "served_sampled_p50_s": round(statistics.median(on), 4),
        "served_unsampled_p50_s": round(statistics.median(off), 4),
        "offer_p50_us": round(statistics.median(offers) * 1e6, 1),
        "outcomes": outcomes,
    }
    print(
        f"shadow           served p50 sampled {fig['served_sampled_p50_s'] * 1000:8.1f} ms   unsampled "
        f"{fig['served_unsampled_p50_s'] * 1000:8.1f} ms   offer p50 {fig['offer_p50_us']:.1f} µs   outcomes {outcomes}"
    )
    return fig


if __name__ == "__main__":
    sys.exit(main())
