"""Upgrade in place from the previous release: a database built, seeded, mirrored, checked and flagged by the
previous release's own code (extracted from git and run in a subprocess) is migrated by this tree's
`lakehouse db migrate`, while the app writes. Nothing is lost, nothing is re-applied, the schema is the one a fresh
database gets, and the mirror, the canary and the flags keep working — from each capture mode the previous release
had, moved to one of this release's two (triggers, after-commit) with the reason printed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

import lakehouse_dagster
from lakehouse_dagster.core.db import connect
from lakehouse_dagster.schema.migrate import FILL_MARK, load_migrations
from lakehouse_dagster.testing.cli import run_cli
from lakehouse_dagster_tests.conftest import _with_db

pytestmark = pytest.mark.slow  # the previous release's code in subprocesses, per capture mode

PREVIOUS_RELEASE = "cc94412"  # main, the last release before the schema became files
# The migrations this tree adds to that release's (in order): an upgrade applies exactly these.
REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "lakehouse_dagster.cli.main"]
# What this tree applies over the previous release: every migration after its last one (024).
# created by the new migrations (028_recorder, 038_shadow_proofs)
NEW_TRIGGERS = {"lakehouse_sync_log_changed_xid", "lakehouse_shadow_proof_count"}


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory) -> Path:
    """The previous release's package, extracted from this repository's history (CI runs on a full clone)."""
    git = shutil.which("git")
    if git is None:
        pytest.fail("test_upgrade needs git, to extract the previous release from the repository's history")
    found = subprocess.run(
        [git, "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.fail(
            f"the previous release (commit {PREVIOUS_RELEASE}) is not in the repository at {REPO}: the upgrade test"
            f" needs the history (a full clone, or `git fetch --unshallow`): {found.stderr.strip()}"
        )
    archive = subprocess.run(
        [git, "-C", str(REPO), "archive", PREVIOUS_RELEASE, "lakehouse_dagster"], capture_output=True, check=True
    )
    root = tmp_path_factory.mktemp("previous-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    assert (root / "lakehouse_dagster" / "store" / "migrations.py").is_file()
    return root


def _run(code_root: Path, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``lakehouse <args>`` with the package of ``code_root`` (run from there: -m puts the cwd first on the path);
    this tree's, the package this process imported, in-process (testing/cli.py)."""
    if code_root == REPO and Path(lakehouse_dagster.__file__).resolve().parents[1] == REPO:
        out = run_cli(*args, env=env)
    else:
        out = subprocess.run(
            [*CLI, *args],
            cwd=code_root,
            env={**os.environ, **env, "PYTHONPATH": str(code_root)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    if check:
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stdout, out.stderr)
    return out


def _json(code_root: Path, env: dict, *args: str):
    return json.loads(_run(code_root, env, *args, "--json").stdout)


def test_every_migration_file_is_byte_identical_to_what_the_previous_release_applied(previous_release):
    dump = (
        "import hashlib, json; from lakehouse_dagster.store.migrations import MIGRATIONS;"
        " print(json.dumps([[n, hashlib.sha256(s.encode()).hexdigest()] for n, s in MIGRATIONS]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", dump],
        cwd=previous_release,
        env={**os.environ, "PYTHONPATH": str(previous_release)},
        capture_output=True,
        text=True,
        check=True,
    )
    old = dict(json.loads(out.stdout))
    new = {m.name: hashlib.sha256(m.path.read_bytes()).hexdigest() for m in load_migrations()}
    assert {n: new.get(n) for n in old} == old  # every shipped one, under its recorded name, byte for byte


