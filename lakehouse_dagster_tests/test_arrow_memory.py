"""Every entry point allocates Arrow memory with jemalloc (core/arrow_memory.py): the CLI, the code location that
the code server and the warm forkserver load, and the service (test_service_faults.py). An operator's
ARROW_DEFAULT_MEMORY_POOL wins. Each case is a fresh process: the pool is a per-process setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

SHOW = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"


def _project_pool() -> str:
    try:
        pa.jemalloc_memory_pool()
        return "jemalloc"
    except NotImplementedError:  # a pyarrow without jemalloc keeps its default
        return pa.default_memory_pool().backend_name


def _pool_after(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{SHOW}"], env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_bare_process_has_pyarrows_default_so_the_entry_points_below_are_what_change_it():
    assert _pool_after("pass") == "mimalloc"


def test_the_code_location_allocates_with_jemalloc_unless_the_operator_names_a_pool():
    load = "import lakehouse_dagster.dagster.definitions"
    assert _pool_after(load) == _project_pool()
    assert _pool_after(load, ARROW_DEFAULT_MEMORY_POOL="system") == "system"


@pytest.mark.parametrize(("extra", "pool"), [({}, None), ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "system")])
def test_a_cli_verb_allocates_with_jemalloc_unless_the_operator_names_a_pool(dsn, extra, pool):
    run = "from lakehouse_dagster.cli.main import main\nassert main(['datasets', '--json']) == 0"
    assert _pool_after(run, LAKEHOUSE_PG_DSN=dsn, **extra) == (pool or _project_pool())
