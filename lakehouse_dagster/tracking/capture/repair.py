"""After a lost slot (``repair``): a new slot, every registration dropped, the switch row written again."""

from __future__ import annotations

import psycopg

from lakehouse_dagster.tracking.capture.catching_up import catch_up
from lakehouse_dagster.tracking.capture.errors import CaptureError
from lakehouse_dagster.tracking.capture.store import (
    AFTER_COMMIT,
    CONSUME_LOCK,
    _create_slot,
    _drop_all_sums,
    _mark_all_changed,
    _slot_name,
    state,
)


def repair(conn: psycopg.Connection) -> dict:
    """After a lost slot: every registration is dropped (its sums may miss writes), a new slot is made and
    the switch row written again; the next canaries fill the sums afresh."""
    st = state(conn)
    if st.mode == "triggers":
        return {"mode": st.mode, "repaired": False}
    if st.slot and conn.execute("select 1 from pg_replication_slots where slot_name = %s", (st.slot,)).fetchone():
        conn.execute("select pg_drop_replication_slot(%s)", (st.slot,))
    slot = _slot_name(conn)
    try:
        _create_slot(conn, slot, 10_000)
    except psycopg.errors.LockNotAvailable:
        raise CaptureError(
            "writing transactions stayed open for 10 s (a new slot waits for every one): no new "
            "slot was made; run `lakehouse digest-capture repair` again when the app's long "
            "transactions are done"
        ) from None
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s, %s)", CONSUME_LOCK)
        dropped = _drop_all_sums(conn)
        out = {}
        if st.mode == AFTER_COMMIT or st.tracking:
            out["datasets_marked_changed"] = _mark_all_changed(conn)
        conn.execute("insert into lakehouse_digest_capture_switch (mode) values (%s)", (st.mode,))
        conn.execute(
            "update lakehouse_digest_capture set slot = %s, applied_lsn = null, applying = false,"
            " tracking = false, changed_at = now()",
            (slot,),
        )
    return {"mode": st.mode, "repaired": True, "registrations_dropped": dropped, **out, **catch_up(conn)}
