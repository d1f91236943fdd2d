"""Maintained digests: parity that costs what changed (migration "015_parity_digests").

The digest is a sum of row hashes (canonical.py), so both sides can keep it up to date instead of
re-reading every row on every canary:

* Iceberg, per data file. Files are immutable, so a file's (count, sum, per-segment sums) is computed
  once — by the writer while the rows are in hand (``FileDigester.add``), or the first time a canary
  meets a file without one (``FileDigester.add_file``) — and stored in ``lakehouse_file_digests`` under
  the contract version and the dataset schema hash it was computed under. A snapshot's digest is the
  sum over its live data files; a snapshot with delete files has no maintained digest (full digest).
* Postgres, per dataset and segment: statement triggers with transition tables add the hashes of
  inserted rows and subtract those of deleted ones into ``lakehouse_pg_digest_deltas``, in the writing
  transaction (schema/functions/lakehouse_digest_rows.sql) — or, in capture mode "after-commit", a logical decoding
  consumer does after the app committed (tracking/capture/). A dataset is maintained once registered and filled (``ensure_pg``).

Segments are fixed: segment = __row_index >> SEG_BITS on both sides, so localisation compares per-segment
sums and reads rows only in the segments that differ.

What the triggers see and what they cannot: the digest triggers are ENABLE ALWAYS, so a write under
``session_replication_role = replica`` (which silences change tracking: rows_version does not move)
still updates the maintained sum, and the canary reports it as a MISMATCH. A write with the triggers
disabled by DDL (``ALTER TABLE dataset_rows DISABLE TRIGGER``) leaves the maintained sum stale and the
maintained comparison cannot see it: the full re-digest (``canary --full``, and every ``FULL_EVERY``-th
scheduled canary) does, and drops the stale sums so they are filled again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
from psycopg.types.json import Jsonb

from lakehouse_dagster.core import duckdb_signals, locks
from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.lake.parquet_ids import columns_in_file
from lakehouse_dagster.parity import canonical, lookup3
from lakehouse_dagster.parity.digest import local_path
from lakehouse_dagster.parity.duck_files import file_source
from lakehouse_dagster.parity.errors import MaintainedDigestUnavailable as Unavailable
from lakehouse_dagster.tracking import barrier, capture, digest_sums
from lakehouse_dagster.tracking.datasets import Column, lookup, parse_schema

SEG_BITS = 16
SEG_WIDTH = 1 << SEG_BITS  # 65,536 row indexes per segment
COMPACT_AFTER = 64  # delta rows per dataset beyond its segments before a canary folds them
_FILL_LOCK = locks.PARITY_FILL  # advisory lock class: one fill / compaction of a dataset at a time
FILL_LOCK = _FILL_LOCK  # public: a reverse full re-sync (mirror/reverse.py) takes it too

Segments = dict[int, tuple[int, int]]


def schema_hash(columns: Sequence[Column]) -> str:
    """The dataset columns the canonical text depends on (names, types, order)."""
    text = json.dumps([[c.name, c.type] for c in columns], separators=(",", ":"))
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def add_segments(into: Segments, more: Segments, sign: int = 1) -> Segments:
    for seg, (n, s) in more.items():
        n0, s0 = into.get(seg, (0, 0))
        into[seg] = (n0 + sign * n, s0 + sign * s)
    return into


def nonzero(segments: Segments) -> Segments:
    return {k: v for k, v in segments.items() if v != (0, 0)}


# ---------------------------------------------------------------------------------------------------
# Iceberg: per data file
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FileDigest:
    count: int = 0
    sum: int = 0
    min_row_index: int | None = None
    max_row_index: int | None = None
    segments: Segments = dataclasses.field(default_factory=dict)


_duck = threading.local()


def _digest_connection():
    """This thread's DuckDB connection for file digests, opened once per process and thread: opening one (a new
    in-memory database, the hash UDF registered) costs 40-120 ms and closing it ~15 ms, more than digesting a
    small file, and a mirror batch digests one new file per dataset. The digests keep no state in it (a batch is
    registered and unregistered around its query), so reuse changes no result."""
    con = getattr(_duck, "con", None)
    if con is None or _duck.pid != os.getpid():  # a forked child must not use its parent's database
        con = duckdb_signals.connect(1)  # a signal mid-digest stays a signal
        lookup3.register(con)
        _duck.con, _duck.pid = con, os.getpid()
    return con


class FileDigester:
    """The canonical row hash of a file's rows (the same DuckDB expression as the Iceberg side of the
    full digest), folded per segment. One per writer or canary; ``close`` when done (the thread's DuckDB
    connection stays open for the next one: _digest_connection). ``table_fields`` (name → Iceberg type) and
    ``field_ids`` (name → field id): the snapshot's schema, so that a file's columns are found by field id
    (a column another engine wrote under a sanitised Parquet name still counts); without ids, by name."""

    def __init__(
        self,
        columns: Sequence[Column],
        table_fields: Mapping[str, object] | Iterable[str] | None = None,
        field_ids: Mapping[str, int] | None = None,
    ):
        self.columns = tuple(columns)
        self.table_fields = None if table_fields is None else set(table_fields)
        self.types = dict(table_fields) if isinstance(table_fields, Mapping) else {}
        self.field_ids = dict(field_ids or {})
        self.con = _digest_connection()

    def close(self) -> None:
        self.con = None

    def empty(self) -> FileDigest:
        """A new file's digest, before any of its rows (the writer asks for one per file it opens)."""
        return FileDigest()

    def _present(self, names: Iterable[str]) -> set[str]:
        wanted = {"__row_index", "__row_id", "__created_at"} | {c.name for c in self.columns}
        present = wanted & set(names)
        return present if self.table_fields is None else present & self.table_fields

    def _fold(self, into: FileDigest, source: str, present: set[str], params: dict) -> FileDigest:
        h = canonical.duck_row_hash(self.columns, present)
        rows = self.con.execute(
            f"select __row_index >> {SEG_BITS} as seg, count(*), coalesce(sum(h::HUGEINT), 0), min(__row_index),"
            f" max(__row_index) from (select __row_index, {h} as h from {source}) group by seg",
            params,
        ).fetchall()
        for seg, n, s, lo, hi in rows:
            add_segments(into.segments, {int(seg): (int(n), int(s))})
            into.count += int(n)
            into.sum += int(s)
            into.min_row_index = int(lo) if into.min_row_index is None else min(into.min_row_index, int(lo))
            into.max_row_index = int(hi) if into.max_row_index is None else max(into.max_row_index, int(hi))
        return into

    def add(self, into: FileDigest, batch: pa.RecordBatch) -> FileDigest:
        """Fold the rows of one Arrow batch (as written into the file) into ``into``."""
        if batch.num_rows == 0:
            return into
        self.con.register("lakehouse_batch", pa.Table.from_batches([batch]))
        try:
            return self._fold(into, "lakehouse_batch", self._present(batch.schema.names), {})
        finally:
            self.con.unregister("lakehouse_batch")

    def _wanted_ids(self) -> dict[str, int]:
        wanted = {"__row_index", "__row_id", "__created_at"} | {c.name for c in self.columns}
        return {n: fid for n, fid in self.field_ids.items() if n in wanted}

    def add_file(self, path: str) -> FileDigest:
        """The digest of a local Parquet file (a file the writer did not digest), its columns found by field id."""
        ids = self._wanted_ids()
        if ids and all(n in self.types for n in ids):
            src = file_source(self.con, [path], {n: (fid, self.types[n]) for n, fid in ids.items()}, "p")
            return self._fold(FileDigest(), src.sql, self._present(src.present), src.params)
        names = [r[0] for r in self.con.execute("select name from parquet_schema($p)", {"p": path}).fetchall()]
        return self._fold(FileDigest(), "read_parquet($p)", self._present(names), {"p": path})

    def add_remote(self, io, path: str) -> FileDigest:
        """The digest of a file on object storage, streamed batch by batch through the table's FileIO; its
        columns found by field id (lake/parquet_ids.py) and named as the table names them."""

        out = FileDigest()
        with io.new_input(path).open() as f:
            pf = pq.ParquetFile(f)
            ids = self._wanted_ids()
            found = {n: c for n, c in columns_in_file(pf.schema_arrow, ids).items() if c is not None} if ids else {}
            for batch in pf.iter_batches(batch_size=65536, columns=list(found.values()) if found else None):
                if found:
                    batch = pa.RecordBatch.from_arrays([batch.column(c) for c in found.values()], names=list(found))
                self.add(out, batch)
        return out


