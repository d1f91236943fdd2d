"""The Postgres side, pinned: one REPEATABLE READ READ ONLY transaction (``PinnedPostgres``), its digest in SQL."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import connect, is_idle
from lakehouse_dagster.parity import canonical, lookup3
from lakehouse_dagster.parity.digest.common import Segments
from lakehouse_dagster.parity.errors import DigestUnavailable
from lakehouse_dagster.tracking import barrier
from lakehouse_dagster.tracking.datasets import Column, digest_reads, parse_schema


@dataclasses.dataclass(frozen=True)
class PgState:
    """What the pinned Postgres snapshot says about the dataset."""

    dataset_id: uuid.UUID
    name: str
    kind: str
    columns: tuple[Column, ...]
    rows_version: int


def idle_autocommit(conn: psycopg.Connection) -> bool:
    """Fit to lend for a pinned read: idle (store.db.is_idle) and in autocommit."""
    return is_idle(conn) and conn.autocommit


class PinnedPostgres:
    """One REPEATABLE READ, READ ONLY transaction on its own connection; every query of a dataset's
    evaluation (version, digest, localisation, smoke rows) runs in it. Use as a context manager."""

    def __init__(self, dsn: str, conn: psycopg.Connection | None = None, *, dataset_id: uuid.UUID | None = None):
        # ``conn``: the caller's idle autocommit connection (a batch's), borrowed for the transaction and left
        # open; otherwise a connection of our own (autocommit, session time zone UTC), closed with the pin.
        # ``dataset_id``: the dataset whose change tracking the caller pairs with its rows; in capture mode
        # after-commit the snapshot is taken behind its barrier (tracking/barrier.py).
        self._own = conn is None or not idle_autocommit(conn)
        self.conn: psycopg.Connection = conn if conn is not None and not self._own else connect(dsn)
        try:
            behind = False
            while True:
                with (
                    barrier.read_tracking_consistently(self.conn, [dataset_id], on_own_connection=True)
                    if behind
                    else contextlib.nullcontext()
                ):
                    self.conn.execute("begin transaction isolation level repeatable read, read only")
                    # Take the snapshot now (the first statement does), before the caller looks at anything else.
                    tracked_after_commit = barrier.mode_is_after_commit(self.conn)
                    if behind or dataset_id is None or not tracked_after_commit:
                        break
                    # Capture mode after-commit: pin again while a connection of ours holds the barrier.
                    self.conn.execute("rollback")
                    behind = True
        except BaseException:
            self.close()
            raise

    def state(self, dataset_id: uuid.UUID) -> PgState | None:
        row = digest_reads.state(self.conn, dataset_id)
        if row is None:
            return None
        columns = parse_schema(row[3], f"dataset {row[0]}") if row[2] == "tabular" else ()
        return PgState(row[0], row[1], row[2], columns, row[4])

    def close(self) -> None:
        try:
            if not self.conn.closed:
                self.conn.execute("rollback")
        finally:
            if self._own:
                self.conn.close()

    def __enter__(self) -> PinnedPostgres:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PgSide:
    """The Postgres side of one dataset, inside a pinned transaction."""

    name = "postgres"

    def __init__(
        self, conn: psycopg.Connection, dataset_id: uuid.UUID, columns: Sequence[Column], *, identity: bool = True
    ):
        self.conn = conn
        self.dataset_id = dataset_id
        self.columns = tuple(columns)
        self._hash = canonical.pg_row_hash(self.columns, identity=identity)

    def self_check(self) -> None:
        """The server renders awkward floats and hashes awkward texts exactly as the contract's own
        implementation does (once per evaluation: a few dozen values)."""
        rows = self.conn.execute(canonical.pg_self_check_sql(), (canonical.SELF_CHECK_FLOATS,)).fetchall()
        for text, got in rows:
            want = canonical.canonical_value(float(text), "float64")
            if got != want:
                raise DigestUnavailable(
                    f"this Postgres formats float {text} as {got!r}, the canonical text is {want!r}; "
                    "the digest contract (parity/canonical.py) does not hold on this server"
                )
        rows = self.conn.execute(canonical.pg_hash_check_sql(), (canonical.SELF_CHECK_TEXTS,)).fetchall()
        for text, got in rows:
            want_hash = lookup3.hash_text(text)
            if got != want_hash:
                raise DigestUnavailable(
                    f"this Postgres hashes {text!r} to {got}, the contract's lookup3 (parity/lookup3.py) gives "
                    f"{want_hash}: the server's hashtextextended differs (a big-endian machine or a changed "
                    "Postgres), so neither side's digest could be compared"
                )

    def bounds(self) -> tuple[int | None, int | None]:
        return digest_reads.bounds(self.conn, self.dataset_id)

    def segment_digests(self, lo: int, hi: int, width: int, *, everything: bool = False) -> Segments:
        """``everything``: [lo, hi) is known to hold every row (the bounds), so no range predicate."""
        query = digest_reads.segment_sums_query(self._hash, everything)
        # The planner cannot estimate how few segments there are and would sort every row to group
        # them; a hash aggregate keeps the parallel scan streaming (local to this transaction).
        self.conn.execute("set local enable_sort = off")
        rows = self.conn.execute(query, {"lo": lo, "hi": hi, "w": width, "ds": self.dataset_id}).fetchall()
        self.conn.execute("set local enable_sort = on")  # (after an error the transaction is over anyway)
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def digest(self) -> tuple[int, int]:
        """(count, sum) of every row: the canary's main query (no grouping: ~5% cheaper than segments)."""
        count, total = digest_reads.count_and_sum(self.conn, self.dataset_id, self._hash)
        return int(count), int(total)

    def row_hashes(self, lo: int, hi: int) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in digest_reads.row_hashes(self.conn, self.dataset_id, self._hash, lo, hi)]

    def typed_rows(self) -> Iterator[tuple]:
        """(row_index, row_id text, created_at, typed values...) — for the value-level smoke check only."""
        items: list[sql.Composable] = [sql.SQL("row_index"), sql.SQL("row_id::text"), sql.SQL("created_at")]
        items += [canonical.pg_typed(c) for c in self.columns]
        return digest_reads.typed_rows(self.conn, self.dataset_id, items)
