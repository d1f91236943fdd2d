"""Benchmark (not a test): what the live app's one-row statements on other datasets cost while the reverse mirror
applies native commits (mirror/reverse.py, issue 31: "the live app's statements on other datasets cost no more while
a reverse apply runs").

    nice .venv/bin/python bench/bench_reverse_app_writes.py [--rows 1000000] [--app-rows 100000] [--statements 600]
                                                            [--rounds 2] [--pause 0.02] [--configs a,b,...]
                                                            [--resync-share 0.5] [--set NAME=VALUE ...]

Set-up as bench/bench_reverse.py: a demo-shaped dataset of --rows rows, mirrored, read-flipped, canary ok (its
maintained digest registered and filled), its writers iceberg_native, the reverse applied once. Beside it, the live
app's dataset: --app-rows rows, registered for the maintained digest, written through change tracking (capture mode
triggers) as the app writes.

Each round runs one-row statements on the app's dataset (INSERT, UPDATE of one row, DELETE of one row, in turn, each
its own transaction, --pause seconds apart), in these configurations, their order rotating round by round:

  quiet    nothing else runs (--statements statements)
  resync   a full reverse re-sync of the --rows-row dataset (``apply_reverse(..., full=True)``: delete every row,
           COPY the snapshot's rows with their jsonb built client-side) in its own process; the statements run from
           its start to its end
  resync-share  the same re-sync paced (LAKEHOUSE_REVERSE_RESYNC_SHARE=--resync-share, copy_back.paced): its COPY
           sends a slice of 8,192 rows in T seconds, then pauses T × (1/share − 1), inside its transaction
  resync-staged  the same re-sync through the staging path (the rows staged, the insert builds their jsonb)
  appends  a stream of small reverse applies in its own process: a native sync.append of 10 rows on the --rows-row
           dataset through the write router, then ``apply_reverse`` (an append), back to back (--statements
           statements)
  appends-share  the same stream paced as the mirror stream paces a dataset's applies (mirror/stream.py
           ``_Reverse``, LAKEHOUSE_MIRROR_SYNC_SHARE): after an apply of T seconds the next waits T × (1/share − 1),
           native commits going on meanwhile (the next apply takes all of them)
  held     no reverse at all: a session holding a REPEATABLE READ snapshot open for as long as the last re-sync
           took (--held-seconds before the first): the long transaction alone, to tell its xmin horizon (the
           app's row versions it keeps from being pruned) from the re-sync's work
  burn     no reverse, no Postgres: a process spinning on one core for as long as the last re-sync took, as a
           re-sync's backend does: what any busy neighbour on the machine costs the app's statements
  native   the same native appends without the reverse apply: what the native commits cost the app by themselves,
           so ``appends`` over ``native`` is the reverse's own share

Two clocks per statement: the wall time as the app sees it, and the CPU time of the app's Postgres backend
(/proc/<pid>/schedstat) — wall time rising with CPU flat is contention (the two cores, the disk), CPU rising is
work the statement itself does more of. Prints p50 / p99 per configuration over all statements of all its rounds,
and the ratios to quiet measured in the same run. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("LAKEHOUSE_SOAK_SECONDS", "0")  # the set-up flips at once (as the tests do)

from psycopg import sql  # noqa: E402

from bench._common import admin_dsn, child_env, fresh_database, make_dataset, mirror_settings  # noqa: E402
from bench.bench_app_writes import backend_cpu_ns  # noqa: E402
from bench.bench_reverse import make_native  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402

WORKER = """
import datetime as dt, json, signal, sys, time, uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.mirror.reverse import apply_reverse
from bench.bench_reverse import _fresh, native_write
import pyarrow as pa
mode, d, seconds = sys.argv[1], uuid.UUID(sys.argv[2]), float(sys.argv[3])
s = Settings.from_env()
catalog = load_catalog(s, s.postgres.dsn)
table = load_table_or_none(catalog, table_identifier(s, d))
template = pa.Table.from_batches(list(table.scan(limit=10).to_arrow_batch_reader())).combine_chunks().to_batches()[0]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # the round is over: finish this commit, then report
print("ready", flush=True)
end, n, applies, rest_until = time.time() + seconds, 0, [], 0.0
factor = 1 / s.stream.sync_share - 1
while time.time() < end and not stop:
    if mode == "burn":  # one core busy, nothing else: the machine's share of the cost
        while time.time() < end and not stop:
            n += 1
        break
    if mode.startswith("resync"):
        if mode == "resync-staged":  # the staging path: the rows staged, their jsonb built by the insert
            import lakehouse_dagster.mirror.reverse as reverse
            reverse.client_jsonb_supported = lambda *a: False
        t = time.perf_counter()
        r = apply_reverse(s.postgres.dsn, catalog, s, d, actor="bench", full=True)
        applies.append(time.perf_counter() - t)
        break
    table = load_table_or_none(catalog, table_identifier(s, d))
    base = int(table.current_snapshot().summary.additional_properties["total-records"])
    native_write(s.postgres.dsn, s, catalog, d, "sync.append", [_fresh(template, base, dt.datetime.now(dt.UTC))], base + 9)
    if mode == "appends" or (mode == "appends-share" and time.perf_counter() >= rest_until):
        t = time.perf_counter()
        r = apply_reverse(s.postgres.dsn, catalog, s, d, actor="bench")
        assert r.how == "append", r
        applies.append(time.perf_counter() - t)
        rest_until = time.perf_counter() + applies[-1] * factor
    n += 1
