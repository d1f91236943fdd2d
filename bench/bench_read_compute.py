"""Structured reads (issue 43): the Iceberg executor against the Postgres executor, same run, same request.

    nice .venv/bin/python bench/bench_read_compute.py [--rows 1000000] [--repeat 5] [--layouts before,after]

Makes a dashboard-shaped dataset of --rows rows in Postgres (a string `category` of 100 values, a float64
`amount` with a NaN and ±Infinity now and then, an int64 `qty`, a date, a note), mirrors it to Iceberg with the real
mirror, then times, p50 of --repeat runs each, engines alternating:

  aggregate   a dashboards.aggregate-shaped request: group by category, count, sum and avg of amount, one where
  keyset      a page of 1,000 rows (after_row_index) at the start, the middle (halfway into a data file) and the end
  row_ids     100 random __row_ids
  shadow      the aggregate served through the router by dashboards.aggregate in read mode shadow: p50 of the served
              read with every read sampled (the Iceberg side computed by the shadow workers meanwhile) against none
              sampled, the request path's own cost of offering one (draw, request dump, queue put), and the outcomes

and prints the ratios (Postgres p50 / Iceberg p50) and that both executors gave the same answer.

``--layouts before,after`` (the default) mirrors the same rows twice per round (``--mirror-rounds``, alternating, a
fresh table each time): ``before`` is the mirror's Parquet layout before issue 43's readers-perf (one row group per
incoming batch, ``lake/write_files.ROW_GROUP_ROWS = 0``), ``after`` today's (row groups of ``ROW_GROUP_ROWS`` rows).
It prints each layout's mirror time (best and p50 of the rounds, rows/s, after ÷ before), times every read case on
both tables (the same reader code: the layout's own effect), and the floors: pyiceberg's planning of the snapshot's
files, reading one row group whole, and decoding the ``__row_id`` column of every row group (what 100 ``row_ids``
cannot go below without a bloom filter or an index). The load average is printed at the start and the end.
Starts its own embedded Postgres when LAKEHOUSE_PG_DSN is unset. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
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
        "--layouts",
        default="before,after",
        help="mirror layouts to compare in this run: before (one row group per batch), after (ROW_GROUP_ROWS rows)",
    )
    ap.add_argument("--mirror-rounds", type=int, default=2, help="mirrors per layout, alternating (default 2)")
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

    print(f"load average at start: {_load()}")
    dsn = fresh_database(admin_dsn(), "bench_read_compute")
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
    print(f"{args.rows:,} rows made in {made:.1f} s")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or any(x not in LAYOUTS for x in layouts):
        ap.error(f"--layouts: give before, after or both, not {args.layouts!r}")
    mirrored: dict[str, list[float]] = {x: [] for x in layouts}
    cpu: dict[str, list[float]] = {x: [] for x in layouts}  # this process' CPU (the mirror's reads, typing, writes)
    tables: dict[str, tuple] = {}
    for r in range(max(1, args.mirror_rounds)):
        for layout in layouts if r % 2 == 0 else layouts[::-1]:
            settings, catalog = mirror_settings(dsn, f"bench_read_compute_{layout}_{r}")
            with _layout(layout):
                t, c = time.perf_counter(), time.process_time()
                snapshot_id = sync_dataset(dsn, catalog, settings, d).snapshot_id
                mirrored[layout].append(time.perf_counter() - t)
                cpu[layout].append(time.process_time() - c)
            tables[layout] = (settings, catalog, snapshot_id)
    figures: dict[str, dict] = {"mirror": {}}
    for layout, times in mirrored.items():
        best, best_cpu = min(times), min(cpu[layout])
        figures["mirror"][layout] = {
            "best_s": round(best, 2),
            "p50_s": round(statistics.median(times), 2),
            "best_cpu_s": round(best_cpu, 2),
        }
        print(
            f"mirror {layout:6s}  best {best:7.2f} s  p50 {statistics.median(times):7.2f} s  "
            f"{args.rows / best:,.0f} rows/s  cpu best {best_cpu:7.2f} s  "
            f"(rounds: {', '.join(f'{x:.2f}' for x in times)} s wall; {', '.join(f'{x:.2f}' for x in cpu[layout])} s cpu)"
        )
    if len(mirrored) == 2:
        ratio = min(mirrored["after"]) / min(mirrored["before"])
        cpu_ratio = min(cpu["after"]) / min(cpu["before"])
        figures["mirror"]["after_over_before"] = round(ratio, 3)
        figures["mirror"]["after_over_before_cpu"] = round(cpu_ratio, 3)
        print(
            f"mirror after ÷ before, best of each: wall {ratio:.3f}, cpu {cpu_ratio:.3f} "
            f"(no more than 5 % slower: wall {ratio <= 1.05}, cpu {cpu_ratio <= 1.05})"
        )
    settings, catalog, snapshot_id = tables[layouts[-1]]

    with connect(dsn) as conn:
        dataset = datasets.get_dataset(conn, d)
        loaded = {x: load_dataset_table(cat, st, d) for x, (st, cat, _) in tables.items()}
        snaps = {x: snap for x, (_, _, snap) in tables.items()}
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
            ice: dict[str, float] = {}
            outs = []
            for layout, table in loaded.items():
                ice[layout], out = _p50(
                    lambda table=table, snap=snaps[layout]: read_iceberg_compute(table, snap, plan), args.repeat
                )
                outs.append(out)
            pg_p50, pg = _p50(lambda: read_postgres_compute(conn, dataset, plan), args.repeat)
            same = all(compare(pg, o, plan.ordered) is None for o in outs)  # type: ignore[arg-type]
            head = layouts[-1]
            figures[name] = {
                "iceberg_p50_s": round(ice[head], 4),
                **{f"iceberg_{x}_p50_s": round(v, 4) for x, v in ice.items()},
                "postgres_p50_s": round(pg_p50, 4),
                "ratio": round(pg_p50 / ice[head], 1),
                "rows": out.num_rows,  # type: ignore[attr-defined]
                "same_answer": same,
            }
            by_layout = "   ".join(f"iceberg[{x}] {v * 1000:8.1f} ms" for x, v in ice.items())
            gain = f"   before/after {ice['before'] / ice['after']:5.2f}×" if len(ice) == 2 else ""
            print(
                f"{name:16s} {by_layout}   postgres {pg_p50 * 1000:8.1f} ms   postgres/iceberg "
                f"{pg_p50 / ice[head]:6.1f}×{gain}   {out.num_rows} rows   same answer: {same}"  # type: ignore[attr-defined]
            )
        for layout, table in loaded.items():
            figures[f"floors[{layout}]"] = floors = _floors(table, snaps[layout], args.repeat)
            print(
                f"floors[{layout}]  plan files {floors['plan_files_ms']:.1f} ms   one row group whole "
                f"({floors['row_group_rows']:,} rows) {floors['one_row_group_ms']:.1f} ms   every __row_id decoded "
                f"{floors['row_ids_column_ms']:.1f} ms ({floors['row_groups']} row groups)"
            )
        if "shadow" in wanted:
            figures["shadow"] = _shadow(conn, dsn, catalog, settings, d, args.repeat)
    print(f"load average at end: {_load()}")
    if args.json:
        print(json.dumps({"rows": args.rows, "figures": figures}))
    return 0 if all(f.get("same_answer", True) for f in figures.values()) else 1


LAYOUTS = ("before", "after")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class _layout:
    """The mirror's row groups as ``before`` (one per incoming batch) or ``after`` (ROW_GROUP_ROWS) for a block."""

    def __init__(self, layout: str):
        from lakehouse_dagster.lake import write_files

        self.module, self.saved = write_files, write_files.ROW_GROUP_ROWS
        self.rows = 0 if layout == "before" else self.saved

    def __enter__(self):
        self.module.ROW_GROUP_ROWS = self.rows

    def __exit__(self, *exc):
        self.module.ROW_GROUP_ROWS = self.saved


