"""Benchmark (not a test): the long variants the suite leaves out to stay in its budget (docs/benchmarks.md, "The
suite"), run as the tests they are, with ``LAKEHOUSE_SUITE_LONG=1``:

* the calm console over the issue's full two minutes idle (``test_calm_stack.py``: at most 10 lines after ``ready``;
  the suite waits 45 s with the same rate, at most 3);
* the object store failing everything before the sync starts (``before-the-sync`` of ``test_object_store_faults.py``
  on the SQL catalog and of ``test_rest_catalog.py`` on the REST one; the suite runs the points that leave files
  behind: after the first file and before the commit on SQL, before the commit on REST);
* the seeded crash schedules at their former lengths (``test_crash_harness.py`` 8/5/6 cycles, the REST catalog's
  three 6/5/6, ``test_infra_faults.py``'s two 6/6; the suite runs the first 3-4 cycles of the same seeds);
* the mirror stream's maintenance trickle at 80 appends (``test_mirror_stream.py``; the suite's 40 reach the same
  bounds).

    .venv/bin/python bench/bench_suite_long.py [--only calm|store|crash|trickle]

One pytest at a time, in one process (``-n 0``); prints each test's outcome and time and what the tests print (the
calm console's line count), then exits non-zero if any failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "calm": ["lakehouse_dagster_tests/test_calm_stack.py"],
    "store": [
        "lakehouse_dagster_tests/test_object_store_faults.py",
        "lakehouse_dagster_tests/test_rest_catalog.py",
        "-k",
        "failing_everything and before-the-sync",
    ],
    "crash": [
        "lakehouse_dagster_tests/test_crash_harness.py",
        "lakehouse_dagster_tests/test_rest_catalog.py",
        "lakehouse_dagster_tests/test_infra_faults.py",
        "-k",
        "crash_harness or seeded_crash_schedule",
    ],
    "trickle": ["lakehouse_dagster_tests/test_mirror_stream.py", "-k", "trickle_through_the_stream"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these (repeatable)")
    args = parser.parse_args()
    env = {**os.environ, "LAKEHOUSE_SUITE_LONG": "1"}
    failed = 0
    for name in args.only or list(RUNS):
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "0", "-q", "-s", "-p", "no:cacheprovider", "-rA", *RUNS[name]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        took = time.monotonic() - started
        said = [line for line in proc.stdout.splitlines() if re.match(r"^(calm:|PASSED|FAILED|ERROR)", line)]
        print(f"{name}: exit {proc.returncode} in {took:.0f} s")
        for line in said:
            print(f"  {line}")
        if proc.returncode != 0:
            failed += 1
            print(proc.stdout[-4000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