def _schema(conn, tables: set[str] | None = None) -> dict[str, list]:
    """The structure of the public schema (not what the capture mode switches: trigger enabled state, replica
    identity; not the row-hash functions made per registered hash expression)."""
    q = {
        "tables": "select c.relname::text, c.relkind::text from pg_class c where c.relnamespace = 'public'::regnamespace"
        " and c.relkind in ('r', 'p', 'v', 'm', 'S')",
        "columns": "select table_name::text, column_name::text, data_type::text, coalesce(column_default, ''),"
        " is_nullable::text, ordinal_position::int from information_schema.columns where table_schema = 'public'",
        "indexes": "select tablename::text, indexname::text, indexdef from pg_indexes where schemaname = 'public'",
        "constraints": "select conrelid::regclass::text, conname::text, pg_get_constraintdef(oid) from pg_constraint"
        " where connamespace = 'public'::regnamespace and conrelid <> 0",
        "triggers": "select tgrelid::regclass::text, tgname::text, pg_get_triggerdef(oid) from pg_trigger"
        " where not tgisinternal",
        "functions": "select p.proname::text, pg_get_functiondef(p.oid) from pg_proc p"
        " where p.pronamespace = 'public'::regnamespace and p.proname not like 'lakehouse_rowdigest_%%'",
        "types": "select t.typname::text, t.typtype::text from pg_type t left join pg_class c on c.oid = t.typrelid"
        " where t.typnamespace = 'public'::regnamespace and t.typtype in ('c', 'e', 'd')"
        " and (c.relkind is null or c.relkind = 'c')",
    }
    out = {k: sorted(conn.execute(v).fetchall()) for k, v in q.items()}
    if tables is not None:  # objects of tables the migrations do not create (the Iceberg SQL catalog's) are left out
        for k in ("tables", "columns", "indexes", "constraints", "triggers"):
            out[k] = [r for r in out[k] if r[0] in tables]
    return out


_COUNTED = (
    "workspaces",
    "datasets",
    "dataset_rows",
    "pipelines",
    "iceberg_sync_log",
    "lakehouse_read_parity",
    "lakehouse_flag_overrides",
    "lakehouse_flag_audit",
    "lakehouse_pg_digest_state",
    "lakehouse_file_digests",
    "lakehouse_migrations",
)


def _facts(conn) -> dict:
    return {
        "counts": {t: conn.execute(f"select count(*) from {t}").fetchone()[0] for t in _COUNTED},
        "migrations": sorted(r[0] for r in conn.execute("select name from lakehouse_migrations")),
        "flags": conn.execute(
            "select kind, name, scope, scope_id::text, mode, set_by from lakehouse_flag_overrides order by 1, 2, 3, 4"
        ).fetchall(),
        "triggers": conn.execute(
            "select tgrelid::regclass::text, tgname, tgenabled from pg_trigger where not tgisinternal order by 1, 2"
        ).fetchall(),
        "capture": conn.execute("select mode, slot, tracking from lakehouse_digest_capture").fetchall(),
        "slots": conn.execute(
            "select slot_name::text from pg_replication_slots where database = current_database()"
        ).fetchall(),
        "datasets": conn.execute(
            "select id, rows_version, rows_rewrite_version, max_row_index, mirrored_version, row_count from datasets"
            " order by id"
        ).fetchall(),
    }


class _database:
    def __init__(self, admin_dsn: str):
        self.admin, self.name = admin_dsn, f"u_{uuid.uuid4().hex[:16]}"

    def __enter__(self) -> str:
        with psycopg.connect(self.admin, autocommit=True) as a:
            a.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(self.name)))
        return _with_db(self.admin, self.name)

    def __exit__(self, *exc):
        with psycopg.connect(self.admin, autocommit=True) as a:
            a.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots where database = %s",
                (self.name,),
            )
            a.execute(
                psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(self.name))
            )


def _app_insert(conn, dataset_id, rows: list[dict]) -> None:
    """The live app appending rows (the foundation columns only, as tests/foundation.py's app does)."""
    start = conn.execute(
        "select coalesce(max(row_index), -1) + 1 from dataset_rows where dataset_id = %s", (dataset_id,)
    ).fetchone()[0]
    with conn.cursor() as cur:
        cur.executemany(
            "insert into dataset_rows (dataset_id, row_index, data) values (%s, %s, %s)",
            [(dataset_id, start + i, psycopg.types.json.Jsonb(r)) for i, r in enumerate(rows)],
        )


