"""The canary schedule at scale (issue 22): N flipped datasets covered within one schedule period, with maintained
digests, and the queue never growing from tick to tick; against the old one-run-per-dataset path, measured on a
sample in the same run.

    .venv/bin/python bench/bench_canary_schedule.py [--n 10000] [--rows 20] [--sample 40] [--workers 2]

N datasets of ``--rows`` rows are written and mirrored (setup, timed apart), then flipped globally (export.stream
iceberg) and made partitions. Then, on a Dagster instance with Postgres storage (as dagster.yaml configures):

1. first round: one real tick of ``parity_canary_schedule`` and its ``parity_canary_batch_job`` runs, executed
   ``--workers`` at a time (dagster.yaml lets two canary runs run at once), each in its own process
   (``execute_in_process`` on the shared instance: no daemon, so no run start-up is counted). Every dataset's first
   check registers and fills its maintained digests;
2. the old path on a sample: ``parity_canary_job`` (one run per dataset, as the schedule used to request) executed
   in process for ``--sample`` datasets, one after the other: seconds per dataset, still without run start-up;
3. queue: the next tick's requests are registered as runs not yet started (what the daemon holds in its queue), and
   a third tick asks for nothing; they are then removed and executed as in 1 (the steady round, maintained digests);
4. alerts: one ``lakehouse_alerts`` tick's work (status/alerts.run_tick) with nothing to report, then with the mirror
   stopped for ``--lagging`` flipped datasets (freshness threshold 1 s), tick after tick until a local receiver got
   every event.

Printed: per tick the runs and datasets requested and the tick's own seconds; per round the wall time, datasets/s
and whether it fits the 30-minute period; per dataset the batch's and the old path's seconds and their ratio. Not a
test: nothing here gates CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PERIOD_S = 30 * 60  # parity_canary_schedule's cron: */30
# Both paths: the console shows warnings only (every event is still stored; printing 30,000 lines is not the subject).
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def _setup(admin: str, n: int, rows: int, workers: int) -> tuple[str, Path, dict]:
    from bench._common import BENCH_SCHEMA, GENERATE, fresh_database
    from lakehouse_dagster.cli.dsn import dagster_url
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.tracking import datasets

    tag = uuid.uuid4().hex[:8]
    dsn = fresh_database(admin, f"bench_canary_{tag}")
    dagster_dsn = fresh_database(admin, f"bench_canary_{tag}_dagster")
    home = Path(tempfile.mkdtemp(prefix="lh-bench-canary-"))
    (home / "warehouse").mkdir()
    (home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {json.dumps(dagster_url(dagster_dsn))}\ntelemetry:\n  enabled: false\n"
    )
    os.environ.update(
        LAKEHOUSE_PG_DSN=dsn,
        LAKEHOUSE_HOME=str(home),
        LAKEHOUSE_WAREHOUSE=(home / "warehouse").as_uri(),
        DAGSTER_HOME=str(home),
    )
    figures: dict = {}
    t = time.perf_counter()
    with connect(dsn) as conn:
        ws = datasets.create_workspace(conn, "bench")
        ids = [datasets.create_dataset(conn, ws, f"c{i:05d}", BENCH_SCHEMA) for i in range(n)]
        for d in ids:
            conn.execute(GENERATE, {"ds": d, "lo": 0, "hi": rows - 1})
        conn.execute("vacuum analyze dataset_rows")
    figures["write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    chunks = [[str(d) for d in ids[i::workers]] for i in range(workers)]
    pool = multiprocessing.get_context("spawn").Pool(workers)
    failed = sum(pool.map(_mirror_worker, chunks))
    pool.close()
    pool.join()
    figures["mirror_s"], figures["mirror_failed"] = time.perf_counter() - t, failed
    from lakehouse_dagster.flags import set_override

    with connect(dsn) as conn:
        set_override(conn, "read", "export.stream", "iceberg", note="fase1 global (bench)", actor="bench")
    return dsn, home, figures


def _mirror_worker(ids: list[str]) -> int:
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.batch import Failed, mirror_many

    settings = Settings.from_env()
    catalog = load_catalog(settings, settings.postgres.dsn)
    return sum(
        isinstance(r, Failed) for r in mirror_many(settings.postgres.dsn, catalog, settings, ids, run_id="bench")
    )


def _instance(home: Path):
    import dagster as dg

    return dg.DagsterInstance.from_config(str(home))


def _resources(dsn: str) -> dict:
    from lakehouse_dagster.dagster.defs.resources import LakehouseResource

    return {"lakehouse": LakehouseResource(pg_dsn=dsn)}


def _tick(instance, dsn: str):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.parity.canary_schedule import parity_canary_schedule

    t = time.perf_counter()
    ctx = dg.build_schedule_context(instance=instance, resources=_resources(dsn))
    out = parity_canary_schedule(ctx)
    return out, time.perf_counter() - t


def _batch_worker(request: dict) -> dict:
    """One canary batch run, in its own process, on the shared instance."""
    from lakehouse_dagster.dagster.defs.parity.canary_batch import parity_canary_batch_job

    dsn, home = os.environ["LAKEHOUSE_PG_DSN"], Path(os.environ["DAGSTER_HOME"])
    with _instance(home) as instance:
        t = time.perf_counter()
        result = parity_canary_batch_job.execute_in_process(
            run_config={**request["run_config"], **QUIET},
            tags=request["tags"],
            resources=_resources(dsn),
            instance=instance,
            raise_on_error=False,
        )
        return {"success": result.success, "seconds": time.perf_counter() - t, "n": request["n"]}


def _as_dicts(requests) -> list[dict]:
    out = []
    for r in requests:
        config = r.run_config
        config = config.to_config_dict() if hasattr(config, "to_config_dict") else config
        out.append(
            {
                "run_config": config,
                "tags": dict(r.tags),
                "n": len(config["ops"]["check_datasets"]["config"]["datasets"]),
            }
        )
    return out


def _round(requests: list[dict], workers: int) -> dict:
    t = time.perf_counter()
    pool = multiprocessing.get_context("spawn").Pool(workers)
    results = pool.map(_batch_worker, requests, chunksize=1)
    pool.close()
    pool.join()
    wall = time.perf_counter() - t
    n = sum(r["n"] for r in results)
    return {
        "wall_s": wall,
        "datasets": n,
        "runs": len(results),
        "failed_runs": sum(not r["success"] for r in results),
        "run_seconds": sum(r["seconds"] for r in results),
    }


def _verdicts(dsn: str) -> dict:
    from lakehouse_dagster.core.db import connect

    with connect(dsn) as conn:
        return dict(
            conn.execute(
                "select verdict || ':' || coalesce(detail->>'digest', '?'), count(*) from lakehouse_read_parity"
                " where source = 'schedule' group by 1"
            ).fetchall()
        )


def _old_path(instance, dsn: str, sample: list[str]) -> dict:
    """The old schedule's unit of work: one parity_canary_job run per dataset (in process, no start-up)."""
    import dagster as dg

    from lakehouse_dagster.dagster.defs.mirror.assets import iceberg_dataset_table, pg_dataset_rows
    from lakehouse_dagster.dagster.defs.parity.canary_schedule import PARTITION_TAG, parity_canary_job
    from lakehouse_dagster.dagster.defs.parity.checks import CANARY_TAG, identity_ready, parity, snapshot_freshness

    job = dg.Definitions(
        assets=[pg_dataset_rows, iceberg_dataset_table],
        asset_checks=[parity, snapshot_freshness, identity_ready],
        jobs=[parity_canary_job],
        resources=_resources(dsn),
    ).resolve_job_def(parity_canary_job.name)
    job.execute_in_process(instance=instance, run_config=QUIET, tags={PARTITION_TAG: sample[0], CANARY_TAG: "schedule"})
    t = time.perf_counter()
    failed = 0
    for d in sample[1:]:
        r = job.execute_in_process(
            instance=instance, run_config=QUIET, tags={PARTITION_TAG: d, CANARY_TAG: "schedule"}, raise_on_error=False
        )
        failed += not r.success
    return {"per_dataset_s": (time.perf_counter() - t) / (len(sample) - 1), "failed_runs": failed}


