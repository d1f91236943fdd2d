"""Benchmark (not a test): the migration overview (status/overview.py) over 1,000 and 10,000 datasets.

    nice .venv/bin/python bench/bench_overview.py [--sizes 1000,10000] [--history 5] [--repeat 5] [--shadow 50]

A throwaway embedded Postgres (deleted on exit; or LAKEHOUSE_PG_DSN as admin) gets, per size N, a migrated database
with N datasets over 20 workspaces in a realistic mix: every dataset mirrored ``--history`` times (the sync log and
the parity table keep their history), 1% behind the mirror (half of them lagging), 1% never synced, 0.2% wedged,
an old failure of 10%, 0.1% MISMATCH, readers flipped globally (export.stream), per workspace (graph.kuzu
iceberg_only on a quarter of them) and per dataset (studio.digest on 10%), sync.full native on 5% and pipelines
reading 2%, dashboards.aggregate declared on 10% with ``--shadow`` comparisons each (issue 43's held list). Then,
best of
``--repeat``: ``compute_overview`` against a baseline measured in the same run on the same database — reading every
dataset's row once (``select id, name, workspace_id, rows_version from datasets``), the floor of anything that
looks at every dataset — with the number of statements each sent (psycopg's ``Cursor.execute`` counted), which must
not grow with N.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from bench._common import admin_dsn, fresh_database  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.settings import Settings  # noqa: E402
from lakehouse_dagster.status.overview import compute_overview  # noqa: E402

SEED = """
insert into workspaces (id, name) select gen_random_uuid(), 'ws' || g from generate_series(1, 20) g;
insert into datasets (id, workspace_id, name, kind, schema, row_count, rows_version)
select gen_random_uuid(), (select id from workspaces order by name offset (g %% 20) limit 1), 'd' || g, 'tabular',
       '[{"name": "n", "type": "int64"}]'::jsonb, 10, 100 + g
  from generate_series(1, %(n)s) g;
-- history: every dataset but the never-synced 1%% mirrored ``history`` times, the last one covering its version
insert into iceberg_sync_log (dataset_id, sync_id, status, rows, has_identity, source_version, started_at, finished_at)
select d.id, gen_random_uuid(), 'succeeded', 10, true, d.rows_version - (%(history)s - h),
       now() - (%(history)s - h) * interval '10 minutes' - interval '1 minute',
       now() - (%(history)s - h) * interval '10 minutes'
  from datasets d cross join generate_series(1, %(history)s) h
 where right(d.name, 2) <> '00';
insert into lakehouse_read_parity (dataset_id, verdict, source, pg_version, iceberg_version, checked_at, detail)
select d.id, case when h = %(history)s and right(d.name, 3) = '777' then 'MISMATCH' else 'ok' end, 'check',
       d.rows_version, d.rows_version, now() - (%(history)s - h) * interval '10 minutes',
       jsonb_build_object('reason', 'bench')
  from datasets d cross join generate_series(1, %(history)s) h
 where right(d.name, 2) <> '00';
-- 1%% behind (written after their last sync), half of those synced long ago (lagging)
update datasets set rows_version = rows_version + 1 where right(name, 2) = '50';
update iceberg_sync_log l set finished_at = finished_at - interval '1 day', started_at = started_at - interval '1 day'
  from datasets d where d.id = l.dataset_id and right(d.name, 3) in ('050', '250', '450', '650', '850');
-- 0.2%% wedged: their latest sync running for two hours (their history a day older)
update iceberg_sync_log l set finished_at = finished_at - interval '1 day', started_at = started_at - interval '1 day'
  from datasets d where d.id = l.dataset_id and right(d.name, 3) in ('123', '623');
insert into iceberg_sync_log (dataset_id, sync_id, status, started_at)
select id, gen_random_uuid(), 'running', now() - interval '2 hours' from datasets where right(name, 3) in ('123', '623');
-- an old failure of 10%% of the datasets, retried and succeeded since (the log keeps it)
insert into iceberg_sync_log (dataset_id, sync_id, status, started_at, finished_at, error)
select id, gen_random_uuid(), 'failed', now() - interval '3 days', now() - interval '3 days', 'bench'
  from datasets where right(name, 1) = '9';
-- pipelines reading 2%% of the datasets as input
insert into pipelines (workspace_id, name, spec)
select d.workspace_id, 'p' || d.name,
       jsonb_build_object('nodes', jsonb_build_array(jsonb_build_object('type', 'dataset',
                          'data', jsonb_build_object('datasetId', d.id::text))))
  from datasets d where right(d.name, 2) in ('07', '57');
