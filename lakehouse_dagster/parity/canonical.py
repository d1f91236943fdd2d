r"""The canonical text of a row — ONE contract, three implementations (Postgres SQL, DuckDB SQL, Python).

Both sides of the parity check hash the same text for the same row, computed from *typed* values
(Postgres: the jsonb value cast to the column's declared type, exactly as the mirror types it;
Iceberg: the typed Parquet column), never from jsonb text, so it also holds for tables written
iceberg-native. Contract version 2 (v1 printed floats with 17 digits and hashed md5: see "Floats", "The hash"):

    row text  = __row_index | __row_id | __created_at | <col 1> | ... | <col n>

    fields joined by "|"; the dataset columns in the order of ``datasets.schema``. Postgres only: a row whose
    ``data`` holds keys the schema does not declare gets one more field, ``+`` and the jsonb text of those keys
    and their values (``data - <declared names>``). Iceberg has no column for them, so its side never produces
    that field: such a row never matches, and a key the mirror could not carry is a MISMATCH, never an ``ok``
    (issue 42, item 5). A row without such keys has exactly the text it always had (the contract version and
    every stored file digest stay valid; the maintained Postgres sums are refilled once under the new
    expression: parity/maintained.py compares the registered ``hash_sql``).

    field rendering, by type:
      null (SQL NULL, JSON null, missing key, column absent from a file)   \N
      string, __row_id          <UTF-8 byte length>:<text>     e.g. 6:héllo
      json                      the Postgres jsonb text of the value (keys sorted the jsonb way, ", " and
                                ": " separators), as is: valid JSON delimits itself. On the Iceberg side a
                                stored text that is not valid JSON becomes !<UTF-8 byte length>:<text>,
                                which no Postgres row produces.
      int64, __row_index        decimal                        e.g. -42
      float64                   NaN for every NaN, else the IEEE-754 bits of x + 0.0 read as a signed
                                64-bit integer, decimal (-0.0 + 0.0 is 0.0: equal values, equal text)
                                e.g. 0.1 → 4591870180066957722, Infinity → 9218868437227405312
      boolean                   true | false
      timestamp, __created_at   microseconds since 1970-01-01T00:00:00Z, decimal (never a zoned text form)
      date                      days since 1970-01-01, decimal  e.g. -1 for 1969-12-31

    hash    = Postgres' hashtextextended(row text COLLATE "C", 0): lookup3 over the UTF-8 bytes, a signed
              64-bit integer (DuckDB and Python: the same function compiled by numba, lookup3.py)
    digest  = (count of rows, exact sum of the hashes)   — Postgres numeric, DuckDB hugeint, Python int

Why each choice:
  * The separator cannot be confused with content: every string carries its byte length, so a "|"
    inside it is just content; a json value is valid JSON, where "|" can only occur inside a quoted
    string, so the value's own syntax says where it ends (and Postgres types it once instead of twice
    for a length: ~7% of the Postgres digest); every other field is drawn from [-0-9a-zA-Z .+] or is
    \N, which neither a length-prefixed text (starts with a digit) nor JSON can be.
  * Floats: the default text forms differ (Postgres vs DuckDB: 56 vs 56.0, exponent thresholds,
    Postgres 15 sometimes printing 17 digits where 16 round-trip). The bits are exact for every
    float64 and cheap on both sides: Postgres float8send (8 big-endian bytes → bit(64) → int8),
    DuckDB DOUBLE::BIT::BIGINT, Python struct. v1's fixed 17 digits (to_char / printf('% .16e'))
    agreed too, but printf was a quarter of the DuckDB digest: the bits are 3× cheaper there and
    as cheap in Postgres. NaN is tested on the bits (exponent all ones, mantissa not zero), never
    with isnan(): DuckDB folds isnan(x) and x != x to FALSE from Parquet min/max statistics, which
    by the Parquet spec leave NaN out (seen with duckdb 2.0.0).
  * Timestamps as epoch microseconds: text forms depend on the session time zone.
  * The hash: md5 was contract v1 (the only hash besides sha256 both engines have built in) and cost
    DuckDB as much as reading the files; with Postgres' lookup3 the 2M-row digests went from 3.96 s
    to 3.32 s in Postgres and from 1.15 s to 0.83 s in DuckDB (lookup3.py says why it is safe).
    64 bits, not cryptographic: parity guards against bugs and lost writes, not against someone
    forging rows to collide.
  * A sum, not a xor: a duplicated row must change the digest (a xor cancels pairs).
  * __row_index is hashed with the row, so a pair of values swapped between two rows changes the
    digest, and range digests over __row_index localise a difference (localise.py).
  * __row_id and __created_at are included: they are data that readers get from Iceberg (the
    Phase 4 readers key on row id / row_index, exports carry created_at), and the mirror copies them,
    so a transport bug there must fail parity too. They cost ~15% of the digest time.

Postgres typing (the mirror's contract, mirror/pinned_read.py, for every value the mirror accepts):
string ``data->>c``, int64 ``::int8``, float64 ``::float8`` (accepts the strings NaN/Infinity/-Infinity),
boolean ``::boolean``, timestamp ``::timestamptz`` (session time zone UTC), date ``::date``,
json ``nullif(data->c, 'null')::text``. A value the mirror would refuse makes the Postgres digest raise
(a data exception), which on a caught-up dataset is reported as MISMATCH.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import struct
import uuid
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from lakehouse_dagster.parity import lookup3
from lakehouse_dagster.tracking import undeclared
from lakehouse_dagster.tracking.datasets import Column

CONTRACT_VERSION = 2
NULL = "\\N"
SEP = "|"
UNDECLARED_MARK = "+"  # starts the Postgres-only field of a row's undeclared keys (see the contract)
# A float64's bits b (signed int64) are a NaN's exactly when (b & _ABS_MASK) > _INF_BITS.
_ABS_MASK = (1 << 63) - 1
_INF_BITS = 0x7FF0000000000000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_MAX_CONCAT_ARGS = 90  # Postgres functions take at most 100 arguments: nest concat_ws beyond that

# ---------------------------------------------------------------------------------------------------
# Python: the reference implementation (tests, triage). Values are typed Python values.
# ---------------------------------------------------------------------------------------------------


def _text(value: str) -> str:
    return f"{len(value.encode('utf-8'))}:{value}"


def canonical_value(value: Any, typ: str) -> str:
    """One field of the row text, from a typed value (json: its Postgres jsonb text, a str)."""
    if value is None:
        return NULL
    if typ == "string":
        return _text(value)
    if typ == "json":  # (valid JSON as-is; Python's parser stands in for DuckDB's json_valid)
        try:
            json.loads(value)
        except ValueError:
            return "!" + _text(value)
        return value
    if typ == "int64":
        return str(int(value))
    if typ == "float64":
        x = float(value)
        if math.isnan(x):
            return "NaN"
        return str(struct.unpack(">q", struct.pack(">d", x + 0.0))[0])
    if typ == "boolean":
        return "true" if value else "false"
    if typ == "timestamp":
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return str((value - _EPOCH) // dt.timedelta(microseconds=1))
    if typ == "date":
        return str((value - _EPOCH_DATE).days)
    raise ValueError(f"unknown column type {typ!r}")


def canonical_row(
    row_index: int,
    row_id: str | uuid.UUID | None,
    created_at: dt.datetime | None,
    values: Sequence[Any],
    columns: Sequence[Column],
) -> str:
    fields = [
        str(int(row_index)),
        NULL if row_id is None else _text(str(row_id)),
        canonical_value(created_at, "timestamp"),
    ]
    fields += [canonical_value(v, c.type) for v, c in zip(values, columns, strict=True)]
    return SEP.join(fields)


def row_hash(text: str) -> int:
    return lookup3.hash_text(text)


# ---------------------------------------------------------------------------------------------------
# Postgres: expressions over dataset_rows (columns row_index, row_id, created_at, data).
# ---------------------------------------------------------------------------------------------------

_PG_CAST = {"int64": "int8", "float64": "float8", "boolean": "boolean", "timestamp": "timestamptz", "date": "date"}


def pg_typed(col: Column) -> sql.Composable:
    """The typed value of a column from the row's jsonb (JSON null and a missing key are NULL)."""
    key = sql.Literal(col.name)
    if col.type == "string":
        return sql.SQL("(data ->> {})").format(key)
    if col.type == "json":
        return sql.SQL("nullif(data -> {}, 'null'::jsonb)::text").format(key)
    return sql.SQL("(data ->> {})::{}").format(key, sql.SQL(_PG_CAST[col.type]))


