"""Benchmark (not a test): what a lakehouse_recorder tick costs, against an idle tick of the same recorder in the
same run.

    nice .venv/bin/python bench/bench_recorder.py [--datasets 10000] [--cap 50]

A throwaway embedded Postgres (deleted on exit) holds ``--datasets`` tabular datasets in 10 workspaces, each with
one succeeded sync log row (a synthetic snapshot: the tick reads Postgres and the Dagster instance, never a table),
and a Dagster instance on Postgres storage in its own database. Timed, with the sensor evaluated as the daemon
does (``build_sensor_context`` on the instance) and its events then reported on the instance (the daemon's part,
timed apart):

1. idle: a tick with nothing new (the baseline);
2. catch-up: ticks until every dataset's first materialization is recorded (``--cap`` per tick: the first pass);
3. busy: ``--cap`` datasets synced again at once, then one tick;
4. flags: ``--cap`` dataset-scope flag changes, then one tick;
5. prune: the comparison of every partition with the datasets (every 5 minutes), 1% of the datasets deleted.

Each line gives seconds per tick (sensor evaluation; the daemon's reporting of the events) and the ratio to the
idle tick. The sensor must finish in Dagster's 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from bench._common import admin_dsn  # noqa: E402
from lakehouse_dagster.cli.dsn import dagster_url  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.dagster.defs.recording.recorder import lakehouse_recorder  # noqa: E402
from lakehouse_dagster.dagster.defs.resources import LakehouseResource  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402
from lakehouse_dagster.testing.pg import with_db  # noqa: E402

SYNCED = """
insert into iceberg_sync_log (dataset_id, sync_id, writer, path, mode, status, rows, bytes, snapshot_id,
                              has_identity, source_version, started_at, finished_at, table_location)
select d.id, gen_random_uuid(), 'sync.full', 'mirror', 'full', 'succeeded', 1000, 65536,
       (random() * 9e18)::bigint, true, d.rows_version, now() - interval '1 second', now(),
       'file:///bench/warehouse/lakehouse.db/ds_' || replace(d.id::text, '-', '')
  from datasets d where d.id = any(%s::uuid[])
"""


def _database(admin: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    return with_db(admin, name)


class Ticks:
    def __init__(self, instance, dsn):
        self.instance, self.dsn, self.cursor = instance, dsn, None

    def tick(self, prune: bool = False) -> tuple[float, float, int]:
        """(seconds in the sensor, seconds reporting its events as the daemon does, events)."""
        cursor = self.cursor
        if cursor and not prune:
            c = json.loads(cursor)
            c["pruned_at"] = time.time()
            cursor = json.dumps(c)
        elif cursor:
            c = json.loads(cursor)
            c["pruned_at"] = 0.0
            cursor = json.dumps(c)
        ctx = dg.build_sensor_context(
            instance=self.instance, cursor=cursor, resources={"lakehouse": LakehouseResource(pg_dsn=self.dsn)}
        )
        t0 = time.perf_counter()
        result = lakehouse_recorder(ctx)
        t1 = time.perf_counter()
        for e in result.asset_events:
            self.instance.report_runless_asset_event(e)
        for r in result.dynamic_partitions_requests or []:
            if isinstance(r, dg.AddDynamicPartitionsRequest):
                self.instance.add_dynamic_partitions(r.partitions_def_name, list(r.partition_keys))
            else:
                for k in r.partition_keys:
                    self.instance.delete_dynamic_partition(r.partitions_def_name, k)
        t2 = time.perf_counter()
        self.cursor = result.cursor
        return t1 - t0, t2 - t1, len(result.asset_events)


def main() -> int:
    """Long on purpose: the five measurements in the order they build on each other, each printed as it ends."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=10_000)
    p.add_argument("--cap", type=int, default=50)
    args = p.parse_args()
    admin = admin_dsn()
    dsn = _database(admin, "bench_rec")
    home = Path(tempfile.mkdtemp(prefix="lh-bench-dg-"))
    dagster_dsn = _database(admin, "bench_dg")
    (home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {json.dumps(dagster_url(dagster_dsn))}\ntelemetry:\n  enabled: false\n"
    )
    os.environ.update(
        {
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_RECORDER_MAX_EVENTS": str(args.cap),
            "LAKEHOUSE_WAREHOUSE": "file:///bench/warehouse",
            "LAKEHOUSE_ACTOR": "bench",
        }
    )
    with connect(dsn) as conn:
        migrate(conn)
        with conn.transaction():
            ws = [
                conn.execute("insert into workspaces (name) values (%s) returning id", (f"ws{i}",)).fetchone()[0]
                for i in range(10)
            ]
            ids = [
                r[0]
                for r in conn.execute(
                    "insert into datasets (workspace_id, name, kind, schema, row_count)"
                    " select (%s::uuid[])[1 + g %% 10], 'd' || g, 'tabular',"
                    ' \'[{"name": "n", "type": "int64"}]\', 1000 from generate_series(1, %s) g returning id',
                    (ws, args.datasets),
                ).fetchall()
            ]
            conn.execute(SYNCED, (ids,))
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            ticks = Ticks(instance, dsn)
            idle = []
            t = ticks.tick(prune=True)  # the first tick (pass 1 of the catch-up, and the first prune)
            rounds, sensor_s, report_s, events = 1, t[0], t[1], t[2]
            while True:
                s, r, n = ticks.tick()
                if n == 0:
                    break
                rounds, sensor_s, report_s, events = rounds + 1, sensor_s + s, report_s + r, events + n
            for _ in range(5):
                idle.append(ticks.tick()[0])
            base = statistics.median(idle)
            print(f"{args.datasets} datasets, {args.cap} changes of each kind per tick at most")
            print(f"idle tick: {base * 1000:.1f} ms (median of 5)")
            print(
                f"catch-up: {events} materializations in {rounds} ticks; per tick {sensor_s / rounds:.3f} s in the "
                f"sensor ({sensor_s / rounds / base:.0f}x idle) + {report_s / rounds:.3f} s reporting"
            )
            busy = ids[: args.cap]
            conn.execute(SYNCED, (busy,))
            s, r, n = ticks.tick()
            print(
                f"busy: {n} changed tables in one tick: {s:.3f} s in the sensor ({s / base:.0f}x idle) + {r:.3f} s reporting"
            )
            for d in busy:
                set_override(conn, "read", "export.stream", "shadow", dataset=d, note="bench", actor="bench")
            s, r, n = ticks.tick()
            print(
                f"flags: {n} flag changes in one tick: {s:.3f} s in the sensor ({s / base:.0f}x idle) + {r:.3f} s reporting"
            )
            gone = ids[-max(1, args.datasets // 100) :]
            with conn.transaction():
                conn.execute("delete from datasets where id = any(%s::uuid[])", (gone,))
            s, r, n = ticks.tick(prune=True)
            left = len(instance.get_dynamic_partitions("datasets"))
            print(
                f"prune: {len(gone)} of {args.datasets} partitions removed in one tick: {s:.3f} s in the sensor "
                f"({s / base:.0f}x idle) + {r:.3f} s deleting ({left} partitions left)"
            )
        finally:
            instance.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
