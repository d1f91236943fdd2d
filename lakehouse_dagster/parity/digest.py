"""The digest, pushed down: Postgres computes its side in SQL, DuckDB computes the Iceberg side over the
Parquet files of one pinned snapshot. No row becomes a Python object on the way (only per-segment
aggregates come back, and per-row hashes of small leaf ranges during localisation).

Both sides answer the same three questions about a half-open ``__row_index`` range [lo, hi):
  * ``segment_digests(lo, hi, width)``: {segment: (count, sum of hashes)} with segment = (row_index - lo) // width
    (one segment when width covers the range: the plain digest);
  * ``row_hashes(lo, hi)``: [(row_index, hash)] for a small range (the leaves of localisation);
  * ``bounds()``: (min, max) row_index.
Pinning: the Postgres side runs inside one REPEATABLE READ READ ONLY transaction opened by
``PinnedPostgres`` (the version, the digest and the localisation all see one snapshot); the Iceberg
side reads the data files listed by one snapshot id (``pin_iceberg``), so a commit landing meanwhile
changes nothing it reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg
from psycopg import sql
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThan
from pyiceberg.table import Table
from pyiceberg.types import BooleanType, DateType, DoubleType, LongType, StringType, TimestamptzType

from lakehouse_dagster.core.db import connect, fetch_one, is_idle
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.parity import canonical, lookup3
from lakehouse_dagster.parity.duck_files import FileSource, file_source
from lakehouse_dagster.tracking import barrier
from lakehouse_dagster.tracking.datasets import Column, parse_schema

# Keys the mirror's writer puts into each snapshot summary and the table properties (lake/writer.py).
SYNC_ID = "lakehouse.sync-id"
SOURCE_VERSION = "lakehouse.source-version"
WRITE_PATH = "lakehouse.path"

EXPECTED_ICEBERG_TYPE = {
    "string": StringType(),
    "json": StringType(),
    "int64": LongType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": TimestamptzType(),
    "date": DateType(),
}

Segments = dict[int, tuple[int, int]]


class DigestUnavailable(LakehouseError):
    """A side's digest could not be computed (the message says which side and why)."""

    exit_code = 5


@dataclasses.dataclass(frozen=True)
class Digest:
    count: int
    sum: int
    seconds: float
    segments: Segments | None = None  # segment → (count, sum), for localisation (when asked for)
    lo: int = 0  # segment 0 starts here
    width: int = 0  # rows of __row_index space per segment

    @property
    def value(self) -> tuple[int, int]:
        return (self.count, self.sum)


