"""Benchmark (not a test): the lifecycle model (lakehouse_dagster/testing/lifecycle_model/) over many random
sequences, seeded, each of up to --steps steps, against a throwaway embedded Postgres; prints sequences, steps,
violations (0, or the first one with its shrunk sequence) and the time.

    .venv/bin/python bench/bench_lifecycle_model.py [--sequences 10000] [--steps 25] [--seed 1] [--rounds 1]
        [--iceberg]

--iceberg runs the model with native writes into real Iceberg tables and the live app's raw statements
(LifecycleWithIceberg; a table per dataset, so about 20x slower per sequence) . Both print how often each kind of move happened (``seen``: plan flips, aborts, interrupted
verbs, ingests...).

Each round runs --sequences sequences with its own seed (--seed + round), so rounds add new sequences instead of
repeating; the same seed draws the same sequences again (before branch lifecycle-tail it did not: the seed never reached
hypothesis). A round that fails prints the first step that raised, with the steps before it and its traceback, whatever
hypothesis reports after its replay ("Flaky", "Inconsistent data generation"). The figures go to docs/benchmarks.md
(The lifecycle model).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database  # noqa: E402
from lakehouse_dagster.testing import lifecycle_model  # noqa: E402


def _seen() -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(lifecycle_model.Lifecycle.seen.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--iceberg", action="store_true", help="native writes into real tables, raw app statements")
    args = ap.parse_args()
    # the verbs' own lines (auto-rollback's report per MISMATCH the model records): thousands; the oracle judges them
    logging.getLogger("lakehouse_dagster").setLevel(logging.CRITICAL)
    dsn = fresh_database(admin_dsn(), "lh_bench_lifecycle")
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.lake.catalog import load_catalog

    where = Path(tempfile.mkdtemp(prefix="lh_bench_lifecycle_"))
    (where / "warehouse").mkdir()
    os.environ.update(
        LAKEHOUSE_PG_DSN=dsn, LAKEHOUSE_HOME=str(where / "home"), LAKEHOUSE_WAREHOUSE=(where / "warehouse").as_uri()
    )
    settings = Settings.from_env()  # the plans' controller reads them in both models
    lake: dict = {"settings": settings}
    if args.iceberg:
        lake |= {"catalog": load_catalog(settings, dsn), "lake_settings": settings}
    total = 0.0
    for r in range(args.rounds):
        started = time.perf_counter()
        try:
            lifecycle_model.run(dsn, examples=args.sequences, steps=args.steps, seed=args.seed + r, **lake)
        except BaseException as exc:  # the violation, as hypothesis shrank it
            print(f"round {r} (seed {args.seed + r}): VIOLATION after {time.perf_counter() - started:.0f} s: {exc}")
            first = lifecycle_model.first_failure()  # what failed first, before hypothesis replayed it
            print(f"  first failure {first}" if first else "  no step raised (hypothesis itself stopped)")
            print("  seen so far: " + _seen(), flush=True)
            return 1
        took = time.perf_counter() - started
        total += took
        print(
            f"round {r} (seed {args.seed + r}): {args.sequences} sequences of up to {args.steps} steps, "
            f"0 violations, {took:.0f} s ({args.sequences / took:.1f} sequences/s)",
            flush=True,
        )
        print("  seen so far: " + _seen(), flush=True)  # a run stopped at its deadline keeps its figures
    print(f"all: {args.sequences * args.rounds} sequences, 0 violations, {total:.0f} s")
    print("seen: " + _seen())
    return 0


if __name__ == "__main__":
    sys.exit(main())
