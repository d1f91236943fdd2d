"""Postgres and CDC sources: a table or query on any Postgres, read as Arrow batches past a stored mark.

ADBC streams the rows as Arrow (no Python object per value) inside one READ ONLY, REPEATABLE READ
transaction, ordered by the cursor / position column when there is one, so the mark to store is simply
the last row's value and rows with a null mark come first (they are only read by a first or full sync).
Marks are compared with ``>`` in SQL, in the column's own type and collation.
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from lakehouse_dagster.core.db import adbc_uri, fetch_one, fetch_value, redact
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.sources.convert import convert_batch
from lakehouse_dagster.sources.errors import BadValue, SourceError
from lakehouse_dagster.sources.spec import SourceSpec
from lakehouse_dagster.tracking.datasets import Column


def relation(spec: SourceSpec) -> sql.Composable:
    """The source as a FROM item."""
    if spec.table:
        return sql.Identifier(*spec.table.split("."))
    return sql.SQL("({}) as lakehouse_src").format(sql.SQL(spec.need("query")))


def where_label(spec: SourceSpec) -> str:
    return f"postgres table {spec.table}" if spec.table else "postgres query"


def read_query(spec: SourceSpec, after: Any, conn: psycopg.Connection) -> str:
    col = spec.order_column
    q = sql.SQL("select * from {}").format(relation(spec))
    if col and after is not None:
        q = sql.SQL("select * from {} where {} > {}").format(relation(spec), sql.Identifier(col), sql.Literal(after))
    if col:
        q = sql.SQL("{} order by {} nulls first").format(q, sql.Identifier(col))
    return q.as_string(conn)


def mark_value(value: Any) -> Any:
    """A cursor/position value as JSON: integers stay numbers, everything else its text form, which Postgres
    reads back in the column's type."""
    if value is None or isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)


def source_columns(spec: SourceSpec, dsn: str) -> list[str]:
    """The source's column names (no rows read); BadInput when the table or query is not readable."""
    try:
        conn = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BadInput(f"{where_label(spec)}: cannot connect ({scrub(first, dsn)})") from None
    with conn:
        try:
            with conn.transaction():
                conn.execute("set transaction read only")
                cur = conn.execute(sql.SQL("select * from {} limit 0").format(relation(spec)))
                return [d.name for d in cur.description or ()]
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadInput(f"{where_label(spec)}: cannot read it ({first})") from None


def scrub(text: str, dsn: str) -> str:
    """An error's text without the DSN's password (drivers may echo the connection string)."""
    try:
        password = str(psycopg.conninfo.conninfo_to_dict(dsn).get("password") or "") or None
    except Exception:
        password = None
    text = text.replace(dsn, redact(dsn))
    return text.replace(password, "***") if password else text


def read_postgres(
    spec: SourceSpec, dsn: str, columns: Sequence[Column], after: Any, on_mark: Callable[[Any], None]
) -> Iterator[pa.RecordBatch]:
    """Typed batches of the rows past ``after``; ``on_mark`` gets the last row's mark after each batch."""
    try:
        yield from _read_postgres(spec, dsn, columns, after, on_mark)
    except (SourceError, GeneratorExit):
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SourceError(f"{where_label(spec)}: cannot read it ({scrub(first, dsn)})") from None


def _read_postgres(spec, dsn, columns, after, on_mark) -> Iterator[pa.RecordBatch]:
    import adbc_driver_postgresql.dbapi as adbc  # lazy: the ADBC driver (native) only where a Postgres source is read

    with psycopg.connect(dsn, autocommit=True) as pconn:
        query = read_query(spec, after, pconn)
    col = spec.order_column
    read = 0
    with adbc.connect(adbc_uri(dsn), autocommit=True) as conn:
        cur = conn.cursor()
        try:
            cur.execute("begin isolation level repeatable read read only")
            cur.execute("set local timezone to 'UTC'")
            cur.execute(query)
            for batch in cur.fetch_record_batch():
                if not batch.num_rows:
                    continue
                try:
                    # ADBC hands numeric as text: text cells are parsed as the declared type, as in CSV
                    typed = convert_batch(batch, columns, text=True)
                except BadValue as exc:
                    at = f" at {col}={mark_value(batch.column(col)[exc.index].as_py())}" if col else ""
                    raise SourceError(
                        f"{where_label(spec)} row {read + exc.index + 1}{at} column {exc.column}: "
                        f"expected {exc.expected}, got {exc.got}"
                    ) from None
                read += batch.num_rows
                yield typed
                if col:
                    last = batch.column(col)[batch.num_rows - 1].as_py()
                    if last is not None:
                        on_mark(mark_value(last))
            cur.execute("rollback")
        finally:
            cur.close()


