"""Benchmark (not a test): the mirror as a stream vs the batch path, end to end through the real stack, same run.

    nice .venv/bin/python bench/bench_stream.py [--trials 20] [--sizes 100,1000] [--rows 1000] [--timeout 300]
                                                [--shards 1] [--variants stream,batch] [--tick-datasets 10000]
    nice .venv/bin/python bench/bench_stream.py --variants stream,stream-rest   # the stream on the SQL vs a REST catalog

Each variant starts the stack exactly as ``lakehouse up --no-demo`` does (bench/bench_freshness.py ``Stack``: embedded
Postgres, Dagster webserver + daemon, the repository's dagster.yaml) with LAKEHOUSE_MIRROR_STREAM=true (``stream``:
the mirror_poller starts a mirror_stream run per shard) or false (``batch``: today's mirror_batch_job runs);
``stream-rest`` is ``stream`` started with ``lakehouse up --catalog rest`` (SeaweedFS beside Postgres: the tables in
its Iceberg REST catalog, the warehouse on its S3; the SQL catalog's warehouse stays local files). Then,
measured from the commit of a write to the first succeeded ``iceberg_sync_log`` row covering it:

1. append → Iceberg: a 10-row append to a 1,000-row dataset (already mirrored), ``--trials`` times at random pauses
   (0.3–3 s, the same seeded draws for every variant), p50 / p95;
2. burst: N datasets of ``--rows`` rows created and filled in one transaction → all mirrored, for each N in
   ``--sizes``;
3. (stream variant) the supervisor's tick: ``--tick-datasets`` more datasets, all mirrored (their sync log rows
   written directly) plus 10 changed, and the mirror_poller evaluated 5 times in this process against the stack's
   database with the stack's stream live (an ephemeral Dagster instance: the run queries are those of an instance
   with no other runs), median seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_freshness import APPEND, Stack, pct  # noqa: E402

LIVE = """
select count(*) from lakehouse_mirror_streams
 where shard_count = %s and ended_at is null and heartbeat_at > now() - interval '5 seconds'
"""


def wait_streaming(stack: Stack, shards: int, timeout: float) -> float:
    t0 = time.perf_counter()
    while stack.conn.execute(LIVE, (shards,)).fetchone()[0] < shards:
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{stack.label}: no live stream for every shard within {timeout} s")
        time.sleep(0.2)
    return time.perf_counter() - t0


def measure(stack: Stack, args, streaming: bool) -> dict:
    out: dict = {"seconds_to_ready": stack.seconds_to_ready}
    if streaming:
        out["stream_live_after_s"] = round(wait_streaming(stack, args.shards, 180), 2)
    (d,), t0 = stack.new_datasets(1, args.rows)
    first = stack.wait_covered([d], args.timeout, t0)
    if d not in first:
        raise RuntimeError(f"{stack.label}: the first dataset was not mirrored within {args.timeout} s")
    out["first_sync_s"] = first[d]
    time.sleep(3)
    lags, lo = [], args.rows
    pauses = random.Random(7).uniform
    for i in range(args.trials):
        stack.conn.execute(APPEND, {"id": d, "lo": lo, "n": 10})
        t0 = time.perf_counter()
        lo += 10
        got = stack.wait_covered([d], args.timeout, t0)
        lags.append(got.get(d, float("inf")))
        print(f"  [{stack.label}] trial {i + 1}: {lags[-1]:.2f} s", file=sys.stderr, flush=True)
        time.sleep(pauses(0.3, 3.0))
    out["lag"] = lags
    for n in args.sizes:
        time.sleep(5)
        ids, t0 = stack.new_datasets(n, args.rows)
        got = stack.wait_covered(ids, args.timeout, t0)
        times = sorted(got.values())
        out[f"burst_{n}"] = {
            "mirrored": len(got),
            "of": n,
            "all_s": round(max(times), 2) if len(got) == n else None,
            "median_s": round(times[len(times) // 2], 2) if times else None,
        }
        print(f"  [{stack.label}] burst {n}: {out[f'burst_{n}']}", file=sys.stderr, flush=True)
    if streaming and args.tick_datasets:
        out["tick_s"] = tick_seconds(stack, args.tick_datasets, args.shards)
    return out


def tick_seconds(stack: Stack, n: int, shards: int) -> dict:
    """The mirror_poller's tick (supervision + the batch path for what no stream covers) over ``n`` more datasets."""
    import dagster as dg

    from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    with stack.conn.transaction():
        stack.conn.execute(
            """insert into datasets (id, workspace_id, name, kind, schema, row_count)
               select gen_random_uuid(), %s, 'tick-' || g, 'tabular', '[{"name": "n", "type": "int64"}]', 0
                 from generate_series(1, %s) g""",
            (stack.ws, n),
        )
        stack.conn.execute(
            """insert into iceberg_sync_log (dataset_id, sync_id, writer, path, status, source_version, started_at,
                                             finished_at)
               select id, gen_random_uuid(), 'sync.full', 'mirror', 'succeeded', rows_version, now(), now()
                 from datasets where name like 'tick-%%'"""
        )
    changed = [r[0] for r in stack.conn.execute("select id from datasets where name like 'tick-%%' limit 10")]
    for d in changed:
        stack.conn.execute(APPEND, {"id": d, "lo": 0, "n": 1})
    env = {"LAKEHOUSE_PG_DSN": stack.dsn, "LAKEHOUSE_MIRROR_STREAM": "true", "LAKEHOUSE_MIRROR_SHARDS": str(shards)}
    env["LAKEHOUSE_HOME"] = str(stack.home)
    os.environ.update(env)
    times = []
    with dg.DagsterInstance.ephemeral() as instance:
        cursor = None
        for _ in range(5):
            ctx = dg.build_sensor_context(
                instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=stack.dsn)}
            )
            t0 = time.perf_counter()
            res = mirror_poller(ctx)
            times.append(time.perf_counter() - t0)
            cursor = res.cursor
    return {"datasets": n, "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--sizes", default="100,1000")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--variants", default="stream,batch")
    p.add_argument("--tick-datasets", type=int, default=10_000)
    args = p.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    results = {}
    for label in [v for v in args.variants.split(",") if v]:
        streaming = label in ("stream", "stream-rest")
        env = {"LAKEHOUSE_MIRROR_STREAM": "true" if streaming else "false", "LAKEHOUSE_MIRROR_SHARDS": str(args.shards)}
        print(f"starting the stack: {label}", file=sys.stderr, flush=True)
        stack = Stack(ROOT, label, extra_env=env, extra_args=["--catalog", "rest"] if label == "stream-rest" else None)
        try:
            results[label] = measure(stack, args, streaming)
        finally:
            stack.stop()
        print(json.dumps({label: results[label]}), flush=True)
    print(json.dumps(results, indent=1))
    print()
    print("| | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))

    def row(name, get):
        cells = []
        for r in results.values():
            try:
                v = get(r)
            except (KeyError, TypeError):
                v = "—"
            cells.append(f"{v:.2f} s" if isinstance(v, float) and v != float("inf") else str(v))
        print(f"| {name} | " + " | ".join(cells) + " |")

    row(f"10-row append → Iceberg, p50 ({args.trials} writes)", lambda r: statistics.median(r["lag"]))
    row(f"10-row append → Iceberg, p95 ({args.trials} writes)", lambda r: pct(r["lag"], 0.95))
    for n in args.sizes:
        row(f"{n} datasets written at once → all mirrored", lambda r, n=n: r[f"burst_{n}"]["all_s"])
    row("supervisor tick (median)", lambda r: r["tick_s"]["median_s"])


if __name__ == "__main__":
    main()