def _floors(table, snapshot_id, repeat: int) -> dict:
    """What no read of this table goes below: planning the snapshot's files (pyiceberg), one row group read whole,
    and every row group's __row_id column decoded (the first pass of a row_ids read)."""
    import pyarrow.parquet as pq

    plan_ms, tasks = _p50(lambda: list(table.scan(snapshot_id=snapshot_id).plan_files()), repeat)
    paths = [t.file.file_path for t in tasks]

    def open_file(path):
        return pq.ParquetFile(table.io.new_input(path).open())

    middle = open_file(paths[len(paths) // 2])
    rg = middle.metadata.num_row_groups // 2
    one_ms, _ = _p50(lambda: middle.read_row_group(rg), repeat)
    groups = 0

    def every_row_id():
        nonlocal groups
        groups = 0
        for path in paths:
            pf = open_file(path)
            for i in range(pf.metadata.num_row_groups):
                pf.read_row_group(i, columns=["__row_id"])
                groups += 1

    ids_ms, _ = _p50(every_row_id, max(1, repeat // 2))
    return {
        "plan_files_ms": round(plan_ms * 1000, 1),
        "row_group_rows": middle.metadata.row_group(rg).num_rows,
        "one_row_group_ms": round(one_ms * 1000, 1),
        "row_ids_column_ms": round(ids_ms * 1000, 1),
        "row_groups": groups,
    }


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