def max_mark(spec: SourceSpec, dsn: str, after: Any) -> Any | None:
    """The source's highest mark past ``after`` (None: nothing new). One indexed query, no rows read."""
    col = spec.need("order_column")
    where: sql.Composable = sql.SQL("")
    if after is not None:
        where = sql.SQL(" where {} > {}").format(sql.Identifier(col), sql.Literal(after))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL("select max({}) from {}{}").format(sql.Identifier(col), relation(spec), where)
            ).fetchone()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SourceError(f"{where_label(spec)}: cannot read it ({scrub(first, dsn)})") from None
    return None if row is None or row[0] is None else mark_value(row[0])


# How the source poller sees a change in a Postgres source without a cursor column (sync.full): a fingerprint
# compared with the one stored by the last ingest (tracking/ingest_state.py, "fingerprint").
STATS, CONTENT = "table statistics", "content digest"

_STATS_FINGERPRINT = """
with rels as (  -- the table itself, or a partitioned table's leaf partitions (pg_partition_tree is empty otherwise)
  select t.relid from pg_partition_tree(%(rel)s::regclass) t where t.isleaf
  union
  select c.oid from pg_class c where c.oid = %(rel)s::regclass and c.relkind <> 'p'
)
select count(*), coalesce(sum(s.n_tup_ins), 0), coalesce(sum(s.n_tup_upd), 0), coalesce(sum(s.n_tup_del), 0),
       string_agg(pg_relation_filenode(r.relid)::text, ',' order by r.relid)
  from rels r
  left join pg_stat_all_tables s on s.relid = r.relid
"""


def fingerprint_method(spec: SourceSpec, conn: psycopg.Connection) -> str:
    """STATS for a table (plain, partitioned or materialised) while the server counts row changes; CONTENT for a
    query, a view or a foreign table (nothing counts their changes)."""
    if (
        not spec.table
        or fetch_value(
            conn.execute("select current_setting('track_counts')::bool"), "the server's track_counts setting"
        )
        is not True
    ):
        return CONTENT
    row = conn.execute(
        "select relkind from pg_class where oid = to_regclass(%s)", (_qualified(spec.need("table")),)
    ).fetchone()
    return STATS if row is not None and row[0] in ("r", "p", "m") else CONTENT


def fingerprint(spec: SourceSpec, dsn: str) -> tuple[str, str]:
    """(a short token that changes whenever the source's rows may have changed, the method). Two ways, by cost:

    * STATS — the table's cumulative row-change counters (``pg_stat_all_tables.n_tup_ins/upd/del``, summed over the
      partitions) and its file node(s), which TRUNCATE and table rewrites replace: one catalog query, no row read,
      whatever the table's size. No committed change goes unseen; a few things move it with no change (an aborted
      write, a statistics reset, VACUUM FULL): a spurious sync.full, never a missed one. Backends report their
      counters in batches, so a change shows up to ~10 s late on an idle server (60 s at most).
    * CONTENT — count and an order-independent sum of a 64-bit hash of every row's text: exact, but it reads every
      row of the query on each visit (O(rows)); the only way for a query or a view.
    """
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            method = fingerprint_method(spec, conn)
            if method == STATS:
                n, ins, upd, dele, nodes = fetch_one(
                    conn.execute(_STATS_FINGERPRINT, {"rel": _qualified(spec.need("table"))}), "the table's statistics"
                )
                token = f"{n}:{ins}:{upd}:{dele}:{nodes}"
            else:
                src = (
                    sql.SQL("({})").format(sql.SQL(spec.query))
                    if spec.query
                    else sql.SQL("(select * from {})").format(relation(spec))
                )
                with conn.transaction():
                    conn.execute("set transaction read only")
                    row = fetch_one(
                        conn.execute(
                            sql.SQL(
                                "select count(*), coalesce(sum(hashtextextended(s::text, 0)), 0) from {} as s"
                            ).format(src)
                        ),
                        "the source's content digest",
                    )
                token = f"{row[0]}:{row[1]}"
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SourceError(f"{where_label(spec)}: cannot read it ({scrub(first, dsn)})") from None
    prefix = "stats" if method == STATS else "content"
    return f"{prefix}:{hashlib.sha256(token.encode()).hexdigest()[:16]}", method


def _qualified(table: str) -> str:
    """schema.table as a regclass text (each part quoted: exact names, as psycopg's Identifier does)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in table.split("."))
