"""Benchmark (not a test): the service's ingest call in-process, one at a time, without HTTP or other clients.

    .venv/bin/python bench/bench_service_ingest.py [--rounds 15] [--demo-rows 20000] [--kept-connection]

The demo workspace (its sourced datasets: files, cdc, a Postgres table) is seeded in a throwaway database, each
sourced dataset ingested once (warm), then ``--rounds`` rounds of one ingest per sourced dataset with its default
writer, as ``lakehouse serve``'s ``/lakehouse/ingest`` makes it: ``checked_write`` (the first native write's check,
issue 42) around the writer's run — given a fresh connection (a tree from before issue 45's fix), or None where
``checked_write`` opens one only for a native writer (the service's call since). ``--kept-connection`` passes one
connection kept for the whole run instead, which splits the cost of that connection from the rest. Prints p50 and min per writer and over
all. Also runs in a tree from before ``checked_write`` (the service then called ``run_writer`` alone): copy this file
into that tree's ``bench/`` to compare (docs/benchmarks.md, issue 45's before and after).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database, mirror_settings  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.demo.workspace import seed_demo  # noqa: E402
from lakehouse_dagster.service.db import ServiceDb  # noqa: E402

SOURCED = (
    "select d.id, case source->>'type' when 'files' then 'sync.append' when 'cdc' then 'cdc.append'"
    " else 'sync.full' end from datasets d where d.workspace_id = %s and source ? 'type'"
    " and source->>'type' <> 'demo' order by d.name"
)


def ingest_call(kept: bool):
    """The service's ingest as this tree makes it: ``checked_write`` in a connection of its own, or (a tree from
    before it) ``run_writer`` alone."""
    try:
        from lakehouse_dagster.api.flips import checked_write
    except ImportError:  # a tree from before issue 42's checked_write
        from lakehouse_dagster.sources.writers import run_writer

        return lambda db, settings, ds, writer: run_writer(
            db.ingest_dsn, db.catalog, settings, db.resolver(), ds, writer
        )
    held: list = []
    lazy = "None" in str(inspect.signature(checked_write).parameters["conn"].annotation)  # issue 45's service call

    def call(db, settings, ds, writer):
        if kept:
            if not held:
                held.append(connect(db.ingest_dsn))
            return checked_write(held[0], db.ingest_dsn, db.catalog, settings, db.resolver(), ds, writer).result
        if lazy:
            return checked_write(None, db.ingest_dsn, db.catalog, settings, db.resolver(), ds, writer).result
        with connect(db.ingest_dsn) as conn:
            return checked_write(conn, db.ingest_dsn, db.catalog, settings, db.resolver(), ds, writer).result

    return call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--demo-rows", type=int, default=20_000)
    ap.add_argument("--kept-connection", action="store_true", help="one connection for checked_write, kept")
    args = ap.parse_args(argv)
    dsn = fresh_database(admin_dsn(), "lh_bench_service_ingest")
    settings, _catalog = mirror_settings(dsn, "bench_service_ingest")
    section = getattr(settings, "project", None)  # settings by section since issue 45; flat before
    home = section.home if section is not None else settings.home
    with connect(dsn) as conn:
        demo = seed_demo(conn, big_rows=args.demo_rows, home=home)
        sourced = [
            (uuid.UUID(r[0].hex), r[1]) for r in conn.execute(SOURCED, (uuid.UUID(demo["workspace_id"]),)).fetchall()
        ]
    db = ServiceDb(dsn, settings)
    call = ingest_call(args.kept_connection)
    for ds, writer in sourced:  # warm: each dataset's first ingest
        call(db, settings, ds, writer)
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for ds, writer in sourced:
            t = time.perf_counter()
            call(db, settings, ds, writer)
            times.setdefault(writer, []).append(time.perf_counter() - t)
    every = [x for ts in times.values() for x in ts]
    for writer, ts in sorted(times.items()):
        print(f"{writer:12s} p50 {statistics.median(ts) * 1000:7.1f} ms  min {min(ts) * 1000:7.1f} ms  n={len(ts)}")
    print(f"{'all':12s} p50 {statistics.median(every) * 1000:7.1f} ms  sum {sum(every):.2f} s")
    db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