def _pg_field(typ: str, v: sql.Composable) -> sql.Composable:
    body: sql.Composable
    if typ == "string":
        body = sql.SQL("octet_length({v})::text || ':' || {v}").format(v=v)
    elif typ == "json":
        body = v  # jsonb's text: valid JSON, self-delimiting
    elif typ in ("int64", "boolean"):
        body = sql.SQL("{}::text").format(v)
    elif typ == "float64":
        b = sql.SQL("('x' || encode(float8send({} + 0.0::float8), 'hex'))::bit(64)::int8").format(v)
        body = sql.SQL("case when ({b} & {m}) > {inf} then 'NaN' else {b}::text end").format(
            b=b, m=sql.Literal(_ABS_MASK), inf=sql.Literal(_INF_BITS)
        )
    elif typ == "timestamp":
        body = sql.SQL("(extract(epoch from {}) * 1000000)::int8::text").format(v)
    elif typ == "date":
        body = sql.SQL("({} - date '1970-01-01')::text").format(v)
    else:
        raise ValueError(f"unknown column type {typ!r}")
    return sql.SQL("coalesce({}, {})").format(body, sql.Literal(NULL))


def _concat(parts: list, join) -> Any:
    """concat_ws over any number of non-null parts (nested past the 100-argument limit)."""
    while len(parts) > _MAX_CONCAT_ARGS:
        parts = [join(parts[i : i + _MAX_CONCAT_ARGS]) for i in range(0, len(parts), _MAX_CONCAT_ARGS)]
    return join(parts)


