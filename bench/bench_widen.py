"""Benchmark (not a test): what the widening rules add to the flip gate, against the gate without them.

    .venv/bin/python bench/bench_widen.py [--datasets 10000] [--repeat 3]

A throwaway embedded Postgres (deleted on exit) gets N datasets in 20 workspaces; every reader Iceberg
can serve is flipped at workspace scope, one dataset per workspace also at dataset scope, and a tenth of
the datasets carry an incident (a read fallback); graph.kuzu is iceberg_only in half the workspaces. Then the same gated checks run (``check_change``,
which writes nothing) with the soak off (LAKEHOUSE_SOAK_SECONDS=0: the gate as it was) and on:
  * a global graph.kuzu iceberg_only widen (the soak of 10 workspace flips over their datasets);
  * a global sync.full write flip (prerequisite #1 with soak: every reader's effective mode replayed
    from the audit for every dataset, plus the incidents).
Figures are ratios against the soak-off run of the same check in the same process.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.core.embedded import start_embedded  # noqa: E402
from lakehouse_dagster.core.errors import FlipRefused  # noqa: E402
from lakehouse_dagster.flags.gates import check_change  # noqa: E402
from lakehouse_dagster.flags.overrides import Scope  # noqa: E402
from lakehouse_dagster.flags.registry import READ, READERS, WRITE, get_flag, rank  # noqa: E402
from lakehouse_dagster.schema.migrate import migrate  # noqa: E402

SERVABLE = [r.name for r in READERS.values() if rank(READ, r.ceiling) >= rank(READ, "iceberg")]


def _seed(conn, n: int) -> None:
    with conn.transaction():
        conn.execute(
            "insert into workspaces (id, name) select gen_random_uuid(), 'ws' || g from generate_series(1, 20) g"
        )
        conn.execute(
            "insert into datasets (workspace_id, name) select w.id, 'd' || g from generate_series(1, %s) g"
            " join (select id, row_number() over () - 1 as i from workspaces) w on w.i = g %% 20",
            (n,),
        )
        for name in SERVABLE:  # workspace flips, audited, 2 hours ago; one dataset flip per workspace 3 hours ago
            for sql in (
                "insert into lakehouse_flag_audit (at, action, kind, name, scope, scope_id, after_mode, actor)"
                " select now() - interval '3 hours', 'set', 'read', %(n)s, 'dataset', min(id::text)::uuid, 'iceberg',"
                " 'bench' from datasets group by workspace_id",
                "insert into lakehouse_flag_audit (at, action, kind, name, scope, scope_id, after_mode, actor)"
                " select now() - interval '2 hours', 'set', 'read', %(n)s, 'workspace', id, 'iceberg', 'bench'"
                " from workspaces",
                "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, set_by)"
                " select 'read', name, scope, scope_id, after_mode, actor from lakehouse_flag_audit where name = %(n)s",
            ):
                conn.execute(sql, {"n": name})
        # graph.kuzu goes on to iceberg_only in half the workspaces (90 minutes ago): a global iceberg_only
        # widen moves the other half and has 10 narrower flips to soak
        conn.execute(
            "insert into lakehouse_flag_audit (at, action, kind, name, scope, scope_id, before_mode,"
            " after_mode, actor) select now() - interval '90 minutes', 'set', 'read', 'graph.kuzu',"
            " 'workspace', id, 'iceberg', 'iceberg_only', 'bench' from workspaces order by id limit 10"
        )
        conn.execute(
            "update lakehouse_flag_overrides o set mode = 'iceberg_only' from (select id from workspaces"
            " order by id limit 10) w where o.name = 'graph.kuzu' and o.scope = 'workspace' and o.scope_id = w.id"
        )
        conn.execute(
            "insert into lakehouse_read_fallbacks (reader, dataset_id, error, at)"
            " select 'export.stream', id, 'IOError: bench', now() - interval '30 minutes'"
            " from datasets where hashtext(id::text) % 10 = 0"
        )


def _once(fn) -> float:
    t0 = time.perf_counter()
    try:
        fn()
    except FlipRefused:
        pass
    return time.perf_counter() - t0


def _pair(off, on, repeat: int) -> tuple[float, float]:
    """Best of ``repeat`` each, alternating which goes first (a warm cache must not favour either)."""
    a, b = [], []
    for i in range(repeat * 2):
        if i % 2:
            b.append(_once(on)), a.append(_once(off))
        else:
            a.append(_once(off)), b.append(_once(on))
    return min(a), min(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lh-bench-"))
    dsn = start_embedded(root / "pg", keep_running=False, delete_on_exit=True)
    with connect(dsn) as conn:
        migrate(conn)
        _seed(conn, args.datasets)
        cases = [
            ("global read widen (graph.kuzu iceberg_only)", get_flag(READ, "graph.kuzu"), "iceberg_only"),
            ("global write flip (sync.full iceberg_native)", get_flag(WRITE, "sync.full"), "iceberg_native"),
        ]
        print(f"{args.datasets} datasets in 20 workspaces; best of {args.repeat * 2}, alternating")
        print(f"{'check':48} {'soak off':>10} {'soak on':>10} {'ratio':>7}")
        for label, flag, mode in cases:
            off, on = _pair(
                lambda: check_change(conn, flag, Scope("global", None), mode, soak_seconds=0),
                lambda: check_change(conn, flag, Scope("global", None), mode, soak_seconds=3600),
                args.repeat,
            )
            print(f"{label:48} {off:9.3f}s {on:9.3f}s {on / off:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
