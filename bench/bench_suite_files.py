"""Benchmark helper (not a test): where a whole run's worker time went, file by file, and whether one file bounds the
wall time (docs/benchmarks.md, "The suite").

Reads the output of a run with ``--durations=0`` (``scripts/test -q --durations=0 > run.txt``), sums each file's
setup + call + teardown (its worker-seconds), and replays what ``scripts/test`` does with them: whole files handed
to two workers (``--dist loadfile``) in the order conftest.py sorts them (``--no-loadscope-reorder``; read from
``pytest --collect-only -q``), each file to the first worker free. If the two finish close together, no file
dominates the tail and the wall time is about half the worker time: only less work makes the run shorter.

    .venv/bin/python bench/bench_suite_files.py run.txt [--workers 2] [--top 25]
"""

from __future__ import annotations

import argparse
import heapq
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"\s*([\d.]+)s (setup|call|teardown)\s+(\S+?)::")


def per_file(text: str) -> tuple[Counter[str], Counter[str]]:
    """Worker-seconds per file, and the setup part of it."""
    total: Counter[str] = Counter()
    setup: Counter[str] = Counter()
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            total[m.group(3)] += float(m.group(1))
            if m.group(2) == "setup":
                setup[m.group(3)] += float(m.group(1))
    return total, setup


def file_order() -> list[str]:
    """The files in the order the suite hands them out (conftest.py's sort, as collected)."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--collect-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    order: list[str] = []
    for line in out.splitlines():
        if "::" in line:
            path = line.split("::", 1)[0]
            if not order or order[-1] != path:
                order.append(path)
    return order


def replay(order: list[str], seconds: Counter[str], workers: int) -> list[tuple[float, list[str]]]:
    """Each worker's finish time and its files, each file to the first worker free."""
    heap = [(0.0, w) for w in range(workers)]
    files: dict[int, list[str]] = {w: [] for w in range(workers)}
    for path in order:
        t, w = heapq.heappop(heap)
        files[w].append(path)
        heapq.heappush(heap, (t + seconds.get(path, 0.0), w))
    return sorted((t, files[w]) for t, w in heap)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("durations", type=Path, help="a pytest output with --durations=0")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    total, setup = per_file(args.durations.read_text(errors="replace"))
    if not total:
        print(f"{args.durations}: no --durations=0 lines", file=sys.stderr)
        return 2
    work = sum(total.values())
    print(f"{len(total)} files, {work / 60:.1f} min of worker time ({sum(setup.values()) / 60:.1f} min of it setup)")
    for path, s in total.most_common(args.top):
        print(f"{s:8.1f} s  (setup {setup[path]:6.1f} s)  {path}")
    ends = replay(file_order(), total, args.workers)
    print(f"replayed on {args.workers} workers: finish at " + ", ".join(f"{t / 60:.1f} min" for t, _ in ends))
    print(f"the worker time / {args.workers}: {work / args.workers / 60:.1f} min; last files: {ends[-1][1][-3:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
