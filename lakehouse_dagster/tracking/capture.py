"""Capture modes: where change tracking and the maintained Postgres digest are written.

Not split yet (900 lines, issue 45): its two tables are written from the WAL consumer, the mode switches, repair,
catch-up and the upgrade; split, those statements first need owner functions the consumer imports without a cycle.

Capture mode "triggers" (the default): statement triggers write both inside every writing transaction: change
tracking (rows_version, rows_xid, max_row_index, rows_rewrite_version, the row-range records) and the row
hashes added and subtracted per segment (schema/functions/lakehouse_digest_rows.sql). That is what an app write
pays for (bench_app_writes.py).

Capture mode "after-commit": both are written by this module's WAL consumer after the app committed (issue 11:
a one-row statement then pays ~1.2x, not ~1.7-2x). The app's statement trigger only takes a shared advisory
lock per dataset it wrote (tracking/barrier.py). The consumer reads the changes to ``dataset_rows`` from a
logical replication slot (plugin pgoutput, through the SQL interface) and writes, per chunk of transactions and
dataset, what the triggers would have: a new rows_version (drawn here, in commit order), rows_xid (its own
transaction: the poller's cursor stays valid), max_row_index, rows_rewrite_version, the row-range records and
the per-segment deltas of the maintained digest. It needs ``wal_level = logical`` (the embedded server is
started with it; a user's server needs a restart) and REPLICA IDENTITY FULL on ``dataset_rows`` (old values of
updated and deleted rows), set by ``enable``. A reader that pairs the tracking with rows, or decides from the
current version, goes through ``barrier.read_tracking_consistently``: it waits for the dataset's writers in
flight, holds new ones and catches this consumer up. The consumer never waits for a datasets row lock (NOWAIT,
retried): an app transaction holding one may be waiting on a reader's barrier, and the reader on this consumer.
TRUNCATE keeps its in-transaction trigger.

The reverse mirror (mirror/reverse.py) writes Iceberg's rows back into ``dataset_rows``; they are no write of the
live app (no echo). The tracking triggers skip a transaction that set ``lakehouse.reverse_apply``, a setting this
consumer cannot see after the commit, so the reverse also emits a transactional logical message (prefix
``REVERSE_PREFIX``) in its transaction, which pgoutput sends inside that transaction when the peek asks for
``messages 'true'`` (PostgreSQL 14+): the consumer writes no change tracking for a transaction that carries it,
and applies its digest deltas as any other (the maintained sums follow the rows whoever writes them; no version
is drawn for them, as the triggers draw none). On an older server the reverse mirror cannot run in after-commit
(``reverse_blocked``).

Exactly once: the consumer peeks (the slot does not move), applies a chunk of whole transactions and records the
end LSN of the last one in the same transaction as what it wrote, then advances the slot; after a crash between
the two it skips what it already applied. The switches are ordered by the stream itself: a switch writes a row
of ``lakehouse_digest_capture_switch`` in the transaction that disables (or enables) the triggers, under the
lock ALTER TABLE ... TRIGGER takes (SHARE ROW EXCLUSIVE: it waits for every writing transaction and holds new
ones back), so every write is on exactly one side of it. A fill (maintained.ensure_pg) takes its snapshot behind
the dataset's barrier, after a catch-up, under the consumer's lock, and records the rows_version it saw; the
consumer applies to it only what it draws a later version for. ``applied_version`` says which version the sums
include, and the canary compares maintained sums only when it equals the rows_version of its snapshot. A change
the consumer cannot account for (an old value it was not given, a TRUNCATE, a value the hash cannot type) drops
that dataset's registration: the canary then uses the full digest and fills it again. Nothing here can make a
comparison pass that should fail.

The previous release had a third mode, "wal" (the digest after the commit, change tracking still in the app's
transaction): it needed everything after-commit needs and still cost one-row writes 1.6-2.0x. It is gone; a
database left in it is moved to one of the two by ``upgrade_from_previous_release`` (``lakehouse db migrate``).
after-commit was called "wal-tracking" (migration 025 renames the stored mode; the CLI accepts the old word).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import defaultdict
from typing import Any

import psycopg
from psycopg import sql

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import fetch_one, fetch_value
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.schema.migrate import LOCK_KEY
from lakehouse_dagster.tracking import digest_sums, pgoutput
from lakehouse_dagster.tracking.datasets import capture_setup, stamps
from lakehouse_dagster.tracking.datasets import rows as dataset_rows

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
CHUNK_CHANGES = 20_000  # messages per consumer transaction (a chunk ends at a transaction boundary)
HASH_BATCH = 1_000  # rows per hash call
_ROW_COLUMNS = ("dataset_id", "row_index", "row_id", "created_at", "data")
REVERSE_PREFIX = "lakehouse_reverse"  # the reverse mirror's no-echo message (mirror/reverse.py)
MESSAGES_FROM = 140_000  # server_version_num from which pgoutput sends logical messages (option messages)

# Every statement on lakehouse_digest_capture is in this module (its owner: lakehouse_dagster_tests/test_table_owners.py);
# the SQL expressions below are how readers put the mode in a query they run anyway.
# The one test of the mode, as an SQL expression (tracking/barrier.py): capture mode triggers pays nothing for it.
MODE_IS_AFTER_COMMIT = "(select mode = 'after-commit' from lakehouse_digest_capture)"
# Whether the WAL consumer has passed the switch to after-commit, as an SQL expression (false without the row).
APPLYING = "coalesce((select applying from lakehouse_digest_capture), false)"
# The mode and whether this server's pgoutput sends logical messages (the reverse mirror, under its table lock).
MODE_AND_MESSAGES = sql.SQL(
    "select mode, current_setting('server_version_num')::int >= {v} from lakehouse_digest_capture"
).format(v=sql.Literal(MESSAGES_FROM))


class CaptureError(LakehouseError):
    """Capture mode cannot be switched or the consumer cannot run; the message says why and what to do."""

    exit_code = 5


class RowLocked(CaptureError):
    """Capture mode after-commit: a datasets row the consumer must write stayed locked by another transaction."""


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


def _slot_name(conn: psycopg.Connection) -> str:
    oid = fetch_value(
        conn.execute("select oid from pg_database where datname = current_database()"), "the current database's oid"
    )
    return f"lakehouse_digest_{oid}"  # slots are per server; one per database


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


def _create_slot(conn: psycopg.Connection, slot: str, lock_timeout_ms: int) -> None:
    """Creating a logical slot waits for every transaction that has written to finish (its starting point must
    be consistent): bounded like the switch's lock, so an app transaction left open cannot hang the command."""
    with conn.transaction():
        conn.execute("select set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))
        conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


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


def sibling(conn: psycopg.Connection) -> psycopg.Connection:
    """A second autocommit connection to the same database (``conn`` is inside a transaction)."""
    params: dict[str, Any] = dict(conn.info.get_parameters())
    if conn.info.password:
        params["password"] = conn.info.password
    return psycopg.connect(**params, autocommit=True)


def _catch_up_beside(conn: psycopg.Connection) -> None:
    """Apply everything committed before now on a second connection, while ``conn`` holds its lock."""
    with sibling(conn) as other:
        force_flush(other)
        catch_up(other)


def force_flush(conn: psycopg.Connection) -> None:
    """Flush the WAL up to now: decoding reads flushed WAL only, and a commit made with synchronous_commit =
    off may not be flushed yet (a transactional message makes this commit write, and so flush, WAL)."""
    with conn.transaction():
        conn.execute("select set_config('synchronous_commit', 'on', true)")
        conn.execute("select pg_logical_emit_message(true, 'lakehouse_barrier', '')")


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


class _Consumer:
    """One chunk's worth of decoding state (a consumer transaction)."""

    def __init__(self, conn: psycopg.Connection, applying: bool, applied_lsn: int, tracking: bool = False):
        self.conn = conn
        self.applying = applying
        self.tracking = tracking
        self.applied_lsn = applied_lsn
        self.track: dict[uuid.UUID, _Track] = defaultdict(_Track)  # change tracking to write, per dataset
        self.tracked_digests: set[uuid.UUID] = set()  # digests applied at the version this chunk draws
        self._registered: dict[uuid.UUID, tuple[str, int]] | None = None
        self._state_changed = False
        self.relations: dict[int, pgoutput.Relation] = {}
        self._positions: dict[tuple, tuple] = {}
        self.deltas: dict[uuid.UUID, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.pending: dict[uuid.UUID, list[tuple]] = defaultdict(list)  # rows of applied transactions, to hash
        self.versions: dict[uuid.UUID, int] = {}
        self.drops: set[uuid.UUID] = set()
        self.transactions = self.rows = 0
        self._begin_tx()

    @property
    def registered(self) -> dict[uuid.UUID, tuple[str, int]]:
        """(row-hash function, fill_version) per registered dataset, read once per chunk when first needed
        (under the consumer's lock no fill runs, so it cannot change meanwhile)."""
        if self._registered is None:
            self._registered = {
                r[0]: (r[1], r[2] if r[2] is not None else -1) for r in digest_sums.registered_hash_fns(self.conn)
            }
        return self._registered

    def _begin_tx(self) -> None:
        self.tx_pending: dict[uuid.UUID, list[tuple]] = defaultdict(list)
        self.tx_deltas: dict[uuid.UUID, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        self.tx_rows: set[uuid.UUID] = set()
        self.tx_unknown: set[uuid.UUID] = set()
        self.tx_marker: str | None = None
        self.tx_truncate = False
        self.tx_track: dict[uuid.UUID, _Track] = defaultdict(_Track)
        self.tx_reverse = False  # the reverse mirror's transaction (its message): no change tracking
        self.tx_changed = False  # a change or a truncate (a transaction of messages only is not counted)

    # -- messages -------------------------------------------------------------------------------------

    def feed(self, msg) -> None:
        if isinstance(msg, pgoutput.Begin):
            self._begin_tx()
        elif isinstance(msg, pgoutput.Relation):
            self.relations[msg.relid] = msg
            self._positions = {k: v for k, v in self._positions.items() if k[0] != msg.relid}
        elif isinstance(msg, pgoutput.Change):
            self.tx_changed = True
            self._change(msg)
        elif isinstance(msg, pgoutput.Message):
            # the barrier's flushes carry one too (prefix lakehouse_barrier): nothing to do
            if msg.transactional and msg.prefix == REVERSE_PREFIX:
                self.tx_reverse = True
        elif isinstance(msg, pgoutput.Truncate):
            self.tx_changed = True
            if any(self._relation(r).name == dataset_rows.TABLE for r in msg.relids):
                self.tx_truncate = True
        elif isinstance(msg, pgoutput.Commit):
            self._commit(msg.end_lsn)

    def _relation(self, relid: int) -> pgoutput.Relation:
        rel = self.relations.get(relid)
        if rel is None:
            raise pgoutput.ProtocolError(f"change for relation {relid} before its Relation message")
        return rel

    def _change(self, msg: pgoutput.Change) -> None:
        rel = self._relation(msg.relid)
        if rel.name == "lakehouse_digest_capture_switch":
            if msg.new is not None:
                self.tx_marker = msg.new[self._at(rel, ("mode",))[0]]
        elif rel.name == dataset_rows.TABLE and self.tracking:
            self._track(rel, msg)
        if rel.name == dataset_rows.TABLE and self.applying and self.registered:
            at = self._at(rel, _ROW_COLUMNS)
            old = None
            if msg.old is not None:
                old = tuple(None if i is None else msg.old[i] for i in at)
                self._row(old, -1, full=not msg.old_is_key)
            elif (
                msg.kind == "U" and msg.new is not None
            ):  # REPLICA IDENTITY no longer FULL: what the update replaced is not in the stream
                self._row(tuple(None if i is None else msg.new[i] for i in at), 1, full=False)
                return
            if msg.new is not None:
                new = tuple(None if i is None else msg.new[i] for i in at)
                if old is not None and not msg.old_is_key and pgoutput.UNCHANGED in new:  # an unchanged TOASTed value
                    new = tuple(o if v is pgoutput.UNCHANGED else v for v, o in zip(new, old))
                self._row(new, 1, full=True)

    def _track(self, rel: pgoutput.Relation, msg: pgoutput.Change) -> None:
        """What the tracking triggers read from the transition tables: the row_index of new rows, of old ones."""
        at = self._at(rel, ("dataset_id", "row_index"))
        if at[0] is None or at[1] is None:
            raise pgoutput.ProtocolError("dataset_rows without dataset_id or row_index in the stream")
        if msg.old is not None:  # a delete, an update that moved the key, or any update under REPLICA IDENTITY FULL
            t = self.tx_track[uuid.UUID(msg.old[at[0]])]
            t.changed.append(int(msg.old[at[1]]))
            t.rewrite = True
        if msg.new is not None:
            t = self.tx_track[uuid.UUID(msg.new[at[0]])]
            if msg.kind == "I":
                t.ins.append(int(msg.new[at[1]]))
            else:
                t.changed.append(int(msg.new[at[1]]))
                t.grow.append(int(msg.new[at[1]]))
                t.rewrite = True

    def _at(self, rel: pgoutput.Relation, names: tuple[str, ...]) -> tuple:
        """Positions of ``names`` in the relation's columns (None: absent), per relation message."""
        key = (rel.relid, names)
        at = self._positions.get(key)
        if at is None:
            at = self._positions[key] = tuple(rel.columns.index(n) if n in rel.columns else None for n in names)
        return at

    def _row(self, values: tuple, sign: int, full: bool) -> None:
        raw = values[0]
        if raw is None or raw is pgoutput.UNCHANGED:
            return
        ds = uuid.UUID(raw)
        if ds not in self.registered or ds in self.drops:
            return
        self.tx_rows.add(ds)
        picked = values[1:]
        if not full or any(v is pgoutput.UNCHANGED for v in picked):
            self.tx_unknown.add(ds)  # old values not in the stream (REPLICA IDENTITY not FULL)
            return
        pending = self.tx_pending[ds]
        pending.append((*picked, sign))
        self.rows += 1
        if len(pending) >= HASH_BATCH:  # a large transaction: hashed as it comes, kept apart until its commit
            if not self._hash(ds, self.tx_pending.pop(ds), self.tx_deltas[ds]):
                self.tx_unknown.add(ds)

    def _hash(self, ds: uuid.UUID, pending: list[tuple], acc: dict[int, list[int]]) -> bool:
        """Add the per-segment (count, sum) of signed rows into ``acc``; False when a value cannot be typed."""
        if not pending:
            return True
        fn = self.registered[ds][0]
        cols = list(zip(*pending))
        try:
            with self.conn.transaction():  # a savepoint: a value the hash cannot type drops the registration
                rows = self.conn.execute(
                    sql.SQL(
                        "select d.seg, d.n, d.s from unnest({}(array(select row(t.r::bigint, t.i::uuid, t.c::timestamptz,"
                        " t.d::jsonb, t.s)::lakehouse_digest_row from unnest(%b::text[], %b::text[], %b::text[], %b::text[],"
                        " %b::int[]) t(r, i, c, d, s)))) d"
                    ).format(sql.Identifier(fn)),
                    (list(cols[0]), list(cols[1]), list(cols[2]), list(cols[3]), list(cols[4])),
                ).fetchall()
        except (psycopg.errors.DataException, psycopg.errors.UndefinedFunction):
            return False
        for seg, n, s in rows:
            cell = acc[int(seg)]
            cell[0] += int(n)
            cell[1] += int(s)
        return True

    def _commit(self, end_lsn: int) -> None:
        self.transactions += self.tx_changed
        if end_lsn <= self.applied_lsn:  # applied by a consumer that crashed before advancing the slot
            return
        # No echo: the reverse mirror's rows are no write of the live app (module docstring); its digest deltas
        # are applied below all the same (tx_track still says that this transaction was tracked here).
        for ds, t in () if self.tx_reverse else self.tx_track.items():
            self.track[ds].merge(t)
        if self.applying and (self.tx_rows or self.tx_truncate):
            self._state_changed = True
            if self.tx_truncate:  # every dataset emptied: what to subtract is not in the stream
                self.drops.update(self.registered)
            for ds in self.tx_rows:
                if ds not in self.registered or ds in self.drops:
                    continue
                # Not tracked here: a write of the previous release's mode wal, before its switch row (its sums
                # were placed by versions the app stamped, which this consumer does not read). No fill saw a
                # tracked one (fills take their snapshot behind the barrier): its version is drawn in write(). The
                # reverse mirror's transaction draws none (no echo): the sums include it at the version they had.
                if ds in self.tx_unknown or ds not in self.tx_track:
                    self.drops.add(ds)  # a write the sums cannot account for (no version, no old values)
                    continue
                into = self.deltas[ds]
                for seg, (n, s) in self.tx_deltas.get(ds, {}).items():
                    cell = into[seg]
                    cell[0] += n
                    cell[1] += s
                rows = self.pending[ds]  # small transactions' rows are hashed together, HASH_BATCH at a time
                rows.extend(self.tx_pending.get(ds, ()))
                if len(rows) >= HASH_BATCH and not self._hash(ds, self.pending.pop(ds), into):
                    self.drops.add(ds)
                self.tracked_digests.add(ds)
        if self.tx_track:
            self._state_changed = True
        if self.tx_marker is not None:
            marker = RENAMED.get(self.tx_marker, self.tx_marker)  # a switch row the previous release wrote
            self.applying = marker != TRIGGERS
            self.tracking = marker == AFTER_COMMIT
            self._state_changed = True
        self.applied_lsn = end_lsn

    # -- results --------------------------------------------------------------------------------------

    def write(self) -> None:
        conn = self.conn
        for ds, v in self._write_tracking().items():
            if ds in self.tracked_digests:
                self.versions[ds] = max(self.versions.get(ds, -1), v)
        for ds, rows in list(self.pending.items()):
            if ds not in self.drops and not self._hash(ds, rows, self.deltas[ds]):
                self.drops.add(ds)
        for ds in self.drops:
            digest_sums.forget(conn, ds)
        rows = [
            (ds, seg, n, s)
            for ds, segs in self.deltas.items()
            if ds not in self.drops
            for seg, (n, s) in segs.items()
            if n or s
        ]
        if rows:
            digest_sums.add_deltas(conn, [(a, b, c, str(d)) for a, b, c, d in rows])
        versions = [(ds, v) for ds, v in self.versions.items() if ds not in self.drops]
        if versions:
            digest_sums.advance_applied(conn, [d for d, _ in versions], [v for _, v in versions])
        if self._state_changed:  # else nothing was applied: nothing a crash before the advance could repeat
            conn.execute(
                "update lakehouse_digest_capture set applied_lsn = %s::pg_lsn, applying = %s, tracking = %s",
                (pgoutput.lsn_text(self.applied_lsn), self.applying, self.tracking),
            )

    def _write_tracking(self) -> dict[uuid.UUID, int]:
        """The chunk's change tracking, per dataset, as the triggers would have written it over the same
        transactions (no reader saw a state between them: readers wait behind the barrier before they pin). Returns the
        version drawn per dataset. NOWAIT on the datasets rows (module docstring): RowLocked."""
        if not self.track:
            return {}
        conn = self.conn
        ids = sorted(self.track)
        try:
            rows = stamps.lock_for_tracking(conn, ids)
        except psycopg.errors.LockNotAvailable:
            raise RowLocked("a datasets row the WAL consumer must write is locked by another transaction") from None
        if not rows:
            return {}
        versions = [
            r[0]
            for r in conn.execute(
                "select nextval('lakehouse_rows_version_seq') from generate_series(1, %s)", (len(rows),)
            )
        ]
        unknown = [r[0] for r in rows if r[1] is None]
        true_max: dict = dataset_rows.max_row_indexes(conn, unknown) if unknown else {}
        out: dict[uuid.UUID, int] = {}
        upd, changes = [], []
        for (ds, mx, prev), v in zip(rows, sorted(versions)):
            t = self.track[ds]
            below = [i for i in t.ins if mx is not None and i <= mx]  # an insert at or below the max rewrites
            rewrite = mx is None or t.rewrite or bool(below)
            buckets: dict[int, list[int]] = {}
            for i in below + t.changed:
                b = buckets.setdefault(i >> 12, [i, i])
                b[0], b[1] = min(b[0], i), max(b[1], i)
            changes += [(ds, v, b, prev, lo, hi) for b, (lo, hi) in buckets.items()]
            new_max = true_max.get(ds) if mx is None else max([mx, *t.ins, *t.grow])
            upd.append((ds, v, rewrite, new_max))
            out[ds] = v
        if changes:
            from lakehouse_dagster.tracking import row_changes  # loads pyiceberg: not at the CLI's load (cli/db.py)

            row_changes.record_changes(conn, changes)
        stamps.write_tracking(conn, upd)
        return out


class _Track:
    """One dataset's change tracking over a transaction (or a chunk of them)."""

    __slots__ = ("ins", "changed", "grow", "rewrite")

    def __init__(self):
        self.ins: list[int] = []  # row_index of inserted rows
        self.changed: list[int] = []  # row_index of updated (old and new) and deleted rows
        self.grow: list[int] = []  # row_index of updated rows' new versions (they may raise the max)
        self.rewrite = False  # an update or a delete

    def merge(self, other: _Track) -> None:
        self.ins += other.ins
        self.changed += other.changed
        self.grow += other.grow
        self.rewrite = self.rewrite or other.rewrite


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


def active(conn: psycopg.Connection) -> bool:
    """A slot is set: capture mode after-commit, or a switch back whose last changes are still to apply."""
    return fetch_value(
        conn.execute("select slot is not null from lakehouse_digest_capture"),
        "the capture state (the one row of lakehouse_digest_capture)",
    )


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


# -- the upgrade from the previous release ------------------------------------------------------------------


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
