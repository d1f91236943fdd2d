"""Iceberg rows back into ``dataset_rows``: what the backfill (runbooks/backfill.py) and the reverse mirror
(mirror/reverse.py) share, here so that both layers may use it.

  * ``snapshot_batches``: a snapshot's rows (or only some of its data files) as a bounded stream of Arrow batches,
    strings as utf8 (what ADBC's binary COPY maps to text);
  * ``data_expr``: the jsonb the pg path builds from typed staged columns (sources/pg_rows.py), so a row copied
    back holds the value the mirror types back to the same Iceberg value;
  * ``counted``: a data-changing statement as a query returning how many rows it changed;
  * ``rows_batches``: the same jsonb built client-side, for a binary COPY straight into ``dataset_rows`` (the
    reverse's full re-sync), or ``ClientJsonbUnsupported`` where it cannot be reproduced exactly.
"""

from __future__ import annotations

import decimal
import json
import math
import queue
import threading
import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from pyiceberg.io.pyarrow import schema_to_pyarrow

from lakehouse_dagster.lake.errors import ClientJsonbUnsupported
from lakehouse_dagster.lake.reader import read_files
from lakehouse_dagster.tracking.datasets import Column

IDENTITY = ("__row_index", "__row_id", "__created_at")
BATCH_ROWS = 65_536


def snapshot_batches(
    table, snapshot_id: int, names: list[str], only: tuple[str, ...] | None = None
) -> pa.RecordBatchReader:
    """The snapshot's rows as a stream of ``BATCH_ROWS``-row batches (strings as utf8, what ADBC's COPY maps
    to text). The chunked writer's files carry Iceberg field ids and no delete files exist, so each data
    file is read with pyarrow's batch iterator (memory bounded by a batch; a column added after a file was
    written reads as nulls); a snapshot with delete files goes through pyiceberg's reader instead.
    ``only``: just these data files (those native appends added)."""
    iceberg = table.scan(snapshot_id=snapshot_id, selected_fields=tuple(names))
    tasks = [t for t in iceberg.plan_files() if only is None or t.file.file_path in only]
    arrow = schema_to_pyarrow(table.schema().select(*names), include_field_ids=False)
    target = pa.schema(
        [
            pa.field(
                f.name, pa.string() if pa.types.is_large_string(f.type) or pa.types.is_string_view(f.type) else f.type
            )
            for f in arrow
        ]
    )
    if only is None and any(t.delete_files for t in tasks):
        reader = iceberg.to_arrow_batch_reader()
        return pa.RecordBatchReader.from_batches(target, (b.cast(target) for b in reader))

    return pa.RecordBatchReader.from_batches(
        target, read_files(table, [t.file.file_path for t in tasks], target, batch_rows=BATCH_ROWS)
    )


def data_expr(columns: Sequence[Column]) -> sql.Composable:
    """jsonb of the staged typed columns; jsonb_build_object takes at most 100 arguments, so groups of 50."""
    groups = []
    for i in range(0, len(columns), 50):
        pairs = []
        for c in columns[i : i + 50]:
            value = sql.SQL("s.{}::jsonb" if c.type == "json" else "s.{}").format(sql.Identifier(c.name))
            pairs.append(sql.SQL("{}, {}").format(sql.Literal(c.name), value))
        groups.append(sql.SQL("jsonb_build_object({})").format(sql.SQL(", ").join(pairs)))
    return sql.SQL(" || ").join(groups) if groups else sql.SQL("'{}'::jsonb")


def counted(stmt: sql.Composable) -> sql.Composable:
    """A data-changing statement as a query returning how many rows it changed (any driver, exactly)."""
    return sql.SQL("with changed as ({} returning 1) select count(*) from changed").format(stmt)


# --- The jsonb built client-side (a full reverse re-sync's rows COPYed straight into dataset_rows) ---------------

_US_MIN, _US_MAX = -62_135_596_800_000_000, 253_402_300_799_999_999  # 0001-01-01 .. 9999-12-31 (4-digit years)
_DAY_MIN, _DAY_MAX = -719_162, 2_932_896
_ARROW_TYPES = {
    "string": pa.string(),
    "json": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}
