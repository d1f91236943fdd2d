"""Benchmark (not a test): a stream run's memory over a long steady trickle, through the real stack.

    nice .venv/bin/python bench/bench_stream_rss.py [--minutes 30] [--datasets 4] [--rows 1000] [--every 0.5]

Starts the stack exactly as ``lakehouse up --no-demo`` does (bench/bench_freshness.py ``Stack``; the mirror streams,
the default) with one shard and a stream lifetime longer than the bench (so one run lives through it all), creates
``--datasets`` datasets, then appends one row to one of them (round robin) every ``--every`` seconds for
``--minutes``. Every 10 s it samples the stream run's worker process (its pid from the run's
``.dagster/lakehouse_run_worker`` tag, the warm launcher's): resident memory (RSS) and unique memory (USS), and the
run's syncs so far. Prints the first sample after the warm-up minute, the last, the most seen, and last / first
(issue 30's target: within 20 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_freshness import APPEND, Stack  # noqa: E402

WORKER = """
select r.run_id, t.value from runs r join run_tags t on t.run_id = r.run_id
 where r.pipeline_name = 'mirror_stream' and r.status = 'STARTED' and t.key = '.dagster/lakehouse_run_worker'
 order by r.create_timestamp desc limit 1
"""


def stream_worker(stack: Stack, timeout: float) -> tuple[str, psutil.Process]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        row = stack.dagster.execute(WORKER).fetchone()
        if row is not None:
            return row[0], psutil.Process(json.loads(row[1])["pid"])
        time.sleep(0.5)
    raise RuntimeError(f"no started mirror_stream run with a worker within {timeout} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--datasets", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--every", type=float, default=0.5, help="seconds between two appends")
    args = ap.parse_args(argv)
    lifetime = int(args.minutes * 60 + 900)
    stack = Stack(
        ROOT,
        "stream-rss",
        extra_env={"LAKEHOUSE_MIRROR_STREAM": "true", "LAKEHOUSE_MIRROR_STREAM_LIFETIME_SECONDS": str(lifetime)},
    )
    try:
        ids, t0 = stack.new_datasets(args.datasets, args.rows)
        got = stack.wait_covered(ids, 300, t0)
        if len(got) < len(ids):
            raise RuntimeError("the datasets were not mirrored within 300 s")
        run_id, worker = stream_worker(stack, 120)
        samples: list[tuple[float, int, int, int]] = []  # (minute, rss, uss, syncs)
        start = time.monotonic()
        end = start + args.minutes * 60
        next_sample = start
        k = 0
        while time.monotonic() < end:
            tick = time.monotonic()
            d = ids[k % len(ids)]
            stack.conn.execute(APPEND, {"id": d, "lo": args.rows + k, "n": 1})
            k += 1
            if tick >= next_sample:
                next_sample += 10
                mem = worker.memory_full_info()
                syncs = stack.conn.execute(
                    "select coalesce(sum(syncs), 0) from lakehouse_mirror_streams where run_id = %s", (run_id,)
                ).fetchone()[0]
                samples.append(((tick - start) / 60, mem.rss, mem.uss, int(syncs)))
            time.sleep(max(0.0, args.every - (time.monotonic() - tick)))
        still = stack.dagster.execute("select status from runs where run_id = %s", (run_id,)).fetchone()[0]
    finally:
        stack.stop()
    warm = [s for s in samples if s[0] >= 1.0] or samples
    first, last = warm[0], warm[-1]
    mb = 1024 * 1024
    print(
        f"{k} appends over {args.minutes:g} min to {args.datasets} datasets; one stream run ({run_id}, {still} at the"
        f" end), {last[3]} syncs"
    )
    print("| the stream run's worker | RSS | USS |")
    print("| --- | --- | --- |")
    print(f"| after the first minute | {first[1] / mb:.0f} MB | {first[2] / mb:.0f} MB |")
    print(f"| at the end | {last[1] / mb:.0f} MB | {last[2] / mb:.0f} MB |")
    print(f"| most seen | {max(s[1] for s in warm) / mb:.0f} MB | {max(s[2] for s in warm) / mb:.0f} MB |")
    print(
        f"| median | {statistics.median(s[1] for s in warm) / mb:.0f} MB | "
        f"{statistics.median(s[2] for s in warm) / mb:.0f} MB |"
    )
    print(f"| end / first | {last[1] / first[1]:.2f}× | {last[2] / first[2]:.2f}× |")
    print(json.dumps({"run_id": run_id, "status": still, "appends": k, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
