"""Benchmark (not a test): what a cached flag resolution costs, against one dict lookup in the same run.

    .venv/bin/python bench/bench_flags.py [--lookups 100000] [--datasets 1000] [--repeat 5]

A throwaway embedded Postgres (deleted on exit) gets 1,000 datasets in 10 workspaces and overrides at
every scope; the cache is warmed (one query per dataset, timed separately), then 100,000 resolutions
of random (reader/writer, dataset) pairs run against a plain ``dict[(name, dataset)] -> mode``
lookup over the same keys. Target: >= 200,000 cached resolutions/s on one core.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.embedded import start_embedded  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.flags.registry import READ, READERS, WRITE, WRITERS  # noqa: E402
from lakehouse_dagster.flags.resolver import FlagResolver  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402
from lakehouse_dagster.tracking import datasets as app_tables  # noqa: E402

TARGET = 200_000


def _seed(conn, n_datasets: int) -> list:
    workspaces = [app_tables.create_workspace(conn, f"ws{i}") for i in range(10)]
    with conn.transaction():
        datasets = [
            app_tables.create_dataset(conn, workspaces[i % 10], f"d{i}", [{"name": "a", "type": "int64"}])
            for i in range(n_datasets)
        ]
    set_override(conn, READ, "export.stream", "iceberg", note="bench global", actor="bench")
    for ws in workspaces[:5]:
        set_override(conn, READ, "graph.kuzu", "iceberg", workspace=ws, actor="bench")
        set_override(conn, WRITE, "sync.full", "iceberg_native", workspace=ws, actor="bench")
    for d in datasets[::10]:
        set_override(conn, READ, "studio.digest", "iceberg", dataset=d, actor="bench")
        set_override(conn, READ, "export.stream", "off", dataset=d, actor="bench")
    return datasets


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--datasets", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="lh-bench-"))
    dsn = start_embedded(root / "pg", keep_running=False, delete_on_exit=True)
    with connect(dsn) as conn:
        migrate(conn)
        datasets = _seed(conn, args.datasets)
        resolver = FlagResolver(conn, ttl_seconds=3600)

        names = [(READ, n) for n in READERS] + [(WRITE, n) for n in WRITERS]
        rng = random.Random(42)
        keys = [(*rng.choice(names), rng.choice(datasets)) for _ in range(args.lookups)]

        t0 = time.perf_counter()
        for d in datasets:  # cold: one query fills every reader and writer of the dataset
            resolver.resolve(READ, "export.stream", d)
        cold = time.perf_counter() - t0

        baseline = {(k, n, d): resolver.resolve(k, n, d).mode for k, n, d in keys}
        resolve = resolver.resolve

        def cached():
            for k, n, d in keys:
                resolve(k, n, d)

        def plain_dict():
            for k, n, d in keys:
                baseline[(k, n, d)]

        t_cached = _best(cached, args.repeat)
        t_dict = _best(plain_dict, args.repeat)
        # Sanity: the cached answers are the resolver's answers, with the precedence applied.
        assert resolver.resolve(READ, "export.stream", datasets[0]).reason == "dataset override"
        assert resolver.resolve(READ, "export.stream", datasets[1]).reason == "global override"
        assert resolver.resolve(WRITE, "sync.full", datasets[1]).reason == "workspace override"

    rate = args.lookups / t_cached
    base_rate = args.lookups / t_dict
    print(f"datasets: {args.datasets}, lookups: {args.lookups}, best of {args.repeat}")
    print(
        f"cold fill: {args.datasets / cold:,.0f} datasets/s ({cold / args.datasets * 1e3:.2f} ms per dataset, one query each)"
    )
    print(f"cached resolutions: {rate:,.0f}/s ({t_cached / args.lookups * 1e6:.2f} us each)")
    print(f"baseline dict lookup: {base_rate:,.0f}/s ({t_dict / args.lookups * 1e6:.2f} us each)")
    print(f"ratio: a cached resolution costs {t_cached / t_dict:.1f}x one dict lookup")
    print(f"target >= {TARGET:,}/s: {'met' if rate >= TARGET else 'NOT met'}")
    return 0 if rate >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
