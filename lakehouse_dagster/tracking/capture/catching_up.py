"""The WAL consumer's loop (``catch_up``): peek a chunk, apply it (consumer.py), advance the slot, under the
consumer's lock; and how a caller gets what committed before now applied (``sibling``, ``force_flush``).

Named catching_up, not catch_up: the package re-exports the function ``catch_up``, which a submodule of that name
would shadow."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from lakehouse_dagster.core.db import fetch_one
from lakehouse_dagster.tracking import pgoutput
from lakehouse_dagster.tracking.capture.consumer import _Consumer
from lakehouse_dagster.tracking.capture.errors import CaptureError, RowLocked
from lakehouse_dagster.tracking.capture.store import (
    _ENABLED_TRIGGERS,
    AFTER_COMMIT,
    BARRIER_TRIGGERS,
    CONSUME_LOCK,
    DIGEST_TRIGGERS,
    MESSAGES_FROM,
    PUBLICATION,
    _drop_all_sums,
    _lost,
    active,
)

CHUNK_CHANGES = 20_000  # messages per consumer transaction (a chunk ends at a transaction boundary)


def sibling(conn: psycopg.Connection) -> psycopg.Connection:
    """A second autocommit connection to the same database (``conn`` is inside a transaction)."""
    params: dict[str, Any] = dict(conn.info.get_parameters())
    if conn.info.password:
        params["password"] = conn.info.password
    return psycopg.connect(**params, autocommit=True)


def force_flush(conn: psycopg.Connection) -> None:
    """Flush the WAL up to now: decoding reads flushed WAL only, and a commit made with synchronous_commit =
    off may not be flushed yet (a transactional message makes this commit write, and so flush, WAL)."""
    with conn.transaction():
        conn.execute("select set_config('synchronous_commit', 'on', true)")
        conn.execute("select pg_logical_emit_message(true, 'lakehouse_barrier', '')")


def _log_running_xacts(conn: psycopg.Connection) -> None:
    """Every peek decodes from the slot's restart_lsn, which moves only past a running-transactions record that a
    previous advance confirmed; Postgres logs one every 15 s, so each peek would re-decode up to 15 s of the
    server's WAL (all databases). Logging one before each catch-up bounds that by the WAL since the previous one
    (test: four rounds of 320 kB of unrelated WAL leave 1.3 MB to re-decode without, one round's at most with).
    PostgreSQL 16+, superuser unless granted: otherwise skipped (slower, not wrong)."""
    try:
        conn.execute("select pg_log_standby_snapshot()")
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction):
        pass


def catch_up(conn: psycopg.Connection, *, chunk: int = CHUNK_CHANGES, row_lock_wait_s: float = 2.0) -> dict:
    """Apply every change committed (and flushed) before now (``conn`` autocommit, idle). Waits for a consumer (or
    fill) already running. Returns what it did; nothing to do in capture mode "triggers" (one query).
    ``row_lock_wait_s``: in after-commit, how long a chunk is retried while a datasets row it must write stays
    locked (then RowLocked; nothing of that chunk applied).
    Long on purpose: the consumer's loop (peek, apply, advance the slot) holds its lock and its crash-safety order in one place."""
    if not active(conn):
        return {"transactions": 0, "rows": 0}
    started = time.perf_counter()
    totals: dict[str, float] = {"transactions": 0, "rows": 0, "dropped": 0, "tracked": 0}
    conn.execute("select pg_advisory_lock(%s, %s)", CONSUME_LOCK)
    try:
        _log_running_xacts(conn)
        # Decoding reads only flushed WAL: a commit not flushed yet (synchronous_commit = off) is left for the
        # next catch-up, and the slot is never advanced past it (pg_current_wal_lsn() here would skip it).
        mode, slot, applied, applying, tracking, wal_status, enabled, barrier_on, upto = fetch_one(
            conn.execute(
                f"select c.mode, c.slot, c.applied_lsn::text, c.applying, c.tracking, s.wal_status, {_ENABLED_TRIGGERS},"
                f" {_ENABLED_TRIGGERS}, pg_current_wal_flush_lsn()::text"
                " from lakehouse_digest_capture c left join pg_replication_slots s on s.slot_name = c.slot",
                (list(DIGEST_TRIGGERS), list(BARRIER_TRIGGERS)),
            ),
            "the capture state (the one row of lakehouse_digest_capture)",
        )
        if not slot:
            return {"transactions": 0, "rows": 0}
        if wal_status is None:
            raise CaptureError(f"replication slot {slot} is missing: run `lakehouse digest-capture repair`")
        if wal_status == "lost":
            raise _lost(slot)
        if mode == AFTER_COMMIT and len(barrier_on) < len(BARRIER_TRIGGERS):
            raise CaptureError(
                f"barrier trigger(s) {', '.join(sorted(set(BARRIER_TRIGGERS) - set(barrier_on)))} were "
                "disabled on dataset_rows while capture mode is after-commit: readers cannot wait for "
                "the app's writers; run `lakehouse digest-capture after-commit` to enable them again"
            )
        if mode != "triggers" and enabled:  # the triggers and the consumer would both count the same writes
            with conn.transaction():
                _drop_all_sums(conn)
            raise CaptureError(
                f"digest trigger(s) {', '.join(enabled)} were re-enabled on dataset_rows while capture "
                f"mode is {mode}: the maintained sums were dropped (canaries use the full digest); run "
                f"`lakehouse digest-capture {mode}` to disable them again and resume"
            )
        applied_lsn = pgoutput.lsn_int(applied) if applied else 0
        # PG 14+: the logical messages too, for the reverse mirror's mark (module docstring)
        messages = ", 'messages', 'true'" if conn.info.server_version >= MESSAGES_FROM else ""
        waited_until = None
        while True:
            try:
                with conn.transaction():
                    consumer = _Consumer(conn, applying, applied_lsn, tracking)
                    n = 0
                    with conn.cursor(name="lakehouse_digest_capture") as cur:
                        cur.itersize = 2000
                        cur.execute(
                            "select data from pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s,"
                            " 'proto_version', '1', 'publication_names', %s" + messages + ")",
                            (slot, upto, chunk, PUBLICATION),
                        )
                        for (data,) in cur:
                            n += 1
                            consumer.feed(pgoutput.parse(bytes(data)))
                    consumer.write()
            except RowLocked as exc:  # rolled back: nothing of the chunk applied; the same chunk again shortly
                waited_until = waited_until or time.monotonic() + row_lock_wait_s
                if time.monotonic() >= waited_until:
                    raise RowLocked(
                        f"{exc} for {row_lock_wait_s:g} s: its change tracking is not applied yet "
                        "(retried at the next catch-up)"
                    ) from None
                time.sleep(0.02)
                continue
            waited_until = None
            applying, applied_lsn, tracking = consumer.applying, consumer.applied_lsn, consumer.tracking
            totals["transactions"] += consumer.transactions
            totals["rows"] += consumer.rows
            totals["dropped"] += len(consumer.drops)
            totals["tracked"] += len(consumer.track)
            exhausted = n < chunk
            # Everything that commits before `upto` was returned once the peek is exhausted.
            target = upto if exhausted else pgoutput.lsn_text(consumer.applied_lsn)
            if consumer.applied_lsn or exhausted:
                conn.execute("select pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, target))
            if exhausted:
                break
    finally:
        conn.execute("select pg_advisory_unlock(%s, %s)", CONSUME_LOCK)
    totals["seconds"] = round(time.perf_counter() - started, 3)
    return totals
