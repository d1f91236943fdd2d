"""Parity digest throughput and mismatch localisation, against baselines measured in the same run.

    nice .venv/bin/python bench/bench_parity.py [--rows 2000000] [--repeat 2]

On a demo-shaped dataset (bench/_common.py: 10 typed columns of every type, json and nulls) mirrored to
Iceberg by the real mirror, prints for the same rows:
  postgres digest   the canary's SQL (count + sum of 64-bit row hashes, hashtextextended) inside Postgres
  postgres baseline draining COPY (SELECT <typed projection of every column>) TO STDOUT (binary, and text)
  iceberg digest    the canary's DuckDB query over the snapshot's Parquet files
  iceberg baseline  DuckDB sum(length(col::VARCHAR)) over every column of the same files
and the ratios (targets: postgres digest time ≤ 1.0 × the COPY drain; iceberg digest ≥ 0.5 × the baseline's
rows/s), that both digests agree, and the time to localise one row changed behind the mirror's back.
Each timing is the best of --repeat runs, baselines and digests alternating. Starts its own embedded
Postgres when LAKEHOUSE_PG_DSN is unset. Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, object, list[float]]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out, times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = ap.parse_args(argv)

    import duckdb
    from psycopg import sql

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity import canary, canonical, localise
    from lakehouse_dagster.parity.digest import IcebergSide, PgSide, PinnedPostgres, pin_iceberg, plain_digest
    from lakehouse_dagster.tracking.datasets import get_dataset

    n = args.rows
    admin = admin_dsn()
    dsn = fresh_database(admin, "lakehouse_bench_parity")
    root = Path(tempfile.mkdtemp(prefix="lh-bench-parity-"))
    (root / "warehouse").mkdir()
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        catalog={"warehouse": (root / "warehouse").as_uri(), "namespace": "bench_parity"},
        project={"home": root},
    )
    catalog = load_catalog(settings, dsn)
    print(f"rows: {n:,}  (machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})", flush=True)

    ds_id, gen_s = make_dataset(dsn, n)
    print(f"generated in Postgres: {gen_s:.1f} s", flush=True)
    t = time.perf_counter()
    r = sync_dataset(dsn, catalog, settings, ds_id, mode="full")
    print(
        f"mirrored to Iceberg: {time.perf_counter() - t:.1f} s, {r.files} file(s), snapshot {r.snapshot_id}", flush=True
    )

    with connect(dsn) as conn:
        columns = get_dataset(conn, ds_id).columns
        workers = conn.execute("show max_parallel_workers_per_gather").fetchone()[0]
        version = conn.execute("show server_version").fetchone()[0]
    pin = pin_iceberg(catalog, settings, ds_id)
    figures: dict = {"rows": n, "postgres": version, "max_parallel_workers_per_gather": int(workers)}

    # --- Postgres: typed COPY drain vs the digest ------------------------------------------------
    typed = [sql.SQL("row_index"), sql.SQL("row_id"), sql.SQL("created_at")] + [canonical.pg_typed(c) for c in columns]
    select = sql.SQL("select {} from dataset_rows where dataset_id = {}").format(
        sql.SQL(", ").join(typed), sql.Literal(str(ds_id))
    )

    def copy_drain(fmt: str):
        def run():
            with connect(dsn) as c, c.cursor() as cur:
                q = sql.SQL("copy ({}) to stdout {}").format(
                    select, sql.SQL("(format binary)" if fmt == "binary" else "")
                )
                nbytes = 0
                with cur.copy(q) as cp:
                    for block in cp:
                        nbytes += len(block)
                return nbytes

        return run

    def pg_digest():
        with PinnedPostgres(dsn) as pg:
            return plain_digest(PgSide(pg.conn, ds_id, columns))

    with PinnedPostgres(dsn) as pg:  # is the digest parallel inside the pinned REPEATABLE READ transaction?
        PgSide(pg.conn, ds_id, columns)  # built as the digest builds it (its session settings)
        plan = pg.conn.execute(
            sql.SQL("explain select count(*), sum({}) from dataset_rows where dataset_id = %s").format(
                canonical.pg_row_hash(columns)
            ),
            (ds_id,),
        ).fetchall()
        planned = [line[0].strip() for line in plan if "Workers Planned" in line[0]]
    figures["postgres_plan_workers"] = planned[0] if planned else "no parallel workers"

    copy_bin, copy_text, pg_d = [], [], []
    pg_value = None
    for _ in range(args.repeat):  # alternate so load changes hit both alike
        copy_bin.append(_best(copy_drain("binary"), 1)[0])
        copy_text.append(_best(copy_drain("text"), 1)[0])
        s, d, _ = _best(pg_digest, 1)
        pg_d.append(s)
        pg_value = d.value
    base_pg = min(min(copy_bin), min(copy_text))
    figures["postgres_copy_binary_s"] = round(min(copy_bin), 3)
    figures["postgres_copy_text_s"] = round(min(copy_text), 3)
    figures["postgres_digest_s"] = round(min(pg_d), 3)
    figures["postgres_digest_over_copy"] = round(min(pg_d) / base_pg, 3)

    # --- Iceberg: DuckDB read-every-column baseline vs the digest --------------------------------
    paths = [p.removeprefix("file://") for p in pin.files]
    names = ["__row_index", "__row_id", "__created_at"] + [c.name for c in columns]
    baseline_sql = (
        "select "
        + ", ".join(f"sum(length({canonical.duck_ident(x)}::VARCHAR))" for x in names)
        + " from read_parquet($files, union_by_name = true)"
    )
    con = duckdb.connect()

    def duck_baseline():
        return con.execute(baseline_sql, {"files": paths}).fetchall()

    def ice_digest():
        with IcebergSide(pin, columns) as side:
            return plain_digest(side)

    duck_b, ice_d = [], []
    ice_value = None
    for _ in range(args.repeat):
        duck_b.append(_best(duck_baseline, 1)[0])
        s, d, _ = _best(ice_digest, 1)
        ice_d.append(s)
        ice_value = d.value
    figures["iceberg_baseline_s"] = round(min(duck_b), 3)
    figures["iceberg_digest_s"] = round(min(ice_d), 3)
    figures["iceberg_digest_rows_per_s_over_baseline"] = round(min(duck_b) / min(ice_d), 3)
    figures["digests_agree"] = pg_value == ice_value
    figures["digest"] = {"count": pg_value[0], "sum": str(pg_value[1])}

    # --- localisation of one row changed behind the mirror's back --------------------------------
    changed = random.Random(4).randrange(n)
    with connect(dsn) as conn, conn.transaction():
        conn.execute("alter table dataset_rows disable trigger user")
        conn.execute(
            "update dataset_rows set data = jsonb_set(data, '{qty}', '-1') where dataset_id = %s and row_index = %s",
            (ds_id, changed),
        )
        conn.execute("alter table dataset_rows enable trigger user")
    t = time.perf_counter()
    verdict = canary.evaluate(dsn, catalog, settings, ds_id)
    canary_s = time.perf_counter() - t
    with PinnedPostgres(dsn) as pg, IcebergSide(pin, columns) as ice:
        pg_side = PgSide(pg.conn, ds_id, columns)
        t = time.perf_counter()
        left, right = plain_digest(pg_side), plain_digest(ice)
        assert left.value != right.value
        found = localise.localise(pg_side, ice, 0, n)
        from_scratch_s = time.perf_counter() - t
    figures["changed_row_index"] = changed
    figures["canary_verdict"] = verdict.verdict
    figures["canary_found"] = verdict.mismatched_row_indexes
    figures["canary_total_s"] = round(canary_s, 3)
    figures["localise_from_scratch_s"] = round(from_scratch_s, 3)
    figures["localise_after_digests_s"] = round(found.seconds, 3)
    figures["localise_queries"] = found.queries
    figures["localise_found"] = found.row_indexes

    rate = lambda s: f"{n / s / 1000:,.0f}k rows/s"  # noqa: E731
    print()
    print(
        f"Postgres {version}, max_parallel_workers_per_gather={workers} (digest plan: {figures['postgres_plan_workers']});"
        f" best of {args.repeat}"
    )
    print(f"  baseline COPY typed → STDOUT binary  {min(copy_bin):7.2f} s  {rate(min(copy_bin))}")
    print(f"  baseline COPY typed → STDOUT text    {min(copy_text):7.2f} s  {rate(min(copy_text))}")
    print(
        f"  digest (the canary's SQL)            {min(pg_d):7.2f} s  {rate(min(pg_d))}"
        f"   = {figures['postgres_digest_over_copy']:.2f} × the faster COPY's time (target ≤ 1.0)"
    )
    print("DuckDB over the snapshot's Parquet files")
    print(f"  baseline sum(length(col::VARCHAR))   {min(duck_b):7.2f} s  {rate(min(duck_b))}")
    print(
        f"  digest (the canary's query)          {min(ice_d):7.2f} s  {rate(min(ice_d))}"
        f"   = {figures['iceberg_digest_rows_per_s_over_baseline']:.2f} × the baseline's rows/s (target ≥ 0.5)"
    )
    print(f"digests agree: {figures['digests_agree']}  (count {pg_value[0]:,}, sum {pg_value[1]})")
    print(f"one row changed behind the mirror's back (row_index {changed}):")
    print(
        f"  canary evaluate (pins, both digests, bisection): {canary_s:.2f} s → {verdict.verdict} {verdict.mismatched_row_indexes}"
    )
    print(
        f"  localisation from scratch (both digests, then segments + bisection): {from_scratch_s:.2f} s (target < 10 s)"
    )
    print(
        f"  of which the bisection after the digests disagree: {found.seconds:.2f} s, {found.queries} range "
        f"queries per side → {found.row_indexes}"
    )
    print(
        f"times per run: copy binary {[round(x, 2) for x in copy_bin]}, copy text {[round(x, 2) for x in copy_text]}, "
        f"pg digest {[round(x, 2) for x in pg_d]}, duck baseline {[round(x, 2) for x in duck_b]}, "
        f"duck digest {[round(x, 2) for x in ice_d]}"
    )
    if args.json:
        print(json.dumps(figures, indent=2))
    with connect(admin) as c:
        c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier("lakehouse_bench_parity")))
    shutil.rmtree(root, ignore_errors=True)
    ok = figures["digests_agree"] and verdict.mismatched_row_indexes == [changed] and found.row_indexes == [changed]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
