"""The service under load and a Postgres restart: --clients clients for --minutes against `lakehouse serve` on an
embedded Postgres of the bench's own, restarted with ``pg_ctl -m immediate`` (every session ends, crash recovery
on start) at --restart-at minutes (default: the middle).

    .venv/bin/python bench/bench_service_faults.py [--clients 32] [--minutes 10] [--restart-at M]
                                                   [--datasets 8] [--rows 20000] [--sourced 4]

Each client loops without retries (lakehouse_dagster/testing/service_faults.py): 80% 1,000-row reads
(``export.stream`` from Iceberg, ``studio.digest`` from Postgres, a random dataset of --datasets), 20% ``sync.full``
ingests of a random one of --sourced Postgres-sourced datasets, at LAKEHOUSE_MAX_CONCURRENT_INGEST=2. The gates:
0 answers other than 200 and a 5xx with Retry-After, 0 stack traces, 0 cut connections, every request sent 30 s
after Postgres was back served (an ingest's G2 503 counts as served), the server's RSS bounded (its maximum against
its RSS after the first tenth of the run), the same server process throughout. Not a test: figures go to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.embedded import start_embedded, stop_embedded  # noqa: E402
from lakehouse_dagster.core.settings import Settings  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.lake.catalog import load_catalog  # noqa: E402
from lakehouse_dagster.mirror.sync import sync_dataset  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402
from lakehouse_dagster.sources import set_source  # noqa: E402
from lakehouse_dagster.testing.service import ServiceProcess, new_token  # noqa: E402
from lakehouse_dagster.testing.service_faults import run_load_with_restart  # noqa: E402
from lakehouse_dagster.tracking import datasets  # noqa: E402

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "name", "type": "string"}]


def _seed(conn, n_datasets: int, rows: int, n_sourced: int) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    ws = datasets.create_workspace(conn, "faults")
    readable, sourced = [], []
    for i in range(n_datasets):
        d = datasets.create_dataset(conn, ws, f"events_{i}", SCHEMA)
        conn.execute(
            "insert into dataset_rows (dataset_id, row_index, data) select %s, g,"
            " jsonb_build_object('n', g, 'name', 'row ' || g) from generate_series(0, %s) g",
            (d, rows - 1),
        )
        readable.append(d)
    for i in range(n_sourced):
        conn.execute(f"create table public.src_{i} (n bigint primary key, name text)")
        conn.execute(f"insert into public.src_{i} select g, 'r' || g from generate_series(1, 2000) g")
        d = datasets.create_dataset(conn, ws, f"sourced_{i}", SCHEMA)
        set_source(conn, d, {"type": "postgres", "table": f"public.src_{i}"})
        sourced.append(d)
    set_override(conn, "read", "export.stream", "iceberg", note="bench", actor="bench")
    return readable, sourced


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--restart-at", type=float, default=None, help="minutes into the run (default: the middle)")
    p.add_argument("--datasets", type=int, default=8)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--sourced", type=int, default=4)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lh-bench-faults-"))
    pgdata = root / "pg"
    try:
        dsn = start_embedded(pgdata)
        (root / "warehouse").mkdir()
        env = {
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(root / "home"),
            "LAKEHOUSE_WAREHOUSE": (root / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "bench_faults",
            "LAKEHOUSE_MAX_CONCURRENT_INGEST": "2",
            "LAKEHOUSE_API_BATCH_ROWS": "1000",
        }
        settings = Settings.from_env().replace(
            postgres={"dsn": dsn},
            project={"home": root / "home"},
            catalog={"warehouse": env["LAKEHOUSE_WAREHOUSE"], "namespace": "bench_faults"},
        )
        with connect(dsn) as conn:
            migrate(conn)
            readable, sourced = _seed(conn, args.datasets, args.rows, args.sourced)
        catalog = load_catalog(settings, dsn)
        for d in readable:
            sync_dataset(dsn, catalog, settings, d)
        seconds = args.minutes * 60
        restart_at = None if args.restart_at is None else args.restart_at * 60
        print(
            f"service faults: {args.clients} clients for {seconds:.0f} s, {args.datasets} datasets of {args.rows:,} "
            f"rows (Iceberg and Postgres), {args.sourced} sourced; Postgres restarted -m immediate at "
            f"{(restart_at if restart_at is not None else seconds / 2):.0f} s",
            flush=True,
        )
        server = ServiceProcess(env, root / "serve.log", token=new_token()).wait_ready()
        try:
            report = run_load_with_restart(
                server, pgdata, readable, sourced, clients=args.clients, seconds=seconds, restart_at=restart_at
            )
            alive = server.proc.poll() is None
            log = server.log_text()
        finally:
            server.stop()
        print("  " + report.line(), flush=True)
        for line in report.unexpected:
            print("  unexpected: " + line)
        out = {**dataclasses.asdict(report), "same_process": alive, "stack_traces_in_log": log.count("Traceback")}
        print(json.dumps(out, default=str))
        ok = (
            report.unexpected_count == 0
            and report.cut_after_back == 0
            and report.tracebacks == 0
            and report.after_recovery_not_served == 0
            and bool(report.after_recovery)  # a run too short to see the 30 s after the restart proves nothing
            and alive
        )
        print("gates:", "pass" if ok else "FAIL", flush=True)
        return 0 if ok else 1
    finally:
        stop_embedded(pgdata)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
