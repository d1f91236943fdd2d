"""The capture state: the modes and triggers by name, the one row of ``lakehouse_digest_capture`` as read
(``state``, ``status``, ``active``) and as the SQL expressions other owners' queries put it in
(``MODE_IS_AFTER_COMMIT``, ``APPLYING``, ``MODE_AND_MESSAGES``), the slot and the triggers as they stand.

The package owns its two tables (lakehouse_dagster_tests/test_table_owners.py); each statement that writes them
stays beside the step it belongs to: the switch row and the mode (switch.py), repair's (repair.py), the end LSN the
consumer reached, in the transaction of what it applied (consumer.py), the upgrade's note (upgrade.py)."""

from __future__ import annotations

import dataclasses

import psycopg
from psycopg import sql

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.tracking import digest_sums
from lakehouse_dagster.tracking.capture.errors import CaptureError
from lakehouse_dagster.tracking.datasets import capture_setup, stamps

PUBLICATION = "lakehouse_digest"
DIGEST_TRIGGERS = (
    "lakehouse_rows_ins_digest",
    "lakehouse_rows_upd_digest",
    "lakehouse_rows_del_digest",
    "lakehouse_rows_trunc_digest",
)
TRACKING_TRIGGERS = ("lakehouse_rows_ins", "lakehouse_rows_upd", "lakehouse_rows_del")  # TRUNCATE's stays on
BARRIER_TRIGGERS = ("lakehouse_rows_barrier_ins", "lakehouse_rows_barrier_upd", "lakehouse_rows_barrier_del")
CONSUME_LOCK = (locks.CAPTURE_CONSUME, 0)  # advisory (class, key): one consumer (or fill behind it) at a time
TRIGGERS = "triggers"
AFTER_COMMIT = "after-commit"
MODES = (TRIGGERS, AFTER_COMMIT)
RENAMED = {"wal-tracking": AFTER_COMMIT}  # the previous release's name for it (CLI, stream markers)
LEGACY_WAL = "wal"  # the previous release's third mode: only ever read, to move a database out of it
REVERSE_PREFIX = "lakehouse_reverse"  # the reverse mirror's no-echo message (mirror/reverse.py)
MESSAGES_FROM = 140_000  # server_version_num from which pgoutput sends logical messages (option messages)

# Every statement on lakehouse_digest_capture is in this package (its owner: lakehouse_dagster_tests/test_table_owners.py);
# the SQL expressions below are how readers put the mode in a query they run anyway.
# The one test of the mode, as an SQL expression (tracking/barrier.py): capture mode triggers pays nothing for it.
MODE_IS_AFTER_COMMIT = "(select mode = 'after-commit' from lakehouse_digest_capture)"
# Whether the WAL consumer has passed the switch to after-commit, as an SQL expression (false without the row).
APPLYING = "coalesce((select applying from lakehouse_digest_capture), false)"
# The mode and whether this server's pgoutput sends logical messages (the reverse mirror, under its table lock).
MODE_AND_MESSAGES = sql.SQL(
    "select mode, current_setting('server_version_num')::int >= {v} from lakehouse_digest_capture"
).format(v=sql.Literal(MESSAGES_FROM))


@dataclasses.dataclass(frozen=True)
class State:
    mode: str
    slot: str | None
    applied_lsn: str | None
    applying: bool
    tracking: bool = False  # the consumer has passed a switch to after-commit: it writes change tracking


def state(conn: psycopg.Connection) -> State:
    row = conn.execute(
        "select mode, slot, applied_lsn::text, applying, tracking from lakehouse_digest_capture"
    ).fetchone()
    return State(*row) if row else State("triggers", None, None, False)


def status(conn: psycopg.Connection) -> dict:
    """What an operator asks: the mode, how far behind the consumer is, what the slot holds back."""
    st = state(conn)
    out = {
        "mode": st.mode,
        "wal_level": fetch_value(conn.execute("show wal_level"), "the server's wal_level"),
        "slot": st.slot,
        "applied_lsn": st.applied_lsn,
        "applying": st.applying,
        "tracking": st.tracking,
    }
    if st.slot:
        row = conn.execute(
            "select wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint"
            " from pg_replication_slots where slot_name = %s",
            (st.slot,),
        ).fetchone()
        if row is None:
            out["slot_status"] = "missing"
        else:
            out.update(slot_status=row[0], behind_bytes=row[1], retained_wal_bytes=row[2])
    return out


