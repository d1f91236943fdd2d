"""One plan (routing/request.py), compiled to the SQL of both engines from ONE description.

The query is built once as fragments — SQL text written in this module, identifiers (only names from the dataset's
schema) and parameters (typed values) — and rendered twice: for Postgres as ``psycopg.sql`` (``sql.Identifier``,
``%s`` placeholders) over the typed projection of ``dataset_rows``; for DuckDB as text with quoted identifiers and
``?`` placeholders over the snapshot's rows. Where the engines differ the fragment says how (``Dialect``): text
comparisons are bytewise on both (Postgres ``COLLATE "C"``, DuckDB's default), float keys are ``x + 0.0`` (one
zero), nulls sort last ascending and first descending (said explicitly on both), ties break on ``__row_index``.

Exact sums: an int64 sum is exact on both (numeric / hugeint). A float64 sum or average is not computed by the
engines' float ``sum`` (its result depends on the order of additions, and Postgres raises on overflow): each value
is split into an integer and a power of two from its IEEE bits (``x = M · 2^(8k-1080)``, ``|M| < 2^60``), the engine
sums ``M`` per group and ``k`` exactly, and Python adds the partial sums exactly and rounds once
(routing/compute.py): the correctly rounded sum, the same on both engines, whatever the row order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import sql

from lakehouse_dagster.routing.request import ROW_INDEX, Bound, Cmp, Logic, Plan

Part = str | tuple  # text | ("ident", name) | ("param", value, type) | ("sql", a psycopg Composable: Postgres only)


@dataclasses.dataclass(frozen=True)
class Frag:
    parts: tuple[Part, ...]

    def __add__(self, other: Frag | str) -> Frag:
        return Frag(self.parts + (other.parts if isinstance(other, Frag) else (other,)))

    def __radd__(self, other: str) -> Frag:
        return Frag((other, *self.parts))


def T(text: str) -> Frag:  # noqa: N802 - reads as SQL text
    return Frag((text,))


def I(name: str) -> Frag:  # noqa: N802,E743 - an identifier
    return Frag((("ident", name),))


def P(value: Any, typ: str) -> Frag:  # noqa: N802 - a parameter
    return Frag((("param", value, typ),))


def join(sep: str, frags: Iterable[Frag]) -> Frag:
    out: list[Part] = []
    for i, f in enumerate(frags):
        if i:
            out.append(sep)
        out.extend(f.parts)
    return Frag(tuple(out))


_PG_CAST = {"int64": "int8", "float64": "float8", "string": "text", "json": "text", "boolean": "boolean"}
_PG_CAST |= {"timestamp": "timestamptz", "date": "date", "uuid": "uuid", "uuid[]": "uuid[]"}
_DUCK_CAST = {"int64": "BIGINT", "float64": "DOUBLE", "string": "VARCHAR", "json": "VARCHAR", "boolean": "BOOLEAN"}
_DUCK_CAST |= {"timestamp": "TIMESTAMPTZ", "date": "DATE"}


class Dialect:
    name = ""
    casts: dict[str, str] = {}
    intdiv = "/"

    def text_key(self, f: Frag, typ: str) -> Frag:
        """A value as it compares, sorts and groups: bytewise text, one float zero."""
        if typ == "float64":
            return "(" + f + T(" + 0.0)")
        return f

    def bits(self, f: Frag) -> Frag:
        raise NotImplementedError

    def bool_min_max(self, fn: str, f: Frag) -> Frag:
        return T(f"{fn}(") + f + T(")")


class Postgres(Dialect):
    name = "postgres"
    casts = _PG_CAST

    def text_key(self, f: Frag, typ: str) -> Frag:
        if typ in ("string", "json"):
            return "(" + f + T(' collate "C")')
        return super().text_key(f, typ)

    def bits(self, f: Frag) -> Frag:
        return "('x' || encode(float8send(" + f + T("), 'hex'))::bit(64)::int8")

    def bool_min_max(self, fn: str, f: Frag) -> Frag:
        return T("bool_and(" if fn == "min" else "bool_or(") + f + T(")")

    def render(self, f: Frag) -> tuple[sql.Composed, list]:
        out: list[sql.Composable] = []
        params: list = []
        for p in f.parts:
            if isinstance(p, str):
                out.append(sql.SQL(p))
            elif p[0] == "ident":
                out.append(sql.Identifier(p[1]))
            elif p[0] == "sql":  # a Postgres-only piece composed elsewhere (the mirror's typed projection)
                out.append(p[1])
            else:
                out.append(sql.SQL("%s::" + self.casts[p[2]]))
                params.append(p[1])
        return sql.Composed(out), params


class DuckDB(Dialect):
    name = "duckdb"
    casts = _DUCK_CAST
    intdiv = "//"

    def bits(self, f: Frag) -> Frag:
        return "((" + f + T(")::BIT)::BIGINT")

    def render(self, f: Frag) -> tuple[str, list]:
        out: list[str] = []
        params: list = []
        for p in f.parts:
            if isinstance(p, str):
                out.append(p)
            elif p[0] == "ident":
                out.append('"' + p[1].replace('"', '""') + '"')
            else:
                out.append("?::" + self.casts[p[2]])
                params.append(p[1])
        return "".join(out), params


POSTGRES, DUCKDB = Postgres(), DuckDB()

_OPS = {"eq": "=", "ne": "<>", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def predicate(d: Dialect, p: Bound) -> Frag:
    if isinstance(p, Logic):
        if p.op == "not":
            return "(not " + predicate(d, p.args[0]) + T(")")
        return "(" + join(f" {p.op} ", (predicate(d, a) for a in p.args)) + T(")")
    assert isinstance(p, Cmp)
    c = d.text_key(I(p.column), p.type)
    if p.op == "is_null":
        return "(" + I(p.column) + T(" is null)")
    if p.op == "not_null":
        return "(" + I(p.column) + T(" is not null)")
    if p.op == "in":
        return "(" + c + T(" in (") + join(", ", (d.text_key(P(v, p.type), p.type) for v in p.values)) + T("))")
    return "(" + c + T(f" {_OPS[p.op]} ") + d.text_key(P(p.values[0], p.type), p.type) + T(")")


def addressing(plan: Plan, column: Frag) -> list[Frag]:
    """The row-index addressing as conditions on ``column`` (Postgres: the indexed row_index itself)."""
    conds = []
    if plan.after_row_index is not None:
        conds.append(column + T(" > ") + P(plan.after_row_index, "int64"))
    if plan.row_ranges:
        spans = [column + T(" between ") + P(lo, "int64") + T(" and ") + P(hi, "int64") for lo, hi in plan.row_ranges]
        conds.append("(" + join(" or ", spans) + T(")"))
    return conds


def conditions(d: Dialect, plan: Plan, *, row_ids: bool = True) -> list[Frag]:
    conds = addressing(plan, I(ROW_INDEX))
    if row_ids and plan.row_ids is not None:
        conds.append(I("__row_id") + T(" in (") + join(", ", (P(r, "string") for r in plan.row_ids)) + T(")"))
    if plan.where is not None:
        conds.append(predicate(d, plan.where))
    return conds


def _where(conds: Sequence[Frag]) -> Frag:
    return (T(" where ") + join(" and ", conds)) if conds else T("")


def rows_query(d: Dialect, plan: Plan, source: Frag, conds: Sequence[Frag], limit: int | None = None) -> Frag:
    """A row read: the columns asked for, filtered, ordered (ties by __row_index), limited."""
    q = T("select ") + join(", ", (I(c) for c in plan.columns)) + T(" from ") + source + _where(conds)
    if plan.order:
        keys = [
            d.text_key(I(c), plan.types[c]) + T(" desc nulls first" if desc else " asc nulls last")
            for c, desc in plan.order
        ]
        if plan.order[-1][0] != ROW_INDEX and all(c != ROW_INDEX for c, _ in plan.order):
            keys.append(I(ROW_INDEX) + T(" asc"))
        q = q + T(" order by ") + join(", ", keys)
    limit = plan.limit if limit is None else limit
    if limit is not None:
        q = q + T(" limit ") + P(limit, "int64")
    return q


def _keys(d: Dialect, plan: Plan) -> list[Frag]:
    return [d.text_key(I(g), plan.types[g]) for g in plan.group_by]


def _group(plan: Plan, extra: int = 0) -> Frag:
    n = len(plan.group_by) + extra
    return T(" group by " + ", ".join(str(i + 1) for i in range(n))) if n else T("")


def measure_expr(d: Dialect, m) -> Frag:
    """A measure's part computed by the main aggregate query (float sums/avgs come from ``float_sum_query``)."""
    if m.fn == "count":
        return T("count(*)") if m.column is None else T("count(") + I(m.column) + T(")")
    assert m.column is not None  # bind: only count goes without a column
    col = I(m.column)
    if m.fn == "count_distinct":
        return T("count(distinct ") + d.text_key(col, m.type) + T(")")
    if m.fn in ("min", "max"):
        if m.type == "boolean":
            return d.bool_min_max(m.fn, col)
        return T(f"{m.fn}(") + d.text_key(col, m.type) + T(")")
    if m.type == "int64":  # sum and avg of int64: the exact sum (avg = sum / count, rounded once in Python)
        return T("sum(") + col + T(")")
    return T("count(") + col + T(")")  # float64: the count here, the sum from float_sum_query