def _customer(i: int) -> dict:
    return {
        "customer_id": 900_000 + i,
        "name": f"upgrade {i}",
        "email": f"u{i}@example.com",
        "country": "NL",
        "signup_date": "2026-11-30",
        "vip": i % 2 == 0,
        "lifetime_value": 12.5 * i,
    }


def _event(i: int) -> dict:
    """A row of the demo's events dataset: only keys its schema declares (a key it does not declare fails the
    mirror, issue 42 item 5; this app wrote customer rows into events, which the mirror used to drop silently)."""
    return {
        "event_id": 900_000 + i,
        "user_name": f"upgrade {i}",
        "amount": 1.5 * i,
        "is_active": i % 2 == 0,
        "occurred_at": "2026-11-30T12:00:00Z",
        "event_date": "2026-11-30",
        "payload": {"i": i},
    }


# The previous release's mode, and what this tree's migrate makes of it (tracking/capture/upgrade.py,
# upgrade_from_previous_release): wal-tracking is renamed; wal goes to after-commit when its slot and consumer
# are healthy, else to triggers; each with its reason printed once.
UPGRADES = {
    "triggers": ("triggers", None),
    "wal-tracking": ("after-commit", "capture mode wal-tracking is now named after-commit (the same mode"),
    "wal": (
        "after-commit",
        "capture mode wal was removed in this release: moved to after-commit, because its"
        " replication slot and WAL consumer are healthy",
    ),
    "wal, its slot lost": (
        "triggers",
        "capture mode wal was removed in this release: moved to triggers, because"
        " its WAL consumer cannot run: replication slot",
    ),
}


class _live_app:
    """The app appending one row at a time on its own connection while migrate runs."""

    def __init__(self, dsn: str, dataset_id):
        self.dsn, self.dataset_id, self.written, self.errors = dsn, dataset_id, 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            with connect(self.dsn) as app:
                while not self.stop.is_set():
                    _app_insert(app, self.dataset_id, [_event(1000 + self.written)])
                    self.written += 1
                    time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def __enter__(self):
        self.thread.start()
        while not self.written and not self.errors:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=60)


# The migrations this tree adds to the previous release (in the order they apply).
NEW_MIGRATIONS = [
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
    "036_lifecycle",
    "037_shadow_proof",
    "038_shadow_proofs",
]


