"""Crash harness, long run: >= 200 seeded cycles of writes + syncs killed at random failpoints.

`nice .venv/bin/python bench/bench_crash.py --cycles 200 --seed 7` prints the cycles, the failpoints
armed and fired (kills per failpoint), the sync exit codes, the write mix, the violations (must be 0)
and the seed, then one JSON line. What each cycle checks: lakehouse_dagster/testing/crash_harness.py.
Not a timing benchmark: seconds are printed for planning only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--datasets", type=int, default=3)
    a = p.parse_args()

    dsn = fresh_database(admin_dsn(), "bench_crash")
    home = Path(tempfile.mkdtemp(prefix="lh-crash-"))
    (home / "warehouse").mkdir()
    os.environ.update(
        {  # the killed syncs are CLI processes: they read the same configuration
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(home / "home"),
            "LAKEHOUSE_WAREHOUSE": (home / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "lakehouse",
        }
    )
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.testing.crash_harness import run_cycles

    shown = [0]

    def progress(cycle, spec, rc, report):
        for v in report.violations[shown[0] :]:
            print(f"  VIOLATION {v}", flush=True)
        shown[0] = len(report.violations)
        if (cycle + 1) % 10 == 0:
            print(
                f"  cycle {cycle + 1}: {sum(report.fired.values())} failpoints fired, "
                f"{len(report.violations)} violations",
                flush=True,
            )

    report = run_cycles(dsn, Settings.from_env(), seed=a.seed, cycles=a.cycles, datasets=a.datasets, progress=progress)
    print(f"seed {report.seed}  cycles {report.cycles}  datasets {a.datasets}  {report.seconds:.0f}s")
    print(f"kills per failpoint: {json.dumps(report.kills_per_failpoint(), sort_keys=True)}")
    print(f"fired (point:action): {json.dumps(dict(sorted(report.fired.items())))}")
    print(f"sync exit codes: {json.dumps({str(k): v for k, v in sorted(report.outcomes.items())})}")
    print(f"writes: {json.dumps(dict(report.ops), sort_keys=True)}")
    print(f"violations: {len(report.violations)}")
    for v in report.violations:
        print(f"  {v}")
    print(json.dumps(report.as_dict(), default=str))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
