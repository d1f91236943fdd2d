"""Capture modes: where change tracking and the maintained Postgres digest are written.

Callers import the package (every name below is re-exported here); one module per part: errors.py (CaptureError,
RowLocked, BarrierTimeout), store.py (the names, the state row as read, the slot and the triggers as they stand), consumer.py (the
WAL consumer's apply of one chunk), catching_up.py (its loop, ``catch_up``), switch.py (``enable``, ``disable``),
repair.py, upgrade.py (from the previous release). The package owns ``lakehouse_digest_capture`` and
``lakehouse_digest_capture_switch``: each statement on them sits in the module of the step that runs it.

Capture mode "triggers" (the default): statement triggers write both inside every writing transaction: change
tracking (rows_version, rows_xid, max_row_index, rows_rewrite_version, the row-range records) and the row
hashes added and subtracted per segment (schema/functions/lakehouse_digest_rows.sql). That is what an app write
pays for (bench_app_writes.py).

Capture mode "after-commit": both are written by this package's WAL consumer after the app committed (issue 11:
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

from lakehouse_dagster.tracking.capture.catching_up import CHUNK_CHANGES, catch_up, force_flush, sibling
from lakehouse_dagster.tracking.capture.consumer import HASH_BATCH
from lakehouse_dagster.tracking.capture.errors import BarrierTimeout, CaptureError, RowLocked
from lakehouse_dagster.tracking.capture.repair import repair
from lakehouse_dagster.tracking.capture.store import (
    AFTER_COMMIT,
    APPLYING,
    BARRIER_TRIGGERS,
    CONSUME_LOCK,
    DIGEST_TRIGGERS,
    LEGACY_WAL,
    MESSAGES_FROM,
    MODE_AND_MESSAGES,
    MODE_IS_AFTER_COMMIT,
    MODES,
    PUBLICATION,
    RENAMED,
    REVERSE_PREFIX,
    TRACKING_TRIGGERS,
    TRIGGERS,
    State,
    active,
    reverse_blocked,
    state,
    status,
)
from lakehouse_dagster.tracking.capture.switch import disable, enable
from lakehouse_dagster.tracking.capture.upgrade import upgrade_from_previous_release

__all__ = [
    "AFTER_COMMIT",
    "APPLYING",
    "BARRIER_TRIGGERS",
    "CHUNK_CHANGES",
    "CONSUME_LOCK",
    "DIGEST_TRIGGERS",
    "HASH_BATCH",
    "LEGACY_WAL",
    "MESSAGES_FROM",
    "MODES",
    "MODE_AND_MESSAGES",
    "MODE_IS_AFTER_COMMIT",
    "PUBLICATION",
    "RENAMED",
    "REVERSE_PREFIX",
    "TRACKING_TRIGGERS",
    "TRIGGERS",
    "BarrierTimeout",
    "CaptureError",
    "RowLocked",
    "State",
    "active",
    "catch_up",
    "disable",
    "enable",
    "force_flush",
    "repair",
    "reverse_blocked",
    "sibling",
    "state",
    "status",
    "upgrade_from_previous_release",
]