def _alerts(dsn: str, rows: int, lagging: int) -> dict:
    """One lakehouse_alerts tick's core (status/alerts.run_tick) at this many flipped datasets: with nothing to report,
    then with the mirror stopped for ``lagging`` of them (threshold 1 s), tick after tick until all are posted to a
    receiver on 127.0.0.1."""
    import datetime as dt
    import http.server
    import threading

    from bench._common import GENERATE
    from lakehouse_dagster.core.db import connect
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.status import alerts

    got: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            got.append(len(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = Settings.from_env().replace(
        alerts={"webhook_url": f"http://127.0.0.1:{server.server_port}/bench"}, mirror={"lagging_after_seconds": 1}
    )
    out: dict = {}
    with connect(dsn) as conn:
        cursor = alerts.Cursor()
        t = time.perf_counter()
        tick = alerts.run_tick(conn, settings, cursor, [], now=dt.datetime.now(dt.UTC))
        out["quiet_s"], cursor = time.perf_counter() - t, tick.cursor
        ids = [r[0] for r in conn.execute("select id from datasets order by name limit %s", (lagging,)).fetchall()]
        for d in ids:  # the mirror is not running: each of them moves past its Iceberg view
            conn.execute(GENERATE, {"ds": d, "lo": rows, "hi": rows})
        time.sleep(1.5)
        out["ticks"] = []
        for _ in range(1000):
            t = time.perf_counter()
            tick = alerts.run_tick(conn, settings, cursor, [], now=dt.datetime.now(dt.UTC))
            cursor = tick.cursor
            d = tick.delivery or alerts.Delivery()
            out["ticks"].append((time.perf_counter() - t, sum(tick.new.values()), d.posted, d.messages))
            if not d.pending:
                break
    server.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=20)
    ap.add_argument("--sample", type=int, default=40, help="datasets the old one-run-per-dataset path checks")
    ap.add_argument("--workers", type=int, default=2, help="canary runs at once (dagster.yaml: 2)")
    ap.add_argument("--lagging", type=int, default=1000, help="datasets the alerts step lets fall behind")
    args = ap.parse_args()
    from bench._common import admin_dsn

    admin = admin_dsn()
    dsn, home, setup = _setup(admin, args.n, args.rows, args.workers)
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.dagster.defs.shared.partitions import datasets_partitions

    settings = Settings.from_env()
    print(
        f"setup: {args.n} datasets of {args.rows} rows written in {setup['write_s']:.0f} s, mirrored in "
        f"{setup['mirror_s']:.0f} s ({setup['mirror_failed']} failed); flipped globally. Schedule settings: "
        f"batch {settings.parity.canary_batch_size}, cap {settings.parity.canary_max_per_tick} per tick, "
        f"{settings.parity.canary_max_runs} canary runs in flight at most; {args.workers} run(s) at once",
        flush=True,
    )
    from lakehouse_dagster.core.db import connect

    with connect(dsn) as conn:
        ids = [str(r[0]) for r in conn.execute("select id from datasets order by name").fetchall()]
    instance = _instance(home)  # the main process's, for its whole life (Dagster's load context refers to it)
    instance.add_dynamic_partitions(datasets_partitions.name, ids)

    first, tick_s = _tick(instance, dsn)
    reqs = _as_dicts(first)
    print(f"tick 1: {len(reqs)} run(s), {sum(r['n'] for r in reqs)} datasets, tick {tick_s:.2f} s", flush=True)
    r1 = _round(reqs, args.workers)
    print(
        f"first round (maintained digests registered + filled): {r1['datasets']} datasets in {r1['wall_s']:.0f} s "
        f"({r1['datasets'] / r1['wall_s']:.1f}/s), {r1['failed_runs']} failed run(s); verdicts {_verdicts(dsn)}",
        flush=True,
    )

    sample = ids[:: max(1, len(ids) // args.sample)][: args.sample]
    old = _old_path(instance, dsn, sample)
    print(
        f"old path: {old['per_dataset_s'] * 1000:.0f} ms per dataset, one parity_canary_job run each, in process "
        f"({len(sample) - 1} datasets, {old['failed_runs']} failed)",
        flush=True,
    )

    second, tick2_s = _tick(instance, dsn)
    reqs2 = _as_dicts(second)
    import dagster as dg

    from lakehouse_dagster.dagster.defs.parity.canary_batch import parity_canary_batch_job

    job = dg.Definitions(jobs=[parity_canary_batch_job], resources=_resources(dsn)).resolve_job_def(
        parity_canary_batch_job.name
    )
    held = [  # what the daemon holds between a tick and the runs' start
        instance.create_run_for_job(
            job, run_config=r["run_config"], tags=r["tags"], status=dg.DagsterRunStatus.NOT_STARTED
        )
        for r in reqs2
    ]
    third, tick3_s = _tick(instance, dsn)
    third_n = 0 if not isinstance(third, list) else sum(r["n"] for r in _as_dicts(third))
    why = third.skip_message if not isinstance(third, list) else ""
    print(
        f"tick 2: {len(reqs2)} run(s), {sum(r['n'] for r in reqs2)} datasets (oldest verdicts first), tick {tick2_s:.2f} s; "
        f"tick 3 while they are in flight: {third_n} datasets requested ({why}), tick {tick3_s:.2f} s",
        flush=True,
    )
    for run in held:
        instance.delete_run(run.run_id)
    r2 = _round(reqs2, args.workers)
    per_batch = r2["run_seconds"] / r2["datasets"]
    print(
        f"steady round (maintained digests): {r2['datasets']} datasets in {r2['wall_s']:.0f} s "
        f"({r2['datasets'] / r2['wall_s']:.1f}/s), {r2['failed_runs']} failed run(s); verdicts {_verdicts(dsn)}",
        flush=True,
    )
    al = _alerts(dsn, args.rows, args.lagging)
    first_tick = al["ticks"][0]
    print(
        f"alerts tick at {args.n} flipped datasets, nothing to report: {al['quiet_s']:.2f} s; the mirror stopped for "
        f"{args.lagging} of them: first tick {first_tick[0]:.2f} s ({first_tick[1]} events recorded, {first_tick[2]} "
        f"posted in {first_tick[3]} messages); all {sum(x[2] for x in al['ticks'])} posted in {len(al['ticks'])} "
        f"tick(s), slowest {max(x[0] for x in al['ticks']):.2f} s",
        flush=True,
    )
    print(
        f"\nwithin one period ({PERIOD_S} s): first round {r1['wall_s'] / PERIOD_S:.2f}x of it, steady round "
        f"{r2['wall_s'] / PERIOD_S:.2f}x of it"
    )
    print(
        f"per dataset inside a run: batch {per_batch * 1000:.0f} ms, old path {old['per_dataset_s'] * 1000:.0f} ms "
        f"→ old / batch = {old['per_dataset_s'] / per_batch:.1f}x (the old path's run start-up and queue not counted)"
    )
    print(
        f"old path over {r2['datasets']} datasets at 4 runs at once, start-up not counted: "
        f"{r2['datasets'] * old['per_dataset_s'] / 4:.0f} s = {r2['datasets'] * old['per_dataset_s'] / 4 / PERIOD_S:.2f}x "
        "the period, every run holding one of the instance's four run slots"
    )


if __name__ == "__main__":
    main()
