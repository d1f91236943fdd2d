"""Benchmark (not a test): seconds from a Postgres write to Iceberg, end to end, through the real stack.

    nice .venv/bin/python bench/bench_freshness.py [--trials 10] [--sizes 10,100] [--rows 1000]
                                                   [--baseline main] [--baseline-sizes 10] [--timeout 300]
                                                   [--after-commit]

For each variant the stack is started exactly as ``lakehouse up --no-demo`` starts it (that command itself, as a
subprocess: embedded Postgres, migrations, Dagster webserver + daemon with the variant's dagster.yaml) in a
temporary LAKEHOUSE_HOME on a free port. Then, measured from the commit of a write to the first succeeded
``iceberg_sync_log`` row whose source version covers it:

1. idle lag: a 10-row append to a 1,000-row dataset (already mirrored), ``--trials`` times, p50 / p95;
2. burst: N datasets of ``--rows`` rows created and filled in one transaction → all mirrored (and the median
   dataset), for each N in ``--sizes``.

3. where the seconds of one idle lag go, from the Dagster event log of the run that covered each trial (medians):
   sensor loop wait (write → the start of the poller's tick that requested the run: the daemon evaluates sensors
   every 5 s), sensor tick (→ run enqueued), queue (→ RUN_STARTING), launch (→ RUN_START, reported by the run's
   own process), run init (→ the sync's start in iceberg_sync_log), sync (→ its finish); and, outside the lag,
   the run's tail after the sync (checks, RUN_SUCCESS).

Variants, in the same run: the baseline is the source tree of git ref ``--baseline`` (default ``main``: one
mirror_job run per dataset), extracted with ``git archive`` and put first on PYTHONPATH; then this tree (batched
mirror runs). Ratios are baseline / new (>1: the new path is faster). ``--baseline none`` skips it.
``--after-commit`` adds this tree once more in capture mode after-commit (``lakehouse digest-capture after-commit``
after the stack is up): change tracking is written by the WAL consumer, which the poller catches up before each
tick. There a write's version is known only once the consumer has written it, so after each write the bench
catches the consumer up itself before it waits for the covering sync (that time counts in the lag).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]

NEW_DATASET = """
insert into datasets (id, workspace_id, name, kind, schema, row_count)
values (%(id)s, %(ws)s, %(name)s, 'tabular', '[{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]', 0)
"""
APPEND = """
insert into dataset_rows (dataset_id, row_index, data)
select %(id)s, g, jsonb_build_object('n', g, 's', 'row-' || g)
  from generate_series(%(lo)s::bigint, %(lo)s::bigint + %(n)s - 1) g
"""
COVERED = """
select d.id from datasets d
 where d.id = any(%s::uuid[])
   and exists (select 1 from iceberg_sync_log s where s.dataset_id = d.id and s.status = 'succeeded'
                  and s.source_version >= d.rows_version)
"""

# The Dagster run that covered a trial: the first mirror run listing the dataset enqueued after the write.
COVERING_RUN = """
select r.run_id from runs r join run_tags t on t.run_id = r.run_id and t.key = 'lakehouse/datasets'
 where t.value like %(pat)s and r.create_timestamp >= (to_timestamp(%(t)s) at time zone 'UTC')
 order by r.create_timestamp limit 1
"""
RUN_EVENTS = """
select dagster_event_type, extract(epoch from min(timestamp))::float8 from event_logs
 where run_id = %s and dagster_event_type is not null group by 1
"""
COVERING_SYNC = """
select extract(epoch from started_at)::float8, extract(epoch from finished_at)::float8 from iceberg_sync_log
 where dataset_id = %s and status = 'succeeded' and source_version >= %s order by finished_at limit 1