def pg_row_text(columns: Sequence[Column], *, identity: bool = True) -> sql.Composable:
    """``identity=False``: the content columns only (a fresh write assigns new identity: first_native.py)."""
    parts: list[sql.Composable] = (
        [
            sql.SQL("row_index::text"),
            sql.SQL("'36:' || row_id::text"),  # row_id is a non-null uuid: its text is always 36 bytes
            _pg_field("timestamp", sql.SQL("created_at")),
        ]
        if identity
        else [sql.Literal("")]
    )
    parts += [_pg_field(c.type, pg_typed(c)) for c in columns]

    def join(items):
        return sql.SQL("concat_ws({}, {})").format(sql.Literal(SEP), sql.SQL(", ").join(items))

    # Outside _concat: concat_ws skips the NULL of a row without undeclared keys, whatever the nesting.
    return join([_concat(parts, join), pg_undeclared_field(columns)])


def pg_undeclared_field(columns: Sequence[Column]) -> sql.Composable:
    """``+`` and the jsonb text of the row's keys the schema does not declare; NULL (no field) when it has none."""
    names = [c.name for c in columns]
    return sql.SQL("case when {} then {} || {}::text end").format(
        undeclared.has_undeclared(names), sql.Literal(UNDECLARED_MARK), undeclared.extra(names)
    )


def pg_row_hash(columns: Sequence[Column], *, identity: bool = True) -> sql.Composable:
    return sql.SQL('hashtextextended(({}) collate "C", 0)').format(pg_row_text(columns, identity=identity))


def pg_self_check_sql() -> sql.Composed:
    """Canonical floats of a few awkward values, to compare with the Python reference at run time."""
    v = sql.SQL("x")
    return sql.SQL("select x::text, {} from unnest(%s::float8[]) as u(x)").format(_pg_field("float64", v))