def store_file_digests(
    conn: psycopg.Connection,
    dataset_id: uuid.UUID,
    columns: Sequence[Column],
    digests: dict[str, FileDigest],
    computed_by: str,
) -> None:
    sh = schema_hash(columns)
    with conn.cursor() as cur:
        cur.executemany(
            """insert into lakehouse_file_digests (dataset_id, file_path, contract_version, schema_hash, row_count,
                 digest, min_row_index, max_row_index, segments, computed_by)
               values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
               on conflict (dataset_id, file_path, contract_version, schema_hash) do nothing""",
            [
                (
                    dataset_id,
                    path,
                    canonical.CONTRACT_VERSION,
                    sh,
                    d.count,
                    d.sum,
                    d.min_row_index,
                    d.max_row_index,
                    Jsonb({str(k): [n, str(s)] for k, (n, s) in d.segments.items()}),
                    computed_by,
                )
                for path, d in digests.items()
            ],
        )


def load_file_digests(
    conn: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column], paths: Sequence[str]
) -> dict[str, FileDigest]:
    rows = conn.execute(
        """select file_path, row_count, digest, min_row_index, max_row_index, segments from lakehouse_file_digests
            where dataset_id = %s and contract_version = %s and schema_hash = %s and file_path = any(%s)""",
        (dataset_id, canonical.CONTRACT_VERSION, schema_hash(columns), list(paths)),
    ).fetchall()
    return {
        r[0]: FileDigest(int(r[1]), int(r[2]), r[3], r[4], {int(k): (int(v[0]), int(v[1])) for k, v in r[5].items()})
        for r in rows
    }


