"""Benchmark (not a test): what the lifecycle adds to a flip and to a write (issue 42's targets: ≤ 5 ms p50 to flips
and ingests), same run, against the same work without it.

    .venv/bin/python bench/bench_lifecycle_cost.py [--datasets 200] [--repeat 200]

* a flip: ``set_override`` of one writer at dataset scope (what every gated flip ends in), with its lifecycle
  transition, against the same override write and audit row in a plain transaction (the flip as it was);
* a write's authority check: the pg path's shared locks + the stored-state read in the write's transaction,
  against the same transaction without them (one ``select 1``).
Prints p50 / p95 of each and the difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.lifecycle import write_lock_statements  # noqa: E402
from lakehouse_dagster.tracking import datasets as app  # noqa: E402

PLAIN = (
    "insert into lakehouse_flag_overrides (kind, name, scope, scope_id, mode, note, set_by, set_at)"
    " values ('write', 'sync.full', 'dataset', %s, %s, 'bench', 'bench', now())"
    " on conflict (kind, name, scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid))"
    " do update set mode = excluded.mode, set_at = now()"
)
AUDIT = (
    "insert into lakehouse_flag_audit (action, kind, name, scope, scope_id, before_mode, after_mode, note, actor)"
    " values ('set', 'write', 'sync.full', 'dataset', %s, null, %s, 'bench', 'bench')"
)


def pct(xs: list[float], p: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    dsn = fresh_database(admin_dsn(), "lh_bench_lifecycle_cost")
    with connect(dsn) as conn:
        ws = app.create_workspace(conn, "bench")
        ids = [app.create_dataset(conn, ws, f"d{i}", [{"name": "a", "type": "int64"}]) for i in range(args.datasets)]
        lifecycle_of(conn, ids)
        plain, moved, bare, checked = [], [], [], []
        for i in range(args.repeat):
            d = ids[i % len(ids)]
            mode = "pg"  # no move: what asking the lifecycle costs a flip (a move adds one row and its history row)
            t = time.perf_counter()
            with conn.transaction():
                conn.execute(PLAIN, (d, mode))
                conn.execute(AUDIT, (d, mode))
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            set_override(conn, "write", "sync.full", mode, dataset=d, note="bench", actor="bench")
            moved.append(time.perf_counter() - t)
            t = time.perf_counter()
            with conn.transaction():
                conn.execute("select 1")
            bare.append(time.perf_counter() - t)
            t = time.perf_counter()
            with conn.transaction():
                for stmt in write_lock_statements(d):
                    conn.execute(stmt).fetchall()
            checked.append(time.perf_counter() - t)
    print(f"{args.repeat} flips over {args.datasets} datasets, on this machine (ms):")
    print(f"  flip without the lifecycle  p50 {pct(plain, 0.5):.2f}  p95 {pct(plain, 0.95):.2f}")
    print(f"  flip with its transition    p50 {pct(moved, 0.5):.2f}  p95 {pct(moved, 0.95):.2f}")
    print(f"  → the lifecycle adds        p50 {pct(moved, 0.5) - pct(plain, 0.5):.2f} ms (target ≤ 5)")
    print(f"  write transaction bare      p50 {pct(bare, 0.5):.2f}  p95 {pct(bare, 0.95):.2f}")
    print(f"  with the authority check    p50 {pct(checked, 0.5):.2f}  p95 {pct(checked, 0.95):.2f}")
    print(f"  → the check adds            p50 {pct(checked, 0.5) - pct(bare, 0.5):.2f} ms (target ≤ 5)")
    print(f"  (mean flip {statistics.mean(moved) * 1000:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
