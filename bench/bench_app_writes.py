"""What the live app pays for its writes: INSERT / UPDATE / DELETE on dataset_rows with change tracking
and the maintained parity digest (migration 015) beside the same statements without them.

    nice .venv/bin/python bench/bench_app_writes.py [--rows 100000] [--statements 200] [--rounds 3]

A demo-shaped dataset (bench/_common.py) of --rows rows, registered for the maintained digest. Each
statement is its own transaction (autocommit), as the app's writes are. Three configurations, measured in
the same run, alternating round by round (the best round of each is kept):
  bare       every lakehouse trigger disabled (the app's table as it was: primary key and foreign key only)
  tracking   change tracking only (the digest triggers disabled)
  digest     change tracking + the maintained digest (what ships)
synchronous_commit is off in the bench session (the WAL flush per commit is the same in all three).
Prints per statement kind the time per statement and digest / bare (target ≤ 1.3 ×), digest / tracking.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402

ROW = {"name": "item-x", "label": "ünïcode ✓ 日本", "qty": 42, "bucket": 7, "price": 1.25, "ratio": 0.5,
       "active": True, "seen_at": "2024-05-01T10:00:00.123456+02:00", "day": "2024-05-01",
       "attrs": {"a": 1, "tags": ["x", 2, None], "nested": {"k": 0, "ü": "v"}}}
DIGEST_TRIGGERS = ("lakehouse_rows_ins_digest", "lakehouse_rows_upd_digest", "lakehouse_rows_del_digest",
                   "lakehouse_rows_trunc_digest")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--statements", type=int, default=200, help="statements per kind per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)

    from psycopg import sql
    from psycopg.types.json import Jsonb

    from lakehouse_dagster.parity import maintained as mt
    from lakehouse_dagster.store.datasets import get_dataset
    from lakehouse_dagster.store.db import connect

    admin = admin_dsn()
    name = "lakehouse_bench_app_writes"
    dsn = fresh_database(admin, name)
    ds_id, _ = make_dataset(dsn, args.rows)
    conn = connect(dsn)
    # Commit latency (a WAL flush per statement) is the same for all three and only adds noise on a shared
    # machine: the triggers' cost is CPU inside the statement.
    conn.execute("set synchronous_commit = off")
    print(f"rows: {args.rows:,}; {args.statements} statements per kind per round, {args.rounds} rounds "
          f"(machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})", flush=True)
    print("registered + filled:", mt.ensure_pg(conn, ds_id, get_dataset(conn, ds_id).columns), flush=True)

    def configure(cfg: str) -> None:
        with conn.transaction():
            conn.execute("alter table dataset_rows enable trigger user")
            for t in DIGEST_TRIGGERS:  # the digest triggers are ENABLE ALWAYS (migration 015)
                conn.execute(sql.SQL("alter table dataset_rows enable always trigger {}").format(sql.Identifier(t)))
            if cfg == "bare":
                conn.execute("alter table dataset_rows disable trigger user")
            elif cfg == "tracking":
                for t in DIGEST_TRIGGERS:
                    conn.execute(sql.SQL("alter table dataset_rows disable trigger {}").format(sql.Identifier(t)))

    row = Jsonb(ROW)
    k = args.statements
    next_index = {"v": args.rows + 1_000_000}

    def workloads():
        """(kind, [statement params...]); each runs on rows it created itself, leaving the dataset as it was."""
        base = next_index["v"]
        next_index["v"] += 1_000_000
        singles = [base + i for i in range(k)]
        batches = [[base + 100_000 + i * 100 + j for j in range(100)] for i in range(k // 10)]
        ins = "insert into dataset_rows (dataset_id, row_index, data) select %s, i, %s from unnest(%s::bigint[]) i"
        upd = ("update dataset_rows set data = data || jsonb_build_object('qty', row_index %% 1000)"
               " where dataset_id = %s and row_index = any(%s::bigint[])")
        dele = "delete from dataset_rows where dataset_id = %s and row_index = any(%s::bigint[])"
        return [
            ("INSERT 1 row", ins, [(ds_id, row, [i]) for i in singles]),
            ("INSERT 100 rows", ins, [(ds_id, row, b) for b in batches]),
            ("UPDATE 1 row", upd, [(ds_id, [i]) for i in singles]),
            ("UPDATE 100 rows", upd, [(ds_id, b) for b in batches]),
            ("DELETE 1 row", dele, [(ds_id, [i]) for i in singles]),
            ("DELETE 100 rows", dele, [(ds_id, b) for b in batches]),
        ]

    configs = ("bare", "tracking", "digest")
    best: dict[tuple[str, str], float] = {}
    for rnd in range(args.rounds):
        for cfg in (configs if rnd % 2 == 0 else configs[::-1]):
            configure(cfg)
            for kind, stmt, params in workloads():
                t = time.perf_counter()
                for p in params:
                    conn.execute(stmt, p)
                per = (time.perf_counter() - t) / len(params)
                best[(cfg, kind)] = min(best.get((cfg, kind), per), per)
    configure("digest")
    with connect(dsn) as c:  # the shipped configuration kept the sums right all along
        from lakehouse_dagster_tests.test_parity_incremental import pg_maintained, pg_reference

        agree = pg_maintained(dsn, ds_id) == pg_reference(dsn, ds_id)
        deltas = c.execute("select count(*) from lakehouse_pg_digest_deltas where dataset_id = %s", (ds_id,)).fetchone()[0]

    kinds = [w[0] for w in workloads()]
    print(f"\n{'statement':18s} {'bare':>10s} {'tracking':>10s} {'digest':>10s}   digest/bare  tracking/bare  digest/tracking")
    worst = 0.0
    for kind in kinds:
        b, tr, dg_ = (best[(c, kind)] * 1000 for c in configs)
        worst = max(worst, dg_ / b)
        print(f"{kind:18s} {b:8.3f}ms {tr:8.3f}ms {dg_:8.3f}ms   {dg_ / b:9.2f}×  {tr / b:12.2f}×  {dg_ / tr:14.2f}×")
    print(f"\nworst digest/bare: {worst:.2f}× (target ≤ 1.3×); maintained sums equal a full digest: {agree}; "
          f"{deltas} delta rows before compaction")
    conn.close()
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