def fill_file_digests(conn: psycopg.Connection, pin, columns: Sequence[Column]) -> int:
    """Compute and store the digest of every live file of the pinned snapshot that has none under
    the current schema (lazily: once per file). Returns how many were computed."""

    missing = [p for p in pin.files if p not in load_file_digests(conn, pin_dataset(pin), columns, pin.files)]
    if not missing:
        return 0
    digester = FileDigester(columns, pin.fields, pin.field_ids)
    try:
        out = {}
        for path in missing:
            local = local_path(path)
            out[path] = digester.add_file(local) if local is not None else digester.add_remote(pin.table.io, path)
    finally:
        digester.close()
    store_file_digests(conn, pin_dataset(pin), columns, out, "lazy")
    return len(out)


def pin_dataset(pin) -> uuid.UUID:
    return uuid.UUID(pin.identifier[1].removeprefix("ds_"))


def iceberg_segments(
    conn: psycopg.Connection, pin, columns: Sequence[Column]
) -> tuple[Segments, int | None, int | None]:
    """The pinned snapshot's per-segment (count, sum): the sum over its live files' stored digests,
    with the snapshot's (min, max) __row_index. ``Unavailable`` when a file has none or deletes exist."""
    if pin.has_deletes:
        raise Unavailable("the snapshot has delete files")
    _files_in_place(pin)
    stored = load_file_digests(conn, pin_dataset(pin), columns, pin.files)
    missing = [p for p in pin.files if p not in stored]
    if missing:
        raise Unavailable(f"{len(missing)} of {len(pin.files)} data file(s) have no digest")
    segments: Segments = {}
    lo = hi = None
    for d in stored.values():
        add_segments(segments, d.segments)
        if d.min_row_index is not None and d.max_row_index is not None:  # both or neither
            lo = d.min_row_index if lo is None else min(lo, d.min_row_index)
            hi = d.max_row_index if hi is None else max(hi, d.max_row_index)
    count = sum(d.count for d in stored.values())
    if pin.total_records is not None and count != pin.total_records:
        raise Unavailable(f"the file digests count {count} rows, the snapshot says {pin.total_records}")
    return nonzero(segments), lo, hi