@pytest.mark.parametrize("capture_mode", list(UPGRADES))
def test_upgrade_in_place_from_the_previous_release(previous_release, pg_admin_dsn, tmp_path, capture_mode):
    old, new = previous_release, REPO
    old_mode = capture_mode.split(",")[0]
    upgraded_mode, why = UPGRADES[capture_mode]
    with _database(pg_admin_dsn) as dsn, _database(pg_admin_dsn) as fresh_dsn:
        env = {
            "LAKEHOUSE_PG_DSN": dsn,
            "LAKEHOUSE_HOME": str(tmp_path / "home"),
            "LAKEHOUSE_WAREHOUSE": (tmp_path / "warehouse").as_uri(),
            "LAKEHOUSE_NAMESPACE": "lakehouse",
            "LAKEHOUSE_ACTOR": "pytest-upgrade",
            "LAKEHOUSE_SOAK_SECONDS": "0",
            "LAKEHOUSE_FLAG_LISTEN": "false",
        }
        (tmp_path / "warehouse").mkdir()
        conn = connect(dsn)
        if old_mode != "triggers" and conn.execute("show wal_level").fetchone()[0] != "logical":
            pytest.skip(f"capture mode {old_mode} needs a server with wal_level = logical")

        # --- the previous release builds, seeds, mirrors, checks and flags the database
        out = _run(old, env, "db", "migrate").stdout
        assert out.startswith("applied 20 migration(s): 001_app_schema,"), out
        seeded = _json(old, env, "demo", "seed", "--rows", "3000")
        ids = {d["name"]: d["id"] for d in seeded["datasets"]}
        customers, events = ids["customers"], ids["events"]
        if old_mode != "triggers":
            assert f"capture mode: {old_mode}" in _run(old, env, "digest-capture", old_mode).stdout
        synced = _json(old, env, "sync", "--dataset", customers, "--dataset", events)["syncs"]
        assert [(s["mode"], s["total_rows"] > 0) for s in synced] == [("full", True), ("full", True)], synced
        verdicts = _json(old, env, "canary", "--dataset", customers)
        assert [r["verdict"] for r in verdicts["results"]] == ["ok"], verdicts
        _run(old, env, "flags", "set", "export.stream", "iceberg", "--dataset", customers, "--note", "old release")
        _run(old, env, "flags", "set", "studio.digest", "shadow")  # a global one too
        _app_insert(conn, customers, [_customer(i) for i in range(3)])  # a write the old release never mirrored
        if capture_mode == "wal, its slot lost":  # invalidated past max_slot_wal_keep_size, or dropped by hand
            conn.execute(
                "select pg_drop_replication_slot(slot_name) from pg_replication_slots"
                " where database = current_database()"
            )
        before = _facts(conn)
        assert FILL_MARK in before["migrations"] and len(before["migrations"]) == 21
        assert before["capture"][0][0] == old_mode

        # --- this tree's migrate, the app writing all along: applies the one new migration, moves the capture
        # mode to one of the two this tree has and says why, loses nothing
        with _live_app(dsn, events) as app:
            done = _json(new, env, "db", "migrate")
        assert not app.errors, repr(app.errors[0])
        assert [a for a in done["applied"] if not a.startswith("functions/")] == NEW_MIGRATIONS, done
        notes = done.get("capture_mode", [])
        assert (why is None and notes == []) or (len(notes) == 1 and notes[0].startswith(why)), notes
        if old_mode == "wal":  # the command to go the other way is in the message
            other = "triggers" if upgraded_mode == "after-commit" else "after-commit"
            assert f"lakehouse digest-capture {other}" in notes[0], notes
        after = _facts(conn)
        assert after["capture"][0][0] == upgraded_mode
        assert after["migrations"] == sorted([*before["migrations"], *NEW_MIGRATIONS])
        _same_data(before, after, app.written, events, sums_dropped=old_mode == "wal")
        assert _triggers_as(after, upgraded_mode)
        if upgraded_mode == "triggers":
            assert after["slots"] == [] and after["capture"][0][1] is None  # no WAL held back
        else:
            assert len(after["slots"]) == 1 and after["capture"][0][2] is True  # the consumer writes the tracking
        settled = _facts(conn)
        assert _run(new, env, "db", "migrate").stdout == "schema up to date\n"  # idempotent: nothing said again
        assert _facts(conn) == settled
        status = _json(new, env, "db", "status")
        assert all(s["applied_at"] for s in status) and len(status) == len(load_migrations())

        # ... and its schema is the one this tree gives a fresh database (016 before 018 there: the same result)
        with connect(fresh_dsn) as fresh:
            _run(new, {**env, "LAKEHOUSE_PG_DSN": fresh_dsn}, "db", "migrate")
            expected = _schema(fresh)
        tables = {r[0] for r in expected["tables"]}
        assert _schema(conn, tables) == expected

        # --- this tree's mirror, canary and flags on the upgraded database
        _app_insert(conn, customers, [_customer(i) for i in range(3, 5)])
        pg_rows = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (customers,)).fetchone()[0]
        synced = _json(new, env, "sync", "--dataset", customers)["syncs"]
        assert synced[0]["total_rows"] == pg_rows, synced
        assert conn.execute(
            "select status from iceberg_sync_log where dataset_id = %s order by id desc limit 1", (customers,)
        ).fetchone() == ("succeeded",)
        verdicts = _json(new, env, "canary", "--dataset", customers)
        assert [r["verdict"] for r in verdicts["results"]] == ["ok"], verdicts
        effective = {e["name"]: e for e in _json(new, env, "flags", "list", "--dataset", customers)["effective"]}
        assert effective["export.stream"]["mode"] == "iceberg"  # the old release's override still resolves
        conn.execute("listen lakehouse_flags")
        _run(new, env, "flags", "set", "graph.kuzu", "iceberg", "--dataset", customers)
        assert {n.channel for n in conn.notifies(timeout=10, stop_after=1)} == {"lakehouse_flags"}
        effective = {e["name"]: e for e in _json(new, env, "flags", "list", "--dataset", customers)["effective"]}
        assert {n: effective[n]["mode"] for n in ("graph.kuzu", "export.stream", "studio.digest")} == {
            "graph.kuzu": "iceberg",
            "export.stream": "iceberg",
            "studio.digest": "shadow",
        }
        assert _json(new, env, "digest-capture")["mode"] == upgraded_mode
        pg_rows = conn.execute("select count(*) from dataset_rows where dataset_id = %s", (events,)).fetchone()[0]
        synced = _json(new, env, "sync", "--dataset", events)["syncs"]  # the rows the live app wrote meanwhile
        assert synced[0]["total_rows"] == pg_rows, synced
        verdicts = _json(new, env, "canary", "--dataset", events)
        assert [r["verdict"] for r in verdicts["results"]] == ["ok"], verdicts
        conn.close()


