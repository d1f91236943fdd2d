"""Backfill throughput and memory (`lakehouse backfill`), against baselines in the same run.

    .venv/bin/python bench/bench_backfill.py [--rows 1000000] [--scale 250000] [--appended 10000]

Set-up per size: a demo-shaped dataset of N rows in Postgres, mirrored, then rewritten natively (a
native sync.full of the same N rows through the write router), and the writer rolled back to pg: the
worst case for a backfill (every Postgres row is superseded, every Iceberg row copied back). With
--appended M, M rows are appended natively above the N instead (sync.append): the common case, where
only the files those snapshots added are copied (then backfill/limit compares with moving all N+M rows).
Prints, for the same rows, each in a fresh child process (its peak RSS is its own):
  backfill  the project's backfill (pyiceberg batch reader → ADBC binary COPY into a temp table →
            delete the stale rows + insert the typed rows as jsonb, one transaction)
  limit     the transport alone: the same batch reader → ADBC COPY into a temp table, nothing else
  mirror    the opposite direction for scale: sync_dataset full of the same N rows
and the ratios backfill/limit and backfill/mirror (rows/s). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _settings(dsn: str, warehouse: str):
    from lakehouse_dagster.core.settings import Settings

    return Settings.from_env().replace(
        postgres={"dsn": dsn}, catalog={"warehouse": warehouse, "namespace": "bench_backfill"}
    )


def child(kind: str, dsn: str, ds_id: str, warehouse: str) -> dict:
    from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier

    settings = _settings(dsn, warehouse)
    catalog = load_catalog(settings, dsn)
    d = uuid.UUID(ds_id)
    t = time.perf_counter()
    if kind == "backfill":
        import logging

        from lakehouse_dagster.runbooks.backfill import backfill

        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        logging.getLogger("lakehouse_dagster.runbooks.backfill").setLevel(logging.DEBUG)

        r = backfill(dsn, catalog, settings, d, actor="bench")
        rows = r.copied
    elif kind == "limit":
        import adbc_driver_postgresql.dbapi as adbc

        from lakehouse_dagster.core.db import adbc_uri
        from lakehouse_dagster.runbooks.backfill import _batches

        table = load_table_or_none(catalog, table_identifier(settings, d))
        names = [f.name for f in table.schema().fields]
        with adbc.connect(adbc_uri(dsn)) as conn:
            cur = conn.cursor()
            rows = cur.adbc_ingest(
                "bench_limit",
                _batches(table, table.current_snapshot().snapshot_id, names),
                mode="create",
                temporary=True,
            )
            conn.rollback()
    else:
        from lakehouse_dagster.mirror.sync import sync_dataset

        rows = sync_dataset(dsn, catalog, settings, d, mode="full").rows
    return {"seconds": time.perf_counter() - t, "rows": rows, "rss_mb": _rss_mb()}


def _run_child(kind: str, dsn: str, ds_id: str, warehouse: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, dsn, ds_id, warehouse], capture_output=True, text=True, check=True
    )
    sys.stderr.write(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _make_native(dsn: str, rows: int, warehouse: str, appended: int = 0) -> str:
    """N rows mirrored, then rewritten natively (sync.full) — or, with ``appended``, that many rows appended
    natively (sync.append) above them — and the writer rolled back to pg."""
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
    from lakehouse_dagster.lake.writer import TableWrite
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity.write_digests import write_digested
    from lakehouse_dagster.routing.write_router import route_write
    from lakehouse_dagster.tracking.datasets import get_dataset

    d, _ = make_dataset(dsn, rows)
    settings = _settings(dsn, warehouse)
    catalog = load_catalog(settings, dsn)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    with connect(dsn) as conn:
        writer = "sync.append" if appended else "sync.full"
        # what the write router asks before a dataset's first native write: readers on Iceberg, parity ok
        from lakehouse_dagster.flags.registry import SERVABLE_READERS
        from lakehouse_dagster.runbooks.auto_rollback import run_canary_and_roll_back as run_canary

        for reader in SERVABLE_READERS:
            set_override(conn, "read", reader.name, "iceberg", dataset=d, actor="bench")
        assert [v.verdict for v in run_canary(conn, dsn, catalog, settings, dataset_ids=[str(d)]).results] == ["ok"]
        set_override(conn, "write", writer, "iceberg_native", dataset=d, actor="bench")
        dataset = get_dataset(conn, d)
        table = load_table_or_none(catalog, table_identifier(settings, d))
        # the same content written again natively, with fresh identity as a sync.full assigns it
        import pyarrow as pa

        from lakehouse_dagster.sources.writers import uuid_texts

        now = pa.scalar(time.time_ns() // 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        source = (
            table.scan(limit=appended).to_arrow_batch_reader() if appended else table.scan().to_arrow_batch_reader()
        )
        shift = rows if appended else 0  # appended rows continue above the table's max __row_index

        def fresh(b):
            b = b.set_column(0, "__row_index", pa.array(range(shift, shift + b.num_rows), pa.int64())) if shift else b
            return b.set_column(1, "__row_id", uuid_texts(b.num_rows)).set_column(
                2, "__created_at", pa.array([now.as_py()] * b.num_rows, pa.timestamp("us", tz="UTC"))
            )

        def native(sync_id, version):
            return write_digested(
                catalog,
                settings,
                dataset,
                (fresh(b) for b in source),
                TableWrite(
                    "append" if appended else "replace",
                    sync_id,
                    version,
                    path="native",
                    max_row_index=rows + appended - 1 if appended else None,
                ),
            )

        route_write(
            conn,
            FlagResolver(conn, ttl_seconds=0),
            writer,
            d,
            pg_write=lambda: None,
            iceberg_write=native,
            settings=settings,
        )
        set_override(conn, "write", writer, "pg", dataset=d, actor="bench")
    return str(d)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:6])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--setup":
        print(json.dumps({"dataset": _make_native(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))}))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--scale", default="250000", help="other sizes for the backfill's peak RSS (comma-separated)")
    ap.add_argument(
        "--appended",
        type=int,
        default=0,
        help="instead of a native rewrite of every row, N rows appended natively above --rows",
    )
    args = ap.parse_args()
    admin = admin_dsn()
    sizes = [args.rows] + [int(s) for s in args.scale.split(",") if s]
    for n in sizes:
        dsn = fresh_database(admin, f"bench_backfill_{n}")
        warehouse = Path(tempfile.mkdtemp(prefix="lh-bench-bf-")).as_uri()
        # the set-up runs in a child: Linux keeps a process's peak RSS across exec, so a parent that had
        # held rows would inflate every measuring child's figure
        out = subprocess.run(
            [sys.executable, __file__, "--setup", dsn, str(n), warehouse, str(args.appended)],
            capture_output=True,
            text=True,
            check=True,
        )
        ds_id = json.loads(out.stdout.strip().splitlines()[-1])["dataset"]
        limit = _run_child("limit", dsn, ds_id, warehouse)
        bf = _run_child("backfill", dsn, ds_id, warehouse)
        line = {
            "rows": n,
            "appended": args.appended,
            "copied": bf["rows"],
            "backfill_s": round(bf["seconds"], 2),
            "backfill_rows_s": round(bf["rows"] / bf["seconds"]),
            "backfill_rss_mb": round(bf["rss_mb"]),
            "limit_s": round(limit["seconds"], 2),
            "limit_rss_mb": round(limit["rss_mb"]),
            "backfill_over_limit_time": round(bf["seconds"] / limit["seconds"], 2),
        }
        if n == args.rows:
            mirror = _run_child("mirror", dsn, ds_id, warehouse)  # after the backfill: Postgres holds the rows
            line.update(
                {
                    "mirror_s": round(mirror["seconds"], 2),
                    "mirror_rss_mb": round(mirror["rss_mb"]),
                    "backfill_over_mirror_rows_s": round(mirror["seconds"] / bf["seconds"], 2),
                }
            )
        assert bf["rows"] == (args.appended or n), bf
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
