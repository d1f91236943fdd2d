"""Benchmark (not a test): what the live app's one-row statements cost while the stream mirrors them.

    nice .venv/bin/python bench/bench_stream_app_writes.py [--rows 100000] [--statements 300] [--rounds 3]
                                                          [--pause 0.02]

A demo-shaped dataset (bench/_common.py) of --rows rows, mirrored once. Each round runs --statements one-row
statements, each its own transaction as the app's are (INSERT, UPDATE of one row, DELETE of one row, in turn,
--pause seconds apart), in three configurations, their order rotating round by round:

  quiet   nothing mirrors (the writes pile up for a later sync)
  batch   what the batch mirror does, at its best: a process that syncs the dataset every 5 s (the daemon's sensor
          loop), without the run launch each batch run also pays (so a floor under "before")
  stream  a stream loop (mirror/stream.py ``stream_shard``, the body of a mirror_stream run) in its own process
          mirrors every change as it comes: its 100 ms cursor query, the 200 ms commit window, a sync per window

The stream adds no trigger and no NOTIFY to the app's transaction (it reads the xid cursor change tracking already
writes), so what can differ is only contention: the sync's reads and its catalog commit on the same server, and its
CPU on the same two cores. Prints median and p95 per statement kind, best round of each, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import admin_dsn, child_env, fresh_database, make_dataset, mirror_settings  # noqa: E402
from bench.bench_freshness import pct  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.mirror.sync import sync_dataset  # noqa: E402

STREAM = """
import sys, time
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.stream import stream_shard
s = Settings.from_env()
for _ in stream_shard(s.postgres.dsn, load_catalog(s, s.postgres.dsn), s, shard=0, shard_count=1, run_id=sys.argv[1],
                      deadline=time.time() + float(sys.argv[2])):
    pass
"""
BATCH = """
import sys, time
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
s = Settings.from_env()
catalog, end = load_catalog(s, s.postgres.dsn), time.time() + float(sys.argv[2])
print("ready", flush=True)
while time.time() < end:
    sync_dataset(s.postgres.dsn, catalog, s, sys.argv[1])
    time.sleep(5)
"""
LIVE = "select count(*) from lakehouse_mirror_streams where run_id = %s and heartbeat_at > now() - interval '3 seconds'"
STATEMENTS = {
    "insert": 'insert into dataset_rows (dataset_id, row_index, data) values (%(ds)s, %(i)s, \'{"name": "x"}\')',
    "update": "update dataset_rows set data = data || '{\"qty\": 1}' where dataset_id = %(ds)s and row_index = %(u)s",
    "delete": "delete from dataset_rows where dataset_id = %(ds)s and row_index = %(i)s",
}


def one_round(conn, ds, n: int, pause: float, base: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in STATEMENTS}
    kinds = list(STATEMENTS)
    for k in range(n):
        kind = kinds[k % 3]
        i = base + k
        t = time.perf_counter()
        conn.execute(STATEMENTS[kind], {"ds": ds, "i": i - (k % 3), "u": (i * 7919) % 50_000})
        times[kind].append(time.perf_counter() - t)
        time.sleep(pause)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--statements", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.02)
    args = ap.parse_args(argv)
    dsn = fresh_database(admin_dsn(), "bench_stream_app_writes")
    settings, catalog = mirror_settings(dsn, "bench_stream_app_writes")
    ds, _ = make_dataset(dsn, args.rows)
    sync_dataset(dsn, catalog, settings, ds)
    env = child_env(dsn, settings)
    best: dict[str, dict[str, list[float]]] = {}
    base = args.rows + 10
    syncs = 0
    with connect(dsn) as conn:
        conn.autocommit = True
        configs = ["quiet", "batch", "stream"]
        for r in range(args.rounds):
            for config in configs[r % 3 :] + configs[: r % 3]:
                proc = None
                seconds = args.statements * (args.pause + 0.01) + 120
                if config == "batch":
                    proc = subprocess.Popen(
                        [sys.executable, "-c", BATCH, str(ds), str(seconds)], env=env, stdout=subprocess.PIPE, text=True
                    )
                    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                    time.sleep(2)
                if config == "stream":
                    run_id = f"bench-app-writes-{r}"
                    proc = subprocess.Popen([sys.executable, "-c", STREAM, run_id, str(seconds)], env=env)
                    t0 = time.monotonic()
                    while conn.execute(LIVE, (run_id,)).fetchone()[0] == 0:
                        if time.monotonic() - t0 > 120:
                            raise RuntimeError("the stream did not hold its shard within 120 s")
                        time.sleep(0.2)
                    time.sleep(2)  # its first sweep (what the quiet round left behind) is done
                times = one_round(conn, ds, args.statements, args.pause, base)
                base += args.statements + 3
                if config == "stream":
                    syncs += conn.execute(
                        "select coalesce(sum(syncs), 0) from lakehouse_mirror_streams where run_id = %s", (run_id,)
                    ).fetchone()[0]
                if proc is not None:
                    proc.terminate()
                    proc.wait(60)
                score = statistics.median(t for ts in times.values() for t in ts)
                if config not in best or score < statistics.median(t for ts in best[config].values() for t in ts):
                    best[config] = times
    print(
        f"{args.statements} one-row statements a round, {args.rounds} rounds a configuration, {args.pause * 1000:.0f} ms"
        f" apart; the stream made {syncs} syncs in its rounds"
    )
    print("| statement (best round) | quiet p50 / p95 | batch p50 / p95 | stream p50 / p95 | stream / batch (p50) |")
    print("| --- | --- | --- | --- | --- |")
    out = {}
    for kind in STATEMENTS:
        cells, med = [], {}
        for config in configs:
            ts = best[config][kind]
            med[config] = statistics.median(ts)
            cells.append(f"{med[config] * 1000:.2f} / {pct(ts, 0.95) * 1000:.2f} ms")
        out[kind] = {f"{c}_p50_ms": m * 1000 for c, m in med.items()} | {"ratio": med["stream"] / med["batch"]}
        print(f"| {kind} | {' | '.join(cells)} | {med['stream'] / med['batch']:.2f}× |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