_HEX = np.full(256, 255, np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_UUID_HEX = [i for i in range(36) if i not in (8, 13, 18, 23)]
ROWS_SCHEMA = pa.schema(
    [
        ("dataset_id", pa.binary(16)),
        ("row_index", pa.int64()),
        ("row_id", pa.binary(16)),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("data", pa.binary()),  # jsonb's binary COPY form: version 1, then the text
    ]
)


def client_jsonb_supported(columns: Sequence[Column], names: Sequence[str]) -> bool:
    """Whether ``rows_batches`` can build these columns' jsonb (every identity column present, known types)."""
    return all(n in names for n in IDENTITY) and all(c.type in _ARROW_TYPES for c in columns)


def _json_string(a: pa.Array) -> pa.Array:
    """Text as a JSON string literal (nulls stay null): what jsonb's parser reads back as the same text."""
    a = pc.replace_substring(pc.replace_substring(a, "\\", "\\\\"), '"', '\\"')
    if pc.any(pc.match_substring_regex(a, "[\\x00-\\x1f]")).as_py():
        for ch in range(0x20):
            a = pc.replace_substring(a, chr(ch), f"\\u{ch:04x}")
    return pc.binary_join_element_wise('"', a, '"', "")


_STR = r'"(?:[^"\\]|\\.)*"'  # a JSON string literal


def _one_value(depth: int, string: str) -> str:
    """A regex for one JSON value as far as its structure goes: a string, a scalar without structure, or one group
    whose brackets balance up to ``depth`` levels, strings (``string``) skipped inside."""
    inner = r"(?:" + string + r'|[^\[\]{}"\\])*'
    for _ in range(depth):
        inner = r"(?:" + string + r'|[^\[\]{}"\\]|\[' + inner + r"\]|\{" + inner + r"\})*"
    return r"^\s*(?:" + string + r'|[^\[\]{},:"\\]*|\[' + inner + r"\]|\{" + inner + r"\})\s*$"


_ONE_VALUE_4 = _one_value(4, _STR)  # one pass, the strings matched in place: fast while nesting stays shallow
_ONE_MASKED_8 = _one_value(8, '""')  # the strings masked first (a slow pass), for the values nested deeper


def _json_value_guard(a: pa.Array) -> None:
    """A json column's text is embedded as it is, so it must not be able to reach outside its own value: it must be
    one string, one scalar without structure, or one bracketed group that balances (a valid JSON value passes; an
    invalid one that could not inject a key fails here or fails jsonb's parse, as ``::jsonb`` would)."""
    ok = pc.fill_null(pc.match_substring_regex(a, _ONE_VALUE_4), True)
    if pc.all(ok).as_py():
        return
    deeper = pc.replace_substring_regex(pc.filter(a, pc.invert(ok)), _STR, '""')
    if not pc.all(pc.match_substring_regex(deeper, _ONE_MASKED_8)).as_py():
        raise ClientJsonbUnsupported("a json value that is not one JSON value (or nested deeper than 8)")


def _civil(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Days since 1970-01-01 as proleptic Gregorian (year, month, day), vectorised (H. Hinnant's civil_from_days)."""
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    return yoe + era * 400 + (month <= 2), month, day


_PAIRS = np.array([[48 + i // 10, 48 + i % 10] for i in range(100)], np.uint8)  # 0..99 as two ASCII digits


def _digits(out: np.ndarray, at: int, value: np.ndarray, width: int) -> None:
    """``value`` (below 10**width, width even) as ``width`` ASCII digits at column ``at`` of ``out``."""
    for i in range(width // 2):
        out[:, at + width - 2 - 2 * i : at + width - 2 * i] = _PAIRS[(value // 100**i) % 100]


def _fixed_texts(a: pa.Array, out: np.ndarray) -> pa.Array:
    """Rows of ``out`` (n × width ASCII) as a string array, null where ``a`` is."""
    n, width = out.shape
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    texts = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(out)))
    return texts if not a.null_count else pc.if_else(pc.is_valid(a), texts, pa.scalar(None, pa.string()))


def _timestamp_texts(a: pa.Array) -> pa.Array:
    """YYYY-MM-DDTHH:MM:SS.ffffff (UTC) of each value, years 1-9999, vectorised."""
    us = pc.fill_null(a.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    days = np.floor_divide(us, 86_400_000_000)
    rem = us - days * 86_400_000_000
    year, month, day = _civil(days)
    out = np.full((len(us), 26), ord("-"), np.uint8)
    out[:, 10], out[:, 13], out[:, 16], out[:, 19] = ord("T"), ord(":"), ord(":"), ord(".")
    for at, value, width in (
        (0, year, 4),
        (5, month, 2),
        (8, day, 2),
        (11, rem // 3_600_000_000, 2),
        (14, rem // 60_000_000 % 60, 2),
        (17, rem // 1_000_000 % 60, 2),
        (20, rem % 1_000_000, 6),
    ):
        _digits(out, at, value, width)
    return _fixed_texts(a, out)


def _date_texts(a: pa.Array) -> pa.Array:
    days = pc.fill_null(a.cast(pa.int32()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    year, month, day = _civil(days)
    out = np.full((len(days), 10), ord("-"), np.uint8)
    for at, value, width in ((0, year, 4), (5, month, 2), (8, day, 2)):
        _digits(out, at, value, width)
    return _fixed_texts(a, out)


def _value_texts(col: Column, a: pa.Array) -> pa.Array:
    """One column's values as the JSON text jsonb_build_object writes for them (``data_expr``), nulls as null."""
    if not a.type.equals(_ARROW_TYPES[col.type]):
        raise ClientJsonbUnsupported(f"column {col.name!r} reads as {a.type}")
    if col.type == "string":
        return _json_string(a)
    if col.type == "json":
        _json_value_guard(a)
        return a
    if col.type == "int64":
        return pc.cast(a, pa.string())
    if col.type == "boolean":
        return pc.if_else(a, "true", "false")
    if col.type == "float64":  # the shortest text that reads back as the double, as float8out (Ryu) writes it
        text = pc.cast(a, pa.string())
        big = pc.fill_null(pc.and_(pc.greater_equal(pc.abs(a), _TWO_53), pc.is_finite(a)), False)
        if pc.any(big).as_py():  # where Arrow's shortest may sit on a rounding boundary, which Ryu never takes
            values = pc.filter(a, big).to_pylist()
            text = pc.replace_with_mask(text, big, pa.array([_ryu_text(x) for x in values], pa.string()))
        text = pc.if_else(pc.is_nan(a), '"NaN"', text)
        return pc.if_else(pc.is_inf(a), pc.if_else(pc.greater(a, 0), '"Infinity"', '"-Infinity"'), text)
    if col.type == "timestamp":  # JSON's (XSD) timestamp in UTC, trailing zeros of the fraction dropped
        lo, hi = pc.min_max(a.cast(pa.int64())).values()
        if lo.is_valid and (lo.as_py() < _US_MIN or hi.as_py() > _US_MAX):
            raise ClientJsonbUnsupported(f"column {col.name!r} holds a timestamp outside years 1-9999")
        t = pc.replace_substring_regex(_timestamp_texts(a), "0+$", "")
        return pc.binary_join_element_wise('"', pc.replace_substring_regex(t, r"\.$", ""), '+00:00"', "")
    lo, hi = pc.min_max(a.cast(pa.int32())).values()  # date
    if lo.is_valid and (lo.as_py() < _DAY_MIN or hi.as_py() > _DAY_MAX):
        raise ClientJsonbUnsupported(f"column {col.name!r} holds a date outside years 1-9999")
    return pc.binary_join_element_wise('"', _date_texts(a), '"', "")


_TWO_53 = float(2**53)


def _ryu_text(x: float) -> str:
    """float8out's digits for a finite double of magnitude ≥ 2**53, where the halfway points between neighbours are
    integers: the shortest decimal that is strictly nearer to ``x`` than to its neighbours (Ryu, as Postgres has it,
    never takes a halfway point; Arrow's and Python's shortest do when round-half-even reads it back as ``x``)."""
    exact, half = decimal.Decimal(x), decimal.Decimal(math.ulp(x)) / 2
    shortest = decimal.Decimal(repr(x))
    if abs(shortest - exact) < half:
        return str(int(shortest))  # an integer at this magnitude: its digits without a ".0" (numeric's scale 0)
    for digits in range(len(shortest.as_tuple().digits) + 1, 18):
        q = exact.normalize(decimal.Context(prec=digits, rounding=decimal.ROUND_HALF_EVEN))
        if abs(q - exact) < half:
            return str(int(q))
    return str(int(exact))


def _uuid_bytes(a: pa.Array) -> pa.Array:
    """Canonical uuid texts as their 16 bytes (uuid's binary COPY form), vectorised."""
    n = len(a)
    if a.null_count or a.type != pa.string():
        raise ClientJsonbUnsupported("a row id that is null")
    offsets = np.frombuffer(a.buffers()[1], np.int32)[a.offset : a.offset + n + 1]
    if n == 0:
        return pa.array([], pa.binary(16))
    if not np.all(np.diff(offsets) == 36):
        raise ClientJsonbUnsupported("a row id not in the canonical 36-character form")
    raw = np.frombuffer(a.buffers()[2], np.uint8)[offsets[0] : offsets[0] + 36 * n].reshape(n, 36)
    if not np.all(raw[:, [8, 13, 18, 23]] == ord("-")):
        raise ClientJsonbUnsupported("a row id not in the canonical 36-character form")
    nib = _HEX[raw[:, _UUID_HEX]]
    if np.any(nib == 255):
        raise ClientJsonbUnsupported("a row id that is not hexadecimal")
    out = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2])
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), n, [None, pa.py_buffer(out.tobytes())])


def rows_batches(reader: pa.RecordBatchReader, dataset_id, columns: Sequence[Column]) -> Iterator[pa.RecordBatch]:
    """The snapshot's batches as ``dataset_rows`` rows (``ROWS_COLUMNS``) for a binary COPY into the table itself:
    uuids as their 16 bytes, ``data`` as jsonb's binary form (version 1 and the text) built here, vectorised, as the
    pg path's expression builds it (``data_expr``: every column, nulls as JSON null; floats in their shortest text,
    NaN/±Infinity as strings; timestamps as UTC XSD texts; json columns as their value). Raises ClientJsonbUnsupported
    (before or during the stream) for what it cannot reproduce exactly."""
    ds = pa.scalar(dataset_id.bytes, pa.binary(16))
    keys = [json.dumps(c.name) + ": " for c in columns]
    for batch in reader:
        n = batch.num_rows
        if not n:
            continue
        parts: list = ["\x01{"]
        for i, (c, key) in enumerate(zip(columns, keys, strict=True)):
            parts += [(", " if i else "") + key, pc.fill_null(_value_texts(c, batch.column(c.name)), "null")]
        parts.append("}")
        data = pc.binary_join_element_wise(*parts, "")
        if isinstance(data, pa.Scalar):  # no column: every row is {}
            data = pa.repeat(data, n)
        index = batch.column("__row_index")
        created = batch.column("__created_at")
        if index.null_count or not created.type.equals(_ARROW_TYPES["timestamp"]):
            raise ClientJsonbUnsupported("a row index that is null")
        yield pa.RecordBatch.from_arrays(
            [pa.repeat(ds, n), index, _uuid_bytes(batch.column("__row_id")), created, data.cast(pa.binary())],
            schema=ROWS_SCHEMA,
        )


class Prefetched:
    """``batches`` built on a thread of their own, ``depth`` ahead, from the moment this is made: the reading and
    the building (pyarrow and numpy, the GIL released) go on while the caller still deletes, and while the COPY
    sends the previous batch and Postgres takes it in. Iterate once; an exception of the builder is raised there.
    ``close`` (always: a consumer that stops early, or never starts) stops the builder."""

    _END = object()

    def __init__(self, batches: Iterator[pa.RecordBatch], depth: int = 4):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._build, args=(batches,), name="lakehouse-copy-build", daemon=True)
        self._worker.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _build(self, batches: Iterator[pa.RecordBatch]) -> None:
        try:
            for b in batches:
                if not self._put(b):
                    return
            item: object = self._END
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            item = exc
        self._put(item)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            got = self._q.get()
            if got is self._END:
                return
            if isinstance(got, BaseException):
                raise got
            yield got

    def close(self) -> None:
        self._stop.set()
        self._worker.join(timeout=30)


PACED_SLICE_ROWS = 8_192


def paced(
    batches: Iterator[pa.RecordBatch], share: float, *, sleep=time.sleep, clock=time.perf_counter
) -> Iterator[pa.RecordBatch]:
    """``batches`` handed on in slices of ``PACED_SLICE_ROWS`` rows at most ``share`` of the time: the consumer
    (a COPY) takes a slice in T seconds, then waits T × (1/share − 1) before the next. Small slices keep each burst
    of the COPY's WAL and CPU short, so the live app's statements beside it meet a short one, not a long one.
    ``share`` 1: passed through as they come."""
    if share >= 1.0:
        yield from batches
        return
    factor = 1.0 / share - 1.0
    for b in batches:
        for at in range(0, b.num_rows, PACED_SLICE_ROWS):
            started = clock()
            yield b.slice(at, PACED_SLICE_ROWS)  # the consumer sends it before asking for the next
            sleep((clock() - started) * factor)
