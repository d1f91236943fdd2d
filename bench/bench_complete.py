"""`lakehouse complete` (runbooks/complete/, issue 31) of a large dataset while the live app writes
another one: rows deleted per second, and how long any of the app's statements waited on a lock meanwhile.

    nice .venv/bin/python bench/bench_complete.py [--rows 1000000] [--batch-rows 10000]

Set-up: a demo-shaped dataset of --rows rows (bench/_common.py), mirrored, read-flipped, canary ok, sync.append set to
iceberg_native, a native append of 10 rows applied by the reverse mirror and a canary verdict at that snapshot (what
complete asks; the soak set to 0), and a second, small dataset of the same schema registered for the maintained
digest (the live app's).

Measured in the same run:
  app alone  the live app's one-row statements (INSERT, UPDATE, DELETE, each its own transaction, as
             bench/bench_app_writes.py's) on the second dataset for --baseline-seconds: per-statement p50 / max
  complete   ``complete`` of the large dataset (batches of --batch-rows rows, each its own transaction): rows
             deleted per second over the delete phase (the checks and the start excluded, as reported by the mark)
             and in total; meanwhile the same app statements in a loop on the second dataset, and a sampler
             (every 2 ms) of pg_stat_activity for the app's backend: the longest time it was seen waiting on a
             lock (wait_event_type Lock or LWLock), and the app's per-statement p50 / p99 / max against app alone.

Prints one JSON line. Target (issue 31): the longest lock wait of a live-app statement ≤ 100 ms. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("LAKEHOUSE_SOAK_SECONDS", "0")  # complete's soak: the bench completes at once

from bench._common import BENCH_SCHEMA, admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402
from bench.bench_reverse import _fresh, native_write  # noqa: E402

ROW = '{"name": "item-x", "label": "live", "qty": 42, "bucket": 7, "price": 1.25, "active": true}'


def completable(dsn: str, settings, catalog, rows: int):
    import datetime as dt

    import pyarrow as pa

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.registry import SERVABLE_READERS
    from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
    from lakehouse_dagster.mirror.reverse import apply_reverse
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity.maintained import ensure_pg
    from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary
    from lakehouse_dagster.tracking import datasets

    d, _ = make_dataset(dsn, rows)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    with connect(dsn) as conn:
        for reader in SERVABLE_READERS:
            set_override(conn, "read", reader.name, "iceberg", dataset=d, actor="bench")
        assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]
        set_override(conn, "write", "sync.append", "iceberg_native", dataset=d, actor="bench")
    apply_reverse(dsn, catalog, settings, d, actor="bench")
    table = load_table_or_none(catalog, table_identifier(settings, d))
    template = pa.Table.from_batches(list(table.scan(limit=10).to_arrow_batch_reader())).combine_chunks()
    native_write(
        dsn,
        settings,
        catalog,
        d,
        "sync.append",
        [_fresh(template.to_batches()[0], rows, dt.datetime.now(dt.UTC))],
        rows + 9,
    )
    r = apply_reverse(dsn, catalog, settings, d, actor="bench")
    assert r.how == "append" and r.pg_rows == rows + 10, r
    with connect(dsn) as conn:
        verdicts = [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results]
        assert verdicts == ["native"], verdicts
        ws = datasets.create_workspace(conn, "live")
        live = datasets.create_dataset(conn, ws, "live", BENCH_SCHEMA)
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, data) select %s, g, %s::jsonb"
            " from generate_series(0, 9999) g",
            (live, ROW),
        )
        ensure_pg(conn, live, datasets.get_dataset(conn, live).columns)
        conn.execute("vacuum analyze dataset_rows")
    return d, live


class App(threading.Thread):
    """The live app: INSERT, UPDATE, DELETE of one row on its dataset, each its own transaction, in a loop."""

    def __init__(self, dsn: str, live, base: int) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.live, self.i = live, base
        self.stop = threading.Event()
        self.lat: list[float] = []

    def run(self) -> None:
        c, d = self.conn, self.live
        while not self.stop.is_set():
            i = self.i
            for stmt, args in (
                ("insert into dataset_rows (dataset_id, row_index, data) values (%s, %s, %s::jsonb)", (d, i, ROW)),
                (
                    "update dataset_rows set data = data || jsonb_build_object('qty', row_index)"
                    " where dataset_id = %s and row_index = %s",
                    (d, i - 5000),
                ),
                ("delete from dataset_rows where dataset_id = %s and row_index = %s", (d, i - 10000)),
            ):
                t = time.perf_counter()
                c.execute(stmt, args)
                self.lat.append(time.perf_counter() - t)
            self.i += 1
            time.sleep(0.002)


class Sampler(threading.Thread):
    """pg_stat_activity every 2 ms: the longest the app's backend was seen waiting on a (LW)lock in one statement."""

    def __init__(self, dsn: str, pid: int) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.pid = pid
        self.stop = threading.Event()
        self.max_wait = {"Lock": 0.0, "LWLock": 0.0}
        self.events: dict[str, int] = {}

    def run(self) -> None:
        started: dict[tuple, float] = {}
        while not self.stop.is_set():
            r = self.conn.execute(
                "select wait_event_type, wait_event, query_start from pg_stat_activity where pid = %s", (self.pid,)
            ).fetchone()
            now = time.perf_counter()
            if r and r[0] in self.max_wait:
                key = (r[0], r[2])  # one wait per statement start
                since = started.setdefault(key, now)
                self.max_wait[r[0]] = max(self.max_wait[r[0]], now - since)
                self.events[f"{r[0]}:{r[1]}"] = self.events.get(f"{r[0]}:{r[1]}", 0) + 1
            else:
                started.clear()
            time.sleep(0.002)


