"""The mode switches: ``enable`` (to after-commit) and ``disable`` (back to triggers), both through ``_switch``:
one transaction under the lock ALTER TABLE ... TRIGGER takes on ``dataset_rows``, which writes the switch row the
consumer orders the stream by."""

from __future__ import annotations

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking import digest_sums
from lakehouse_dagster.tracking.capture.catching_up import catch_up, force_flush, sibling
from lakehouse_dagster.tracking.capture.errors import CaptureError, RowLocked
from lakehouse_dagster.tracking.capture.store import (
    AFTER_COMMIT,
    BARRIER_TRIGGERS,
    CONSUME_LOCK,
    DIGEST_TRIGGERS,
    LEGACY_WAL,
    PUBLICATION,
    TRACKING_TRIGGERS,
    TRIGGERS,
    State,
    _create_slot,
    _drop_all_sums,
    _mark_all_changed,
    _slot_exists,
    _slot_name,
    _tracking_triggers_as,
    _triggers_enabled,
    state,
)
from lakehouse_dagster.tracking.datasets import capture_setup


def enable(conn: psycopg.Connection, *, lock_timeout_ms: int = 10_000) -> dict:
    """Switch to capture mode "after-commit" (``conn`` autocommit). Idempotent; refuses with the reason when the
    server cannot decode (wal_level) or the table cannot be altered."""
    level = fetch_value(conn.execute("show wal_level"), "the server's wal_level")
    if level != "logical":
        raise CaptureError(
            f"wal_level is {level!r}: logical decoding needs wal_level = logical "
            "(ALTER SYSTEM SET wal_level = logical, then restart the server); nothing was changed"
        )
    target = AFTER_COMMIT
    st = state(conn)
    if (
        st.mode == target
        and st.slot
        and _slot_exists(conn, st.slot)
        and not _triggers_enabled(conn)
        and _tracking_triggers_as(conn, target)
    ):
        return {"mode": target, "changed": False, **catch_up(conn)}
    if not conn.execute("select 1 from pg_publication where pubname = %s", (PUBLICATION,)).fetchone():
        conn.execute(
            sql.SQL(
                "create publication {} for table {}, lakehouse_digest_capture_switch"
                " with (publish = 'insert, update, delete, truncate')"
            ).format(sql.Identifier(PUBLICATION), capture_setup.PUBLISHED)
        )
    slot = st.slot or _slot_name(conn)
    created = not _slot_exists(conn, slot)
    try:
        if created:  # before the switch: the stream then holds the switch row
            _create_slot(conn, slot, lock_timeout_ms)
        _switch(conn, st, slot, target, lock_timeout_ms)
    except psycopg.errors.LockNotAvailable:
        if created and conn.execute("select 1 from pg_replication_slots where slot_name = %s", (slot,)).fetchone():
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))  # nothing would consume it
        raise CaptureError(
            f"writing transactions stayed open for {lock_timeout_ms / 1000:g} s (the slot and the "
            "switch wait for every one; dataset_rows stayed locked): nothing was changed; try again "
            "when the app's long transactions are done"
        ) from None
    return {"mode": target, "changed": True, **catch_up(conn)}