"""
# The sensor tick that requested a run: its start (the daemon's loop reached the poller) splits the sensor phase.
COVERING_TICK = """
select extract(epoch from min(timestamp))::float8 from job_ticks where tick_body like %(pat)s
"""
PHASES = ["sensor loop wait", "sensor tick", "queue", "launch", "run init", "sync", "after sync (not in the lag)"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """`lakehouse up --no-demo --json` from ``src`` in a temporary home; ``dsn`` once ready."""

    def __init__(
        self,
        src: Path,
        label: str,
        capture: str | None = None,
        extra_env: dict | None = None,
        extra_args: list[str] | None = None,
    ):
        """``extra_args``: more of `lakehouse up`'s options (``--catalog rest``: bench_stream.py's REST variant)."""
        self.label = label
        self.capture = capture
        self.home = Path(tempfile.mkdtemp(prefix=f"lh-fresh-{label}-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_"))}
        env.update({"LAKEHOUSE_HOME": str(self.home), "PYTHONPATH": str(src), "LAKEHOUSE_ACTOR": "bench"})
        env.update(extra_env or {})
        self.log = open(self.home / "up.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lakehouse_dagster.cli.main",
                "up",
                "--no-demo",
                "--port",
                str(free_port()),
                "--api-port",  # two stacks at once (two benches) must not meet on the default 3001
                str(free_port()),
                "--json",
                *(extra_args or []),
            ],
            cwd=src,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{label}: lakehouse up exited; see {self.home / 'up.log'}")
        ready = json.loads(line)
        self.dsn = ready["database"]  # the embedded server's socket DSN (no password to hide)
        self.seconds_to_ready = ready.get("seconds_to_ready")
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.dagster = psycopg.connect(psycopg.conninfo.make_conninfo(self.dsn, dbname="dagster"), autocommit=True)
        self.ws = uuid.uuid4()
        self.conn.execute("insert into workspaces (id, name) values (%s, 'bench')", (self.ws,))
        if capture:
            subprocess.run(
                [sys.executable, "-m", "lakehouse_dagster.cli.main", "digest-capture", capture],
                cwd=src,
                env={**env, "LAKEHOUSE_PG_DSN": self.dsn},
                check=True,
                stdout=self.log,
                stderr=self.log,
            )

    def written(self) -> None:
        """In capture mode after-commit the write's version exists once the consumer wrote it."""
        if self.capture:
            sys.path.insert(0, str(ROOT))
            from lakehouse_dagster.tracking import capture

            capture.catch_up(self.conn)

    def stop(self) -> None:
        self.conn.close()
        self.dagster.close()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def wait_covered(self, ids: list[uuid.UUID], timeout: float, t0: float) -> dict[uuid.UUID, float]:
        """Seconds from t0 at which each dataset's latest version had a succeeded sync (polled every 50 ms)."""
        done: dict[uuid.UUID, float] = {}
        deadline = t0 + timeout
        while len(done) < len(ids) and time.perf_counter() < deadline:
            rest = [d for d in ids if d not in done]
            now = time.perf_counter() - t0
            for (d,) in self.conn.execute(COVERED, (rest,)).fetchall():
                done[d] = now
            time.sleep(0.05)
        return done

    def breakdown(self, d: uuid.UUID, t_write: float, version: int) -> dict[str, float] | None:
        """Seconds per phase of the lag of one trial (PHASES), from the covering run's events and sync."""
        run = self.dagster.execute(COVERING_RUN, {"pat": f"%{d}%", "t": t_write - 0.5}).fetchone()
        sync = self.conn.execute(COVERING_SYNC, (d, version)).fetchone()
        if run is None or sync is None:
            return None
        ev = dict(self.dagster.execute(RUN_EVENTS, (run[0],)).fetchall())
        need = ("PIPELINE_ENQUEUED", "PIPELINE_STARTING", "PIPELINE_START", "PIPELINE_SUCCESS")
        tick = self.dagster.execute(COVERING_TICK, {"pat": f"%{run[0]}%"}).fetchone()
        if not all(k in ev for k in need) or tick is None or tick[0] is None:
            return None
        marks = [
            t_write,
            tick[0],
            ev["PIPELINE_ENQUEUED"],
            ev["PIPELINE_STARTING"],
            ev["PIPELINE_START"],
            sync[0],
            sync[1],
            ev["PIPELINE_SUCCESS"],
        ]
        return {name: round(b - a, 3) for name, a, b in zip(PHASES, marks, marks[1:])}

    def new_datasets(self, n: int, rows: int) -> tuple[list[uuid.UUID], float]:
        ids = [uuid.uuid4() for _ in range(n)]
        with self.conn.transaction():
            for i, d in enumerate(ids):
                self.conn.execute(NEW_DATASET, {"id": d, "ws": self.ws, "name": f"bench-{i}"})
                self.conn.execute(APPEND, {"id": d, "lo": 0, "n": rows})
        t0 = time.perf_counter()
        self.written()
        return ids, t0


