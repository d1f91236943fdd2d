"""What auto-rollback adds to a canary that finds a MISMATCH, against baselines measured in the same run.

    nice .venv/bin/python bench/bench_auto_rollback.py [--rows 200000] [--repeat 5]

A demo-shaped dataset (bench/_common.py) mirrored by the real mirror, read from Iceberg by every reader
that can be (dataset-scope overrides), one row changed behind the mirror's back. Then, for the same verdict:
  canary            parity.canary.evaluate: the pinned comparison that finds the MISMATCH (and localises it)
  record, off       canary.record with LAKEHOUSE_AUTO_ROLLBACK=false: the insert, the flags read, report only
  record + rollback canary.record with auto-rollback on: under the gate lock, one gated set_flag per reader
and the ratios (rollback / canary, rollback / record off). Between repeats the readers are put back on
Iceberg (ungated, outside the timing). Starts its own embedded Postgres when LAKEHOUSE_PG_DSN is unset.
Not a test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    logging.getLogger("lakehouse_dagster").addHandler(logging.NullHandler())  # the outcome lines, once per repeat

    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.flags.overrides import clear_override, set_override
    from lakehouse_dagster.flags.registry import READ, READERS, rank
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.parity import canary
    from lakehouse_dagster.runbooks import auto_rollback

    dsn = fresh_database(admin_dsn(), "lakehouse_bench_auto_rollback")
    root = Path(tempfile.mkdtemp(prefix="lh-bench-autorb-"))
    (root / "warehouse").mkdir()
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        catalog={"warehouse": (root / "warehouse").as_uri(), "namespace": "bench_autorb"},
        project={"home": root, "actor": "bench"},
    )
    catalog = load_catalog(settings, dsn)
    print(f"rows: {args.rows:,}  (machine: {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f})", flush=True)
    d, _ = make_dataset(dsn, args.rows)
    sync_dataset(dsn, catalog, settings, d, mode="full")
    readers = [r.name for r in READERS.values() if rank(READ, r.ceiling) >= rank(READ, "iceberg")]
    times: dict[str, list[float]] = {"canary": [], "record, off": [], "record + rollback": []}
    with connect(dsn) as conn:
        with conn.transaction():  # one row changed, the version untouched: the dataset stays caught up
            conn.execute("alter table dataset_rows disable trigger user")
            conn.execute(
                "update dataset_rows set data = data || '{\"qty\": 1}' where dataset_id = %s and row_index = 7", (d,)
            )
            conn.execute("alter table dataset_rows enable trigger user")
        rolled = 0
        for _ in range(args.repeat):
            for r in readers:
                set_override(conn, READ, r, "iceberg", dataset=d, actor="bench")
            t = time.perf_counter()
            v = canary.evaluate(dsn, catalog, settings, d)
            times["canary"].append(time.perf_counter() - t)
            assert v.verdict == canary.MISMATCH, v.detail
            t = time.perf_counter()
            auto_rollback.record_and_roll_back(conn, v, settings=settings.replace(rollout={"auto_rollback": False}))
            times["record, off"].append(time.perf_counter() - t)
            t = time.perf_counter()
            auto_rollback.record_and_roll_back(conn, v, settings=settings)
            times["record + rollback"].append(time.perf_counter() - t)
            rolled = len(v.detail["auto_rollback"]["rolled_back"])
            assert rolled == len(readers), v.detail["auto_rollback"]
            for r in readers:
                clear_override(conn, READ, r, dataset=d, actor="bench")
    best = {k: min(x) for k, x in times.items()}
    for k, x in best.items():
        print(f"  {k:<18} {x * 1000:9.1f} ms (best of {args.repeat})")
    print(f"readers rolled back per MISMATCH: {rolled}")
    overhead = (best["record + rollback"] - best["record, off"]) * 1000
    print(f"rollback overhead (record + rollback − record, off): {overhead:.1f} ms")
    print(f"record + rollback / canary: {best['record + rollback'] / best['canary']:.3f}×")
    print(f"record + rollback / record, off: {best['record + rollback'] / best['record, off']:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