print(json.dumps({"commits": n, "applies": len(applies), "apply_s": sum(applies)}), flush=True)
"""
STATEMENTS = {
    "insert": 'insert into dataset_rows (dataset_id, row_index, data) values (%(ds)s, %(i)s, \'{"name": "x"}\')',
    "update": "update dataset_rows set data = data || '{\"qty\": 1}' where dataset_id = %(ds)s and row_index = %(u)s",
    "delete": "delete from dataset_rows where dataset_id = %(ds)s and row_index = %(i)s",
}
FPI = "select wal_fpi from pg_stat_wal"  # full-page images written to the WAL, server-wide
CONFIGS = ("quiet", "resync", "resync-share", "resync-staged", "held", "burn", "appends", "appends-share", "native")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def backend_wrote(pid: int) -> int | None:
    """Bytes the backend has written (write() calls: at a commit, the WAL up to its record, whoever inserted it)."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def statements(conn, pid: int, ds, n: int | None, pause: float, base: int, until=None) -> tuple[list, list, list, int]:
    """One-row statements until ``n`` ran or ``until()`` says stop: (wall seconds, backend CPU seconds, bytes the
    backend wrote, count)."""
    wall, cpu, wrote = [], [], []
    kinds = list(STATEMENTS)
    k = 0
    while (n is None or k < n) and (until is None or k == 0 or not until()):
        kind = kinds[k % 3]
        i = base + k
        w0, c0, t = backend_wrote(pid), backend_cpu_ns(pid), time.perf_counter()
        conn.execute(STATEMENTS[kind], {"ds": ds, "i": i - (k % 3), "u": (i * 7919) % 50_000})
        wall.append(time.perf_counter() - t)
        c1, w1 = backend_cpu_ns(pid), backend_wrote(pid)
        if w0 is not None and w1 is not None:
            wrote.append(w1 - w0)
        if c0 is not None and c1 is not None:
            cpu.append((c1 - c0) / 1e9)
        k += 1
        time.sleep(pause)
    return wall, cpu, wrote, k


