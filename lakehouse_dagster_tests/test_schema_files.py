"""The schema as files (schema/migrations, schema/functions): a shipped migration never changes, a broken set of
files is an error before anything is written, each migration is its own transaction, two migrators at once
apply everything once, and re-applying the current functions leaves every trigger as it was."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.schema import names
from lakehouse_dagster.schema.migrate import (
    FILL_MARK,
    FUNCTIONS_DIR,
    LOCK_KEY,
    MANIFEST,
    MIGRATIONS_DIR,
    MigrationError,
    load_functions,
    load_migrations,
    migrate,
)
from lakehouse_dagster_tests.conftest import _with_db

# What every release up to the one that made them files shipped, in the numbers it recorded. Appending is fine.
SHIPPED = [
    "001_app_schema",
    "002_change_tracking",
    "003_iceberg_sync_log",
    "004_flags",
    "005_parity",
    "006_sync_log_failed_idx",
    "007_adopt_app_tables",
    "008_latest_sync_and_sweep",
    "010_sources",
    "011_rollback",
    "012_widen_rules",
    "015_parity_digests",
    "016_flag_notify",
    "018_no_key_row_locks",
    "019_row_changes",
    "020_app_write_cost",
    "021_file_identity",
    "022_digest_capture",
    "023_append_in_one_statement",
    "024_tracking_capture",
    "025_capture_after_commit",
    "026_stored_soak",
    "027_rollout_plans",
    "028_recorder",
    "029_canary_rounds_and_alerts",
    "030_recorder_verdicts_fallbacks",
    "031_alert_delivery",
    "032_mirror_streams",
    "033_reverse_mirror",
    "034_complete",
    "035_rollout_complete_step",
]
# The number a new migration would take in the ``files`` copy (tests that add one): after the shipped ones, which
# are all that copy holds, so a branch's own new migration breaks nothing here.
_NEXT = 1 + max(int(name[:3]) for name in SHIPPED)
N4, N3, AFTER_GAP = f"{_NEXT:04d}", f"{_NEXT:03d}", f"{_NEXT + 1:04d}"


# ---------------------------------------------------------------------------------------------------------------
# The files


def _manifest() -> dict[str, str]:
    out = {}
    for line in (MIGRATIONS_DIR / MANIFEST).read_text().splitlines():
        digest, name = line.split("  ")
        out[name] = digest
    return out


def test_every_migration_file_has_the_sha256_its_manifest_line_says():
    """Fails when a shipped migration's text changes. Never fix it by re-hashing: add a migration instead."""
    sums = _manifest()
    files = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
    assert sorted(sums) == files, "every migration file has one line in SHA256SUMS, and every line its file"
    changed = [n for n in files if hashlib.sha256((MIGRATIONS_DIR / n).read_bytes()).hexdigest() != sums[n]]
    assert changed == [], f"shipped migration(s) edited: {changed}"


def test_the_shipped_migrations_keep_their_recorded_names_in_numeric_order():
    got = [m.name for m in load_migrations()]
    assert got[: len(SHIPPED)] == SHIPPED  # new ones after them
    assert [m.number for m in load_migrations()] == sorted(m.number for m in load_migrations())


@pytest.fixture
def files(tmp_path):
    """A copy of the shipped migrations to break (only those: a branch's own new migration, which the tests below
    would number alike, is left out)."""
    d = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, d)
    shipped = {f"0{name}.sql" for name in SHIPPED}
    for path in d.glob("*.sql"):
        if path.name not in shipped:
            path.unlink()
            _unlist(d, path.name)
    return d


def _add(d, name: str, text: str, *, listed: bool = True) -> None:
    (d / name).write_text(text)
    if listed:
        with (d / MANIFEST).open("a") as f:
            f.write(f"{hashlib.sha256(text.encode()).hexdigest()}  {name}\n")


def _unlist(d, name: str) -> None:
    lines = [ln for ln in (d / MANIFEST).read_text().splitlines() if not ln.endswith("  " + name)]
    (d / MANIFEST).write_text("".join(ln + "\n" for ln in lines))


