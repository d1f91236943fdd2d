"""row.edit partial rewrites: the sync after a small update/delete, partial against full, in the same run.

    nice .venv/bin/python bench/bench_row_edit.py [--rows 2000000] [--chunk 250000]

Two identical demo-shaped datasets (bench/_common.py make_dataset) of --rows rows, each mirrored once
(full, files of --chunk rows). Every edit is applied to both, in one statement each; then dataset A is
synced the way the mirror does (auto: a partial rewrite when the changed rows sit in at most
LAKEHOUSE_PARTIAL_MAX_FRACTION of the table's rows, else full) and dataset B with mode=full, the old
behaviour. Both stay identical, so each edit compares the same work. Prints per edit the mode auto chose,
the files it replaced, both times and auto / full. At the end the canary (full digest) checks A is ok.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BENCH_SCHEMA, admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--chunk", type=int, default=250_000, help="LAKEHOUSE_INGEST_CHUNK_ROWS (rows per data file)")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)

    from psycopg import sql

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.lake.catalog import table_identifier
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity import canary
    from lakehouse_dagster.tracking import datasets

    n = args.rows
    rnd = random.Random(args.seed)
    admin = admin_dsn()
    name = "lakehouse_bench_row_edit"
    dsn = fresh_database(admin, name)
    settings, catalog = mirror_settings(dsn, "bench_row_edit", sync={"chunk_rows": args.chunk})
    print(
        f"rows: {n:,} per dataset, {args.chunk:,} rows per file; partial when ≤ "
        f"{settings.sync.partial_max_fraction:.0%} of the rows are in touched files "
        f"(machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})",
        flush=True,
    )
    a, gen_s = make_dataset(dsn, n, "a")
    with connect(dsn) as conn:  # B: a copy of A (faster than generating it again)
        t = time.perf_counter()
        b = datasets.create_dataset(
            conn, conn.execute("select workspace_id from datasets where id = %s", (a,)).fetchone()[0], "b", BENCH_SCHEMA
        )
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)"
            " select %s, row_index, row_id, created_at, data from dataset_rows where dataset_id = %s",
            (b, a),
        )
        conn.execute("vacuum analyze dataset_rows")
        gen_s += time.perf_counter() - t
    print(f"generated in Postgres: {gen_s:.1f} s", flush=True)
    for d in (a, b):
        t = time.perf_counter()
        r = sync_dataset(dsn, catalog, settings, d, mode="full")
        print(f"mirrored {'A' if d == a else 'B'}: {time.perf_counter() - t:.1f} s, {r.files} file(s)", flush=True)

    upd = (
        "update dataset_rows set data = data || jsonb_build_object('qty', -1)"
        " where dataset_id = %s and row_index = any(%s)"
    )
    dele = "delete from dataset_rows where dataset_id = %s and row_index = any(%s)"
    start = rnd.randrange(n - 10)
    start2 = rnd.randrange(n - 10)
    edits = [
        ("update 10 rows (one block)", upd, list(range(start, start + 10))),
        ("delete 10 rows (one block)", dele, list(range(start2, start2 + 10))),
        ("update 10 rows (spread)", upd, rnd.sample(range(n), 10)),
        ("update 1% (spread)", upd, rnd.sample(range(n), n // 100)),
    ]
    print(f"\n{'edit':28s} {'auto mode':>9s} {'files':>9s} {'auto':>8s} {'full':>8s}  auto/full", flush=True)
    with connect(dsn) as conn:
        for label, stmt, indexes in edits:
            for d in (a, b):
                conn.execute(stmt, (d, indexes))
            t = time.perf_counter()
            ra = sync_dataset(dsn, catalog, settings, a)
            auto_s = time.perf_counter() - t
            t = time.perf_counter()
            sync_dataset(dsn, catalog, settings, b, mode="full")
            full_s = time.perf_counter() - t
            snap = catalog.load_table(table_identifier(settings, a)).current_snapshot().summary
            files = f"-{snap.get('deleted-data-files', '0')}+{snap.get('added-data-files', '0')}"
            print(
                f"{label:28s} {ra.mode:>9s} {files:>9s} {auto_s:7.2f}s {full_s:7.2f}s  {auto_s / full_s:8.3f}×",
                flush=True,
            )
    v = canary.evaluate(dsn, catalog, settings, a, full=True)
    print(f"\ncanary (full digest) on A after every edit: {v.verdict}", flush=True)
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    return 0 if v.verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
