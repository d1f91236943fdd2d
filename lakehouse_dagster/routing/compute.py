"""The answer of a plan, finished the same way whichever engine computed its parts, and how two answers compare.

Result types (documented in docs/reads.md):
- rows: the columns asked for, typed as the dataset's Iceberg table (lake/schema.py), the same on both engines;
- ``count``, ``count_distinct``: int64; ``min``/``max``: the column's type; ``sum`` of int64: decimal128(38, 0),
  exact (2^63 · 2^31 rows < 10^38: no overflow); ``sum`` of float64: float64, the correctly rounded exact sum of
  the values (a NaN, or both infinities, give NaN; one infinity gives it; an exact sum beyond float64 — at or past
  2^1024 − 2^970, where round-to-nearest leaves the largest float — gives ±Infinity); ``avg``: float64, the exact sum divided
  by the count of non-null values, rounded once; a ``sum``/``avg``/``min``/``max`` over no value is null.
- floats are returned with one zero (``x + 0.0``: -0.0 reads 0.0), as the parity contract compares them.

Equality rule: two answers are equal when they have the same schema and the same rows — in the same order when the
plan is ordered (an aggregate always is, by its group keys), as multisets otherwise — comparing floats by value
with every NaN equal to every NaN and -0.0 equal to 0.0, everything else exactly. No tolerance: the float sums are
exact by construction (compute_sql.py), so both engines give the same bits.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import math
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from lakehouse_dagster.lake.schema import arrow_type
from lakehouse_dagster.routing.compute_sql import Dialect, Frag, aggregate_query, float_sum_query, rows_query
from lakehouse_dagster.routing.request import Plan

Run = Callable[[Frag], list[tuple]]  # an engine runs a rendered fragment and returns its rows
_SCALE = 1080  # float_sum_query's bucket k stands for 2^(8k - 1080)


def result_schema(plan: Plan) -> pa.Schema:
    if not plan.is_aggregate:
        return pa.schema([pa.field(c, arrow_type(plan.types[c])) for c in plan.columns])
    fields = [pa.field(g, arrow_type(plan.types[g])) for g in plan.group_by]
    for m in plan.measures:
        if m.fn in ("count", "count_distinct"):
            t = pa.int64()
        elif m.fn == "sum" and m.type == "int64":
            t = pa.decimal128(38, 0)
        elif m.fn in ("sum", "avg"):
            t = pa.float64()
        else:
            t = arrow_type(m.type or "")
        fields.append(pa.field(m.name, t))
    return pa.schema(fields)


def answer(dialect: Dialect, plan: Plan, source: Frag, conds: Sequence[Frag], run: Run) -> pa.Table:
    """The plan's answer: the engine runs the queries (``run``), the finishing is shared."""
    schema = result_schema(plan)
    if not plan.is_aggregate:
        return to_table(schema, run(rows_query(dialect, plan, source, conds)))
    main = run(aggregate_query(dialect, plan, source, conds))
    floats = {m.column for m in plan.measures if m.column and m.fn in ("sum", "avg") and m.type == "float64"}
    partial = {c: run(float_sum_query(dialect, plan, c, source, conds)) for c in sorted(floats)}
    return to_table(schema, finish_aggregate(plan, main, partial))


