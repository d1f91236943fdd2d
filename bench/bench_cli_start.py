"""Benchmark (not a test): how long `lakehouse` takes to answer, as an operator types it (issue 44).

    .venv/bin/python bench/bench_cli_start.py [--repeat 5] [--checkout DIR ...] [--top 8]

Each command runs as its own process (``python -m lakehouse_dagster.cli.main``), ``--repeat`` times after one
warm-up, and the median wall time is printed: ``--help``, a mistyped verb, a mistyped option, and the light verbs
(`flags list`, `datasets`, `status`, `write-flags list`, `soak show`) against a throwaway embedded Postgres
(deleted on exit) holding a migrated schema and 20 datasets in 2 workspaces. Byte-code caches are written and used
(PYTHONDONTWRITEBYTECODE dropped), as an installed package has them. Then ``python -X importtime``'s top items
(cumulative) of `--help` and of `status`. ``--checkout``: the source trees to compare (default: this one), e.g.
``--checkout /path/to/main --checkout .``. Targets: --help and a usage error <= 0.3 s, a light verb <= 0.8 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import admin_dsn, fresh_database  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.tracking import datasets  # noqa: E402

USAGE = {
    "--help": ["--help"],
    "a mistyped verb": ["flgas", "list"],
    "a mistyped option": ["flags", "set", "export.stream", "iceberg", "--worksapce", "w"],
}
LIGHT = {
    "flags list": ["flags", "list"],
    "datasets": ["datasets"],
    "status": ["status"],
    "write-flags list": ["write-flags", "list"],
    "soak show": ["soak", "show"],
}
TARGET = {**dict.fromkeys(USAGE, 0.3), **dict.fromkeys(LIGHT, 0.8)}
HEAVY = ("pyiceberg", "pyarrow", "pandas", "numba", "duckdb", "dagster")


def _env(checkout: Path, dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(checkout), "LAKEHOUSE_PG_DSN": dsn, "COLUMNS": "120"}


def _as_of(checkout: Path, argv: list[str]) -> list[str]:
    """The command as the checkout names it: before 0.25.0 `soak` was a subcommand of `flags` (cli/moved.py)."""
    if argv[0] == "soak" and not (checkout / "lakehouse_dagster" / "cli" / "soak.py").exists():
        return ["flags", *argv]
    return argv


def _wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", *argv], env=env, cwd=env["PYTHONPATH"], capture_output=True
    )
    return time.perf_counter() - t0


def _importtime(argv: list[str], env: dict[str, str], top: int) -> list[tuple[float, str]]:
    """(cumulative seconds, module) of the slowest imports, each module's name indented by its depth."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "lakehouse_dagster.cli.main", *argv],
        env=env,
        cwd=env["PYTHONPATH"],  # `-m` puts the working directory first on sys.path
        capture_output=True,
        text=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        rows.append((int(cumulative) / 1e6, name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def _seed(dsn: str) -> None:
    with connect(dsn) as conn:
        for w in range(2):
            ws = datasets.create_workspace(conn, f"ws{w}")
            for i in range(10):
                d = datasets.create_dataset(conn, ws, f"d{w}_{i}", [{"name": "n", "type": "int64"}])
                datasets.insert_rows(conn, d, [{"n": k} for k in range(10)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--checkout", action="append", type=Path, help="source tree to time (repeatable; default: this)")
    ap.add_argument("--top", type=int, default=8, help="importtime items shown per command (default 8)")
    args = ap.parse_args()
    checkouts = [c.resolve() for c in (args.checkout or [Path(__file__).resolve().parents[1]])]
    dsn = fresh_database(admin_dsn(), "bench_cli_start")
    _seed(dsn)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"median of {args.repeat} wall times per command (s), one process each, after a warm-up; load {load}")
    print(f"{'command':<20}" + "".join(f"{c.name:>16}" for c in checkouts) + f"{'target':>9}")
    medians: dict[Path, dict[str, float]] = {c: {} for c in checkouts}
    for label, argv in {**USAGE, **LIGHT}.items():
        for c in checkouts:
            env = _env(c, dsn)
            named = _as_of(c, argv)
            _wall(named, env)  # the warm-up writes the byte-code caches and warms the page cache
            medians[c][label] = statistics.median(_wall(named, env) for _ in range(args.repeat))
        row = "".join(f"{medians[c][label]:>16.3f}" for c in checkouts)
        print(f"{label:<20}{row}{TARGET[label]:>9.1f}", flush=True)
    for c in checkouts:
        for argv in (USAGE["--help"], LIGHT["status"]):
            items = _importtime(argv, _env(c, dsn), args.top)
            print(f"\npython -X importtime, {c.name}, lakehouse {' '.join(argv)}: top {args.top} (cumulative s)")
            for seconds, name in items:
                print(f"  {seconds:7.3f}  {name}")
            heavy = sorted({n.strip().split(".")[0] for _, n in items} & set(HEAVY))
            print(f"  heavy libraries among them: {', '.join(heavy) or 'none'}")
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    late = [(c.name, k, v) for c in checkouts[-1:] for k, v in medians[c].items() if v > TARGET[k]]
    print(
        "\n" + ("all within target" if not late else "over target: " + "; ".join(f"{k} {v:.3f} s" for _, k, v in late))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
