"""The structured read request, declared once (issue 43): addressing, ``where``, ``order``, ``aggregate``.

The shapes are pydantic models (``Query``; its JSON Schema is ``Query.model_json_schema()``); ``bind`` checks one
against a dataset's schema and types every value by its column's type, exactly as the mirror types the jsonb values
(mirror/pinned_read.py): int64 a whole number within int64, float64 a number or "NaN" / "Infinity" / "-Infinity",
timestamp an ISO 8601 text (no offset: UTC, as the mirror's session reads it), date an ISO date, string / json a text
(json compares its jsonb text). No SQL text is accepted: identifiers come only from the schema, values only become
parameters. Every refusal is one ``BadInput`` line saying what was wrong and what to send.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import uuid
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.tracking.datasets import Dataset

MAX_ROW_IDS = 10_000
MAX_RANGES = 1_000
MAX_IN_VALUES = 1_000
MAX_PREDICATES = 200
MAX_GROUP_BY = 16
MAX_MEASURES = 64
MAX_LIMIT = 1_000_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
IDENTITY_TYPES = {"__row_index": "int64", "__row_id": "string", "__created_at": "timestamp"}
ROW_INDEX = "__row_index"
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Compare(_Model):
    op: Literal["eq", "ne", "lt", "le", "gt", "ge"]
    column: str
    value: Any


class InList(_Model):
    op: Literal["in"]
    column: str
    values: list[Any] = Field(min_length=1, max_length=MAX_IN_VALUES)


class NullTest(_Model):
    op: Literal["is_null", "not_null"]
    column: str


class AllOf(_Model):
    op: Literal["and", "or"]
    args: list[Predicate] = Field(min_length=1, max_length=MAX_PREDICATES)


class Negation(_Model):
    op: Literal["not"]
    arg: Predicate


Predicate = Annotated[Compare | InList | NullTest | AllOf | Negation, Field(discriminator="op")]
AllOf.model_rebuild()
Negation.model_rebuild()


class OrderKey(_Model):
    column: str
    desc: bool = False  # ascending puts nulls last, descending first (Postgres' own defaults, said on both engines)


class Measure(_Model):
    fn: Literal["count", "count_distinct", "sum", "avg", "min", "max"]
    column: str | None = None  # count without a column counts rows
    name: str | None = None  # the output column; default fn_column (count: "count")


class Aggregate(_Model):
    group_by: list[str] = Field(default_factory=list, max_length=MAX_GROUP_BY)
    measures: list[Measure] = Field(min_length=1, max_length=MAX_MEASURES)


class Query(_Model):
    """What a read asks for, beyond which reader and dataset (the service's body adds those)."""

    columns: list[str] | None = None
    limit: int | None = Field(default=None, ge=0, le=MAX_LIMIT)
    order: Literal["row_index"] | list[OrderKey] | None = None
    where: Predicate | None = None
    aggregate: Aggregate | None = None
    row_ids: list[str] | None = Field(default=None, min_length=1, max_length=MAX_ROW_IDS)
    after_row_index: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    row_index: list[Annotated[list[int], Field(min_length=2, max_length=2)]] | None = Field(
        default=None, min_length=1, max_length=MAX_RANGES
    )  # inclusive [low, high] ranges of __row_index

    @property
    def is_compute(self) -> bool:
        """Anything beyond projection + limit + row_index order (those keep the streamed read path)."""
        return any(
            v is not None for v in (self.where, self.aggregate, self.row_ids, self.after_row_index, self.row_index)
        ) or isinstance(self.order, list)


COMPUTE_FIELDS = ("where", "aggregate", "row_ids", "after_row_index", "row_index")


def json_schema_text() -> str:
    """The request's JSON Schema as docs/reads.schema.json holds it (a test fails when they drift)."""
    return json.dumps(Query.model_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def parse_query(obj: dict[str, Any]) -> Query:
    """The request's fields as a ``Query``, or one line naming the first thing wrong."""
    try:
        return Query.model_validate(obj)
    except pydantic.ValidationError as exc:
        raise BadInput(one_line(exc)) from None


def one_line(exc: pydantic.ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in _UNION_TAGS)) or "the request"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    got = repr(err.get("input"))[:60] if err["type"] not in ("missing", "extra_forbidden") else ""
    return f"{where}: {err['msg']}{' (got ' + got + ')' if got else ''}{more}; see docs/reads.md for the shapes"


_UNION_TAGS = {"eq", "ne", "lt", "le", "gt", "ge", "in", "is_null", "not_null", "and", "or", "not", "list[OrderKey]"}


# --- bound: checked against the schema, values typed ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cmp:
    op: str  # eq ne lt le gt ge in is_null not_null
    column: str
    type: str
    values: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class Logic:
    op: str  # and or not
    args: tuple[Cmp | Logic, ...]


Bound = Cmp | Logic


@dataclasses.dataclass(frozen=True)
class BoundMeasure:
    fn: str
    column: str | None
    type: str | None  # the column's type
    name: str


@dataclasses.dataclass(frozen=True)
class Plan:
    """A request checked against one dataset: what both executors run."""

    types: dict[str, str]  # every column the plan touches → its type
    columns: tuple[str, ...]  # output columns of a row read
    where: Bound | None
    row_ids: tuple[str, ...] | None
    after_row_index: int | None
    row_ranges: tuple[tuple[int, int], ...] | None
    order: tuple[tuple[str, bool], ...]  # (column, desc), ties by __row_index; () = engine's order
    limit: int | None
    group_by: tuple[str, ...] = ()
    measures: tuple[BoundMeasure, ...] = ()
    is_aggregate: bool = False

    @property
    def ordered(self) -> bool:
        return self.is_aggregate or bool(self.order)

    @property
    def output(self) -> tuple[str, ...]:
        return (*self.group_by, *(m.name for m in self.measures)) if self.is_aggregate else self.columns


def bind(query: Query, dataset: Dataset) -> Plan:  # noqa: C901
    """Check ``query`` against the dataset's schema; refuse what no engine can answer exactly.
    Complex on purpose: each refusal of the query beside the clause it checks."""
    types = dict(IDENTITY_TYPES) | {c.name: c.type for c in dataset.columns}
    known = ", ".join(types)

    def col(name: str, what: str) -> str:
        if name not in types:
            shown = name if len(name) <= 100 else name[:40] + "…"
            raise BadInput(f"{what}: unknown column {shown!r} in dataset {dataset.id}; its columns are {known}")
        return name

    where = _bind_pred(query.where, types, col, "where") if query.where is not None else None
    row_ids = None
    if query.row_ids is not None:
        try:
            row_ids = tuple(dict.fromkeys(str(uuid.UUID(r)) for r in query.row_ids))
        except ValueError:
            bad = next(r for r in query.row_ids if not _is_uuid(r))
            raise BadInput(f"row_ids: {bad[:60]!r} is not a row id (a uuid, as __row_id holds)") from None
    ranges = None
    if query.row_index is not None:
        for lo, hi in query.row_index:
            if lo > hi:
                raise BadInput(f"row_index: the range [{lo}, {hi}] is empty; give [low, high] with low <= high")
        ranges = tuple((lo, hi) for lo, hi in query.row_index)
    order: tuple[tuple[str, bool], ...] = ()
    if query.order == "row_index":
        order = ((ROW_INDEX, False),)
    elif isinstance(query.order, list):
        order = tuple((col(k.column, "order"), k.desc) for k in query.order)
    if query.after_row_index is not None and order not in ((), ((ROW_INDEX, False),)):
        raise BadInput("after_row_index pages in __row_index order: drop 'order' or make it \"row_index\"")
    if query.after_row_index is not None:
        order = ((ROW_INDEX, False),)
    if query.aggregate is None:
        columns = tuple(dict.fromkeys(col(c, "columns") for c in query.columns)) if query.columns else tuple(types)
        if query.limit is not None and not order:
            order = ((ROW_INDEX, False),)  # a limit alone would let the two engines pick different rows
        return Plan(types, columns, where, row_ids, query.after_row_index, ranges, order, query.limit)
    if query.columns:
        raise BadInput("columns and aggregate do not mix: an aggregate returns its group_by columns and measures")
    if query.order is not None or query.after_row_index is not None:
        raise BadInput("an aggregate's results are ordered by its group_by columns: drop 'order' / 'after_row_index'")
    group_by = tuple(col(g, "aggregate.group_by") for g in query.aggregate.group_by)
    if len(set(group_by)) != len(group_by):
        raise BadInput("aggregate.group_by names a column twice")
    measures = tuple(_bind_measure(m, types, col) for m in query.aggregate.measures)
    names = list(group_by) + [m.name for m in measures]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise BadInput(f"aggregate: the output column {dup!r} appears twice; give the measures distinct names")
    return Plan(types, (), where, row_ids, None, ranges, (), query.limit, group_by, measures, True)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
        return True
    except ValueError:
        return False


_NUMERIC = ("int64", "float64")


def _bind_measure(m: Measure, types: dict[str, str], col) -> BoundMeasure:
    if m.column is None:
        if m.fn != "count":
            raise BadInput(f"aggregate: {m.fn} needs a column")
        return BoundMeasure("count", None, None, m.name or "count")
    name = col(m.column, f"aggregate.{m.fn}")
    typ = types[name]
    if m.fn in ("sum", "avg") and typ not in _NUMERIC:
        raise BadInput(f"aggregate: {m.fn} of {name!r} ({typ}) is not defined; {m.fn} takes int64 or float64 columns")
    return BoundMeasure(m.fn, name, typ, m.name or f"{m.fn}_{name}")


def _bind_pred(p: Any, types: dict[str, str], col, path: str) -> Bound:
    if isinstance(p, AllOf):
        return Logic(p.op, tuple(_bind_pred(a, types, col, f"{path}.{p.op}") for a in p.args))
    if isinstance(p, Negation):
        return Logic("not", (_bind_pred(p.arg, types, col, f"{path}.not"),))
    name = col(p.column, path)
    typ = types[name]
    if isinstance(p, NullTest):
        return Cmp(p.op, name, typ)
    raw = p.values if isinstance(p, InList) else [p.value]
    return Cmp(p.op, name, typ, tuple(typed_value(v, typ, f"{path}.{p.op} {name!r}") for v in raw))


def typed_value(v: Any, typ: str, what: str) -> Any:
    """A JSON value as the Python value of a column type (as the mirror would type it), or one line saying why not."""
    if v is None:
        raise BadInput(f"{what}: null is not a value to compare with; use is_null / not_null")
    if typ == "int64":
        if isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX:
            return v
        raise BadInput(f"{what}: {_shown(v)} is not an int64 (a whole number from {INT64_MIN} to {INT64_MAX})")
    if typ == "float64":
        if isinstance(v, int | float) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, str) and v in _FLOAT_WORDS:
            return _FLOAT_WORDS[v]
        raise BadInput(f'{what}: {_shown(v)} is not a float64 (a number, or "NaN", "Infinity", "-Infinity")')
    if typ == "boolean":
        if isinstance(v, bool):
            return v
        raise BadInput(f"{what}: {_shown(v)} is not a boolean (true or false)")
    if not isinstance(v, str):
        raise BadInput(f"{what}: {_shown(v)} is not a {typ} (send it as a JSON string)")
    if typ in ("string", "json"):
        if "\x00" in v:
            raise BadInput(f"{what}: a text with a NUL character matches nothing Postgres can hold")
        return v
    try:
        if typ == "date":
            return dt.date.fromisoformat(v)
        ts = dt.datetime.fromisoformat(v)
    except ValueError:
        raise BadInput(f"{what}: {_shown(v)} is not an ISO 8601 {typ} (e.g. 2024-03-10T12:34:56+02:00)") from None
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def _shown(v: Any) -> str:
    return repr(v)[:60]


def referenced(plan: Plan) -> tuple[str, ...]:
    """Every column the plan reads, __row_index first (addressing, ties, pruning)."""
    names: list[str] = [ROW_INDEX]
    if plan.row_ids is not None:
        names.append("__row_id")

    def walk(p: Bound | None) -> None:
        if isinstance(p, Cmp):
            names.append(p.column)
        elif isinstance(p, Logic):
            for a in p.args:
                walk(a)

    walk(plan.where)
    names += list(plan.columns) + [c for c, _ in plan.order] + list(plan.group_by)
    names += [m.column for m in plan.measures if m.column is not None]
    return tuple(dict.fromkeys(names))