def to_table(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [() for _ in schema]
    arrays = []
    for values, field in zip(cols, schema):
        if pa.types.is_floating(field.type):
            values = tuple(None if v is None else float(v) + 0.0 for v in values)
        elif pa.types.is_decimal(field.type):
            values = tuple(None if v is None else decimal.Decimal(int(v)) for v in values)
        arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _key(values: Sequence[Any]) -> tuple:
    return tuple(("nan",) if isinstance(v, float) and math.isnan(v) else v for v in values)


def finish_aggregate(plan: Plan, main: list[tuple], partial: dict[str, list[tuple]]) -> list[tuple]:
    n = len(plan.group_by)
    sums: dict[str, dict[tuple, list[int]]] = {}
    for column, rows in partial.items():
        acc: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])  # total, nan, +inf, -inf
        for r in rows:
            a = acc[_key(r[:n])]
            k, s, nan, pinf, ninf = r[n:]
            if k is not None:
                a[0] += int(s) << (8 * int(k))
            a[1] += int(nan)
            a[2] += int(pinf)
            a[3] += int(ninf)
        sums[column] = acc
    out = []
    for r in main:
        key, parts = r[:n], list(r[n:])
        extra = iter(parts[len(plan.measures) :])
        values = list(key)
        for m, part in zip(plan.measures, parts):
            if m.fn in ("count", "count_distinct", "min", "max"):
                values.append(part)
            elif m.type == "int64":
                total = None if part is None else int(part)
                if m.fn == "sum":
                    values.append(total)
                else:
                    count = int(next(extra))
                    values.append(None if total is None or count == 0 else total / count)
            else:  # float64: part is count(column)
                count = int(part)
                acc4 = sums[m.column].get(_key(key)) if m.column else None
                if count == 0 or acc4 is None:
                    values.append(None)
                else:
                    values.append(_exact_float(acc4, 1 if m.fn == "sum" else count))
        out.append(tuple(values))
    return out


def _exact_float(acc: list[int], count: int) -> float:
    total, nan, pinf, ninf = acc
    if nan or (pinf and ninf):
        return math.nan
    if pinf:
        return math.inf
    if ninf:
        return -math.inf
    try:
        return total / (count << _SCALE)  # Python divides integers correctly rounded
    except OverflowError:  # beyond float64 (only a sum: an average is never above its largest value)
        return math.inf if total > 0 else -math.inf  # as IEEE rounds an overflow; copysign would convert the int


# --- equality --------------------------------------------------------------------------------------------------


def _canonical(v: Any) -> Any:
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v + 0.0
    return v


@dataclasses.dataclass(frozen=True)
class Difference:
    """How two answers differ: one line, and the first differing row (a group, for an aggregate) of each side."""

    detail: str
    first: dict | None = None  # of the first answer (None: it has no row there)
    second: dict | None = None


def compare(a: pa.Table, b: pa.Table, ordered: bool) -> str | None:
    """None when the answers are equal (the rule above), else one line naming the first difference."""
    d = difference(a, b, ordered)
    return None if d is None else d.detail


def difference(a: pa.Table, b: pa.Table, ordered: bool) -> Difference | None:
    """None when the answers are equal (the rule above), else the first difference (what a shadow read records)."""
    if a.schema != b.schema:
        return Difference(f"different schemas: {a.schema.to_string(show_schema_metadata=False)!r} vs {b.schema!r}")
    rows_a, rows_b = a.to_pylist(), b.to_pylist()
    left = [tuple(_canonical(v) for v in r.values()) for r in rows_a]
    right = [tuple(_canonical(v) for v in r.values()) for r in rows_b]
    if ordered:
        for i, (x, y) in enumerate(zip(left, right)):
            if x != y:
                return Difference(f"row {i} differs: {x!r} vs {y!r}", rows_a[i], rows_b[i])
        if len(left) != len(right):
            i = min(len(left), len(right))
            extra_a, extra_b = rows_a[i] if i < len(rows_a) else None, rows_b[i] if i < len(rows_b) else None
            return Difference(f"{len(left)} rows vs {len(right)}", extra_a, extra_b)
        return None
    lc, rc = collections.Counter(left), collections.Counter(right)
    if lc == rc:
        return None
    only_a, only_b = lc - rc, rc - lc
    first_a = next((r for r, k in zip(rows_a, left) if k in only_a), None)
    first_b = next((r for r, k in zip(rows_b, right) if k in only_b), None)
    return Difference(
        f"{sum(only_a.values())} row(s) only in the first answer (e.g. {next(iter(only_a), None)!r}), "
        f"{sum(only_b.values())} only in the second (e.g. {next(iter(only_b), None)!r})",
        first_a,
        first_b,
    )
