"""Benchmark (not a test): one rollout_controller tick with 10,000 datasets and 10 live plans, against a tick with
one plan and with none, in the same process.

    .venv/bin/python bench/bench_rollout_controller.py [--datasets 10000] [--plans 10] [--repeat 5]

A throwaway embedded Postgres (deleted on exit) gets N datasets in 20 workspaces, each with a succeeded mirror sync
and an ok verdict, and a tenth with a read fallback an hour ago. The plans are written straight into the plan tables
in the phases that cost the most per tick: soaking after a global stage (every dataset moved: the incident queries
run over all of them), analysing (an analysis run in flight), flipping (flip runs in flight) and waiting for an
approval; readers and writers alternate (a writer's soak adds the native-safety check). The plan tables hold one
live plan per reader or writer (9 can flip); the scratch database drops that index to hold 10. The run lookup is
a dictionary (what the sensor's one ``instance.get_runs`` per plan in flight returns), so the figure is the
controller's own work: plan state, incidents, Postgres round trips.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.embedded import start_embedded  # noqa: E402
from lakehouse_dagster.core.settings import Settings  # noqa: E402
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, SERVABLE_READERS  # noqa: E402
from lakehouse_dagster.plans import analysis, controller  # noqa: E402
from lakehouse_dagster.plans.spec import Analysis, Plan, Stage  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402

PHASES = [
    "soaking",
    "soaking",
    "soaking",
    "analyzing",
    "flipping",
    "soaking",
    "analyzing",
    "flipping",
    "waiting",
    "waiting",
]


def _seed(conn, n: int) -> list[uuid.UUID]:
    with conn.transaction():
        conn.execute(
            "insert into workspaces (id, name) select gen_random_uuid(), 'ws' || g from generate_series(1, 20) g"
        )
        conn.execute(
            "insert into datasets (workspace_id, name) select w.id, 'd' || g from generate_series(1, %s) g"
            " join (select id, row_number() over () - 1 as i from workspaces) w on w.i = g %% 20",
            (n,),
        )
        conn.execute(
            "insert into iceberg_sync_log (sync_id, dataset_id, writer, path, status, rows, snapshot_id, has_identity,"
            " source_version, started_at, finished_at) select gen_random_uuid(), id, 'sync.full', 'mirror', 'succeeded',"
            " 0, 1, true, rows_version, now() - interval '2 hours', now() - interval '2 hours' from datasets"
        )
        conn.execute(
            "insert into lakehouse_read_parity (dataset_id, verdict, source, pg_version, checked_at)"
            " select id, 'ok', 'bench', rows_version, now() - interval '90 minutes' from datasets"
        )
        conn.execute(  # prerequisite #1 holds everywhere: a writer plan's datasets pass the gates (the costly path)
            "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
            " select 'read', unnest(%s::text[]), 'global', null, 'iceberg', 'bench'",
            ([r.name for r in SERVABLE_READERS],),
        )
        conn.execute(
            "insert into lakehouse_read_fallbacks (reader, dataset_id, error, at) select 'export.stream', id,"
            " 'IOError: bench', now() - interval '1 hour' from datasets where hashtext(id::text) % 10 = 0"
        )
        conn.execute("drop index lakehouse_rollout_plans_live_idx")
    return [r[0] for r in conn.execute("select id from datasets").fetchall()]


def _plans(conn, ids: list[uuid.UUID], count: int) -> dict[uuid.UUID, str]:
    """``count`` plans in the costly phases; returns {plan id: the step key in flight}."""
    flags = [("read", r.name, "iceberg") for r in SERVABLE_READERS] + [
        ("write", w.name, "iceberg_native") for w in FLIPPABLE_WRITERS
    ]
    in_flight = {}
    for i in range(count):
        kind, name, mode = flags[i % len(flags)]
        phase = PHASES[i % len(PHASES)]
        stages = (Stage("global", soak=3600, approval=phase == "waiting"),)  # a writer soaking at i=5
        plan = Plan(kind, name, mode, stages)
        plan_id = uuid.uuid4()
        change = {
            "stage": 0,
            "step_key": "stage0:global:all",
            "scope": "global",
            "scope_id": None,
            "mode": mode,
            "before": None,
        }
        rendered = {"stages": [{"changes": [change]}]}
        moved = ids if phase == "soaking" else ids[:500]
        with conn.transaction():
            conn.execute(
                "insert into lakehouse_rollout_plans (id, kind, name, mode, spec, rendered, phase, created_by)"
                " values (%s, %s, %s, %s, %s, %s, %s, 'bench')",
                (plan_id, kind, name, mode, Jsonb(plan.as_dict()), Jsonb(rendered), phase),
            )
            conn.execute(
                "insert into lakehouse_rollout_stages (plan_id, stage, flipped_at, moved) values (%s, 0, %s, %s)",
                (plan_id, None if phase in ("waiting", "flipping") else "now", moved),
            )
            if phase == "soaking":  # what its global stage did: the flag set, so a writer's datasets are native
                conn.execute(
                    "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
                    " values (%s, %s, 'global', null, %s, 'bench') on conflict do nothing",
                    (kind, name, mode),
                )
            if phase != "waiting":
                conn.execute(
                    "insert into lakehouse_rollout_steps (plan_id, step_key, stage, kind, job, config, status, moved)"
                    " values (%s, 'stage0:global:all', 0, 'flip', 'read_flip', %s, %s, %s)",
                    (
                        plan_id,
                        Jsonb({"scope": "global", "scope_id": None}),
                        "requested" if phase == "flipping" else "succeeded",
                        moved,
                    ),
                )
            if phase == "analyzing":
                conn.execute(
                    "insert into lakehouse_rollout_steps (plan_id, step_key, stage, kind, job, config, moved)"
                    " values (%s, 'stage0:analysis:1', 0, 'analysis', 'rollout_analysis', '{}', %s)",
                    (plan_id, moved[:20]),
                )
                in_flight[plan_id] = "stage0:analysis:1"
            elif phase == "flipping":
                in_flight[plan_id] = "stage0:global:all"
    return in_flight


def _tick(conn, settings, in_flight) -> tuple[float, controller.TickResult]:
    def lookup(plan_id):
        key = in_flight.get(plan_id)
        return {key: controller.RunState("bench-run", controller.IN_FLIGHT)} if key else {}

    t0 = time.perf_counter()
    result = controller.tick(conn, settings, lookup)
    return time.perf_counter() - t0, result


def _measure(conn, settings, in_flight, repeat: int) -> float:
    _tick(conn, settings, in_flight)  # warm: prepared statements, caches
    return statistics.median(_tick(conn, settings, in_flight)[0] for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=10_000)
    parser.add_argument("--plans", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    dsn = start_embedded(
        Path(tempfile.mkdtemp(prefix="lh-bench-rollout-")) / "pg", keep_running=False, delete_on_exit=True
    )
    os.environ["LAKEHOUSE_SOAK_SECONDS"] = "0"  # (the native-safety check reads the project's soak itself)
    settings = Settings.from_env().replace(postgres={"dsn": dsn}, rollout={"soak_seconds": 0})
    with connect(dsn) as conn:
        migrate(conn)
        t0 = time.perf_counter()
        ids = _seed(conn, args.datasets)
        print(f"seeded {len(ids)} datasets in {time.perf_counter() - t0:.1f} s")
        none = _measure(conn, settings, {}, args.repeat)
        one = _measure(conn, settings, _plans(conn, ids, 1), args.repeat)
        conn.execute("delete from lakehouse_rollout_plans")
        in_flight = _plans(conn, ids, args.plans)
        many = _measure(conn, settings, in_flight, args.repeat)
        _, result = _tick(conn, settings, in_flight)
        writer = conn.execute(
            "select p.id, p.name, s.flipped_at from lakehouse_rollout_plans p join lakehouse_rollout_stages s"
            " on s.plan_id = p.id where p.kind = 'write' and p.phase = 'soaking' limit 1"
        ).fetchone()
        t0 = time.perf_counter()
        found = analysis.incidents(conn, writer[0], "write", writer[1], writer[2], Analysis(), 3600, native_safety=True)
        native = time.perf_counter() - t0
        states = conn.execute(
            "select state || ' ' || phase, count(*) from lakehouse_rollout_plans group by 1 order by 1"
        ).fetchall()
        reasons = [r[0] for r in conn.execute("select reason from lakehouse_rollout_plans where reason is not null")]
    print(f"plans after the ticks: {dict(states)}; asked for {len(result.asks)} run(s)")
    if reasons:  # every plan must still be live, or the figure leaves its work out
        raise SystemExit(f"a plan left its phase during the bench: {reasons}")
    print(f"tick, no live plan:        {none * 1000:8.1f} ms")
    print(f"tick, 1 plan (soaking, {len(ids)} datasets moved): {one * 1000:8.1f} ms  ({one / none:.1f}x no plan)")
    print(f"tick, {args.plans} plans:              {many * 1000:8.1f} ms  ({many / one:.1f}x one plan)")
    print(
        f"a writer's native-safety check at its analysis ({len(ids)} datasets native): {native * 1000:.0f} ms "
        f"({native / many:.1f}x a tick of {args.plans} plans; {'a finding' if found else 'no finding'})"
    )


if __name__ == "__main__":
    main()