-- flags: a global reader, a workspace-scope reader on a quarter of the workspaces, per-dataset overrides
insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by)
values ('read', 'export.stream', 'global', null, 'iceberg', 'bench', 'bench');
insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by)
select 'read', 'graph.kuzu', 'workspace', id, 'iceberg_only', 'bench', 'bench' from workspaces where name like '%%5';
insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by)
select 'read', 'studio.digest', 'dataset', id, 'iceberg', 'bench', 'bench' from datasets where right(name, 1) = '3';
insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by)
select 'write', 'sync.full', 'dataset', id, 'iceberg_native', 'bench', 'bench'
  from datasets where right(name, 2) in ('11', '31', '71', '91', '99');
-- held on Postgres (issue 43): dashboards.aggregate declared on 10%% (a fifth of those flipped to iceberg, so not
-- held), sdk.files.list on a workspace; ``shadow`` shadow comparisons per declared dataset, one mismatch in 1,000
insert into lakehouse_reader_datasets (reader, scope, scope_id, note, declared_by)
select 'dashboards.aggregate', 'dataset', id, 'bench', 'bench' from datasets where right(name, 1) = '4';
insert into lakehouse_reader_datasets (reader, scope, scope_id, note, declared_by)
select 'sdk.files.list', 'workspace', id, 'bench', 'bench' from workspaces where name = 'ws1';
insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by)
select 'read', 'dashboards.aggregate', 'dataset', id, 'iceberg', 'bench', 'bench'
  from datasets where right(name, 2) in ('04', '54');
insert into lakehouse_shadow_reads (reader, dataset_id, outcome, schema_digest, at)
select 'dashboards.aggregate', d.id, case when right(d.name, 3) = '444' and h = 7 then 'mismatch' else 'match' end,
       md5(d.schema::text), now() - h * interval '1 minute'
  from datasets d cross join generate_series(1, %(shadow)s) h where right(d.name, 1) = '4'
"""


class Statements:
    """Counts the statements psycopg sends (every ``execute`` goes through ``Cursor.execute``)."""

    def __init__(self) -> None:
        self.n = 0
        self._real = psycopg.Cursor.execute

    def __enter__(self):
        real, counter = self._real, self

        def counted(cur, *a, **kw):
            counter.n += 1
            return real(cur, *a, **kw)

        psycopg.Cursor.execute = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        psycopg.Cursor.execute = self._real  # type: ignore[method-assign]


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure(admin: str, n: int, history: int, repeat: int, shadow: int = 50) -> None:
    dsn = fresh_database(admin, f"bench_overview_{uuid.uuid4().hex[:8]}")
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn}, mirror={"lagging_after_seconds": 3600, "wedged_after_seconds": 3600}
    )
    with connect(dsn) as conn:
        t = time.perf_counter()
        for statement in SEED.strip().split(";\n"):
            conn.execute(statement, {"n": n, "history": history, "shadow": shadow})
        conn.execute("vacuum analyze")
        seeded = time.perf_counter() - t
        log_rows = conn.execute("select count(*) from iceberg_sync_log").fetchone()[0]
        verdicts = conn.execute("select count(*) from lakehouse_read_parity").fetchone()[0]
        compared = conn.execute("select count(*) from lakehouse_shadow_reads").fetchone()[0]
        baseline = _best(
            lambda: conn.execute("select id, name, workspace_id, rows_version from datasets").fetchall(), repeat
        )
        ov = compute_overview(conn, settings)  # warm (prepared statements, caches)
        with Statements() as counted:
            compute_overview(conn, settings)
        took = _best(lambda: compute_overview(conn, settings), repeat)
    print(
        f"{n:>6,} datasets ({log_rows:,} sync log rows, {verdicts:,} verdicts, {compared:,} shadow comparisons; seeded "
        f"in {seeded:.1f} s): "
        f"overview {took * 1000:.0f} ms in {counted.n} statements = {took / baseline:.1f}x reading every "
        f"dataset's row once ({baseline * 1000:.1f} ms); {ov.attention_total} need attention "
        f"({', '.join(f'{v} {k}' for k, v in ov.problems.items() if v)}), stages {ov.dataset_stages}; "
        f"{ov.held_total} held on Postgres {ov.held_by}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--history", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shadow", type=int, default=50, help="shadow comparisons per declared dataset")
    args = ap.parse_args()
    admin = admin_dsn()
    for n in (int(s) for s in args.sizes.split(",")):
        measure(admin, n, args.history, args.repeat, args.shadow)
    return 0


if __name__ == "__main__":
    sys.exit(main())