def measure(stack: Stack, args, sizes: list[int]) -> dict:
    out: dict = {"seconds_to_ready": stack.seconds_to_ready}
    (d,), t0 = stack.new_datasets(1, args.rows)
    first = stack.wait_covered([d], args.timeout, t0)
    if d not in first:
        raise RuntimeError(f"{stack.label}: the first dataset was not mirrored within {args.timeout} s")
    out["first_sync_s"] = first[d]
    time.sleep(5)  # let the checks of that first run finish: the stack is idle before the trials
    lags, trials, lo = [], [], args.rows
    # Idle 3-8 s between trials, drawn uniformly (the same draws for every variant): the writes land at uniformly
    # spread phases of the daemon's 5 s sensor loop. Whole-second sleeps sampled only ~5 phases, so the lag's
    # p50 was a property of the schedule (the trials came out bimodal, 3.5 s and 5.5 s).
    pauses = random.Random(11).uniform
    for i in range(args.trials):
        stack.conn.execute(APPEND, {"id": d, "lo": lo, "n": 10})
        t0, t_write = time.perf_counter(), time.time()
        stack.written()
        lo += 10
        got = stack.wait_covered([d], args.timeout, t0)
        lags.append(got.get(d, float("inf")))
        version = stack.conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        trials.append((t_write, version))
        print(f"  [{stack.label}] trial {i + 1}: {lags[-1]:.2f} s", file=sys.stderr, flush=True)
        time.sleep(pauses(3.0, 8.0))
    out["lag"] = lags
    time.sleep(5)  # the last run's tail (checks, RUN_SUCCESS) reaches the event log
    phases = [stack.breakdown(d, t_write, version) for t_write, version in trials]
    print(f"  [{stack.label}] lag breakdown per trial: {phases}", file=sys.stderr, flush=True)
    got = [p for p in phases if p]
    out["lag_breakdown"] = {k: statistics.median(p[k] for p in got) for k in PHASES} if got else None
    for n in sizes:
        ids, t0 = stack.new_datasets(n, args.rows)
        got = stack.wait_covered(ids, args.timeout, t0)
        times = sorted(got.values())
        out[f"burst_{n}"] = {
            "mirrored": len(got),
            "of": n,
            "all_s": max(times) if len(got) == n else None,
            "median_s": times[len(times) // 2] if times else None,
            "timeout_s": args.timeout,
        }
        print(f"  [{stack.label}] burst {n}: {out[f'burst_{n}']}", file=sys.stderr, flush=True)
        time.sleep(10)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def baseline_tree(ref: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="lh-fresh-baseline-src-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--sizes", default="10,100")
    p.add_argument("--baseline", default="main", help="git ref of the baseline tree, or none")
    p.add_argument("--baseline-sizes", default="10")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--after-commit", action="store_true", help="also this tree in capture mode after-commit")
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    variants = [("new", ROOT, sizes)]  # first: on a shared machine the cheaper figures come in first
    if args.after_commit:
        variants.append(("after-commit", ROOT, sizes))
    if args.baseline != "none":
        variants.append(
            ("baseline", baseline_tree(args.baseline), [int(x) for x in args.baseline_sizes.split(",") if x])
        )
    results = {}
    for label, src, vsizes in variants:
        print(f"starting the stack: {label} ({src})", file=sys.stderr, flush=True)
        stack = Stack(src, label, "after-commit" if label == "after-commit" else None)
        try:
            results[label] = measure(stack, args, vsizes)
        finally:
            stack.stop()
        print(json.dumps({label: results[label]}), flush=True)
    results = {k: results[k] for k in ("baseline", "new", "after-commit") if k in results}
    print(json.dumps(results, indent=1))
    print()
    print("| | " + " | ".join(results) + (" | ratio (baseline / new) |" if "baseline" in results else " |"))
    print("|---|" + "---|" * (len(results) + ("baseline" in results)))

    def row(name, get):
        vals = [get(r) for r in results.values()]
        cells = [f"{v:.1f} s" if isinstance(v, (int, float)) and v != float("inf") else str(v) for v in vals]
        ratio = ""
        if "baseline" in results and all(isinstance(v, (int, float)) and v not in (0, float("inf")) for v in vals):
            ratio = f" {vals[0] / vals[1]:.1f}× |"
        elif "baseline" in results:
            ratio = " — |"
        print(f"| {name} | " + " | ".join(cells) + " |" + ratio)

    row("stack ready", lambda r: r["seconds_to_ready"])
    row("first sync of a new 1,000-row dataset", lambda r: r["first_sync_s"])
    row(f"10-row append → Iceberg, p50 ({args.trials} trials)", lambda r: statistics.median(r["lag"]))
    row(f"10-row append → Iceberg, p95 ({args.trials} trials)", lambda r: pct(r["lag"], 0.95))
    for phase in PHASES:
        row(f"  of which (median): {phase}", lambda r, phase=phase: (r.get("lag_breakdown") or {}).get(phase, "—"))
    for n in sorted({n for _, _, s in variants for n in s}):
        row(
            f"{n} datasets written at once → all mirrored",
            lambda r, n=n: (
                (r.get(f"burst_{n}") or {}).get("all_s")
                or (f"{r[f'burst_{n}']['mirrored']}/{n} in {args.timeout:.0f} s" if f"burst_{n}" in r else "not run")
            ),
        )
        row(f"{n} datasets: median dataset", lambda r, n=n: (r.get(f"burst_{n}") or {}).get("median_s") or "—")


if __name__ == "__main__":
    main()
