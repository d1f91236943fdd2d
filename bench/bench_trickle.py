"""Benchmark (not a test): a trickle of one small append per second to one dataset, what it leaves in the table.

    nice .venv/bin/python bench/bench_trickle.py [--minutes 10] [--every 10] [--rows 1000]

Two datasets of --rows demo-shaped rows (bench/_common.py), mirrored once, then for --minutes: each second a one-row
append to each, each followed by the mirror's sync (mirror/sync.py sync_dataset, as the stream calls it: one commit
per change at this rate). Dataset "maintained" also gets lake/maintenance.py every --every seconds (compact_small_files
then expire_snapshots, with the LAKEHOUSE_MAINTENANCE_* defaults); dataset "as before" only what a sync does itself
(its compaction of the small files at the top of the table; its expiry of snapshots past 100 and older than an hour).
Prints, for both, the live snapshots, live data files and the metadata file's size at the end and the most seen,
and the median sync time in the last minute. Same run, same machine: the difference is the maintenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402

APPEND = """
insert into dataset_rows (dataset_id, row_index, data)
values (%(ds)s, %(i)s, jsonb_build_object('name', 'trickle-' || %(i)s, 'qty', %(i)s))
"""


def _state(catalog, settings, d) -> dict:
    from lakehouse_dagster.lake.catalog import table_identifier

    table = catalog.load_table(table_identifier(settings, d))
    size = table.io.new_input(table.metadata_location).open().read()
    return {
        "snapshots": len(table.metadata.snapshots),
        "data_files": sum(1 for _ in table.scan().plan_files()),
        "metadata_kb": round(len(size) / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=10, help="seconds between maintenance rounds")
    ap.add_argument("--rows", type=int, default=1000)
    args = ap.parse_args(argv)

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake.maintenance import compact_small_files, expire_snapshots
    from lakehouse_dagster.mirror.sync import sync_dataset

    dsn = fresh_database(admin_dsn(), "bench_trickle")
    settings, catalog = mirror_settings(dsn, "bench_trickle")
    names = ("maintained", "as before")
    ids = {name: make_dataset(dsn, args.rows, name)[0] for name in names}
    for d in ids.values():
        sync_dataset(dsn, catalog, settings, d)
    most = {name: {"snapshots": 0, "data_files": 0, "metadata_kb": 0.0} for name in names}
    sync_s: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    maint_s: list[float] = []
    t0 = time.monotonic()
    end = t0 + args.minutes * 60
    next_maint = t0 + args.every
    appends = 0
    with connect(dsn) as conn:
        while time.monotonic() < end:
            tick = time.monotonic()
            for name in names:
                conn.execute(APPEND, {"ds": ids[name], "i": args.rows + appends})
                t = time.perf_counter()
                sync_dataset(dsn, catalog, settings, ids[name])
                sync_s[name].append((tick - t0, time.perf_counter() - t))
            appends += 1
            if time.monotonic() >= next_maint:
                t = time.perf_counter()
                compact_small_files(conn, catalog, settings, ids["maintained"])
                expire_snapshots(conn, catalog, settings, ids["maintained"])
                maint_s.append(time.perf_counter() - t)
                next_maint += args.every
                for name in names:
                    now = _state(catalog, settings, ids[name])
                    most[name] = {k: max(most[name][k], v) for k, v in now.items()}
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    elapsed = time.monotonic() - t0
    print(f"{appends} appends to each dataset in {elapsed:.0f} s ({appends / elapsed:.2f}/s)")
    print("| | maintained | as before |")
    print("| --- | --- | --- |")
    final = {name: _state(catalog, settings, ids[name]) for name in names}
    for key in ("snapshots", "data_files", "metadata_kb"):
        print(
            f"| {key} at the end (most seen) | {final[names[0]][key]} ({most[names[0]][key]}) |"
            f" {final[names[1]][key]} ({most[names[1]][key]}) |"
        )
    last = {n: statistics.median(s for at, s in sync_s[n] if at > elapsed - 60) for n in names}
    print(f"| sync, median of the last minute | {last[names[0]]:.3f} s | {last[names[1]]:.3f} s |")
    print(
        f"maintenance round: median {statistics.median(maint_s):.3f} s, max {max(maint_s):.3f} s ({len(maint_s)} rounds)"
    )
    print(json.dumps({"final": final, "most": most, "appends": appends}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