def aggregate_query(d: Dialect, plan: Plan, source: Frag, conds: Sequence[Frag]) -> Frag:
    """One row per group: the keys, then per measure its part (an avg of int64 also counts: see compute.py)."""
    items = _keys(d, plan) + [measure_expr(d, m) for m in plan.measures]
    items += [
        T("count(") + I(m.column) + T(")") for m in plan.measures if m.column and m.fn == "avg" and m.type == "int64"
    ]
    q = T("select ") + join(", ", items) + T(" from ") + source + _where(conds) + _group(plan)
    if plan.group_by:
        q = q + T(" order by ") + join(", ", (T(str(i + 1) + " asc nulls last") for i in range(len(plan.group_by))))
    return q


# x = M · 2^(8k - 1080) for a finite float64 x with bits b: exponent field ex, fraction f, e = max(ex, 1) - 1075,
# m = f (+ 2^52 when ex > 0), k = (e + 1080) div 8, M = ±(m << ((e + 1080) mod 8)) < 2^60.
_EX = "((b >> 52) & 2047)"
_FRAC = "(b & 4503599627370495)"


def float_sum_query(d: Dialect, plan: Plan, column: str, source: Frag, conds: Sequence[Frag]) -> Frag:
    """Per group and power-of-two bucket k: the exact sum of the integers M, and the counts of NaN, +Inf, -Inf
    (bucket null). Python rounds the total once (compute.py)."""
    keys = _keys(d, plan)
    names = [f"g{i}" for i in range(len(keys))]
    inner_items = [k + T(f" as {n}") for k, n in zip(keys, names)] + [d.bits(I(column)) + T(" as b")]
    inner = (
        T("select ") + join(", ", inner_items) + T(" from ") + source + _where([*conds, I(column) + T(" is not null")])
    )
    e = f"(greatest({_EX}, 1) - 1075 + 1080)"
    m = f"({_FRAC} + case when {_EX} > 0 then 4503599627370496 else 0 end)"
    mag = f"({m} << (({e} - ({e} {d.intdiv} 8) * 8)::integer))"  # no %: psycopg's placeholder
    items = [T(n) for n in names] + [
        T(f"case when {_EX} < 2047 then {e} {d.intdiv} 8 end as k"),
        T(f"sum(case when {_EX} = 2047 then 0 when b < 0 then -{mag} else {mag} end)"),
        T(f"sum(case when {_EX} = 2047 and {_FRAC} <> 0 then 1 else 0 end)"),
        T(f"sum(case when {_EX} = 2047 and {_FRAC} = 0 and b > 0 then 1 else 0 end)"),
        T(f"sum(case when {_EX} = 2047 and {_FRAC} = 0 and b < 0 then 1 else 0 end)"),
    ]
    # offset 0: the bits are computed once per row, not once per use (Postgres would pull the subquery up)
    return T("select ") + join(", ", items) + T(" from (") + inner + T(" offset 0) as bits") + _group(plan, 1)