def _switch(conn: psycopg.Connection, st: State, slot: str | None, target: str, lock_timeout_ms: int) -> None:
    """One transaction under the lock ALTER TABLE ... TRIGGER takes on dataset_rows (SHARE ROW EXCLUSIVE: it
    waits for every writing transaction and holds new ones), so every write is on one side of the switch row."""
    with conn.transaction():
        conn.execute("select set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
        # The table first, then the consumer's lock: an app writer in flight may wait on a reader's barrier,
        # and that reader on the consumer's lock (tracking/barrier.py); holding it while we wait would close a cycle.
        capture_setup.lock_rows_for_switch(conn)
        if st.mode == AFTER_COMMIT and target != AFTER_COMMIT:
            # The writes before this lock are tracked by the consumer only: apply every one now, before the
            # triggers take over (a version drawn by the consumer after theirs would hide a rewrite).
            try:
                _catch_up_beside(conn)
            except CaptureError as exc:
                if isinstance(exc, RowLocked):
                    raise
                _mark_all_changed(conn)  # a lost or missing slot: what it held is unknown
        conn.execute("select pg_advisory_xact_lock(%s, %s)", CONSUME_LOCK)
        again = st.mode != TRIGGERS and bool(_triggers_enabled(conn))
        # The previous release's mode wal: its sums were placed by the versions the app's transactions stamped,
        # which this consumer no longer reads; what the slot still holds of it cannot be applied, so every
        # registration goes (the next canaries fill them again from the rows).
        again = again or st.mode == LEGACY_WAL
        if target != "triggers":
            capture_setup.replica_identity_full(conn)
        digest_how = "enable always trigger" if target == "triggers" else "disable trigger"
        for t in DIGEST_TRIGGERS:
            capture_setup.set_trigger(conn, digest_how, t)
        tracked_here = target == AFTER_COMMIT
        for t in TRACKING_TRIGGERS:
            capture_setup.set_trigger(conn, "disable trigger" if tracked_here else "enable trigger", t)
        for t in BARRIER_TRIGGERS:
            capture_setup.set_trigger(conn, "enable always trigger" if tracked_here else "disable trigger", t)
        if again:  # the digest triggers were enabled behind the consumer: the sums are unknown
            _drop_all_sums(conn)
        conn.execute("insert into lakehouse_digest_capture_switch (mode) values (%s)", (target,))
        if target == "triggers":
            conn.execute("update lakehouse_digest_capture set mode = 'triggers', changed_at = now()")
            return
        conn.execute(
            "update lakehouse_digest_capture set mode = %s, slot = %s,"
            " applied_lsn = case when mode <> 'triggers' then applied_lsn end,"
            " applying = (mode <> 'triggers' and applying),"
            " tracking = (mode <> 'triggers' and tracking), changed_at = now()",
            (target, slot),
        )
        if st.mode == "triggers":
            # What the triggers summed so far is exact up to now (no write runs under this lock).
            digest_sums.exact_up_to_now(conn)


def _catch_up_beside(conn: psycopg.Connection) -> None:
    """Apply everything committed before now on a second connection, while ``conn`` holds its lock."""
    with sibling(conn) as other:
        force_flush(other)
        catch_up(other)


def disable(conn: psycopg.Connection, *, lock_timeout_ms: int = 10_000) -> dict:
    """Back to capture mode "triggers": the triggers take over in one transaction, the consumer applies
    what was written before it, then the slot and the publication are dropped (no WAL held back)."""
    st = state(conn)
    if st.mode != "triggers":
        try:
            _switch(conn, st, st.slot, "triggers", lock_timeout_ms)
        except psycopg.errors.LockNotAvailable:
            raise CaptureError(
                f"dataset_rows stayed locked by other transactions for {lock_timeout_ms / 1000:g} s "
                f"(the switch needs a brief lock that waits for every writer): still capture mode {st.mode}; try again "
                "when the app's long transactions are done"
            ) from None
    out = {"mode": "triggers", "changed": st.mode != "triggers"}
    if st.slot:
        try:
            out.update(catch_up(conn))
        except CaptureError as exc:  # a lost or missing slot: what it held is unknown, so are the sums
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s, %s)", CONSUME_LOCK)
                out["registrations_dropped"] = _drop_all_sums(conn)
            out["consumer_error"] = str(exc)
        if conn.execute("select 1 from pg_replication_slots where slot_name = %s", (st.slot,)).fetchone():
            conn.execute("select pg_drop_replication_slot(%s)", (st.slot,))
    conn.execute(
        "update lakehouse_digest_capture set slot = null, applied_lsn = null, applying = false, tracking = false"
    )
    conn.execute(sql.SQL("drop publication if exists {}").format(sql.Identifier(PUBLICATION)))
    return out