def _same_data(before: dict, after: dict, written: int, live, *, sums_dropped: bool) -> None:
    """Nothing lost: every row, sync, verdict, flag, trigger (but dataset_rows's, the capture mode's) and
    dataset's tracking as before, but for the rows the live app wrote meanwhile into dataset ``live`` (the new
    migrations recorded; the maintained sums of mode wal dropped: the next canaries fill them again)."""
    counts = dict(before["counts"], dataset_rows=before["counts"]["dataset_rows"] + written)
    counts["lakehouse_migrations"] += len(NEW_MIGRATIONS)
    if sums_dropped:
        counts["lakehouse_pg_digest_state"] = 0
    assert after["counts"] == counts
    assert after["flags"] == before["flags"]
    # tables the new migrations create (026_stored_soak, 033_reverse_mirror, 034_complete, 036_lifecycle): their
    # triggers
    new_tables = {
        "lakehouse_settings_audit",
        "lakehouse_reverse_audit",
        "lakehouse_complete_audit",
        "lakehouse_lifecycle_history",
    }
    assert [
        t for t in after["triggers"] if t[0] != "dataset_rows" and t[0] not in new_tables and t[1] not in NEW_TRIGGERS
    ] == [t for t in before["triggers"] if t[0] != "dataset_rows"]
    assert [d[0] for d in after["datasets"]] == [d[0] for d in before["datasets"]]
    for b, a in zip(before["datasets"], after["datasets"]):
        if str(a[0]) == str(live):
            assert a[1] >= b[1] and a[2] >= b[2], (b, a)  # moved on, never back
        else:
            assert a == b


def _triggers_as(facts: dict, mode: str) -> bool:
    """dataset_rows's triggers as the mode has them: change tracking and the digest in the transaction, or only
    the barrier."""
    on = {t for rel, t, state in facts["triggers"] if rel == "dataset_rows" and state != "D"}
    tracking = {"lakehouse_rows_ins", "lakehouse_rows_upd", "lakehouse_rows_del"}
    digest = {"lakehouse_rows_ins_digest", "lakehouse_rows_upd_digest", "lakehouse_rows_del_digest"}
    barrier = {"lakehouse_rows_barrier_ins", "lakehouse_rows_barrier_upd", "lakehouse_rows_barrier_del"}
    if mode == "triggers":
        return tracking | digest <= on and not on & barrier
    return barrier <= on and not on & (tracking | digest)