def _stats(lat: list[float]) -> dict:
    q = statistics.quantiles(lat, n=100)
    return {
        "statements": len(lat),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(max(lat) * 1000, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=None, help="LAKEHOUSE_COMPLETE_BATCH_ROWS (default: settings)")
    ap.add_argument("--baseline-seconds", type=float, default=10.0)
    args = ap.parse_args()
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.runbooks.complete import complete

    dsn = fresh_database(admin_dsn(), "bench_complete")
    settings, catalog = mirror_settings(dsn, "bench_complete")
    d, live = completable(dsn, settings, catalog, args.rows)

    app = App(dsn, live, 10_000)
    sampler = Sampler(dsn, app.pid)
    app.start()
    sampler.start()
    time.sleep(args.baseline_seconds)
    alone = list(app.lat)
    alone_lock = dict(sampler.max_wait)
    app.lat.clear()
    sampler.max_wait = {"Lock": 0.0, "LWLock": 0.0}
    sampler.events = {}

    t = time.perf_counter()
    r = complete(dsn, catalog, settings, d, actor="bench", batch_rows=args.batch_rows)
    seconds = time.perf_counter() - t
    during = list(app.lat)
    app.stop.set()
    sampler.stop.set()
    app.join()
    sampler.join()
    assert r.status == "complete" and r.rows_deleted == args.rows + 10, r
    with connect(dsn) as conn:
        row = conn.execute(
            "select min(at), max(at) from lakehouse_complete_audit where dataset_id = %s and event = 'batch'", (d,)
        ).fetchone()
    delete_s = (row[1] - row[0]).total_seconds() if row and row[0] else seconds
    print(
        json.dumps(
            {
                "rows": r.rows_deleted,
                "batches": r.batches,
                "batch_rows": args.batch_rows or settings.complete.batch_rows,
                "complete_s": round(seconds, 2),
                "rows_s": round(r.rows_deleted / seconds),
                "delete_phase_s": round(delete_s, 2),
                "delete_phase_rows_s": round(r.rows_deleted / delete_s) if delete_s else None,
                "app_alone": {**_stats(alone), "max_lock_wait_ms": round(alone_lock["Lock"] * 1000, 1)},
                "app_during": {
                    **_stats(during),
                    "max_lock_wait_ms": round(sampler.max_wait["Lock"] * 1000, 1),
                    "max_lwlock_wait_ms": round(sampler.max_wait["LWLock"] * 1000, 1),
                    "wait_events_seen": sampler.events,
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
