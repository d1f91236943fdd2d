"""Benchmark (not a test): adopting a live database of 10,000 datasets, and the poller over it.

    nice .venv/bin/python bench/bench_adopt.py [--datasets 10000] [--rows 5] [--empty-every 10]
                                               [--sample 300] [--caps 25,500] [--changed 100]

A throwaway embedded Postgres (deleted on exit; or LAKEHOUSE_PG_DSN as admin) gets a database holding only
the app's tables in the foundation shape (no lakehouse column, default or trigger) with N datasets of a few
rows each (every ``--empty-every``-th empty). Then, each figure next to a baseline measured in the same run:

1. ``migrate`` (DDL + the batched change-tracking fill), and the fill alone again from an unfilled state,
   against one UPDATE touching every datasets row;
2. real ``mirror_poller`` ticks (``dg.build_sensor_context`` on an ephemeral instance, partitions added as
   the sensor asks) until every dataset has been requested, for each cap in ``--caps``
   (LAKEHOUSE_SENSOR_MAX_REQUESTS);
3. ``sync_dataset`` on a sample of datasets (first syncs: each creates its table), extrapolated to N;
4. with every dataset caught up (the sample really synced; the rest recorded as synced in the log, which
   is all the poller reads), the tick with ``--changed`` datasets changed, against an idle tick, and the
   sweep's behind query against the same question asked without mirrored_version (latest succeeded sync
   per dataset, over every dataset).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402
import psycopg  # noqa: E402

from bench._common import admin_dsn  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.settings import Settings  # noqa: E402
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller, requested_datasets  # noqa: E402
from lakehouse_dagster.dagster.defs.resources import LakehouseResource  # noqa: E402
from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions  # noqa: E402
from lakehouse_dagster.lake.catalog import load_catalog  # noqa: E402
from lakehouse_dagster.mirror.poller import _BEHIND  # noqa: E402
from lakehouse_dagster.mirror.sync import sync_dataset  # noqa: E402
from lakehouse_dagster.schema.migrate import FILL_MARK, fill_change_tracking, migrate  # noqa: E402
from lakehouse_dagster.testing.foundation import APP_INSERT_ROW, FOUNDATION_SQL  # noqa: E402
from lakehouse_dagster.testing.pg import with_db  # noqa: E402

SCHEMA = '[{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]'

SEED = """
insert into workspaces (id, name) values (%(ws)s, 'live');
insert into datasets (id, workspace_id, name, kind, schema, row_count, status)
select gen_random_uuid(), %(ws)s, 'd' || g, 'tabular', %(schema)s::jsonb,
       case when g %% %(empty_every)s = 0 then 0 else %(rows)s end, 'ready'
  from generate_series(1, %(n)s) g;
insert into dataset_rows (dataset_id, row_index, row_id, created_at, data)
select d.id, r, gen_random_uuid(), now(), jsonb_build_object('n', r, 's', 'v' || r)
  from datasets d cross join generate_series(0, %(rows)s - 1) r
 where d.row_count > 0;
"""

# The poller's question without mirrored_version: every dataset's latest succeeded sync, compared.
BEHIND_WITHOUT_COLUMN = """
select d.id from datasets d left join lateral lakehouse_latest_succeeded_sync(d.id) s on true
 where d.kind = 'tabular' and coalesce(s.source_version, -1) < d.rows_version
