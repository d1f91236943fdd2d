"""Mirror throughput and memory, against baselines measured in the same run.

    .venv/bin/python bench/bench_mirror.py [--rows 2000000] [--scale 1000000,4000000]

Prints, for the same rows:
  mirror    the project's sync (ADBC typed read on 2 connections → Parquet chunks → one commit)
  naive     read all rows into one Arrow table, one pyiceberg table.append
  limit     rows ÷ (seconds to drain COPY (typed select) TO STDOUT + seconds of pyarrow.parquet.write_table)
and ratios mirror/limit, mirror/naive. Each measurement runs in a fresh child process so its peak
RSS is its own. --scale repeats the mirror at other sizes to show peak RSS stays flat.
--digest-ab N runs the mirror N more times each with and without the per-file parity digest computed at
write time (LAKEHOUSE_DIGEST_ON_WRITE, parity/maintained.py), alternating, and prints the best-of ratio.
--allocator-ab N runs the mirror and the limit N more times each on jemalloc (every process of the project's,
core/arrow_memory.py; every child here too) and on pyarrow's default mimalloc, alternating: best-of and peak RSS.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BENCH_SCHEMA, admin_dsn, fresh_database, make_dataset  # noqa: E402


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(kind: str, dsn: str, ds_id: str, warehouse: str, chunk: int) -> dict:
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog

    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        catalog={"warehouse": warehouse, "namespace": f"bench_{kind}"},
        sync={"chunk_rows": chunk},
    )
    ds_uuid = uuid.UUID(ds_id)
    if kind == "mirror":
        from lakehouse_dagster.mirror.sync import sync_dataset

        t = time.perf_counter()
        r = sync_dataset(dsn, load_catalog(settings, dsn), settings, ds_uuid, mode="full")
        return {"seconds": time.perf_counter() - t, "rows": r.rows, "rss_mb": _rss_mb(), "files": r.files}
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.mirror.pinned_read import select_query
    from lakehouse_dagster.tracking.datasets import parse_schema

    columns = parse_schema(BENCH_SCHEMA)
    with connect(dsn) as conn:
        query = select_query(ds_uuid, columns, None, None).as_string(conn)
    if kind == "naive":
        import adbc_driver_postgresql.dbapi as adbc

        from lakehouse_dagster.lake.catalog import ensure_namespace, table_identifier
        from lakehouse_dagster.lake.schema import iceberg_schema

        catalog = load_catalog(settings, dsn)
        t = time.perf_counter()
        with adbc.connect(dsn) as c:
            cur = c.cursor()
            cur.execute(query)
            data = cur.fetch_arrow_table()
        ensure_namespace(catalog, settings.catalog.namespace)
        table = catalog.create_table(table_identifier(settings, ds_uuid), schema=iceberg_schema(columns))
        table.append(data.cast(table.schema().as_arrow()))
        return {"seconds": time.perf_counter() - t, "rows": data.num_rows, "rss_mb": _rss_mb()}
    if kind == "limit":
        import adbc_driver_postgresql.dbapi as adbc
        import pyarrow.parquet as pq

        with connect(dsn) as conn:
            t = time.perf_counter()
            n = 0
            with conn.cursor().copy("copy (" + query + ") to stdout (format binary)") as copy:
                for block in copy:
                    n += len(block)
            copy_s = time.perf_counter() - t
        with adbc.connect(dsn) as c:
            cur = c.cursor()
            cur.execute(query)
            data = cur.fetch_arrow_table()
        out = Path(tempfile.mkdtemp()) / "limit.parquet"
        t = time.perf_counter()
        pq.write_table(data, out, compression="zstd")
        write_s = time.perf_counter() - t
        return {
            "seconds": copy_s + write_s,
            "copy_s": copy_s,
            "write_s": write_s,
            "rows": data.num_rows,
            "copy_bytes": n,
            "rss_mb": _rss_mb(),
        }
    raise SystemExit(f"unknown child kind {kind}")


def run_child(kind: str, dsn: str, ds_id, warehouse: str, chunk: int, env: dict | None = None) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--dsn",
            dsn,
            "--dataset",
            str(ds_id),
            "--warehouse",
            warehouse,
            "--chunk",
            str(chunk),
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--chunk", type=int, default=250_000)
    p.add_argument("--scale", default="", help="comma-separated extra sizes for the mirror's peak-RSS check")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument(
        "--digest-ab",
        type=int,
        default=0,
        metavar="N",
        help="N extra mirror runs each with and without the write-time file digest",
    )
    p.add_argument(
        "--allocator-ab",
        type=int,
        default=0,
        metavar="N",
        help="N extra runs of the mirror and of the limit each on jemalloc (the project's) and pyarrow's mimalloc",
    )
    p.add_argument("--child"), p.add_argument("--dsn"), p.add_argument("--dataset"), p.add_argument("--warehouse")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.dsn, a.dataset, a.warehouse, a.chunk)))
        return

    admin = admin_dsn()
    dsn = fresh_database(admin, "bench_mirror")
    warehouse = Path(tempfile.mkdtemp(prefix="lh-bench-wh-")).as_uri()
    ds_id, gen_s = make_dataset(dsn, a.rows)
    print(f"rows: {a.rows:,}  (generated in Postgres in {gen_s:.1f}s)  chunk: {a.chunk:,}")
    results = {}
    for kind in ["limit", "mirror"] + ([] if a.skip_naive else ["naive"]):
        results[kind] = r = run_child(kind, dsn, ds_id, warehouse, a.chunk)
        extra = f"  (COPY drain {r['copy_s']:.2f}s + parquet write {r['write_s']:.2f}s)" if kind == "limit" else ""
        print(
            f"{kind:7s} {r['seconds']:7.2f}s  {a.rows / r['seconds']:>11,.0f} rows/s  peak RSS {r['rss_mb']:7.0f} MB{extra}"
        )
    m, lim = results["mirror"], results["limit"]
    print(f"mirror / limit rows/s: {lim['seconds'] / m['seconds']:.2f}x   (target >= 0.7x, aim >= 1.0x)")
    if "naive" in results:
        n = results["naive"]
        print(
            f"mirror / naive rows/s: {n['seconds'] / m['seconds']:.2f}x   peak RSS mirror/naive: "
            f"{m['rss_mb'] / n['rss_mb']:.2f}x"
        )
    if a.digest_ab:
        times: dict[str, list[float]] = {"false": [], "true": []}
        for _ in range(a.digest_ab):
            for flag in ("false", "true"):  # alternate, so load changes hit both alike
                r = run_child("mirror", dsn, ds_id, warehouse, a.chunk, env={"LAKEHOUSE_DIGEST_ON_WRITE": flag})
                times[flag].append(r["seconds"])
        off, on = min(times["false"]), min(times["true"])
        print(
            f"mirror without the write-time digest {off:6.2f}s, with it {on:6.2f}s: {on / off:.3f}x the time "
            f"(best of {a.digest_ab}; all: off {[round(x, 2) for x in times['false']]}, "
            f"on {[round(x, 2) for x in times['true']]})"
        )
    if a.allocator_ab:
        ab: dict[tuple[str, str], list[dict]] = {}
        for _ in range(a.allocator_ab):
            for pool in ("mimalloc", "jemalloc"):  # alternate, so load changes hit both alike
                for kind in ("mirror", "limit"):
                    env = {"ARROW_DEFAULT_MEMORY_POOL": pool}
                    ab.setdefault((kind, pool), []).append(run_child(kind, dsn, ds_id, warehouse, a.chunk, env=env))
        for kind in ("mirror", "limit"):
            mi, je = ab[(kind, "mimalloc")], ab[(kind, "jemalloc")]
            best_mi, best_je = min(r["seconds"] for r in mi), min(r["seconds"] for r in je)
            rss_mi, rss_je = max(r["rss_mb"] for r in mi), max(r["rss_mb"] for r in je)
            print(
                f"{kind:7s} on jemalloc {best_je:6.2f}s, on mimalloc {best_mi:6.2f}s: {best_mi / best_je:.2f}x the "
                f"rows/s (best of {a.allocator_ab}); peak RSS {rss_je:.0f} vs {rss_mi:.0f} MB "
                f"(all: jemalloc {[round(r['seconds'], 2) for r in je]}, mimalloc {[round(r['seconds'], 2) for r in mi]})"
            )
        lim_mi = min(r["seconds"] for r in ab[("limit", "mimalloc")])
        mir_mi = min(r["seconds"] for r in ab[("mirror", "mimalloc")])
        lim_je = min(r["seconds"] for r in ab[("limit", "jemalloc")])
        mir_je = min(r["seconds"] for r in ab[("mirror", "jemalloc")])
        print(
            f"mirror / limit rows/s: {lim_je / mir_je:.2f}x both on jemalloc, {lim_mi / mir_mi:.2f}x both on mimalloc"
        )
    sizes = [int(s) for s in a.scale.split(",") if s.strip()]
    if sizes:
        rss = {a.rows: m["rss_mb"]}
        for size in sizes:
            other = fresh_database(admin, f"bench_mirror_{size}")
            d2, _ = make_dataset(other, size)
            r = run_child("mirror", other, d2, Path(tempfile.mkdtemp(prefix="lh-bench-wh-")).as_uri(), a.chunk)
            rss[size] = r["rss_mb"]
            print(
                f"mirror at {size:>9,} rows: {r['seconds']:6.2f}s  {size / r['seconds']:>9,.0f} rows/s  "
                f"peak RSS {r['rss_mb']:5.0f} MB"
            )
        lo, hi = min(rss.values()), max(rss.values())
        print(f"peak RSS spread across sizes: {(hi - lo) / lo * 100:.0f}% (target within 20%)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
