"""The WAL consumer's apply: one consumer transaction's worth of decoding (``_Consumer``: a chunk of whole
transactions from the slot) and what it writes in that transaction: the change tracking the triggers would have
written, the maintained digest's deltas, and the end LSN it reached (exactly once: the package docstring)."""

from __future__ import annotations

import uuid
from collections import defaultdict

import psycopg
from psycopg import sql

from lakehouse_dagster.tracking import digest_sums, pgoutput
from lakehouse_dagster.tracking.capture.errors import RowLocked
from lakehouse_dagster.tracking.capture.store import AFTER_COMMIT, RENAMED, REVERSE_PREFIX, TRIGGERS
from lakehouse_dagster.tracking.datasets import rows as dataset_rows
from lakehouse_dagster.tracking.datasets import stamps

HASH_BATCH = 1_000  # rows per hash call
_ROW_COLUMNS = ("dataset_id", "row_index", "row_id", "created_at", "data")


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
