"""Migrations as files: the reference app schema and the lakehouse control tables.

``schema/migrations/NNNN_name.sql`` are the numbered migrations, immutable once shipped (their sha256 is in
``schema/migrations/SHA256SUMS``; ``migrations/README.md`` says what each one does and how to add one). Each is
recorded in ``lakehouse_migrations`` under its name with a three-digit number (``0016_flag_notify.sql`` records
``016_flag_notify``: the names the previous releases recorded), so a database migrated by an older release is
recognised and nothing is re-applied. ``migrate`` applies the missing ones in numeric order, each in its own
transaction, under a session-level advisory lock held from before it reads what is applied until the end, so
two processes migrating at once apply every migration once (the second waits, then finds nothing to do).

``schema/functions/<name>.sql`` hold the current definition of every function the project defines, one file
each; ``migrate`` re-applies them (``create or replace function``) after the numbered migrations, every time,
in one transaction that it rolls back when no definition changed (an up-to-date database is not written to).
Triggers are never created there: which triggers are enabled is the capture mode's business
(tracking/capture/) and ``create or replace function`` leaves it alone.

The migrations run over app tables that may already exist, hold rows and take the live app's writes (a real
deployment has them before we arrive): after the DDL, ``migrate`` fills change tracking for the rows that
predate our triggers, in batches (``fill_change_tracking``).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import LakehouseError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
FUNCTIONS_DIR = Path(__file__).with_name("functions")
MANIFEST = "SHA256SUMS"

# Numbers no release ever shipped (the list had gaps when it became files). Frozen: a new gap is an error,
# and a new migration takes the next number after the highest.
NEVER_SHIPPED = frozenset({9, 13, 14, 17})

_FILE = re.compile(r"(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)*)\.sql")
_SUM = re.compile(r"([0-9a-f]{64}) [ *](\S+)")
_FUNCTION = re.compile(r"\bcreate\s+or\s+replace\s+function\s+(\w+)\s*\(", re.IGNORECASE)
_NOT_IN_A_FUNCTION_FILE = re.compile(r"\b(create|drop|alter)\s+(or\s+replace\s+)?(trigger|table|type|index)\b", re.I)


class MigrationError(LakehouseError):
    """The migration files are not what a release may ship (a gap, a duplicate, an empty or edited file...),
    or the connection cannot run them. Nothing was applied."""

    exit_code = 5


@dataclass(frozen=True)
class Migration:
    number: int
    name: str  # as recorded in lakehouse_migrations: 001_app_schema
    path: Path
    sql: str


@dataclass(frozen=True)
class Function:
    name: str
    path: Path
    sql: str


def recorded_name(number: int, slug: str) -> str:
    """The name lakehouse_migrations records for migration file ``{number:04d}_{slug}.sql``."""
    return f"{number:03d}_{slug}"


def _read_manifest(directory: Path) -> dict[str, str]:
    path = directory / MANIFEST
    if not path.is_file():
        raise MigrationError(f"{path} is missing: every migration's sha256 is listed there")
    sums: dict[str, str] = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        m = _SUM.fullmatch(line)
        if not m:
            raise MigrationError(f"{path}:{i}: not a 'sha256  file' line: {line!r}")
        if m.group(2) in sums:
            raise MigrationError(f"{path}:{i}: {m.group(2)} is listed twice")
        sums[m.group(2)] = m.group(1)
    return sums


def load_migrations(
    directory: Path = MIGRATIONS_DIR, *, never_shipped: frozenset[int] = NEVER_SHIPPED
) -> list[Migration]:
    """The numbered migrations of ``directory`` in numeric order, checked: names ``NNNN_slug.sql``, numbers
    1.. without a gap (but ``never_shipped``) or a duplicate, no empty file, every file listed in SHA256SUMS
    with its sha256, every listed file present. Anything else raises MigrationError: a migration is never
    silently skipped."""
    if not directory.is_dir():
        raise MigrationError(f"{directory} is missing: it holds the numbered migrations")
    sums = _read_manifest(directory)
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        m = _FILE.fullmatch(path.name)
        if not m:
            raise MigrationError(f"{path}: a migration file is named NNNN_name.sql (four digits, lower case)")
        number = int(m.group(1))
        if number in found:
            raise MigrationError(f"migration number {number} is used twice: {found[number].path.name} and {path.name}")
        if number in never_shipped:
            raise MigrationError(f"{path.name}: number {number} was never shipped and is not reused")
        data = path.read_bytes()
        try:
            sql = data.decode("utf-8")
        except UnicodeDecodeError:
            raise MigrationError(f"{path}: not UTF-8") from None
        if not sql.strip():
            raise MigrationError(f"{path} is empty")
        if path.name not in sums:
            raise MigrationError(
                f"{path.name} is not listed in {MANIFEST} (a new migration: sha256sum {path.name} >> {MANIFEST})"
            )
        if hashlib.sha256(data).hexdigest() != sums[path.name]:
            raise MigrationError(
                f"{path.name} differs from the sha256 in {MANIFEST}: a shipped migration is never edited"
                " (add a new one instead)"
            )
        found[number] = Migration(number, recorded_name(number, m.group(2)), path, sql)
    missing = sorted(set(sums) - {m.path.name for m in found.values()})
    if missing:
        raise MigrationError(f"migration file(s) listed in {MANIFEST} are missing: {', '.join(missing)}")
    top = max(found, default=0)
    gaps = [n for n in range(1, top + 1) if n not in found and n not in never_shipped]
    if gaps:
        raise MigrationError(f"no migration numbered {', '.join(f'{n:04d}' for n in gaps)} (numbers have no gaps)")
    return [found[n] for n in sorted(found)]


def load_functions(directory: Path = FUNCTIONS_DIR) -> list[Function]:
    """The current function definitions: ``<name>.sql`` holds one ``create or replace function <name>(`` and
    nothing that creates or alters a trigger, table, type or index."""
    if not directory.is_dir():
        raise MigrationError(f"{directory} is missing: it holds the current function definitions")
    out = []
    for path in sorted(directory.glob("*.sql")):
        sql = path.read_text()
        defined = _FUNCTION.findall(sql)
        if defined != [path.stem]:
            raise MigrationError(f"{path}: defines {defined or 'no function'}; it must define exactly {path.stem}()")
        if _NOT_IN_A_FUNCTION_FILE.search(sql):
            raise MigrationError(f"{path}: a function file only (re)defines its function, never a trigger or table")
        out.append(Function(path.stem, path, sql))
    return out


def migration_sql(name: str) -> str:
    """The text of a shipped migration, by its recorded name (``020_app_write_cost``) or file stem."""
    for m in load_migrations():
        if name in (m.name, m.path.stem):
            return m.sql
    raise KeyError(name)


# One batch of the fill (its own transaction) over every dataset once: datasets no trigger ever stamped
# get a version, the writing transaction and their true max row_index, and a max the pre-007 trigger
# set too low (it started from -1 for a dataset that already had rows) is raised. ``greatest`` and the
# row locks mean a concurrent app write is never undone: its trigger either ran before (we wait for it
# and keep its larger values) or runs after us. A batch skips the rows the app holds right now (its
# writes must never queue behind a batch waiting for one of them); those are done afterwards one at a
# time, each waiting for the app while holding no other lock.
_FILL_IDS = "select id from datasets where id > %(after)s order by id limit %(batch)s"
_FILL_LOCK = "select id from datasets where id = any(%(ids)s::uuid[]) order by id for update skip locked"
_FILL_LOCK_ONE = "select id from datasets where id = %(id)s for update"
# A new statement, so a new snapshot (READ COMMITTED): max(row_index) sees every row committed before
# the locks were granted; the version is drawn after them, like the triggers do.
_FILL_STAMP = """
update datasets d
   set max_row_index = greatest(d.max_row_index, m.mx, -1),
       rows_rewrite_version = case when d.rows_version = 0 then greatest(d.rows_rewrite_version, v.v)
                                   else d.rows_rewrite_version end,
       rows_version = case when d.rows_version = 0 then v.v else d.rows_version end,
       rows_xid = coalesce(d.rows_xid, pg_current_xact_id())
  from (select x.id, (select max(r.row_index) from dataset_rows r where r.dataset_id = x.id) as mx
          from unnest(%(ids)s::uuid[]) as x(id)) m,
       (select nextval('lakehouse_rows_version_seq') as v) v
 where d.id = m.id
   and (d.rows_xid is null or d.max_row_index is null or d.max_row_index < m.mx)
"""

FILL_MARK = "007_change_tracking_filled"


def fill_change_tracking(conn: psycopg.Connection, *, batch: int = 1000) -> int:
    """Stamp change tracking on datasets that predate the triggers, in batches of ``batch`` datasets,
    each its own transaction. Safe to re-run (it only raises values and stamps what is unstamped); a
    mark in lakehouse_migrations, written at the end, makes the next ``migrate`` skip it. Returns the
    number of datasets it changed."""
    if conn.execute("select 1 from lakehouse_migrations where name = %s", (FILL_MARK,)).fetchone():
        return 0
    after, total, busy = "00000000-0000-0000-0000-000000000000", 0, []
    while True:
        ids = [r[0] for r in conn.execute(_FILL_IDS, {"after": after, "batch": batch}).fetchall()]
        if not ids:
            break
        with conn.transaction():
            locked = [r[0] for r in conn.execute(_FILL_LOCK, {"ids": ids}).fetchall()]
            if locked:
                total += conn.execute(_FILL_STAMP, {"ids": locked}).rowcount
        busy += sorted(set(ids) - set(locked))
        after = str(ids[-1])
    for ds_id in busy:
        with conn.transaction():
            if conn.execute(_FILL_LOCK_ONE, {"id": ds_id}).fetchone():
                total += conn.execute(_FILL_STAMP, {"ids": [ds_id]}).rowcount
    conn.execute("insert into lakehouse_migrations (name) values (%s) on conflict do nothing", (FILL_MARK,))
    return total


# The same key as the releases that took it per transaction (pg_advisory_xact_lock): an older release
# migrating at the same time waits for us, and we for it.
LOCK_KEY = locks.MIGRATE

# Every definition of the named functions in the current schema (md5 of pg_get_functiondef, by oid).
_DEFINITIONS = (
    "select p.proname::text, string_agg(md5(pg_get_functiondef(p.oid)), ',' order by p.oid) from pg_proc p"
    " where p.pronamespace = current_schema()::regnamespace and p.proname = any(%s) group by p.proname"
)


def apply_functions(conn: psycopg.Connection, functions: list[Function] | None = None) -> list[str]:
    """Re-apply the current function definitions in one transaction; returns ``functions/<name>.sql`` for
    each one whose definition changed. Nothing changed: the transaction is rolled back (no catalog write,
    no plan invalidation in the app's sessions)."""
    functions = load_functions() if functions is None else functions
    names = [f.name for f in functions]
    changed: list[str] = []
    with conn.transaction() as tx:
        before: dict[str, str] = dict(conn.execute(_DEFINITIONS, (names,)).fetchall())
        for f in functions:
            conn.execute(f.sql)
        after: dict[str, str] = dict(conn.execute(_DEFINITIONS, (names,)).fetchall())
        changed = [n for n in names if before.get(n) != after.get(n)]
        if not changed:
            raise psycopg.Rollback(tx)
    return [f"functions/{n}.sql" for n in changed]


def applied_migrations(conn: psycopg.Connection) -> dict:
    """Each migration recorded as applied, with when (``lakehouse db status``); empty on a database never
    migrated."""
    if not fetch_value(
        conn.execute("select to_regclass('lakehouse_migrations')"), "whether the migrations table exists"
    ):
        return {}
    return dict(conn.execute("select name, applied_at from lakehouse_migrations order by name").fetchall())


def migrate(
    conn: psycopg.Connection,
    *,
    migrations_dir: Path = MIGRATIONS_DIR,
    functions_dir: Path = FUNCTIONS_DIR,
    never_shipped: frozenset[int] = NEVER_SHIPPED,
) -> list[str]:
    """Apply pending migrations, each in its own transaction, then the current function definitions, then the
    change-tracking fill; returns what was applied now (empty when up to date). A migration that fails
    rolls back alone: the ones before it stay applied and recorded, the lock is released, the error raised."""
    migrations = load_migrations(migrations_dir, never_shipped=never_shipped)  # checked before any write
    functions = load_functions(functions_dir)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise MigrationError("migrate runs each migration in its own transaction: call it with no transaction open")
    applied_now: list[str] = []
    with conn.transaction():  # session-level: it outlives this transaction, until the unlock below
        conn.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        with conn.transaction():
            conn.execute(
                "create table if not exists lakehouse_migrations ("
                " name text primary key, applied_at timestamptz not null default now())"
            )
        done = {r[0] for r in conn.execute("select name from lakehouse_migrations")}
        for m in migrations:
            if m.name in done:
                continue
            try:
                with conn.transaction():
                    conn.execute(m.sql)
                    conn.execute("insert into lakehouse_migrations (name) values (%s)", (m.name,))
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {m.name} ({m.path.name}) failed and was rolled back"
                    f"{' after applying ' + ', '.join(applied_now) if applied_now else ''}: {exc}"
                ) from exc
            applied_now.append(m.name)
        applied_now += apply_functions(conn, functions)
        filled = fill_change_tracking(conn)
        if filled:
            applied_now.append(f"{FILL_MARK} ({filled} datasets)")
    finally:
        # A broken connection has lost the lock with its session.
        with contextlib.suppress(psycopg.OperationalError):
            if not conn.closed:
                with conn.transaction():
                    conn.execute("select pg_advisory_unlock(%s)", (LOCK_KEY,))
    return applied_now
