"""Parity that costs what changed: the canary on maintained digests against one full Postgres digest,
measured in the same run.

    nice .venv/bin/python bench/bench_parity_incremental.py [--rows 2000000] [--repeat 2]

On a demo-shaped dataset (bench/_common.py) mirrored by the real mirror, prints (files are digested at
write time with LAKEHOUSE_DIGEST_ON_WRITE=true, else by the first canary that meets them):
  baseline        one full Postgres digest of the dataset (the canary's SQL before maintained digests)
  first canary    registers the dataset's Postgres digest and fills it, digests the files (once)
  unchanged       the canary on the caught-up dataset, nothing changed since     (target ≤ 0.1 ×)
  after append    1,000 rows appended and mirrored incrementally, then the canary (target ≤ 0.1 ×)
  localise        one row changed under session_replication_role = replica (no version bump): the
                  maintained canary finds it                                    (target ≤ 2 ×)
  localise, full  one row changed with the triggers disabled: the maintained canary cannot see it, the
                  full cross-check (canary --full) finds it                      (target ≤ 2 ×)
  full canary     the cross-check on the unchanged dataset (for reference)
Each ratio is against the baseline's best time. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import GENERATE, admin_dsn, fresh_database, make_dataset  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)

    from psycopg import sql

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity import canary as canary_checks
    from lakehouse_dagster.parity.digest import PgSide, PinnedPostgres, plain_digest

    n = args.rows
    admin = admin_dsn()
    name = "lakehouse_bench_parity_inc"
    dsn = fresh_database(admin, name)
    root = Path(tempfile.mkdtemp(prefix="lh-bench-parity-inc-"))
    (root / "warehouse").mkdir()
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        catalog={"warehouse": (root / "warehouse").as_uri(), "namespace": "bench_parity_inc"},
        project={"home": root},
    )
    catalog = load_catalog(settings, dsn)
    print(f"rows: {n:,}  (machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})", flush=True)
    ds_id, gen_s = make_dataset(dsn, n)
    print(f"generated in Postgres: {gen_s:.1f} s", flush=True)
    t = time.perf_counter()
    r = sync_dataset(dsn, catalog, settings, ds_id, mode="full")
    print(f"mirrored: {time.perf_counter() - t:.1f} s, {r.files} file(s)", flush=True)

    def pg_full() -> float:
        with PinnedPostgres(dsn) as pg:
            side = PgSide(pg.conn, ds_id, pg.state(ds_id).columns)
            t0 = time.perf_counter()
            plain_digest(side)
            return time.perf_counter() - t0

    def canary(**kw):
        t0 = time.perf_counter()
        v = canary_checks.evaluate(dsn, catalog, settings, ds_id, **kw)
        return time.perf_counter() - t0, v

    base = min(pg_full() for _ in range(args.repeat))
    print(f"baseline: one full Postgres digest {base:.2f} s", flush=True)
    first_s, first = canary()
    print(
        f"first canary (registers + fills the Postgres digest): {first_s:.2f} s → {first.verdict}, "
        f"{first.detail.get('digest')}, prepare {first.detail.get('maintained_prepare')}",
        flush=True,
    )

    rows = []

    def measure(label: str, target: float | None, check, **kw):
        best, last = None, None
        for _ in range(args.repeat):
            s, v = canary(**kw)
            best = s if best is None else min(best, s)
            last = v
        ok = check(last)
        rows.append((label, best, best / base, target, last, ok))
        print(
            f"{label:48s} {best:7.3f} s  {best / base:6.3f} × baseline"
            + (f"  (target ≤ {target})" if target else "")
            + f"  → {last.verdict} [{last.detail.get('digest')}] {last.mismatched_row_indexes[:5]}"
            + ("" if ok else "  UNEXPECTED"),
            flush=True,
        )
        return last

    measure("canary, unchanged", 0.1, lambda v: v.verdict == canary_checks.OK and v.detail["digest"] == "maintained")

    with connect(dsn) as conn:
        conn.execute(GENERATE, {"ds": ds_id, "lo": n, "hi": n + 999})
    t = time.perf_counter()
    r = sync_dataset(dsn, catalog, settings, ds_id)
    print(f"1,000 rows appended; mirror {r.mode}: {time.perf_counter() - t:.2f} s", flush=True)
    measure(
        "canary after a 1,000-row append",
        0.1,
        lambda v: (
            v.verdict == canary_checks.OK
            and v.detail["digest"] == "maintained"
            and v.detail["maintained_prepare"]["iceberg_files_digested"] <= 1
        ),
    )
    measure(
        "full cross-check (canary --full), unchanged",
        None,
        lambda v: v.verdict == canary_checks.OK and v.detail.get("maintained_agrees") is True,
        full=True,
    )

    rng = random.Random(11)
    changed = rng.randrange(n)
    with connect(dsn) as conn, conn.transaction():
        conn.execute("set local session_replication_role = replica")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{qty}', '-1') where dataset_id = %s and row_index = %s",
            (ds_id, changed),
        )
    measure(
        "localise 1 row (replica-role write), maintained",
        2.0,
        lambda v: v.verdict == canary_checks.MISMATCH and v.mismatched_row_indexes == [changed],
    )
    with connect(dsn) as conn, conn.transaction():  # put it back the same way
        conn.execute("set local session_replication_role = replica")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{qty}', to_jsonb(%s::bigint * 7 - 1000000))"
            " where dataset_id = %s and row_index = %s",
            (changed, ds_id, changed),
        )
    changed2 = rng.randrange(n)
    with connect(dsn) as conn, conn.transaction():
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{qty}', '-1') where dataset_id = %s and row_index = %s",
            (ds_id, changed2),
        )
        conn.execute("alter table dataset_rows enable trigger user")
    hidden_s, hidden = canary()
    print(
        f"{'(triggers disabled) maintained canary':48s} {hidden_s:7.3f} s  → {hidden.verdict}: the maintained "
        "sum cannot see it",
        flush=True,
    )
    # one run only: the full canary drops the stale Postgres sums it finds
    rows_before = args.repeat
    args.repeat = 1
    measure(
        "localise 1 row (triggers disabled), full",
        2.0,
        lambda v: v.verdict == canary_checks.MISMATCH and v.mismatched_row_indexes == [changed2],
        full=True,
    )
    args.repeat = rows_before

    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
    shutil.rmtree(root, ignore_errors=True)
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
