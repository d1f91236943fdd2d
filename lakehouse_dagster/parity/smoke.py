"""The value-level smoke check (``--smoke``): the multiset of rows matches, compared as Python values.

It is deliberately independent of the digest's canonical text: Postgres rows come typed by SQL, Iceberg
rows come through pyiceberg's own reader (not DuckDB), json is compared parsed (key order and spacing
do not matter here), floats compare as values (NaN equals NaN, -0.0 equals 0.0). So a digest mismatch
whose smoke check matches points at the text form (e.g. a native writer's json text), and a bug in the
digest cannot hide a real difference in small datasets. Only for datasets under a size threshold.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from lakehouse_dagster.tracking.datasets import Column

SMOKE_MAX_ROWS = 10_000


@dataclasses.dataclass
class SmokeResult:
    outcome: str  # match | differs | skipped
    reason: str = ""
    differing_row_indexes: list[int] = dataclasses.field(default_factory=list)


def _freeze_json(value: Any) -> Any:
    if isinstance(value, dict):
        return ("{}", tuple(sorted((k, _freeze_json(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("[]", tuple(_freeze_json(v) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float):
        return _float(value)
    return value


def _float(x: float) -> Any:
    if math.isnan(x):
        return ("float", "NaN")
    return x + 0.0  # -0.0 → 0.0


def _value(v: Any, typ: str) -> Any:
    if v is None:
        return None
    if typ == "json":
        try:
            return ("json", _freeze_json(json.loads(v)))
        except (TypeError, ValueError):
            return ("invalid json", v)
    if typ == "float64":
        return _float(float(v))
    if typ == "boolean":
        return ("bool", bool(v))
    if typ == "timestamp" and isinstance(v, dt.datetime):
        return v if v.tzinfo else v.replace(tzinfo=dt.UTC)
    return v


def normalise(row: Sequence[Any], columns: Sequence[Column]) -> tuple:
    ri, rid, created, *values = row
    out = [int(ri), None if rid is None else str(rid), _value(created, "timestamp")]
    out += [_value(v, c.type) for v, c in zip(values, columns, strict=True)]
    return tuple(out)


def iceberg_rows(pin, columns: Sequence[Column], present: set[str]) -> Iterable[tuple]:
    """Rows of the pinned snapshot through pyiceberg (absent columns as None)."""
    names = ["__row_index"] + [n for n in ("__row_id", "__created_at") if n in present]
    names += [c.name for c in columns if c.name in present]
    table = pin.table.scan(snapshot_id=pin.snapshot_id, selected_fields=tuple(names)).to_arrow()
    wanted = ["__row_index", "__row_id", "__created_at"] + [c.name for c in columns]
    data = {n: table.column(n).to_pylist() if n in names else None for n in wanted}
    for i in range(table.num_rows):
        yield tuple(None if (col := data[n]) is None else col[i] for n in wanted)


def compare(
    pg_rows: Iterable[tuple], ice_rows: Iterable[tuple], columns: Sequence[Column], *, identity: bool = True
) -> SmokeResult:
    """``identity`` False: the content columns only (a native sync.full assigns __row_id/__created_at anew and
    __row_index in the source's order), so the rows that differ are counted, not located."""
    cut = 0 if identity else 3
    left = collections.Counter(normalise(r, columns)[cut:] for r in pg_rows)
    right = collections.Counter(normalise(r, columns)[cut:] for r in ice_rows)
    if left == right:
        return SmokeResult("match", "" if identity else "content columns match (identity columns not compared)")
    if not identity:
        n = sum(((left - right) + (right - left)).values())
        return SmokeResult("differs", f"{n} row(s) differ by content (identity columns not compared)")
    differing = sorted({r[0] for r in (left - right) + (right - left)})
    return SmokeResult("differs", f"{len(differing)} row index(es) differ by value", differing[:100])
