"""The crash harness, short and seeded for CI: 4 cycles of syncs, 3 of streams, 3 of reverse applies (each cycle
starts a CLI process: 3-6 s of imports depending on load). lakehouse_dagster/testing/crash_harness/ says what every
cycle checks.

The same seeds run longer (8, 5 and 6 cycles: the schedules' first cycles are the suite's) with
``LAKEHOUSE_SUITE_LONG=1`` (bench/bench_suite_long.py --only crash); LAKEHOUSE_CRASH_CYCLES / LAKEHOUSE_CRASH_SEED
run it longer or with another seed (LAKEHOUSE_CRASH_STREAM_CYCLES, LAKEHOUSE_CRASH_REVERSE_CYCLES the stream and
reverse modes longer); bench/bench_crash.py runs >= 200 cycles and prints the figures.
"""

from __future__ import annotations

import os

import pytest

from lakehouse_dagster.testing.crash_harness import run_cycles

pytestmark = pytest.mark.slow  # crash cycles: a CLI process killed per cycle (~40 s for the three on 2 cores)
LONG = os.environ.get("LAKEHOUSE_SUITE_LONG") == "1"  # bench/bench_suite_long.py: the schedules' longer runs


def test_seeded_crash_schedule_converges_with_no_violation(dsn, settings):
    cycles = int(os.environ.get("LAKEHOUSE_CRASH_CYCLES", "8" if LONG else "4"))
    seed = int(os.environ.get("LAKEHOUSE_CRASH_SEED", "20261130"))
    report = run_cycles(dsn, settings, seed=seed, cycles=cycles, datasets=2)
    print(report.as_dict())
    assert report.cycles == cycles
    assert sum(report.fired.values()) >= cycles // 3, report.as_dict()  # the schedule really crashes syncs
    assert report.violations == [], "\n".join(report.violations)


def test_seeded_crash_schedule_of_stream_processes_converges_with_no_violation(dsn, settings):
    """The harness's stream mode: each cycle's process is a mirror stream (mirror/stream.py) killed, terminated or
    failed at a failpoint inside its sync (bench/bench_crash.py --stream-share 1 runs >= 200)."""
    cycles = int(os.environ.get("LAKEHOUSE_CRASH_STREAM_CYCLES", "5" if LONG else "3"))
    report = run_cycles(dsn, settings, seed=20261204, cycles=cycles, datasets=2, armed_share=1.0, stream_share=1.0)
    print(report.as_dict())
    assert report.cycles == cycles and report.ops["stream"] == cycles
    assert sum(report.fired.values()) >= 2, report.as_dict()  # the streams really die at their failpoints
    assert report.violations == [], "\n".join(report.violations)


def test_seeded_crash_schedule_of_reverse_applies_converges_with_no_violation(dsn, settings):
    """The harness's reverse mode (issue 31): each cycle makes a native change (an append, or an overwrite: a full
    reverse re-sync) and runs the reverse apply in a process killed or failed before, inside or after its commit;
    Postgres must hold a whole snapshot, the clean apply must apply it exactly once, without echo
    (bench/bench_crash.py --reverse-share 1 runs >= 200)."""
    cycles = int(os.environ.get("LAKEHOUSE_CRASH_REVERSE_CYCLES", "6" if LONG else "3"))
    report = run_cycles(dsn, settings, seed=20261215, cycles=cycles, datasets=2, armed_share=1.0, reverse_share=1.0)
    print(report.as_dict())
    assert report.cycles == cycles and report.ops["reverse"] == cycles
    assert sum(report.fired.values()) >= 2, report.as_dict()  # the applies really die at their failpoints
    assert report.violations == [], "\n".join(report.violations)
