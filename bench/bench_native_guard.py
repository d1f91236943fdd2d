"""Benchmark (not a test): what the gates that hold after the flip cost, against baselines in the same run.

    .venv/bin/python bench/bench_native_guard.py [--datasets 2000] [--pipelines 500] [--repeat 200]

A throwaway embedded Postgres (deleted on exit) gets ``--datasets`` datasets in 10 workspaces, half of
them covered by a native writer at workspace scope, readers flipped there, one succeeded native sync each,
and ``--pipelines`` pipelines reading other datasets. Measured, each as the median of ``--repeat`` calls:

- the write router's guard for one native write (``native_blockers`` for one dataset), against one
  ``freshness`` query (what the read router pays per read) — the guard's ratio says how many such
  round trips it costs;
- a flag-cache fill (``FlagResolver`` load through ``flags/precedence.py``), against the load it replaced
  (the overrides of one dataset + ``resolve_from`` in Python, reproduced here);
- one ``native_safety`` sensor evaluation over every native dataset (``unsafe_native_datasets``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psycopg.types.json import Jsonb  # noqa: E402

from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.embedded import start_embedded  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.flags.registry import REGISTRY, SERVABLE_READERS  # noqa: E402
from lakehouse_dagster.flags.resolver import FlagResolver, resolve_from  # noqa: E402
from lakehouse_dagster.routing.native_guard import native_blockers, unsafe_native_datasets  # noqa: E402
from lakehouse_dagster.routing.read_router import freshness  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402
from lakehouse_dagster.tracking import datasets as app_tables  # noqa: E402

# The resolver's load before precedence.py: the dataset's overrides, then precedence in Python.
_OLD_LOAD = """
select o.kind, o.name, o.scope, o.mode
  from lakehouse_flag_overrides o
 where o.scope = 'global'
    or (o.scope = 'dataset' and o.scope_id = %(ds)s)
    or (o.scope = 'workspace' and o.scope_id = (select d.workspace_id from datasets d where d.id = %(ds)s))
"""


def _old_load(conn, dataset_id):
    stored: dict = {}
    for kind, name, scope, mode in conn.execute(_OLD_LOAD, {"ds": dataset_id}).fetchall():
        stored.setdefault((kind, name), {})[scope] = mode
    return {(k, n): resolve_from(f, stored.get((k, n), {})) for k, fs in REGISTRY.items() for n, f in fs.items()}


def _seed(conn, n_datasets: int, n_pipelines: int) -> list[uuid.UUID]:
    workspaces = [app_tables.create_workspace(conn, f"ws{i}") for i in range(10)]
    with conn.transaction():
        datasets = [
            app_tables.create_dataset(conn, workspaces[i % 10], f"d{i}", [{"name": "a", "type": "int64"}])
            for i in range(n_datasets)
        ]
        conn.execute(
            "insert into iceberg_sync_log (dataset_id, sync_id, writer, path, mode, status, has_identity,"
            " source_version, snapshot_id, finished_at)"
            " select d, gen_random_uuid(), 'sync.full', 'native', 'replace', 'succeeded', true, 0, 1, now()"
            " from unnest(%s::uuid[]) d",
            ([d for i, d in enumerate(datasets) if i % 10 < 5],),
        )
        for p in range(n_pipelines):  # pipelines reading datasets outside the native workspaces
            src = datasets[(p * 10 + 7) % n_datasets]
            conn.execute(
                "insert into pipelines (workspace_id, name, spec) values (%s, %s, %s)",
                (
                    workspaces[7],
                    f"p{p}",
                    Jsonb(
                        {
                            "nodes": [
                                {"type": "dataset", "data": {"datasetId": str(src)}},
                                {"type": "sql", "data": {"q": "select 1"}},
                            ]
                        }
                    ),
                ),
            )
    for ws in workspaces[:5]:
        for r in SERVABLE_READERS:
            set_override(conn, "read", r.name, "iceberg", workspace=ws, actor="bench")
        set_override(conn, "write", "sync.full", "iceberg_native", workspace=ws, actor="bench")
    return [d for i, d in enumerate(datasets) if i % 10 < 5]


def _interleaved_ms(fns: dict, args: list, repeat: int) -> dict:
    """Median milliseconds of each function, calls interleaved so a busy machine slows them alike."""
    times: dict = {k: [] for k in fns}
    for i in range(repeat):
        a = args[i % len(args)]
        for k, fn in fns.items():
            t = time.perf_counter()
            fn(a)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=2000)
    ap.add_argument("--pipelines", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lh-bench-guard-"))
    dsn = start_embedded(root / "pg", keep_running=False, delete_on_exit=True)
    with connect(dsn) as conn:
        migrate(conn)
        native = _seed(conn, args.datasets, args.pipelines)
        conn.execute("analyze")
        assert native_blockers(conn, native[:1]) == [], "the seeded native datasets must pass"
        resolver = FlagResolver(conn, 0)
        m = _interleaved_ms(
            {
                "guard": lambda d: native_blockers(conn, [d]),
                "fresh": lambda d: freshness(conn, d),
                "fill": lambda d: resolver._load(d),
                "old_fill": lambda d: _old_load(conn, d),
            },
            native,
            args.repeat,
        )
        assert all(resolver._load(d) == _old_load(conn, d) for d in native[:50]), "the two loads disagree"
        tick = _interleaved_ms(
            {"tick": lambda _: unsafe_native_datasets(conn), "fresh": lambda d: freshness(conn, d)},
            native,
            max(5, args.repeat // 20),
        )
    guard, fresh, fill, old_fill = m["guard"], m["fresh"], m["fill"], m["old_fill"]
    print(f"{args.datasets} datasets ({len(native)} native), {args.pipelines} pipelines; medians of {args.repeat}")
    print(
        f"write-router guard (one native write)  {guard:8.2f} ms   {guard / fresh:5.1f}x one freshness query "
        f"({fresh:.2f} ms)"
    )
    print(
        f"flag-cache fill via precedence.py      {fill:8.2f} ms   {fill / old_fill:5.2f}x the old load "
        f"({old_fill:.2f} ms)"
    )
    print(
        f"native_safety sensor evaluation        {tick['tick']:8.2f} ms   {tick['tick'] / tick['fresh']:5.1f}x one "
        f"freshness query "
        f"({len(native)} native datasets)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
