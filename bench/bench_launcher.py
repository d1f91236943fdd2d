"""Benchmark (not a test): the warm run launcher against Dagster's stock DefaultRunLauncher, in the same run.

    nice .venv/bin/python bench/bench_launcher.py [--launches 5] [--rows 1000] [--append 10]

What an operator feels of a launcher is a run they start (from the UI, a schedule, a batch of the mirror): the time
from the launch to its first step, and to its success. Both launchers launch the same run, the real code location's
``mirror_batch_job`` over one dataset that has just had ``--append`` rows appended (a real sync each time), on the
same Dagster instance storage (Postgres, through deploy/dagster.yaml's storage class), from the same separate code
server (``dagster code-server start``, the production topology of deploy/). They alternate, the order switching each
round, ``--launches`` times each, after one warm-up launch each that is reported apart (the warm launcher's first
launch waits for its forkserver's imports; the stock launcher's first one pays nothing extra).

Measured from just before ``instance.launch_run`` (what the daemon's run queue calls), by the wall-clock timestamps
Dagster stores on the run's events: ``launch returned`` (how long the queue's launching thread is held),
``→ first step`` (STEP_START), ``→ success`` (RUN_SUCCESS). Ratios are stock / warm (>1: the warm launcher is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import admin_dsn, fresh_database, make_dataset  # noqa: E402
from lakehouse_dagster.cli.dsn import conninfo_to_url  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.testing.pg import with_db  # noqa: E402

LOCATION = "lakehouse_dagster"
APPEND = """
insert into dataset_rows (dataset_id, row_index, data)
select %(ds)s, g, jsonb_build_object('name', 'row-' || g, 'qty', g)
  from generate_series(%(lo)s::bigint, %(lo)s::bigint + %(n)s - 1) g
"""
STORAGE = """storage:
  custom:
    module: lakehouse_dagster.dagster.storage
    class: PostgresStorage
    config:
      postgres_url: {url}
telemetry:
  enabled: false
"""
WARM = """run_launcher:
  module: lakehouse_dagster.dagster.launcher.run_launcher
  class: WarmRunLauncher
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _home(root: Path, name: str, url: str, extra: str = "") -> Path:
    home = root / name
    home.mkdir()
    (home / "dagster.yaml").write_text(STORAGE.format(url=json.dumps(url)) + extra)
    return home


