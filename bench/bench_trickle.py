"""Benchmark (not a test): a trickle of one small append per second to one dataset, what it leaves in the table.

    nice .venv/bin/python bench/bench_trickle.py [--minutes 10] [--every 10] [--rows 1000] [--stream]

Two datasets of --rows demo-shaped rows (bench/_common.py), mirrored once, then for --minutes: each second a one-row
append to each, each followed by the mirror's sync (mirror/sync.py sync_dataset, as the stream calls it: one commit
per change at this rate). Dataset "maintained" also gets lake/maintenance.py every --every seconds (compact_small_files
then expire_snapshots, with the LAKEHOUSE_MAINTENANCE_* defaults); dataset "as before" only what a sync does itself
(its compaction of the small files at the top of the table; its expiry of snapshots past 100 and older than an hour).
Prints, for both, the live snapshots, live data files and the metadata file's size at the end and the most seen,
and the median sync time in the last minute. Same run, same machine: the difference is the maintenance.

--stream: the same trickle through the stream instead (mirror/stream.py stream_shard, as a mirror_stream run runs
it): two shards of two, each streamed by its own loop in this process, one dataset on each; shard 0's loop runs
its background maintenance (LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS = --every, mirror/stream_maintenance.py),
shard 1's has it off (0). The bench only appends (one row a second to each) and samples the tables every 10 s; the
streams find the changes and sync them. Prints the same figures, the sync's median over the run and the last
minute, and the maintenance rounds the stream made.
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
    ap.add_argument("--stream", action="store_true", help="the trickle through two stream loops (on / off)")
    args = ap.parse_args(argv)
    if args.stream:
        return _through_the_stream(args)

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


def _through_the_stream(args) -> int:  # noqa: C901
    """Long on purpose: the setup of two shards' streams, the trickle and the report read best as one script."""
    import threading

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.stream import shard_of, stream_shard
    from lakehouse_dagster.mirror.stream_maintenance import Maintained
    from lakehouse_dagster.mirror.sync import SyncResult

    dsn = fresh_database(admin_dsn(), "bench_trickle_stream")
    settings, catalog = mirror_settings(dsn, "bench_trickle_stream")
    names = ("maintained", "as before")  # shard 0 of 2 (maintenance on), shard 1 of 2 (off)
    per_shard = {
        0: settings.replace(stream={"maintenance_seconds": int(args.every)}),
        1: settings.replace(stream={"maintenance_seconds": 0}),
    }
    ids: dict[str, object] = {}
    k = 0
    while len(ids) < 2:  # a dataset on each shard (a third one on a taken shard is synced once, then left)
        d = make_dataset(dsn, args.rows, f"trickle-{k}")[0]
        ids.setdefault(names[shard_of(d, 2)], d)
        k += 1
    stop = threading.Event()
    syncs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    rounds: list[Maintained] = []
    t0 = time.monotonic()
    deadline = time.time() + args.minutes * 60 + 120

    def run(shard: int) -> None:
        name = names[shard]
        s = per_shard[shard]
        for e in stream_shard(
            dsn,
            load_catalog(s, dsn),
            s,
            shard=shard,
            shard_count=2,
            run_id=f"bench-{shard}",
            deadline=deadline,
            stop=stop,
        ):
            if isinstance(e, SyncResult) and e.dataset_id == ids[name] and e.mode != "noop":
                syncs[name].append((time.monotonic() - t0, e.seconds))
            elif isinstance(e, Maintained):
                rounds.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (0, 1)]
    for t in threads:
        t.start()
    with connect(dsn) as conn:

        def caught_up() -> bool:
            return conn.execute(
                "select bool_and(mirrored_version >= rows_version) from datasets where id = any(%s)",
                (list(ids.values()),),
            ).fetchone()[0]

        while not caught_up():
            time.sleep(0.2)
        most = {name: {"snapshots": 0, "data_files": 0, "metadata_kb": 0.0} for name in names}
        t0 = time.monotonic()
        for name in names:
            syncs[name].clear()
        end = t0 + args.minutes * 60
        next_sample = t0 + 10
        appends = 0
        while time.monotonic() < end:
            tick = time.monotonic()
            for name in names:
                conn.execute(APPEND, {"ds": ids[name], "i": args.rows + appends})
            appends += 1
            if time.monotonic() >= next_sample:
                next_sample += 10
                for name in names:
                    now = _state(catalog, settings, ids[name])
                    most[name] = {key: max(most[name][key], v) for key, v in now.items()}
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        elapsed = time.monotonic() - t0
        settle = time.monotonic() + 30
        while not caught_up() and time.monotonic() < settle:
            time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(120)
    print(f"{appends} appends to each dataset in {elapsed:.0f} s ({appends / elapsed:.2f}/s), through the stream")
    print("| | maintained (stream maintenance on) | as before (off) |")
    print("| --- | --- | --- |")
    final = {name: _state(catalog, settings, ids[name]) for name in names}
    for key in ("snapshots", "data_files", "metadata_kb"):
        most_now = {n: max(most[n][key], final[n][key]) for n in names}
        print(
            f"| {key} at the end (most seen) | {final[names[0]][key]} ({most_now[names[0]]}) |"
            f" {final[names[1]][key]} ({most_now[names[1]]}) |"
        )
    med = {n: statistics.median(s for _, s in syncs[n]) for n in names}
    last = {n: statistics.median(s for at, s in syncs[n] if at > elapsed - 60) for n in names}
    print(f"| syncs (commits) | {len(syncs[names[0]])} | {len(syncs[names[1]])} |")
    print(f"| sync p50, whole run | {med[names[0]]:.3f} s | {med[names[1]]:.3f} s |")
    print(f"| sync p50, last minute | {last[names[0]]:.3f} s | {last[names[1]]:.3f} s |")
    done = [r for r in rounds if r.did_something]
    if rounds:
        times = [r.seconds for r in rounds if not r.busy and r.error is None]
        print(
            f"stream maintenance: {len(rounds)} rounds ({len(done)} did something, "
            f"{sum(r.busy for r in rounds)} busy, {sum(r.error is not None for r in rounds)} failed), "
            f"{sum(r.compacted_files for r in rounds)} files compacted, {sum(r.expired_snapshots for r in rounds)} "
            f"snapshots expired; a round median {statistics.median(times):.3f} s, max {max(times):.3f} s"
        )
    print(json.dumps({"final": final, "most": most, "appends": appends, "stream": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