def test_adding_a_listed_migration_is_fine(files):
    _add(files, f"{N4}_more.sql", "create table if not exists more (x int);")
    assert load_migrations(files)[-1].name == f"{N3}_more"


@pytest.mark.parametrize(
    "breakage, error",
    [
        ("edited", r"0016_flag_notify.sql differs from the sha256 in SHA256SUMS: a shipped migration is never edited"),
        ("missing", r"listed in SHA256SUMS are missing: 0024_tracking_capture.sql"),
        ("missing-unlisted", r"no migration numbered 0011"),
        ("empty", rf"{N4}_nothing.sql is empty"),
        ("blank", rf"{N4}_nothing.sql is empty"),
        ("gap", rf"no migration numbered {N4}"),
        ("duplicate", r"migration number 24 is used twice: 0024_other.sql and 0024_tracking_capture.sql"),
        ("never-shipped", r"0017_late.sql: number 17 was never shipped"),
        ("unlisted", rf"{N4}_new.sql is not listed in SHA256SUMS"),
        ("bad-name", r"25_short.sql: a migration file is named NNNN_name.sql"),
        ("no-manifest", r"SHA256SUMS is missing"),
    ],
)
def test_a_broken_set_of_migration_files_is_an_error_never_a_skip(files, breakage, error, pg_admin_dsn):
    if breakage == "edited":
        p = files / "0016_flag_notify.sql"
        p.write_text(p.read_text().replace("tg_op", "tg_op || ''"))
    elif breakage == "missing":
        (files / "0024_tracking_capture.sql").unlink()
    elif breakage == "missing-unlisted":
        (files / "0011_rollback.sql").unlink()
        _unlist(files, "0011_rollback.sql")
    elif breakage == "empty":
        _add(files, f"{N4}_nothing.sql", "")
    elif breakage == "blank":
        _add(files, f"{N4}_nothing.sql", "\n  \n")
    elif breakage == "gap":
        _add(files, f"{AFTER_GAP}_after_a_gap.sql", "select 1;")
    elif breakage == "duplicate":
        _add(files, "0024_other.sql", "select 1;")
    elif breakage == "never-shipped":
        _add(files, "0017_late.sql", "select 1;")
    elif breakage == "unlisted":
        _add(files, f"{N4}_new.sql", "select 1;", listed=False)
    elif breakage == "bad-name":
        _add(files, "25_short.sql", "select 1;")
    elif breakage == "no-manifest":
        (files / MANIFEST).unlink()
    with pytest.raises(MigrationError, match=error):
        load_migrations(files)
    # ... and migrate refuses before it writes anything, even on an empty database
    with _database(pg_admin_dsn) as dsn, connect(dsn) as conn:
        with pytest.raises(MigrationError, match=error):
            migrate(conn, migrations_dir=files)
        assert conn.execute("select to_regclass('lakehouse_migrations')").fetchone()[0] is None


def test_every_function_the_migrations_define_has_one_current_definition():
    defined = set()
    for m in load_migrations():
        defined |= set(re.findall(r"create or replace function (\w+)\(", m.sql))
    functions = load_functions()
    assert sorted(f.name for f in functions) == sorted(defined)
    for f in functions:
        assert len(re.findall(r"create or replace function", f.sql)) == 1, f.path


def test_no_project_function_in_a_migrated_database_lacks_its_file(conn):
    in_db = {
        r[0]
        for r in conn.execute(
            "select proname from pg_proc where pronamespace = current_schema()::regnamespace"
            " and proname like 'lakehouse%%' and proname not like 'lakehouse_rowdigest_%%'"  # made per hash expression
        )
    }
    assert in_db == {f.name for f in load_functions()}


def test_the_names_python_uses_are_the_ones_the_sql_defines():
    notify = (FUNCTIONS_DIR / "lakehouse_flag_overrides_notify.sql").read_text()
    assert f"pg_notify('{names.FLAG_NOTIFY_CHANNEL}'" in notify
    digest = (FUNCTIONS_DIR / "lakehouse_digest_rows.sql").read_text()
    assert f"limit {names.DIGEST_ARRAY_ROWS + 1}" in digest and f"> {names.DIGEST_ARRAY_ROWS} then" in digest
    assert (FUNCTIONS_DIR / f"{names.LATEST_SUCCEEDED_FN}.sql").is_file()