def _files_in_place(pin) -> None:
    """Stored digests vouch for files as written: a local file that is gone or not the size its manifest
    says gets the full digest (which reads it, and fails loudly if it cannot). Remote files are trusted
    (one request per file would cost more than the manifests)."""

    for path in pin.files:
        local = local_path(path)
        if local is None:
            continue
        try:
            size = os.stat(local).st_size
        except OSError:
            raise Unavailable(f"data file {path} is missing") from None
        if pin.sizes.get(path) not in (None, size):
            raise Unavailable(f"data file {path} is {size} bytes, its manifest says {pin.sizes[path]}")


def forget_file_digests(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    conn.execute("delete from lakehouse_file_digests where dataset_id = %s", (dataset_id,))


# ---------------------------------------------------------------------------------------------------
# Postgres: maintained by the triggers
# ---------------------------------------------------------------------------------------------------


def ensure_pg(
    conn: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column], *, lock_timeout_ms: int = 5000
) -> str:
    """Register the dataset for maintained digests and fill its sums, unless that is done already.
    Returns "ready", "registered+filled" or "filled". ``conn`` is autocommit.

    Registration takes the datasets row lock (as every write's change-tracking trigger does), so each
    write either committed before it — and is in the fill — or runs its digest trigger after it and
    writes deltas. The fill is one REPEATABLE READ transaction: it sums the rows of its snapshot and
    deletes the deltas that snapshot sees (already counted in the rows); deltas of writes that commit
    after its snapshot stay, so no write is counted twice or lost, and no app write waits for the fill."""
    sh = schema_hash(columns)
    hash_sql = canonical.pg_row_hash(columns).as_string(conn)
    row = digest_sums.registration(conn, dataset_id)
    outcome = "filled"
    # a registration under another row expression (an older release's: before undeclared keys were hashed) is redone
    same = row is not None and row[0] == sh and row[1] == canonical.CONTRACT_VERSION and row[3] == hash_sql
    if same and row is not None and row[2]:
        return "ready"
    if not same:
        with conn.transaction():
            conn.execute("select set_config('lock_timeout', %s, true)", (str(int(lock_timeout_ms)),))  # SET LOCAL
            cur = lookup.lock_schema(conn, dataset_id)
            if cur is None:
                raise Unavailable(f"dataset {dataset_id} does not exist")

            if schema_hash(parse_schema(cur[0])) != sh:
                raise Unavailable("the dataset's schema changed meanwhile")
            digest_sums.register(conn, dataset_id, canonical.CONTRACT_VERSION, sh, hash_sql)
        outcome = "registered+filled"
    # In capture mode after-commit the fill runs under the WAL consumer's lock (tracking/capture/), behind the
    # dataset's barrier (tracking/barrier.py), after a catch-up: its snapshot then sees every delta the consumer
    # wrote and the versions it drew, and the consumer, running after it, applies only what it draws a later
    # version for. The barrier lets the writers go once the snapshot is taken; the consumer's lock stays held
    # to the end. In capture mode triggers fills of different datasets run side by side; one whose snapshot sees
    # a switch to after-commit that committed after it looked starts again behind the barrier (a switch
    # committed after its snapshot is safe: what is written before the switch row is the triggers'). While a
    # switch back to triggers still has changes to apply (a slot is set), the fill runs under the consumer's
    # lock after a catch-up.
    while True:
        with barrier.read_tracking_consistently(conn, [dataset_id]) as behind:
            locked = capture.active(conn)
            if locked:
                conn.execute("select pg_advisory_lock(%s, %s)", capture.CONSUME_LOCK)
            try:
                if locked and not behind:  # behind the barrier the consumer has just been caught up
                    capture.catch_up(conn)
                if _fill(conn, dataset_id, sh, locked, behind):
                    return outcome
            finally:
                if locked:
                    conn.execute("select pg_advisory_unlock(%s, %s)", capture.CONSUME_LOCK)


