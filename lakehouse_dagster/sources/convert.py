"""Source values → the dataset's declared column types, with the mirror's strictness.

Both write paths take their values from here, so the pg path (typed values → jsonb → the mirror's typed
projection) and the native path (typed values → Parquet) store the same thing. A value that does not fit
raises BadValue with the row (within the batch), the column, the expected type and what was found — never
the value itself.

Three kinds of input:
  typed Arrow (Parquet files, a Postgres source): the Arrow type must fit the declared type;
  text (CSV cells): parsed as the declared type; an empty unquoted cell is a null;
  JSON values (NDJSON lines): the JSON type must fit exactly as in the mirror (a JSON string in an int64
  column fails; float64 also accepts "NaN", "Infinity", "-Infinity"; a JSON null is a null).
json columns hold Postgres' jsonb text form of the value (jsonb_text), the form the mirror writes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
from collections.abc import Sequence
from json.encoder import encode_basestring
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_dagster.lake.schema import arrow_type
from lakehouse_dagster.sources.errors import BadValue
from lakehouse_dagster.tracking.datasets import Column

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT_TEXT = r"^[+-]?[0-9]+$"
_FLOAT_TEXT = r"^([+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|NaN|Infinity|-Infinity)$"
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def target_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns])


# --- jsonb text form ------------------------------------------------------------------------------------


def _jsonb_key(key: str) -> tuple[int, bytes]:
    b = key.encode("utf-8")
    return (len(b), b)  # jsonb orders object keys by length, then bytewise


class _Num(str):
    """A JSON number with a fraction or exponent, kept as its text (numeric keeps the input's digits)."""

    __slots__ = ()


def _numeric_text(raw: str) -> str:
    """What Postgres' numeric prints for a JSON number's text: the digits as written, an exponent applied
    (1.5e1 → 15, 1e-2 → 0.01), and no negative zero."""
    text = raw if "e" not in raw and "E" not in raw else format(decimal.Decimal(raw), "f")
    if text.startswith("-") and not text.strip("-0."):
        return text[1:]
    return text


def _render(value: Any, out: list[str]) -> None:  # noqa: C901
    """Complex on purpose: one branch per JSON value type, a flat dispatch."""
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is _Num:
        out.append(_numeric_text(value))
    elif isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a string holding \\u0000 (Postgres jsonb cannot store it)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holding a lone surrogate (not valid Unicode)") from None
        out.append(encode_basestring(value))  # json.dumps(value, ensure_ascii=False), without an encoder per call
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise ValueError("a non-finite number (JSON has no NaN/Infinity)")
        text = format(value, "f")  # numeric's text: the input's scale, exponent applied
        out.append(text[1:] if text.startswith("-") and not value else text)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a non-finite number (JSON has no NaN/Infinity)")
        _render(decimal.Decimal(repr(value)), out)
    elif isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value, key=_jsonb_key)):
            if i:
                out.append(", ")
            _render(str(key), out)
            out.append(": ")
            _render(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(", ")
            _render(item, out)
        out.append("]")
    elif isinstance(value, (dt.datetime, dt.date)):
        _render(value.isoformat(), out)
    elif isinstance(value, bytes):
        raise ValueError("binary data (not JSON)")
    else:
        _render(str(value), out)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> Any:
    """JSON text → Python; numbers with a fraction or exponent stay text (_Num) so their jsonb form is exact."""
    return json.loads(text, parse_float=_Num, parse_constant=_reject_constant)


def jsonb_text_of(value: Any) -> str | None:
    """A parsed JSON value in Postgres' jsonb text form (keys by length then bytes, ", " and ": ",
    numbers as numeric prints them); a JSON null is None (a null, as in the mirror)."""
    if value is None:
        return None
    out: list[str] = []
    _render(value, out)
    return "".join(out)


def jsonb_text(text: str) -> str | None:
    return jsonb_text_of(loads(text))


# --- typed Arrow and text -------------------------------------------------------------------------------


def _first_true(mask: pa.Array) -> int:
    found = pc.index(mask.fill_null(False), True).as_py()
    return 0 if found is None or found < 0 else found


def _first_valid(arr: pa.Array) -> int:
    return _first_true(pc.is_valid(arr))


def _type_name(t: pa.DataType) -> str:
    return f"a {t} value"


def _check_text(arr: pa.Array, col: Column, pattern: str, what: str) -> None:
    ok = pc.match_substring_regex(arr, pattern)
    bad = pc.and_(pc.is_valid(arr), pc.invert(ok.fill_null(True)))
    if pc.any(bad).as_py():
        raise BadValue(_first_true(bad), col.name, col.type, what)


def _parse_each(arr: pa.Array, col: Column, parse, target: pa.DataType) -> pa.Array:
    """Per-value fallback for text the vectorised cast refuses: finds the row that does not parse."""
    values: list = []
    for i, s in enumerate(arr.to_pylist()):
        if s is None:
            values.append(None)
            continue
        try:
            values.append(parse(s.strip()))
        except (ValueError, OverflowError):
            raise BadValue(i, col.name, col.type, "text that does not parse as one") from None
    return pa.array(values, type=target)


def _timestamp(s: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(s)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def _text_to(arr: pa.Array, col: Column) -> pa.Array:
    target = arrow_type(col.type)
    if col.type == "string":
        return arr.cast(pa.string())
    if col.type == "json":
        return json_column(arr, col)
    if col.type == "int64":
        _check_text(arr, col, _INT_TEXT, "text that is not an integer")
        return _parse_each(arr, col, _int64, target) if not _fits_cast(arr, target) else arr.cast(target)
    if col.type == "float64":
        _check_text(arr, col, _FLOAT_TEXT, "text that is not a number")
        return arr.cast(target)
    if col.type == "boolean":
        lower = pc.utf8_lower(arr)
        _check_text(lower, col, r"^(true|false)$", "text that is not true or false")
        return pc.equal(lower, "true")
    if col.type == "date":
        return arr.cast(target) if _fits_cast(arr, target) else _parse_each(arr, col, dt.date.fromisoformat, target)
    # timestamp
    return arr.cast(target) if _fits_cast(arr, target) else _parse_each(arr, col, _timestamp, target)


def _fits_cast(arr: pa.Array, target: pa.DataType) -> bool:
    try:
        arr.cast(target)
        return True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False


def _int64(s: str) -> int:
    v = int(s)
    if not INT64_MIN <= v <= INT64_MAX:
        raise OverflowError
    return v


def json_column(arr: pa.Array, col: Column) -> pa.Array:
    """Any Arrow column → jsonb text. Strings are JSON text; other types are their JSON value. Distinct values
    are rendered once per batch (JSON columns repeat a lot), so the cost follows the distinct count."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    is_text = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
    if not is_text:
        return _jsonb_texts(arr.to_pylist(), col)
    encoded = pc.dictionary_encode(arr)
    uniques = encoded.dictionary.to_pylist()
    rendered = []
    for u in uniques:
        try:
            rendered.append(jsonb_text(u))
        except (ValueError, RecursionError) as exc:
            index = _first_true(pc.equal(arr, u))
            why = "text that is not valid JSON" if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise BadValue(index, col.name, col.type, why) from None
    return pc.take(pa.array(rendered, type=pa.string()), encoded.indices)


def _typed_to(arr: pa.Array, col: Column) -> pa.Array:
    t = arr.type
    target = arrow_type(col.type)
    if pa.types.is_dictionary(t):
        return _typed_to(arr.dictionary_decode(), col)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), target)
    if col.type == "json":
        return json_column(arr, col)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if col.type == "string":
            return arr.cast(pa.string())
        if col.type in ("timestamp", "date"):  # ISO text is how timestamps and dates travel in JSON too
            return _text_to(arr.cast(pa.string()), col)
        raise BadValue(_first_valid(arr), col.name, col.type, "a string")
    ok = {
        "string": False,
        "int64": pa.types.is_integer(t) or (pa.types.is_decimal(t) and t.scale == 0),
        "float64": pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t),
        "boolean": pa.types.is_boolean(t),
        "timestamp": pa.types.is_timestamp(t) or pa.types.is_date(t),
        "date": pa.types.is_date(t),
    }[col.type]
    if not ok:
        raise BadValue(_first_valid(arr), col.name, col.type, _type_name(t))
    if col.type == "timestamp":
        if pa.types.is_timestamp(t) and t.tz is None:
            arr = pc.assume_timezone(arr, "UTC")
        return arr.cast(target, safe=False)
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, OverflowError):  # an unsigned or decimal value beyond int64
        for i, v in enumerate(arr.to_pylist()):
            if v is not None and not INT64_MIN <= int(v) <= INT64_MAX:
                raise BadValue(i, col.name, col.type, "a number out of the int64 range") from None
        raise


# --- JSON values (NDJSON) -------------------------------------------------------------------------------

_JSON_TYPE = {bool: "boolean", str: "string", dict: "object", list: "array", type(None): "null"}


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, _Num, decimal.Decimal, float)):
        return "number"
    return _JSON_TYPE.get(type(v), type(v).__name__)


def _jsonb_texts(values: list, col: Column) -> pa.Array:
    """Python values → Postgres' jsonb text form, one per value; a value JSON cannot hold is a BadValue."""
    out = []
    for i, v in enumerate(values):
        try:
            out.append(jsonb_text_of(v))
        except ValueError as exc:
            raise BadValue(i, col.name, col.type, str(exc)) from None
    return pa.array(out, type=pa.string())


def _json_values_to(values: list, col: Column) -> pa.Array:
    if col.type == "json":
        return _jsonb_texts(values, col)
    out: list = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        kind = _json_type(v)
        if col.type in ("string", "timestamp", "date") and kind == "string":
            out.append(v)
        elif col.type == "boolean" and kind == "boolean":
            out.append(v)
        elif col.type == "int64" and kind == "number":
            if isinstance(v, int) and INT64_MIN <= v <= INT64_MAX:
                out.append(v)
            else:
                raise BadValue(i, col.name, col.type, "a JSON number that does not convert")
        elif col.type == "float64" and (kind == "number" or (kind == "string" and v in _SPECIAL_FLOATS)):
            out.append(_SPECIAL_FLOATS[v] if kind == "string" else float(v))
        else:
            raise BadValue(i, col.name, col.type, f"a JSON {kind}")
    if col.type in ("timestamp", "date"):
        return _text_to(pa.array(out, type=pa.string()), col)
    return pa.array(out, type=arrow_type(col.type))


# --- batches --------------------------------------------------------------------------------------------


def convert_batch(source: pa.RecordBatch, columns: Sequence[Column], *, text: bool = False) -> pa.RecordBatch:
    """A source batch → a batch of exactly the dataset's columns, typed. A column the source lacks is null
    (a missing key is a null in the mirror too); source columns the dataset does not declare are ignored."""
    arrays = []
    names = source.schema.names
    for col in columns:
        if col.name not in names:
            arrays.append(pa.nulls(source.num_rows, arrow_type(col.type)))
            continue
        arr = source.column(col.name)
        if isinstance(arr.type, pa.ExtensionType) or isinstance(arr, pa.ExtensionArray):
            arr = arr.storage  # e.g. ADBC's opaque numeric/jsonb: their text form
        arrays.append(
            _text_to(arr.cast(pa.string()), col) if text and pa.types.is_string(arr.type) else _typed_to(arr, col)
        )
    return pa.RecordBatch.from_arrays(arrays, schema=target_schema(columns))


def convert_records(records: list[dict], columns: Sequence[Column]) -> pa.RecordBatch:
    """Parsed JSON objects (NDJSON lines) → a typed batch; a key the object lacks is a null."""
    arrays = [_json_values_to([r.get(c.name) for r in records], c) for c in columns]
    return pa.RecordBatch.from_arrays(arrays, schema=target_schema(columns))