# ---------------------------------------------------------------------------------------------------------------
# Migrating


class _database:
    """An empty database on the test server (dropped afterwards)."""

    def __init__(self, admin_dsn: str):
        self.admin, self.name = admin_dsn, f"s_{uuid.uuid4().hex[:16]}"

    def __enter__(self) -> str:
        with psycopg.connect(self.admin, autocommit=True) as a:
            a.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(self.name)))
        return _with_db(self.admin, self.name)

    def __exit__(self, *exc):
        with psycopg.connect(self.admin, autocommit=True) as a:
            a.execute(
                psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(self.name))
            )


@pytest.fixture
def empty_dsn(pg_admin_dsn):
    with _database(pg_admin_dsn) as dsn:
        yield dsn


def test_a_fresh_database_gets_every_migration_in_numeric_order_then_nothing(empty_dsn):
    with connect(empty_dsn) as conn:
        applied = migrate(conn)
        names = [m.name for m in load_migrations()]
        assert applied[: len(names)] == names
        # then the functions whose current body is newer than the migrations' (none today)
        assert all(a.startswith("functions/") for a in applied[len(names) :]), applied
        assert applied.index("016_flag_notify") < applied.index("018_no_key_row_locks")
        recorded = [r[0] for r in conn.execute("select name from lakehouse_migrations")]
        assert sorted(recorded) == sorted(names + [FILL_MARK])
        assert migrate(conn) == []