def _fill(conn: psycopg.Connection, dataset_id: uuid.UUID, sh: str, locked: bool, behind: barrier.Barrier) -> bool:
    """One REPEATABLE READ fill; False (nothing written) when it must run again under the consumer's lock (and,
    in after-commit, behind the barrier): a switch committed after the caller looked."""
    conn.execute("begin isolation level repeatable read")
    try:
        if behind:  # frozen while it holds the barrier, the session is ended by the server (tracking/barrier.py)
            idle = fetch_value(
                conn.execute(
                    "select current_setting('idle_in_transaction_session_timeout'),"
                    " set_config('idle_in_transaction_session_timeout', %s, true)",
                    (str(barrier.HOLD_IDLE_TIMEOUT_MS),),
                ),
                "the session's idle_in_transaction_session_timeout",
            )
        conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (_FILL_LOCK, str(dataset_id)))
        if (not locked and capture.active(conn)) or (not behind and barrier.mode_is_after_commit(conn)):
            conn.execute("rollback")  # both read in this fill's snapshot
            return False
        if behind:  # the snapshot is taken: the dataset's writers need not wait for the sums
            behind.let_go()
            conn.execute("select set_config('idle_in_transaction_session_timeout', %s, true)", (idle,))
        state = digest_sums.fill_state(conn, dataset_id)
        if state is None or state[0] != sh:
            raise Unavailable("the registration was dropped meanwhile (a schema change or an untyped value)")
        if not state[1]:
            digest_sums.fill(conn, dataset_id, SEG_BITS, state[2])
        conn.execute("commit")
        return True
    except BaseException:
        conn.execute("rollback")
        raise


def compact_pg(conn: psycopg.Connection, dataset_id: uuid.UUID, *, after: int = COMPACT_AFTER) -> int:
    """Fold the dataset's delta rows into one per segment when there are many; returns rows removed.
    Exact under concurrent writes: it deletes and re-adds exactly the rows its DELETE saw."""
    n = digest_sums.duplicate_segments(conn, dataset_id)
    if n < after:
        return 0
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s, hashtext(%s))", (_FILL_LOCK, str(dataset_id)))
        before = digest_sums.fold(conn, dataset_id)
    return int(before)


def pg_segments(conn: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column]) -> Segments:
    """The maintained per-segment (count, sum) as the caller's (pinned) snapshot sees them."""
    state = digest_sums.state_with_applying(conn, dataset_id, capture.APPLYING)
    if state is None:
        raise Unavailable("Postgres digest not maintained for this dataset (not registered)")
    if state[0] != schema_hash(columns) or state[1] != canonical.CONTRACT_VERSION:
        raise Unavailable("the maintained Postgres digest is for another schema or contract")
    if state[6] != canonical.pg_row_hash(columns).as_string(conn):
        raise Unavailable("the maintained Postgres digest was registered under an older row expression")
    if not state[2]:
        raise Unavailable("the maintained Postgres digest is not filled yet")
    if state[5] and state[3] != state[4]:  # the WAL consumer's sums are as of applied_version
        raise Unavailable(
            f"the WAL consumer has applied this dataset up to version {state[3]}, "
            f"not yet {state[4]} (tracking/capture/)"
        )
    rows = digest_sums.segment_sums(conn, dataset_id)
    return nonzero({int(r[0]): (int(r[1]), int(r[2])) for r in rows})


def forget_pg(conn: psycopg.Connection, dataset_id: uuid.UUID) -> None:
    """Drop a registration found stale (by a full re-digest): the next canary fills it again."""
    with conn.transaction():
        digest_sums.forget(conn, dataset_id)