def segment_plan(lo: int, hi: int, factor: int) -> int:
    """Width of ``factor`` equal segments covering [lo, hi)."""
    return max(1, -(-(hi - lo) // factor))


def fold(segments: Segments) -> tuple[int, int]:
    return sum(c for c, _ in segments.values()), sum(s for _, s in segments.values())


# ---------------------------------------------------------------------------------------------------
# Postgres
# ---------------------------------------------------------------------------------------------------


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
        row = self.conn.execute(
            "select id, name, kind, schema, rows_version from datasets where id = %s", (dataset_id,)
        ).fetchone()
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
        return fetch_one(
            self.conn.execute(
                "select min(row_index), max(row_index) from dataset_rows where dataset_id = %s", (self.dataset_id,)
            ),
            "the dataset's row index bounds",
        )

    def segment_digests(self, lo: int, hi: int, width: int, *, everything: bool = False) -> Segments:
        """``everything``: [lo, hi) is known to hold every row (the bounds), so no range predicate."""
        query = sql.SQL(
            "select (row_index - %(lo)s) / %(w)s as seg, count(*), coalesce(sum({h}), 0) from dataset_rows"
            " where dataset_id = %(ds)s{rng} group by 1"
        ).format(h=self._hash, rng=sql.SQL("" if everything else " and row_index >= %(lo)s and row_index < %(hi)s"))
        # The planner cannot estimate how few segments there are and would sort every row to group
        # them; a hash aggregate keeps the parallel scan streaming (local to this transaction).
        self.conn.execute("set local enable_sort = off")
        rows = self.conn.execute(query, {"lo": lo, "hi": hi, "w": width, "ds": self.dataset_id}).fetchall()
        self.conn.execute("set local enable_sort = on")  # (after an error the transaction is over anyway)
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def digest(self) -> tuple[int, int]:
        """(count, sum) of every row: the canary's main query (no grouping: ~5% cheaper than segments)."""
        query = sql.SQL("select count(*), coalesce(sum({h}), 0) from dataset_rows where dataset_id = %s").format(
            h=self._hash
        )
        count, total = fetch_one(self.conn.execute(query, (self.dataset_id,)), "the digest of the dataset's rows")
        return int(count), int(total)

    def row_hashes(self, lo: int, hi: int) -> list[tuple[int, int]]:
        query = sql.SQL(
            "select row_index, {h} from dataset_rows where dataset_id = %s and row_index >= %s and row_index < %s"
        ).format(h=self._hash)
        return [(int(a), int(b)) for a, b in self.conn.execute(query, (self.dataset_id, lo, hi)).fetchall()]

    def typed_rows(self) -> Iterator[tuple]:
        """(row_index, row_id text, created_at, typed values...) — for the value-level smoke check only."""
        items: list[sql.Composable] = [sql.SQL("row_index"), sql.SQL("row_id::text"), sql.SQL("created_at")]
        items += [canonical.pg_typed(c) for c in self.columns]
        query = sql.SQL("select {} from dataset_rows where dataset_id = %s").format(sql.SQL(", ").join(items))
        with self.conn.cursor() as cur:
            cur.execute(query, (self.dataset_id,))
            yield from cur


# ---------------------------------------------------------------------------------------------------
# Iceberg
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class IcebergPin:
    """One snapshot of the dataset's table, pinned: everything later reads exactly these files."""

    identifier: tuple[str, str]
    table: Any = None  # pyiceberg Table, None when the table does not exist
    snapshot_id: int | None = None
    committed_at: dt.datetime | None = None
    source_version: int | None = None
    version_from: str | None = None  # "snapshot summary" | "table property"
    sync_id: str | None = None
    path: str | None = None  # mirror | native (from the summary or the table property)
    total_records: int | None = None
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # name → Iceberg type
    field_ids: dict[str, int] = dataclasses.field(default_factory=dict)  # name → Iceberg field id
    files: list[str] = dataclasses.field(default_factory=list)
    sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # path → bytes, as the manifests say
    records: dict[str, int] = dataclasses.field(default_factory=dict)  # path → rows, as the manifests say
    schema_id: int | None = None  # the snapshot's schema
    local: bool = True
    has_deletes: bool = False

    @property
    def exists(self) -> bool:
        return self.table is not None

    @property
    def has_snapshot(self) -> bool:
        return self.snapshot_id is not None


def _int_or_none(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


def local_path(uri: str) -> str | None:
    """A local filesystem path for a file:// URI or a bare path; None for remote storage."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and uri[1:3] == ":\\"):
        return uri
    return None


def pin_iceberg(
    catalog: Catalog, settings: Settings, dataset_id: uuid.UUID, *, table: Table | None = None
) -> IcebergPin:
    """``table``: the dataset's table as the caller just loaded or committed it (a catalog migration's moved table),
    pinned instead of loading it again."""
    ident = table_identifier(settings, dataset_id)
    pin = IcebergPin(ident)
    table = load_table_or_none(catalog, ident) if table is None else table
    if table is None:
        return pin
    pin.table = table
    snap = table.current_snapshot()
    if snap is None:
        return pin
    pin.snapshot_id = snap.snapshot_id
    pin.committed_at = dt.datetime.fromtimestamp(snap.timestamp_ms / 1000, tz=dt.UTC)
    summary = snap.summary.additional_properties if snap.summary is not None else {}
    props = table.properties
    pin.sync_id = summary.get(SYNC_ID)
    # The summary names the version this exact snapshot covers; a snapshot not made by a sync (a
    # maintenance commit, or a rogue one) inherits the table's durable watermark, set by the last
    # sync in the same transaction as its data: the table still claims to be at that version.
    pin.source_version = _int_or_none(summary.get(SOURCE_VERSION))
    pin.version_from = "snapshot summary" if pin.source_version is not None else None
    if pin.source_version is None:
        pin.source_version = _int_or_none(props.get(SOURCE_VERSION))
        pin.version_from = "table property" if pin.source_version is not None else None
    pin.path = summary.get(WRITE_PATH) or props.get(WRITE_PATH)
    pin.total_records = _int_or_none(summary.get("total-records"))
    schema = table.schemas().get(snap.schema_id) if snap.schema_id is not None else None
    schema = schema or table.schema()
    pin.schema_id = schema.schema_id
    pin.fields = {f.name: f.field_type for f in schema.fields}
    pin.field_ids = {f.name: f.field_id for f in schema.fields}
    for task in table.scan(snapshot_id=snap.snapshot_id).plan_files():
        pin.files.append(task.file.file_path)
        pin.sizes[task.file.file_path] = task.file.file_size_in_bytes
        pin.records[task.file.file_path] = task.file.record_count
        if task.delete_files:
            pin.has_deletes = True
    pin.local = all(local_path(p) is not None for p in pin.files)
    return pin


class IcebergSide:
    """The Iceberg side of one dataset: DuckDB over the pinned snapshot's Parquet files.

    Columns are read by Iceberg field id (parity/duck_files.py), never by Parquet name: a column another engine
    wrote under a sanitised name still reads, a column added after a file was written is NULL in it, as Iceberg
    reads it; a file without field ids is read by name. Remote files (s3://...) or delete files go through pyiceberg's Arrow batch
    reader instead (it resolves deletes and object storage), streamed into DuckDB per query.
    """

    name = "iceberg"

    def __init__(
        self,
        pin: IcebergPin,
        columns: Sequence[Column],
        *,
        threads: int | None = None,
        via_arrow: bool | None = None,
        identity: bool = True,
    ):
        import duckdb  # lazy: DuckDB (~0.3 s to import) only where a digest runs

        self.pin = pin
        self.columns = tuple(columns)
        self.con = duckdb.connect(config={"threads": threads} if threads else {})
        lookup3.register(self.con)
        # via_arrow forces (True) or forbids (False) the pyiceberg reader; None picks by the files.
        self._arrow = ((not pin.local) or pin.has_deletes) if via_arrow is None else via_arrow
        self._paths = [local_path(p) for p in pin.files] if not self._arrow else []
        self.empty = not pin.files
        self._files: FileSource | None = None
        if self._paths:
            wanted = {"__row_index", "__row_id", "__created_at"} | {c.name for c in self.columns}
            fields = {n: (pin.field_ids.get(n), pin.fields[n]) for n in wanted if n in pin.fields}
            self._files = file_source(self.con, [p for p in self._paths if p is not None], fields, "files")
        self.present = self._present_columns()
        self._hash = canonical.duck_row_hash(self.columns, self.present, identity=identity)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> IcebergSide:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _present_columns(self) -> set[str]:
        wanted = {"__row_index", "__row_id", "__created_at"} | {c.name for c in self.columns}
        # Only columns of the snapshot's schema count: a name in a file but not in the table is not data.
        in_table = set(self.pin.fields)
        if self.empty:
            return wanted & in_table
        if self._arrow or self._files is None:
            return wanted & in_table  # pyiceberg projects the table schema (absent columns as NULL)
        return wanted & in_table & set(self._files.present)

    def _source(self, lo: int | None = None, hi: int | None = None) -> str:
        if not self._arrow:
            assert self._files is not None  # every caller returns early on an empty snapshot
            return self._files.sql

        row_filter = AlwaysTrue()
        if lo is not None:
            # pyiceberg's expressions take (term, literal) positionally; its stubs declare keyword fields only
            row_filter = And(GreaterThanOrEqual("__row_index", lo), LessThan("__row_index", hi))  # type: ignore[call-arg, arg-type, assignment]
        names = ["__row_index"] + [n for n in ("__row_id", "__created_at") if n in self.present]
        names += [c.name for c in self.columns if c.name in self.present]
        reader = self.pin.table.scan(
            snapshot_id=self.pin.snapshot_id, row_filter=row_filter, selected_fields=tuple(names)
        ).to_arrow_batch_reader()
        self.con.register("ice_src", reader)
        return "ice_src"

    def _params(self, **kw) -> dict:
        if not self._arrow and self._files is not None:
            kw.update(self._files.params)
        return kw

    def bounds(self) -> tuple[int | None, int | None]:
        if self.empty:
            return (None, None)
        # DuckDB: the source is our own text (a view name or a read_parquet over the planned files), values bound
        query = "select min(__row_index), max(__row_index) from " + self._source()
        cur = self.con.execute(query, self._params())
        row = fetch_one(cur, "the Iceberg side's row index bounds")
        # DuckDB 2: a result not fetched to its end leaves the connection busy, and the next query's register of
        # the Arrow reader (remote files: an s3:// warehouse, test_rest_catalog.py) is refused (ResourceInUse).
        cur.fetchall()
        return row

    def segment_digests(self, lo: int, hi: int, width: int, *, everything: bool = False) -> Segments:
        if self.empty:
            return {}
        if everything:
            query = (
                f"select (__row_index - $lo) // $w as seg, count(*), coalesce(sum(h::HUGEINT), 0) from ("
                f" select __row_index, {self._hash} as h from {self._source()}) group by seg"
            )
            params = self._params(lo=lo, w=width)
        else:
            query = (
                f"select (__row_index - $lo) // $w as seg, count(*), coalesce(sum(h::HUGEINT), 0) from ("
                f" select __row_index, {self._hash} as h from {self._source(lo, hi)}"
                f" where __row_index >= $lo and __row_index < $hi) group by seg"
            )
            params = self._params(lo=lo, hi=hi, w=width)
        rows = self.con.execute(query, params).fetchall()
        return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}

    def digest(self) -> tuple[int, int]:
        if self.empty:
            return (0, 0)
        count, total = fetch_one(
            self.con.execute(
                f"select count(*), coalesce(sum(h::HUGEINT), 0) from (select {self._hash} as h from {self._source()})",
                self._params(),
            ),
            "the digest of the Iceberg side's rows",
        )
        return int(count), int(total)

    def row_hashes(self, lo: int, hi: int) -> list[tuple[int, int]]:
        if self.empty:
            return []
        query = (
            f"select __row_index, h from (select __row_index, {self._hash} as h"
            f" from {self._source(lo, hi)} where __row_index >= $lo and __row_index < $hi)"
        )
        return [(int(a), int(b)) for a, b in self.con.execute(query, self._params(lo=lo, hi=hi)).fetchall()]

    def identity_stats(self) -> dict[str, int]:
        """Counts behind identity readiness: rows, non-null identity values, distinct __row_index."""
        if self.empty:
            return {"rows": 0, "row_index": 0, "row_id": 0, "created_at": 0, "distinct_row_index": 0}
        rid = "count(__row_id)" if "__row_id" in self.present else "0"
        cat = "count(__created_at)" if "__created_at" in self.present else "0"
        row = fetch_one(
            self.con.execute(
                f"select count(*), count(__row_index), {rid}, {cat}, count(distinct __row_index) from {self._source()}",
                self._params(),
            ),
            "the Iceberg side's identity counts",
        )
        return dict(zip(("rows", "row_index", "row_id", "created_at", "distinct_row_index"), map(int, row)))


def schema_problems(pin: IcebergPin, columns: Sequence[Column]) -> list[str]:
    """Dataset columns whose Iceberg type is not the contract's (a missing column reads as NULL)."""
    problems = []
    for c in columns:
        have = pin.fields.get(c.name)
        if have is not None and have != EXPECTED_ICEBERG_TYPE[c.type]:
            problems.append(
                f"column {c.name!r} is {have} in Iceberg; the contract maps {c.type} to {EXPECTED_ICEBERG_TYPE[c.type]}"
            )
    return problems


def full_digest(
    side, lo: int, hi: int, factor: int = 32, *, everything: bool = False, width: int | None = None
) -> Digest:
    """The side's digest over [lo, hi), kept per segment so a mismatch can start bisecting at once.
    ``everything``: the caller knows every row lies in [lo, hi) (from both sides' bounds); ``width``:
    fixed segments (the maintained digests' grid) instead of ``factor`` equal ones."""
    t = time.perf_counter()
    width = width or segment_plan(lo, hi, factor)
    segments = side.segment_digests(lo, hi, width, everything=everything)
    count, total = fold(segments)
    return Digest(count, total, time.perf_counter() - t, segments, lo, width)


def plain_digest(side) -> Digest:
    """The side's digest of every row, in one ungrouped aggregate (the canary's common path)."""
    t = time.perf_counter()
    count, total = side.digest()
    return Digest(count, total, time.perf_counter() - t)
