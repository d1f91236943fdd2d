"""Source writer throughput and memory, against baselines measured in the same run.

    .venv/bin/python bench/bench_writers.py [--rows 2000000] [--scale 1000000,2000000,4000000]

The source is Parquet made from the demo-shaped generator (bench/_common.py): 1M-row files, k copies
for k million rows. Prints, for the same files:
  pq        pyarrow.parquet read (iter_batches) + write (zstd) of the files — the native baseline
  native    `sync.full` iceberg-native ingest (convert → identity → Parquet chunks → one commit)
  rowcopy   plain COPY of the same rows, already rendered as dataset_rows lines (dataset_id, row_index, jsonb
            text; rendering not timed), into dataset_rows in one transaction — the pg-path baseline: what
            landing these rows in the row store costs at least (jsonb parsing, primary key, change tracking)
  typed     plain COPY of the same rows (ADBC binary COPY) into a typed table — for context
  pg        `sync.full` pg-path ingest (COPY to a stage → dataset_rows jsonb, one transaction)
and ratios native/pq, pg/rowcopy (rows/s), plus native peak RSS at each --scale size.
Each measurement runs in a fresh child process so its peak RSS is its own. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import BENCH_SCHEMA, admin_dsn, fresh_database, make_dataset  # noqa: E402

FILE_ROWS = 1_000_000


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(kind: str, dsn: str, src: str, warehouse: str) -> dict:
    import pyarrow.parquet as pq

    files = sorted(str(p) for p in Path(src).glob("*.parquet"))
    t = time.perf_counter()
    if kind == "pq":
        rows = 0
        out = Path(tempfile.mkdtemp(prefix="lh-bench-pq-"))
        for i, f in enumerate(files):
            pf = pq.ParquetFile(f)
            with pq.ParquetWriter(out / f"{i}.parquet", pf.schema_arrow, compression="zstd") as w:
                for b in pf.iter_batches(batch_size=131_072):
                    w.write_batch(b)
                    rows += b.num_rows
        seconds = time.perf_counter() - t
        shutil.rmtree(out)
        return {"seconds": seconds, "rows": rows, "rss_mb": _rss_mb()}
    if kind == "rowcopy":
        import psycopg

        from lakehouse_dagster.tracking import datasets

        with psycopg.connect(dsn, autocommit=True) as conn:
            d = datasets.create_dataset(conn, None, "bench-rowcopy", BENCH_SCHEMA)
            rows = 0
            t = time.perf_counter()
            with conn.transaction():
                with conn.cursor().copy(
                    "copy dataset_rows (dataset_id, row_index, data) from stdin (format csv)"
                ) as cp:
                    for k in range(len(files)):  # the rendered rows once per 1M-row file, each with its own indexes
                        with open(Path(src).parent / "rows.csv", "rb") as fh:
                            while lines := fh.readlines(8 << 20):
                                block = (
                                    b"".join(lines).replace(b"@DS@", str(d).encode()).replace(b"@K@", str(k).encode())
                                )
                                cp.write(block)
                                rows += len(lines)
            return {"seconds": time.perf_counter() - t, "rows": rows, "rss_mb": _rss_mb()}
    if kind == "typed":
        import adbc_driver_postgresql.dbapi as adbc

        from lakehouse_dagster.core.db import adbc_uri

        rows = 0
        with adbc.connect(adbc_uri(dsn)) as conn:
            cur = conn.cursor()
            cur.execute("drop table if exists bench_copy")
            for f in files:
                for b in pq.ParquetFile(f).iter_batches(batch_size=131_072):
                    cur.adbc_ingest("bench_copy", b, mode="create_append")
                    rows += b.num_rows
            conn.commit()
        return {"seconds": time.perf_counter() - t, "rows": rows, "rss_mb": _rss_mb()}
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.flags.resolver import FlagResolver
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.sources import set_source
    from lakehouse_dagster.sources.writers import run_writer
    from lakehouse_dagster.tracking import datasets

    settings = Settings.from_env().replace(
        postgres={"dsn": dsn}, catalog={"warehouse": warehouse, "namespace": f"bench_{kind}"}
    )
    with connect(dsn) as conn:
        d = datasets.create_dataset(conn, None, f"bench-{kind}", BENCH_SCHEMA)
        set_source(conn, d, {"type": "files", "uri": f"{src}/*.parquet", "format": "parquet"}, settings=settings)
        if kind == "native":  # read-flipped first: the write router refuses a new dataset's readers on Postgres
            from lakehouse_dagster.flags.registry import SERVABLE_READERS

            for reader in SERVABLE_READERS:
                set_override(conn, "read", reader.name, "iceberg", dataset=d, note="bench", actor="bench")
            set_override(conn, "write", "sync.full", "iceberg_native", dataset=d, note="bench", actor="bench")
        catalog = load_catalog(settings, dsn)  # process start-up (imports), not ingest
        t = time.perf_counter()
        r = run_writer(dsn, catalog, settings, FlagResolver(conn, 10), d, "sync.full")
        seconds = time.perf_counter() - t
        assert r.path == ("native" if kind == "native" else "pg"), r
    return {"seconds": seconds, "rows": r.rows, "rss_mb": _rss_mb()}


def _run(kind: str, dsn: str, src: Path, warehouse: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, dsn, str(src), warehouse],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _source(base: Path, one: Path, millions: int) -> Path:
    d = base / f"src_{millions}m"
    d.mkdir(exist_ok=True)
    for i in range(millions):
        target = d / f"part-{i:03d}.parquet"
        if not target.exists():
            os.link(one, target) if hasattr(os, "link") else shutil.copy(one, target)
    return d


def _export(dsn: str, ds_id: uuid.UUID, path: Path) -> None:
    """The generated rows, typed as the mirror reads them, into one Parquet file (json as jsonb text)."""
    import adbc_driver_postgresql.dbapi as adbc
    import pyarrow.parquet as pq

    from lakehouse_dagster.core.db import adbc_uri, connect
    from lakehouse_dagster.mirror.pinned_read import select_query
    from lakehouse_dagster.tracking.datasets import parse_schema

    with connect(dsn) as conn:
        q = select_query(ds_id, parse_schema(BENCH_SCHEMA), None, None).as_string(conn)
    with adbc.connect(adbc_uri(dsn), autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("set timezone to 'UTC'")
        cur.execute(q)
        reader = cur.fetch_record_batch()
        schema = reader.schema
        content = [f for f in schema if not f.name.startswith("__")]
        import pyarrow as pa

        with pq.ParquetWriter(path, pa.schema(content), compression="zstd") as w:
            for b in reader:
                w.write_batch(
                    pa.RecordBatch.from_arrays([b.column(f.name) for f in content], schema=pa.schema(content))
                )


def _render_rows(dsn: str, ds_id: uuid.UUID, path: Path) -> None:
    """The generated rows as dataset_rows COPY lines (placeholders for the target dataset and file number)."""
    import psycopg

    with psycopg.connect(dsn) as conn, open(path, "wb") as fh:
        q = (
            "copy (select '@DS@', '@K@' || lpad(row_index::text, 7, '0'), data from dataset_rows"
            " where dataset_id = %s order by row_index) to stdout (format csv)"
        )
        with conn.cursor().copy(psycopg.sql.SQL(q.replace("%s", "{}")).format(psycopg.sql.Literal(str(ds_id)))) as cp:
            for chunk in cp:
                fh.write(chunk)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the main comparison (multiple of 1M)")
    ap.add_argument("--scale", default="1000000,2000000,4000000", help="native ingest sizes for peak RSS")
    args = ap.parse_args()
    admin = admin_dsn()
    dsn = fresh_database(admin, f"bench_writers_{uuid.uuid4().hex[:8]}")
    base = Path(tempfile.mkdtemp(prefix="lh-bench-writers-"))
    print(f"generating {FILE_ROWS:,} demo-shaped rows …", flush=True)
    gen_id, gen_s = make_dataset(dsn, FILE_ROWS, "bench-source")
    one = base / "one.parquet"
    _export(dsn, gen_id, one)
    print(f"  {gen_s:.1f}s; Parquet file {one.stat().st_size / 1e6:.0f} MB", flush=True)
    src = _source(base, one, args.rows // FILE_ROWS)
    warehouse = (base / "warehouse").as_uri()
    results = {}
    _render_rows(dsn, gen_id, base / "rows.csv")
    for kind in ("pq", "native", "rowcopy", "typed", "pg"):
        r = _run(kind, dsn, src, warehouse)
        r["rows_per_s"] = r["rows"] / r["seconds"]
        results[kind] = r
        print(
            f"{kind:7s} {r['rows']:>10,} rows {r['seconds']:7.2f}s {r['rows_per_s']:>12,.0f} rows/s "
            f"peak RSS {r['rss_mb']:6.0f} MB",
            flush=True,
        )
    print(f"native / pq   = {results['native']['rows_per_s'] / results['pq']['rows_per_s']:.2f}x (target >= 0.6x)")
    print(f"pg / rowcopy  = {results['pg']['rows_per_s'] / results['rowcopy']['rows_per_s']:.2f}x (target >= 0.6x)")
    print(f"pg / typed    = {results['pg']['rows_per_s'] / results['typed']['rows_per_s']:.2f}x (context)")
    sizes = [int(s) for s in args.scale.split(",") if s]
    rss = []
    for n in sizes:
        r = _run("native", dsn, _source(base, one, n // FILE_ROWS), warehouse)
        rss.append(r["rss_mb"])
        print(
            f"native {n:>10,} rows {r['seconds']:7.2f}s {r['rows'] / r['seconds']:>12,.0f} rows/s "
            f"peak RSS {r['rss_mb']:6.0f} MB",
            flush=True,
        )
    if rss:
        print(f"peak RSS max/min across sizes = {max(rss) / min(rss):.2f}x (target <= 1.20x)")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:6])))
    else:
        main()