def main(argv: list[str] | None = None) -> int:  # noqa: C901
    """Complex on purpose: a bench script: argument parsing, setup, rounds and report read top to bottom."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--app-rows", type=int, default=100_000)
    ap.add_argument("--statements", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.02)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--held-seconds", type=float, default=20.0)
    ap.add_argument("--resync-share", type=float, default=0.5, help="the share of resync-share (0 < share < 1)")
    ap.add_argument(
        "--wal-writer-delay",
        help="the server's wal_writer_delay before the rounds, e.g. 10ms (as --set wal_writer_delay=10ms)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting (ALTER SYSTEM on this bench's own server, restarted once) before the rounds, e.g. "
        "shared_buffers=2GB, wal_compression=on, max_wal_size=8GB; repeat for several",
    )
    args = ap.parse_args(argv)
    bad = [item for item in args.set if "=" not in item.strip("=")]
    if bad:
        ap.error(f"--set takes NAME=VALUE (e.g. shared_buffers=2GB), not {bad[0]!r}")
    if args.wal_writer_delay:  # one of the server settings below
        args.set.append(f"wal_writer_delay={args.wal_writer_delay}")
    from lakehouse_dagster.parity.maintained import ensure_pg
    from lakehouse_dagster.tracking import datasets

    dsn = fresh_database(admin_dsn(), "bench_reverse_app_writes")
    settings, catalog = mirror_settings(dsn, "bench_reverse_app_writes")
    t0 = time.perf_counter()
    native = make_native(dsn, settings, catalog, args.rows)
    app, _ = make_dataset(dsn, args.app_rows, name="app")
    with connect(dsn) as conn:
        conn.autocommit = True
        ensure_pg(conn, app, datasets.get_dataset(conn, app).columns)
        conn.execute("vacuum analyze dataset_rows")
    if args.set:  # the server's room (buffers, WAL): set, then the server restarted with them
        from urllib.parse import parse_qs, urlparse

        from lakehouse_dagster.testing.service import restart_postgres

        pairs = [item.split("=", 1) for item in args.set]
        with connect(dsn) as conn:
            conn.autocommit = True
            for name, value in pairs:
                conn.execute(sql.SQL("alter system set {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        restart_postgres(Path(parse_qs(urlparse(dsn).query)["host"][0]), mode="fast")
        with connect(dsn) as conn:
            for name, _ in pairs:
                shown = conn.execute(sql.SQL("show {}").format(sql.Identifier(name))).fetchone()[0]
                print(f"{name} {shown}", file=sys.stderr, flush=True)
    print(f"set-up {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    env = child_env(dsn, settings)
    configs = [c for c in CONFIGS if c in args.configs.split(",")]
    wall: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    wrote: dict[str, list[int]] = {c: [] for c in configs}
    fpi: dict[str, int] = {c: 0 for c in configs}
    work: dict[str, list[dict]] = {c: [] for c in configs}
    base = args.app_rows + 10
    held = args.held_seconds
    with connect(dsn) as conn:
        conn.autocommit = True
        pid = conn.execute("select pg_backend_pid()").fetchone()[0]
        for r in range(args.rounds):
            for config in configs[r % len(configs) :] + configs[: r % len(configs)]:
                proc = None
                fpi0 = conn.execute(FPI).fetchone()[0]
                if config == "held":
                    with connect(dsn) as other:
                        other.execute("set transaction isolation level repeatable read")
                        other.execute("select count(*) from datasets").fetchone()
                        end = time.monotonic() + held
                        w, c, b, k = statements(
                            conn, pid, app, None, args.pause, base, until=lambda: time.monotonic() >= end
                        )
                        other.rollback()
                elif config != "quiet":
                    seconds = (
                        3600
                        if config.startswith("resync")
                        else held
                        if config == "burn"
                        else args.statements * (args.pause + 0.01) + 60
                    )
                    share = (
                        {"LAKEHOUSE_REVERSE_RESYNC_SHARE": str(args.resync_share)} if config == "resync-share" else {}
                    )
                    proc = subprocess.Popen(
                        [sys.executable, "-c", WORKER, config, str(native), str(seconds)],
                        env={**env, **share},
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
                    time.sleep(1)
                if config == "held":
                    pass
                elif config.startswith("resync") or config == "burn":
                    assert proc is not None
                    w, c, b, k = statements(
                        conn, pid, app, None, args.pause, base, until=lambda: proc.poll() is not None
                    )
                else:
                    w, c, b, k = statements(conn, pid, app, args.statements, args.pause, base)
                base += k + 3
                if proc is not None:
                    if not (config.startswith("resync") or config == "burn"):
                        proc.terminate()
                    out, _ = proc.communicate(timeout=600)
                    if out.strip():
                        work[config].append(json.loads(out.strip().splitlines()[-1]))
                        if config == "resync":
                            held = work[config][-1]["apply_s"]
                wall[config] += w
                cpu[config] += c
                wrote[config] += b
                fpi[config] += conn.execute(FPI).fetchone()[0] - fpi0
                print(f"round {r} {config}: {k} statements, p50 {statistics.median(w) * 1000:.2f} ms", file=sys.stderr)
    print(
        f"one-row statements on another dataset ({args.app_rows} rows), {args.pause * 1000:.0f} ms apart, "
        f"{args.rounds} round(s) per configuration; the reverse on a {args.rows}-row dataset"
    )
    print(
        "| configuration | statements | wall p50 / p99 | backend CPU p50 / p99 | backend wrote p50 / p99"
        " | WAL full-page images | wall p50, p99 over quiet |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    out: dict = {"rows": args.rows, "app_rows": args.app_rows}
    q50, q99 = statistics.median(wall["quiet"]), pct(wall["quiet"], 0.99)
    for c in configs:
        w50, w99 = statistics.median(wall[c]), pct(wall[c], 0.99)
        c50, c99 = (statistics.median(cpu[c]), pct(cpu[c], 0.99)) if cpu[c] else (float("nan"), float("nan"))
        b50, b99 = (statistics.median(wrote[c]), pct(wrote[c], 0.99)) if wrote[c] else (0, 0)
        print(
            f"| {c} | {len(wall[c])} | {w50 * 1000:.2f} / {w99 * 1000:.2f} ms | {c50 * 1000:.3f} / {c99 * 1000:.3f} ms"
            f" | {b50 / 1024:.1f} / {b99 / 1024:.1f} KiB | {fpi[c]} | {w50 / q50:.2f}×, {w99 / q99:.2f}× |"
        )
        out[c] = {
            "n": len(wall[c]),
            "wall_p50_ms": round(w50 * 1000, 3),
            "wall_p99_ms": round(w99 * 1000, 3),
            "cpu_p50_ms": round(c50 * 1000, 4),
            "cpu_p99_ms": round(c99 * 1000, 4),
            "wrote_p50_kib": round(b50 / 1024, 1),
            "wrote_p99_kib": round(b99 / 1024, 1),
            "wal_fpi": fpi[c],
            "p50_over_quiet": round(w50 / q50, 2),
            "p99_over_quiet": round(w99 / q99, 2),
            "work": work[c],
        }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
