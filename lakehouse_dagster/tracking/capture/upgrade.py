"""The upgrade from the previous release (``lakehouse db migrate``): a database left in capture mode wal moves to
after-commit or triggers, and migration 025's rename note is returned once."""

from __future__ import annotations

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.schema.migrate import LOCK_KEY
from lakehouse_dagster.tracking.capture.catching_up import catch_up
from lakehouse_dagster.tracking.capture.errors import CaptureError
from lakehouse_dagster.tracking.capture.store import LEGACY_WAL, state
from lakehouse_dagster.tracking.capture.switch import disable, enable


def upgrade_from_previous_release(conn: psycopg.Connection, *, lock_timeout_ms: int = 10_000) -> list[str]:
    """What ``lakehouse db migrate`` does after the numbered migrations: a database the previous release left in
    capture mode wal is moved to after-commit when its slot and consumer are healthy (the operator took work out
    of the app's transaction; after-commit does that for change tracking too, with the same requirements), else
    to triggers; the reason is returned, to be printed. Also returns, once, the note migration 025 left when it
    renamed wal-tracking. ``conn`` autocommit. Idempotent (nothing to say the second time); under migrate's
    lock, so two migrating processes do it once. A live app keeps writing: the switch is ``_switch``'s (a brief
    table lock that waits for every writer), and when that lock cannot be had the database stays in wal (still
    read correctly: its change tracking is in the app's transaction) and this raises: migrate again."""

    notes: list[str] = []
    conn.execute("select pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        if (
            fetch_value(
                conn.execute("select to_regclass('lakehouse_digest_capture')"), "whether the capture state table exists"
            )
            is None
        ):
            return notes
        if state(conn).mode == LEGACY_WAL:
            notes.append(_leave_wal(conn, lock_timeout_ms))
        with conn.transaction():
            row = conn.execute(
                "select upgrade_note from lakehouse_digest_capture where upgrade_note is not null for update"
            ).fetchone()
            if row is not None:
                conn.execute("update lakehouse_digest_capture set upgrade_note = null")
                notes.insert(0, row[0])
    finally:
        conn.execute("select pg_advisory_unlock(%s)", (LOCK_KEY,))
    return notes


def _leave_wal(conn: psycopg.Connection, lock_timeout_ms: int) -> str:
    gone = "capture mode wal was removed in this release"
    unhealthy = _wal_consumer_unhealthy(conn)
    try:
        if unhealthy is None:
            done = enable(conn, lock_timeout_ms=lock_timeout_ms)
            return (
                f"{gone}: moved to after-commit, because its replication slot and WAL consumer are healthy (caught"
                " up) and after-commit takes change tracking out of the app's transaction as well as the digest,"
                " with the same requirements (wal_level = logical, the slot); the maintained sums were dropped"
                f" (the next canaries fill them again); {done.get('transactions', 0)} transaction(s) applied."
                " To go back: lakehouse digest-capture triggers"
            )
        disable(conn, lock_timeout_ms=lock_timeout_ms)
        return (
            f"{gone}: moved to triggers, because {unhealthy}; the maintained sums were dropped (the next canaries"
            " fill them again). To take change tracking and the digest out of the app's transaction once that is"
            " fixed: lakehouse digest-capture after-commit"
        )
    except CaptureError as exc:
        raise CaptureError(
            f"{gone} and this database is still in it: {exc}; run `lakehouse db migrate` again"
        ) from None


def _wal_consumer_unhealthy(conn: psycopg.Connection) -> str | None:
    """Why the slot or its consumer cannot carry capture mode after-commit (None: they can): a catch-up is
    run, which also leaves little for the switch to apply."""
    level = fetch_value(conn.execute("show wal_level"), "the server's wal_level")
    if level != "logical":
        return f"wal_level is {level!r} (logical decoding needs wal_level = logical)"
    if not state(conn).slot:
        return "no replication slot is recorded for it"
    try:
        catch_up(conn)
    except CaptureError as exc:
        return f"its WAL consumer cannot run: {exc}"
    return None