def active(conn: psycopg.Connection) -> bool:
    """A slot is set: capture mode after-commit, or a switch back whose last changes are still to apply."""
    return fetch_value(
        conn.execute("select slot is not null from lakehouse_digest_capture"),
        "the capture state (the one row of lakehouse_digest_capture)",
    )


def reverse_blocked(conn: psycopg.Connection) -> str | None:
    """Why the reverse mirror cannot keep ``dataset_rows`` in this capture mode (None: it can). In after-commit it
    marks its transactions with a logical message this consumer must receive: pgoutput sends them from
    PostgreSQL 14. One query (none on 14+)."""
    if conn.info.server_version >= MESSAGES_FROM or not active(conn):
        return None
    return (
        "capture mode is after-commit on PostgreSQL < 14, whose pgoutput cannot carry the reverse mirror's no-echo "
        "mark (a logical message), so its rows would count as the live app's writes: `lakehouse digest-capture "
        "triggers`, or PostgreSQL 14+"
    )


def _slot_name(conn: psycopg.Connection) -> str:
    oid = fetch_value(
        conn.execute("select oid from pg_database where datname = current_database()"), "the current database's oid"
    )
    return f"lakehouse_digest_{oid}"  # slots are per server; one per database


def _create_slot(conn: psycopg.Connection, slot: str, lock_timeout_ms: int) -> None:
    """Creating a logical slot waits for every transaction that has written to finish (its starting point must
    be consistent): bounded like the switch's lock, so an app transaction left open cannot hang the command."""
    with conn.transaction():
        conn.execute("select set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
        conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def _lost(slot: str) -> CaptureError:
    return CaptureError(
        f"replication slot {slot} lost WAL it had not decoded (max_slot_wal_keep_size): "
        "run `lakehouse digest-capture repair` (drops the maintained sums; canaries refill them)"
    )


def _slot_exists(conn: psycopg.Connection, slot: str) -> bool:
    row = conn.execute("select wal_status from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
    if row is not None and row[0] == "lost":
        raise _lost(slot)
    return row is not None


# The digest triggers not disabled on dataset_rows (an array of names).
_ENABLED_TRIGGERS = capture_setup.ROWS_TRIGGERS_ENABLED


def _triggers_enabled(conn: psycopg.Connection) -> list[str]:
    return fetch_value(
        conn.execute(sql.SQL("select ") + sql.SQL(_ENABLED_TRIGGERS), (list(DIGEST_TRIGGERS),)),
        "the enabled digest triggers",
    )


def _tracking_triggers_as(conn: psycopg.Connection, mode: str) -> bool:
    """Change tracking's triggers as ``mode`` has them: in the app's transaction, or only the barrier."""
    on = set(
        fetch_value(
            conn.execute(
                sql.SQL("select ") + sql.SQL(_ENABLED_TRIGGERS), (list(TRACKING_TRIGGERS + BARRIER_TRIGGERS),)
            ),
            "the enabled tracking and barrier triggers",
        )
    )
    want = set(BARRIER_TRIGGERS) if mode == AFTER_COMMIT else set(TRACKING_TRIGGERS)
    return on == want


def _mark_all_changed(conn: psycopg.Connection) -> int:
    """Lost WAL held change tracking nobody wrote: which datasets it changed is unknown, so every one has
    changed (a new version, a rewrite, an unknown max), as after a TRUNCATE: each syncs in full once."""
    v = fetch_value(
        conn.execute("select nextval('lakehouse_rows_version_seq')"),
        "the next rows version (lakehouse_rows_version_seq)",
    )
    return stamps.mark_all_changed(conn, v)


def _drop_all_sums(conn: psycopg.Connection) -> int:
    """Every registration and its deltas (sums that may miss or double-count writes); returns how many."""
    return digest_sums.drop_all(conn)
