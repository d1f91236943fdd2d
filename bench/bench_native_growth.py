"""After the writer flip: what one small native write costs as its Iceberg table's history grows.

    nice .venv/bin/python bench/bench_native_growth.py [--writes 400] [--append 10] [--window 50]

A dataset written iceberg-native (sync.append flipped for a bench workspace, as the ingest bench does), then
--writes native appends of --append rows through the real write router and chunked writer (route_write →
write_arrow). Two variants in the same run, a fresh dataset each: "keep all" (the writer as before: a native
commit expired nothing, because the rollback's walk needed every native snapshot, and no file was ever
compacted) and "expire" (each native commit carries its run's totals, rollback/iceberg_only.native_run, and
expires like a mirror commit, with LAKEHOUSE_SNAPSHOTS_KEEP and a max age of 0 s so the bench's minutes show
what a day's history does; small files are compacted, routing/native_compaction.py). Prints, per window of
writes, the median write time (the route_write call), the metadata file's size, the snapshots kept, the live
data files, and the time of the rollback's count of the rows only Iceberg holds (iceberg_only, median of 3); at the
end, a full scan of the table (pyiceberg to Arrow, median of 3: what a reader pays); the last window against the first,
and "expire" against "keep all", as ratios. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, mirror_settings  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writes", type=int, default=400)
    ap.add_argument("--append", type=int, default=10)
    ap.add_argument("--window", type=int, default=50)
    args = ap.parse_args(argv)

    from psycopg import sql

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.registry import SERVABLE_READERS
    from lakehouse_dagster.runbooks.ingest_bench import BENCH_SCHEMA
    from lakehouse_dagster.tracking import datasets

    admin = admin_dsn()
    name = "lakehouse_bench_native_growth"
    dsn = fresh_database(admin, name)
    settings, catalog = mirror_settings(dsn, "bench_native")
    settings = settings.replace(sync={"snapshots_max_age_seconds": 0})
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "native-growth")
        for reader in SERVABLE_READERS:
            set_override(conn, "read", reader.name, "iceberg", workspace=ws, note="bench", actor="bench")
        set_override(conn, "write", "sync.append", "iceberg_native", workspace=ws, note="bench", actor="bench")
        last = {
            variant: writes(
                conn,
                dsn,
                catalog,
                settings,
                datasets.create_dataset(conn, ws, variant, BENCH_SCHEMA),
                args,
                variant,
                carry=(variant == "expire"),
            )
            for variant in ("keep all", "expire")
        }
    (w0, c0, r0), (w1, c1, r1) = last["keep all"], last["expire"]
    print(
        f"\nexpire / keep all, last window: write p50 {w1 / w0:.2f}×, rollback count {c1 / c0:.2f}×, "
        f"full scan {r1 / r0:.2f}×"
    )
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    return 0


def writes(conn, dsn, catalog, settings, dataset_id, args, variant: str, *, carry: bool) -> tuple[float, float, float]:
    """--writes native appends; prints the windows, returns the last one's write p50, count time and the time of a
    full scan of the table at the end (s)."""
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.lake.catalog import table_identifier
    from lakehouse_dagster.mirror.native_run import iceberg_only
    from lakehouse_dagster.routing.write_router import native_write, route_write
    from lakehouse_dagster.runbooks.ingest_bench import _batches
    from lakehouse_dagster.tracking import datasets

    dataset = datasets.get_dataset(conn, dataset_id)
    flags = FlagResolver(conn, ttl_seconds=0)
    print(
        f"\n{variant}: {args.writes} native appends of {args.append} rows (machine: {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    print(
        f"{'writes':>11s} {'write p50 ms':>13s} {'count ms':>9s} {'metadata KB':>12s} {'snapshots':>10s} "
        f"{'data files':>11s} {'rows only in Iceberg':>21s}"
    )
    windows: list[tuple[float, float]] = []
    times: list[float] = []
    for i in range(1, args.writes + 1):
        t = time.perf_counter()
        route_write(
            conn,
            flags,
            "sync.append",
            dataset_id,
            pg_write=lambda: None,
            settings=settings,
            iceberg_write=native_write(
                catalog,
                settings,
                dataset,
                _batches(dataset, args.append, i),
                writer="sync.append",
                conn=conn if carry else None,
            ),
        )
        times.append(time.perf_counter() - t)
        if i % args.window == 0 or i == args.writes:
            table = catalog.load_table(table_identifier(settings, dataset_id))
            counts = []
            for _ in range(3):
                t = time.perf_counter()
                found = iceberg_only(conn, catalog, settings, dataset_id, table=table)
                counts.append(time.perf_counter() - t)
            assert found is not None and found.rows == i * args.append, found  # every native row counted
            meta_kb = Path(table.metadata_location.removeprefix("file://")).stat().st_size / 1024
            p50, count = statistics.median(times), statistics.median(counts)
            windows.append((p50, count))
            files = sum(1 for _ in table.scan().plan_files())
            print(
                f"{i - len(times) + 1:5d}-{i:<5d} {p50 * 1000:13.1f} {count * 1000:9.1f} {meta_kb:12.1f} "
                f"{len(table.metadata.snapshots):10d} {files:11d} {found.rows:21d}",
                flush=True,
            )
            times = []
    (w0, c0), (w1, c1) = windows[0], windows[-1]
    scans = []
    for _ in range(3):  # what a reader of the table pays at the end: plan + read every file
        t = time.perf_counter()
        rows = table.scan().to_arrow().num_rows
        scans.append(time.perf_counter() - t)
    assert rows == args.writes * args.append
    scan = statistics.median(scans)
    print(
        f"last window / first: write {w1 / w0:.2f}×, rollback count {c1 / c0:.2f}×; a full scan at the end "
        f"{scan * 1000:.1f} ms",
        flush=True,
    )
    return w1, c1, scan


if __name__ == "__main__":
    sys.exit(main())