"""
BEHIND_WITH_INDEX = _BEHIND  # the poller's own sweep query


def _best(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _tick(instance, dsn, cursor):
    ctx = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}
    )
    t = time.perf_counter()
    res = mirror_poller(ctx)
    dt = time.perf_counter() - t
    for req in res.dynamic_partitions_requests:  # what the daemon does with the sensor's result
        instance.add_dynamic_partitions(datasets_partitions.name, list(req.partition_keys))
    return res, dt


def ticks_until_all_requested(dsn: str, n: int, cap: int) -> tuple[int, list[float]]:
    os.environ["LAKEHOUSE_SENSOR_MAX_REQUESTS"] = str(cap)
    with connect(dsn) as conn:
        conn.execute("truncate lakehouse_mirror_requests")
    seen: set[str] = set()
    times: list[float] = []
    cursor = None
    with dg.DagsterInstance.ephemeral() as instance:
        while len(seen) < n and len(times) < 4 * n // cap + 10:
            res, dt = _tick(instance, dsn, cursor)
            times.append(dt)
            cursor = res.cursor
            seen |= set(requested_datasets(res.run_requests))
    assert len(seen) == n, f"only {len(seen)} of {n} requested after {len(times)} ticks"
    return len(times), times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--empty-every", type=int, default=10)
    ap.add_argument("--sample", type=int, default=300)
    ap.add_argument("--caps", default="25,500")
    ap.add_argument("--changed", type=int, default=100)
    args = ap.parse_args()
    n = args.datasets

    admin = admin_dsn()
    name = f"bench_adopt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    dsn = with_db(admin, name)
    home = Path(tempfile.mkdtemp(prefix="lh-bench-adopt-"))
    (home / "warehouse").mkdir()
    os.environ.update(
        {
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(home / "home"),
            "LAKEHOUSE_WAREHOUSE": (home / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "lakehouse",
            "LAKEHOUSE_ACTOR": "bench",
        }
    )
    try:
        with connect(dsn) as conn:
            conn.execute(FOUNDATION_SQL)
            t = time.perf_counter()
            params = {"ws": uuid.uuid4(), "schema": SCHEMA, "n": n, "rows": args.rows, "empty_every": args.empty_every}
            for statement in SEED.strip().split(";\n"):
                conn.execute(statement, params)
            conn.execute("vacuum analyze")
            seeded = time.perf_counter() - t
            total_rows = conn.execute("select count(*) from dataset_rows").fetchone()[0]
            print(
                f"foundation-shape tables: {n:,} datasets, {total_rows:,} rows "
                f"(every {args.empty_every}th empty), seeded in {seeded:.2f} s"
            )

            # 1. migrate + fill
            baseline = _best(lambda: conn.execute("update datasets set status = status"), 3)
            t = time.perf_counter()
            applied = migrate(conn)
            t_migrate = time.perf_counter() - t
            assert any(a.startswith(FILL_MARK) for a in applied), applied
            conn.execute(
                "update datasets set max_row_index = null, rows_xid = null, rows_version = 0, rows_rewrite_version = 0"
            )
            conn.execute("delete from lakehouse_migrations where name = %s", (FILL_MARK,))
            t = time.perf_counter()
            filled = fill_change_tracking(conn)
            t_fill = time.perf_counter() - t
            conn.execute("vacuum analyze datasets")
            print(
                f"migrate (DDL + fill): {t_migrate:.2f} s; the fill alone: {t_fill:.2f} s for {filled:,} datasets"
                f" ({t_fill / n * 1e6:.0f} µs each) = {t_fill / baseline:.1f}× one UPDATE of every datasets row"
                f" ({baseline * 1000:.0f} ms, baseline)"
            )

        # 2. ticks until every dataset is requested
        for cap in [int(c) for c in args.caps.split(",")]:
            ticks, times = ticks_until_all_requested(dsn, n, cap)
            print(
                f"cap {cap} runs: {ticks} ticks until all {n:,} requested; per tick median {statistics.median(times) * 1000:.0f} ms,"
                f" max {max(times) * 1000:.0f} ms, total {sum(times):.1f} s; at the sensor's 5 s interval"
                f" that is {ticks * 5 + sum(times):.0f} s of wall time"
            )

        # 3. mirror a sample, extrapolate
        settings = Settings.from_env()
        catalog = load_catalog(settings, dsn)
        with connect(dsn) as conn:
            sample = [
                r[0] for r in conn.execute("select id from datasets order by id limit %s", (args.sample,)).fetchall()
            ]
        t = time.perf_counter()
        per = []
        for d in sample:
            t1 = time.perf_counter()
            sync_dataset(dsn, catalog, settings, d)
            per.append(time.perf_counter() - t1)
        t_sync = time.perf_counter() - t
        print(
            f"mirror: {len(sample)} first syncs (sync_dataset, sequential) in {t_sync:.1f} s, median "
            f"{statistics.median(per) * 1000:.0f} ms each; extrapolated to {n:,}: {t_sync / len(sample) * n / 60:.0f} min"
            f" on one process (a sample, not measured end to end)"
        )

        # 4. the steady state: everything caught up, then --changed datasets change
        with connect(dsn) as conn:
            conn.execute("""insert into iceberg_sync_log (dataset_id, sync_id, status, source_version, finished_at)
                            select d.id, gen_random_uuid(), 'succeeded', d.rows_version, now() from datasets d
                             where coalesce(d.mirrored_version, -1) < d.rows_version""")
            conn.execute("vacuum analyze")
            assert conn.execute(BEHIND_WITH_INDEX).fetchall() == []
            os.environ["LAKEHOUSE_SENSOR_MAX_REQUESTS"] = str(max(args.changed, 25))
            with dg.DagsterInstance.ephemeral() as instance:
                res, _ = _tick(instance, dsn, None)
                cursor = res.cursor
                idle = [_tick(instance, dsn, cursor)[1] for _ in range(5)]
                changed = [
                    r[0]
                    for r in conn.execute(
                        "select id from datasets order by random() limit %s", (args.changed,)
                    ).fetchall()
                ]
                for d in changed:
                    conn.execute(APP_INSERT_ROW, (d, 1000, psycopg.types.json.Jsonb({"n": 1})))
                res, t_changed = _tick(instance, dsn, cursor)
                assert sorted(requested_datasets(res.run_requests)) == sorted(map(str, changed))
            q_idx = _best(lambda: conn.execute(BEHIND_WITH_INDEX).fetchall())
            q_scan = _best(lambda: conn.execute(BEHIND_WITHOUT_COLUMN).fetchall())
            plan = " ".join(r[0] for r in conn.execute("explain " + BEHIND_WITH_INDEX))
            uses = "uses datasets_mirror_behind_idx" if "datasets_mirror_behind_idx" in plan else "NO INDEX: " + plan
            print(
                f"tick with {args.changed} of {n:,} changed: {t_changed * 1000:.0f} ms vs idle tick "
                f"{min(idle) * 1000:.0f} ms (baseline) = {t_changed / min(idle):.1f}×"
            )
            print(
                f"the sweep's behind query ({uses}), {args.changed} behind: {q_idx * 1000:.2f} ms vs "
                f"{q_scan * 1000:.1f} ms for latest-succeeded-sync per dataset (baseline) = {q_idx / q_scan:.3f}×"
            )
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