def _wait_for_server(port: int, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    from dagster._grpc.client import DagsterGrpcClient

    client = DagsterGrpcClient(port=port, host="127.0.0.1")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the code server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            client.ping("")
            return
        except Exception:
            time.sleep(0.5)
    raise SystemExit(f"the code server did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def _one(instance, workspace, job, remote, run_config: dict) -> dict:
    import dagster as dg

    run = instance.create_run_for_job(
        job_def=job,
        run_config=run_config,
        remote_job_origin=remote.get_remote_origin(),
        job_code_origin=remote.get_python_origin(),
    )
    t0 = time.time()
    instance.launch_run(run.run_id, workspace)
    returned = time.time() - t0
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = instance.get_run_by_id(run.run_id).status
        if status in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
            break
        time.sleep(0.1)
    else:
        raise SystemExit(f"run {run.run_id} did not finish within 600 s")
    logs = instance.all_logs(run.run_id)
    if status != dg.DagsterRunStatus.SUCCESS:
        raise SystemExit(f"run {run.run_id} ended {status}: {[r.message for r in logs][-8:]}")
    first = {}
    for r in logs:
        if r.dagster_event is not None:
            first.setdefault(r.dagster_event.event_type_value, r.timestamp)
    return {
        "returned": returned,
        "first_step": first["STEP_START"] - t0,
        "success": first["PIPELINE_SUCCESS"] - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=5, help="measured launches per launcher (after one warm-up)")
    ap.add_argument("--rows", type=int, default=1000, help="rows of the dataset before the first launch")
    ap.add_argument("--append", type=int, default=10, help="rows appended before each launch")
    args = ap.parse_args(argv)

    import dagster as dg
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import GrpcServerTarget

    root = Path(tempfile.mkdtemp(prefix="lh-bench-launcher-"))
    admin = admin_dsn()
    dsn = fresh_database(admin, "bench_launcher")
    fresh_database(admin, "bench_launcher_dagster")
    url = conninfo_to_url(with_db(admin, "bench_launcher_dagster"))  # a bare postgresql:// URL
    (root / "warehouse").mkdir()
    os.environ.update(
        {
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(root / "home"),
            "LAKEHOUSE_WAREHOUSE": (root / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "bench_launcher",
        }
    )
    dataset, _ = make_dataset(dsn, args.rows, "launched")
    homes = {"stock": _home(root, "stock", url), "warm": _home(root, "warm", url, WARM)}

    port = _free_port()
    log = root / "code-server.log"
    dagster_bin = Path(sys.executable).with_name("dagster")
    env = {**os.environ, "DAGSTER_HOME": str(homes["stock"]), "PYTHONPATH": str(ROOT)}
    with open(log, "w") as out:
        server = subprocess.Popen(
            [str(dagster_bin), "code-server", "start", "-h", "127.0.0.1", "-p", str(port)]
            + ["-m", "lakehouse_dagster.dagster.definitions", "--location-name", LOCATION],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    results: dict[str, list[dict]] = {"stock": [], "warm": []}
    warmup: dict[str, dict] = {}
    try:
        _wait_for_server(port, server, log)
        from lakehouse_dagster.dagster.definitions import defs

        job = defs().get_job_def("mirror_batch_job")
        run_config = {"ops": {"mirror_datasets": {"config": {"datasets": [str(dataset)]}}}}
        contexts = {}
        for name, home in homes.items():
            instance = dg.DagsterInstance.from_config(str(home))
            ctx = WorkspaceProcessContext(
                instance, GrpcServerTarget(host="127.0.0.1", port=port, socket=None, location_name=LOCATION)
            )
            workspace = ctx.create_request_context()
            (entry,) = workspace.get_code_location_entries().values()
            (repo,) = entry.code_location.get_repositories().values()
            contexts[name] = (instance, ctx, workspace, repo.get_full_job(job.name))
        assert type(contexts["stock"][0].run_launcher).__name__ == "DefaultRunLauncher"
        assert type(contexts["warm"][0].run_launcher).__name__ == "WarmRunLauncher"

        next_row = args.rows

        def launch(name: str) -> dict:
            nonlocal next_row
            with connect(dsn) as conn:
                conn.execute(APPEND, {"ds": dataset, "lo": next_row, "n": args.append})
            next_row += args.append
            instance, _ctx, workspace, remote = contexts[name]
            return _one(instance, workspace, job, remote, run_config)

        for name in ("warm", "stock"):
            warmup[name] = launch(name)
            print(f"warm-up {name}: {json.dumps({k: round(v, 2) for k, v in warmup[name].items()})}", flush=True)
        for i in range(args.launches):
            for name in ("stock", "warm") if i % 2 == 0 else ("warm", "stock"):
                r = launch(name)
                results[name].append(r)
                print(f"{i} {name}: {json.dumps({k: round(v, 2) for k, v in r.items()})}", flush=True)
        for _instance, ctx, _ws, _remote in contexts.values():
            ctx.__exit__(None, None, None)
        with connect(dsn) as conn:
            rows = conn.execute(
                "select count(*) from iceberg_sync_log where dataset_id = %s and status = 'succeeded'", (dataset,)
            ).fetchone()[0]
        print(f"succeeded syncs: {rows} (expected {2 * args.launches + 2})")
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print()
    print(f"| median of {args.launches} | stock DefaultRunLauncher | warm launcher | stock / warm |")
    print("| --- | --- | --- | --- |")
    for key, label in (("returned", "launch call returned"), ("first_step", "→ first step"), ("success", "→ success")):
        s, w = med("stock", key), med("warm", key)
        print(f"| {label} | {s:.2f} s | {w:.2f} s | {s / w:.1f}× |")
    print(
        f"| first launch → success (warm-up) | {warmup['stock']['success']:.2f} s | {warmup['warm']['success']:.2f} s"
        f" | {warmup['stock']['success'] / warmup['warm']['success']:.1f}× |"
    )
    print(json.dumps({"run": str(uuid.uuid4())[:8], "results": results, "warmup": warmup}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