def pg_hash_check_sql() -> sql.SQL:
    return sql.SQL('select t, hashtextextended(t collate "C", 0) from unnest(%s::text[]) as u(t)')


# Every tail length 0..11 around one and two 12-byte blocks, multi-byte UTF-8, bytes ≥ 0x80 in each lane.
SELF_CHECK_TEXTS = ["x" * n for n in range(26)] + ["héllo wörld ✓ 日本", "ÿ" * 13, "0|36:" + "f" * 36 + "|\\N"]

SELF_CHECK_FLOATS = [
    "0.1",
    "-0.0",
    "0",
    "1e-300",
    "5e-324",
    "1.7976931348623157e308",
    "-2.5",
    "56",
    "3.5399581018880077e+17",
    "NaN",
    "Infinity",
    "-Infinity",
]


# ---------------------------------------------------------------------------------------------------
# DuckDB: expressions over the Parquet files of an Iceberg snapshot (typed columns).
# ---------------------------------------------------------------------------------------------------

_DUCK_TYPE = {
    "string": "VARCHAR",
    "json": "VARCHAR",
    "int64": "BIGINT",
    "float64": "DOUBLE",
    "boolean": "BOOLEAN",
    "timestamp": "TIMESTAMPTZ",
    "date": "DATE",
}


def duck_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def duck_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _duck_field(typ: str, v: str) -> str:
    if typ == "string":
        body = f"strlen({v})::VARCHAR || ':' || {v}"
    elif typ == "json":
        # Not valid JSON (a writer broke the contract): marked and length-prefixed, so it can never
        # borrow a neighbour's "|" and equal some Postgres row's text.
        body = f"CASE WHEN json_valid({v}) THEN {v} ELSE '!' || strlen({v})::VARCHAR || ':' || {v} END"
    elif typ == "int64":
        body = f"{v}::VARCHAR"
    elif typ == "boolean":
        body = f"CASE WHEN {v} THEN 'true' WHEN NOT {v} THEN 'false' END"
    elif typ == "float64":
        b = f"(({v} + 0.0)::BIT)::BIGINT"
        body = f"CASE WHEN ({b} & {_ABS_MASK}) > {_INF_BITS} THEN 'NaN' ELSE {b}::VARCHAR END"
    elif typ == "timestamp":
        body = f"epoch_us({v})::VARCHAR"
    elif typ == "date":
        body = f"({v} - DATE '1970-01-01')::VARCHAR"
    else:
        raise ValueError(f"unknown column type {typ!r}")
    return f"coalesce({body}, {duck_literal(NULL)})"


def duck_typed(col: Column, present: bool) -> str:
    """The typed column (cast to the declared type), or a typed NULL when no file has it."""
    if not present:
        return f"NULL::{_DUCK_TYPE[col.type]}"
    return f"{duck_ident(col.name)}::{_DUCK_TYPE[col.type]}"


def duck_row_text(columns: Sequence[Column], present: set[str], *, identity: bool = True) -> str:
    parts = (
        [
            "__row_index::VARCHAR",
            _duck_field("string", "__row_id::VARCHAR") if "__row_id" in present else duck_literal(NULL),
            _duck_field("timestamp", "__created_at::TIMESTAMPTZ") if "__created_at" in present else duck_literal(NULL),
        ]
        if identity
        else [duck_literal("")]
    )
    parts += [_duck_field(c.type, duck_typed(c, c.name in present)) for c in columns]

    def join(items):
        return f"concat_ws({duck_literal(SEP)}, {', '.join(items)})"

    return _concat(parts, join)


def duck_row_hash(columns: Sequence[Column], present: set[str], *, identity: bool = True) -> str:
    """The hash as BIGINT, bit for bit Postgres' (needs ``lookup3.register`` on the connection)."""
    return f"{lookup3.DUCK_FUNCTION}({duck_row_text(columns, present, identity=identity)})"
