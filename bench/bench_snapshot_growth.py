"""A long-lived mirror: what one small sync costs as the Iceberg table's history grows.

    nice .venv/bin/python bench/bench_snapshot_growth.py [--syncs 400] [--rows 1000] [--append 10]

One demo-shaped dataset (bench/_common.py) of --rows rows, mirrored once, then --syncs rounds of an
--append-row append followed by the sync the mirror runs (incremental append: one commit). Three variants in
the same run, a fresh dataset each: "as before" (one manifest and one data file per append, every snapshot
and every metadata file kept), "merge" (lake/writer.py MERGE_MANIFESTS), "merge + expiry" (also
METADATA_FILES and expirable_snapshots with LAKEHOUSE_SNAPSHOTS_KEEP and a max age of 0 s, so the bench's
minutes show what an hour's history does to a hot dataset) and "all" (also the compaction of small appended
files, tracking/row_changes.py). Prints, per window of rounds, the median sync time, the metadata file's size, the
snapshots and the manifests of the current snapshot, and the time to plan a scan of the current snapshot (median of 3)
(what readers, the identity check and the Iceberg-side digest start with); the last window against the
first, and each variant against "as before", as ratios. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GENERATE, admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--syncs", type=int, default=400)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--append", type=int, default=10)
    ap.add_argument("--window", type=int, default=50)
    args = ap.parse_args(argv)

    from psycopg import sql

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake import writer
    from lakehouse_dagster.tracking import row_changes

    admin = admin_dsn()
    name = "lakehouse_bench_snapshot_growth"
    dsn = fresh_database(admin, name)
    settings, catalog = mirror_settings(dsn, "bench_snapshots")
    merging, metadata_files = dict(writer.MERGE_MANIFESTS), dict(writer.METADATA_FILES)
    compact_files = row_changes.COMPACT_FILES
    variants = {  # name: (merge manifests, delete old metadata files, snapshots kept past a max age of 0 s, compact)
        "as before": (False, False, 0, False),
        "merge": (True, False, 0, False),
        "merge + expiry": (True, True, settings.sync.snapshots_keep, False),
        "all (+ compact)": (True, True, settings.sync.snapshots_keep, True),
    }
    last: dict[str, tuple[float, float]] = {}
    for variant, (merge, delete_old, keep, compact) in variants.items():
        writer.MERGE_MANIFESTS.update(merging if merge else {"commit.manifest-merge.enabled": "false"})
        writer.METADATA_FILES.update(
            metadata_files if delete_old else {"write.metadata.delete-after-commit.enabled": "false"}
        )
        row_changes.COMPACT_FILES = compact_files if compact else 10**9
        last[variant] = rounds(
            dsn, catalog, settings.replace(sync={"snapshots_keep": keep, "snapshots_max_age_seconds": 0}), args, variant
        )
    s0, p0 = last["as before"]
    print()
    for variant, (s1, p1) in last.items():
        print(
            f"{variant:>15s} / as before: sync p50 of the last window {s1 / s0:.2f}×, scan planning (mean over the "
            f"windows) {p1 / p0:.2f}×"
        )
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    return 0


def rounds(dsn, catalog, settings, args, variant: str) -> tuple[float, float]:
    """Mirror a fresh dataset, then --syncs rounds of append + sync; prints the windows, returns the last one's
    sync p50 and the mean plan time over the windows (merging makes it saw-toothed), in seconds."""
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake.catalog import table_identifier
    from lakehouse_dagster.mirror.sync import sync_dataset

    d, _ = make_dataset(dsn, args.rows)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    print(
        f"\n{variant}: {args.rows:,} rows mirrored; {args.syncs} rounds of a {args.append}-row append + sync "
        f"(machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    print(
        f"{'rounds':>11s} {'sync p50 ms':>12s} {'plan ms':>8s} {'metadata KB':>12s} {'all metadata MB':>16s} "
        f"{'snapshots':>10s} {'manifests':>10s}"
    )
    windows: list[tuple[float, float]] = []
    times: list[float] = []
    nxt = args.rows
    with connect(dsn) as conn:
        for i in range(1, args.syncs + 1):
            conn.execute(GENERATE, {"ds": d, "lo": nxt, "hi": nxt + args.append - 1})
            nxt += args.append
            r = sync_dataset(dsn, catalog, settings, d)
            assert r.mode == "incremental" or (r.mode == "partial" and "compacted" in r.reason), r
            times.append(r.seconds)
            if i % args.window == 0 or i == args.syncs:
                table = catalog.load_table(table_identifier(settings, d))
                plans = []
                for _ in range(3):
                    t = time.perf_counter()
                    files = list(table.scan().plan_files())
                    plans.append(time.perf_counter() - t)
                plan = statistics.median(plans)
                snap = table.current_snapshot()
                manifests = len(snap.manifests(table.io))
                meta = Path(table.metadata_location.removeprefix("file://"))
                meta_kb = meta.stat().st_size / 1024
                all_mb = sum(f.stat().st_size for f in meta.parent.glob("*.metadata.json")) / 2**20
                p50 = statistics.median(times)
                windows.append((p50, plan))
                print(
                    f"{i - len(times) + 1:5d}-{i:<5d} {p50 * 1000:12.1f} {plan * 1000:8.1f} {meta_kb:12.1f} {all_mb:16.1f} "
                    f"{len(table.metadata.snapshots):10d} {manifests:10d}   ({len(files)} data files)",
                    flush=True,
                )
                times = []
    (s0, p0), (s1, p1) = windows[0], windows[-1]
    print(f"last window / first: sync {s1 / s0:.2f}×, scan planning {p1 / p0:.2f}×", flush=True)
    return windows[-1][0], statistics.mean(p for _, p in windows)


if __name__ == "__main__":
    sys.exit(main())