def test_each_migration_is_its_own_transaction_and_a_failure_rolls_back_only_itself(files, empty_dsn):
    _add(files, f"{N4}_half_done.sql", "create table lakehouse_half (x int);\nselect 1 / 0;")
    with connect(empty_dsn) as conn:
        with pytest.raises(MigrationError, match=rf"migration {N3}_half_done \({N4}_half_done.sql\) failed.*division"):
            migrate(conn, migrations_dir=files)
        recorded = {r[0] for r in conn.execute("select name from lakehouse_migrations")}
        assert recorded == set(SHIPPED)  # those before it committed, one by one
        assert conn.execute("select to_regclass('lakehouse_half')").fetchone()[0] is None
        # the lock was released: another session takes it at once
        with connect(empty_dsn) as other:
            assert other.execute("select pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()[0] is True
        # fixed (a new file, as it was never shipped): the next migrate applies just it
        (files / f"{N4}_half_done.sql").unlink()
        _unlist(files, f"{N4}_half_done.sql")
        _add(files, f"{N4}_done.sql", "create table lakehouse_half (x int);")
        assert migrate(conn, migrations_dir=files)[:1] == [f"{N3}_done"]


def test_migrate_refuses_inside_an_open_transaction(conn):
    conn.execute("begin")
    conn.execute("select 1")
    with pytest.raises(MigrationError, match="no transaction open"):
        migrate(conn)
    conn.execute("rollback")


def _waiting_for_the_lock(dsn) -> int:
    with connect(dsn) as c:
        return c.execute(
            "select count(*) from pg_locks where locktype = 'advisory' and not granted and objid = %s",
            (LOCK_KEY & 0xFFFFFFFF,),
        ).fetchone()[0]


@pytest.mark.parametrize("held_by", ["session", "old-release-transaction"])
def test_two_processes_migrating_at_once_apply_every_migration_once(empty_dsn, held_by):
    """Both wait behind a holder of the lock (a third session, or an older release's transaction-level lock),
    then one applies everything and the other finds nothing to do."""
    holder = connect(empty_dsn)
    if held_by == "session":
        holder.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
    else:
        holder.execute("begin")
        holder.execute("select pg_advisory_xact_lock(%s)", (LOCK_KEY,))
    results, errors = {}, []

    def run(k):
        try:
            with connect(empty_dsn) as c:
                results[k] = migrate(c)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while _waiting_for_the_lock(empty_dsn) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _waiting_for_the_lock(empty_dsn) == 2 and not results
    if held_by == "session":
        holder.execute("select pg_advisory_unlock(%s)", (LOCK_KEY,))
    else:
        holder.execute("commit")
    for t in threads:
        t.join(120)
    holder.close()
    assert errors == []
    everything = [m.name for m in load_migrations()]
    first, second = sorted(results.values(), key=len, reverse=True)
    assert first[: len(everything)] == everything and second == []
    with connect(empty_dsn) as c:
        assert c.execute("select count(*), count(distinct name) from lakehouse_migrations").fetchone() == (
            len(everything) + 1,
            len(everything) + 1,
        )


def test_two_cli_processes_migrating_at_once_apply_every_migration_once(empty_dsn, tmp_path):
    """`lakehouse db migrate` twice at once (both held at the lock until both wait, so they really overlap)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "LAKEHOUSE_PG_DSN": empty_dsn, "LAKEHOUSE_HOME": str(tmp_path)}
    holder = connect(empty_dsn)
    holder.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "lakehouse_dagster.cli.main", "db", "migrate"],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 120
    while _waiting_for_the_lock(empty_dsn) < 2 and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.1)
    assert _waiting_for_the_lock(empty_dsn) == 2
    holder.execute("select pg_advisory_unlock(%s)", (LOCK_KEY,))
    holder.close()
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    everything = ", ".join(m.name for m in load_migrations())
    up_to_date, applied = sorted(o for o, _ in outs)[::-1]
    assert up_to_date == "schema up to date\n"
    assert applied.startswith("applied ") and f"migration(s): {everything}" in applied


def _triggers(conn) -> list[tuple]:
    return conn.execute(
        "select tgrelid::regclass::text, tgname, tgenabled, pg_get_triggerdef(oid) from pg_trigger"
        " where not tgisinternal order by 1, 2"
    ).fetchall()


def _definition(conn, fn: str) -> str:
    return conn.execute("select pg_get_functiondef(%s::regproc)", (fn,)).fetchone()[0]


def test_the_current_functions_are_re_applied_and_every_trigger_keeps_its_state(conn):
    fresh = _definition(conn, "lakehouse_rows_barrier_ins")
    conn.execute(
        "create or replace function lakehouse_rows_barrier_ins() returns trigger language plpgsql as $$"
        " begin return null; end $$"
    )
    # as capture modes leave them: barrier enabled always, tracking and digest disabled
    conn.execute("alter table dataset_rows enable always trigger lakehouse_rows_barrier_ins")
    conn.execute("alter table dataset_rows disable trigger lakehouse_rows_ins")
    conn.execute("alter table dataset_rows disable trigger lakehouse_rows_ins_digest")
    before = _triggers(conn)
    assert migrate(conn) == ["functions/lakehouse_rows_barrier_ins.sql"]
    assert _definition(conn, "lakehouse_rows_barrier_ins") == fresh
    assert _triggers(conn) == before
    # nothing changed: the re-application is rolled back, the catalog row is not even rewritten
    xmin = conn.execute("select xmin::text from pg_proc where proname = 'lakehouse_rows_inserted'").fetchone()[0]
    assert migrate(conn) == []
    assert (
        conn.execute("select xmin::text from pg_proc where proname = 'lakehouse_rows_inserted'").fetchone()[0] == xmin
    )
    assert _triggers(conn) == before


def test_a_function_file_that_touches_a_trigger_is_refused(tmp_path):
    d = tmp_path / "functions"
    shutil.copytree(FUNCTIONS_DIR, d)
    p = d / "lakehouse_rows_barrier_ins.sql"
    p.write_text(p.read_text() + "\ndrop trigger if exists lakehouse_rows_barrier_ins on dataset_rows;\n")
    with pytest.raises(MigrationError, match="never a trigger or table"):
        load_functions(d)
    (d / "lakehouse_other.sql").write_text((d / "lakehouse_schema_changed.sql").read_text())
    p.unlink()
    with pytest.raises(MigrationError, match=r"defines \['lakehouse_schema_changed'\]; it must define exactly"):
        load_functions(d)
