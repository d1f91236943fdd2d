"""The requests' bodies and query strings, checked before anything is read or written.

Every refusal is ``BadInput`` with one line: what was wrong and what to send instead. Names are checked
against the flag registry, ids parsed as UUIDs, columns later against the dataset's schema
(routing/projection.py): nothing a caller sends reaches SQL other than as a parameter or a checked identifier.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from typing import Any

from lakehouse_dagster.api.flags import READ, READERS, get_flag
from lakehouse_dagster.api.reads import COMPUTE_FIELDS, Query, parse_query
from lakehouse_dagster.api.sources import check_writer
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.ids import parse_uuid

MAX_LIMIT = 1_000_000_000  # above it a limit is a mistake: omit it to read every row
MAX_COLUMNS = 10_000
ORDERS = ("row_index",)

READ_EXAMPLE = (
    '{"reader": "export.stream", "dataset_id": "<uuid>", "columns": ["a"], "limit": 100, "order": "row_index"}'
)
INGEST_EXAMPLE = '{"dataset_id": "<uuid>", "writer": "sync.full"}'
FALLBACK_EXAMPLE = '{"reader": "export.stream", "dataset_id": "<uuid>", "reason": "<the Iceberg read error>"}'


@dataclasses.dataclass(frozen=True)
class ReadRequest:
    reader: str
    dataset_id: uuid.UUID
    columns: tuple[str, ...] | None
    limit: int | None
    order_by_row_index: bool
    query: Query | None = None  # a structured read (where, aggregate, addressing, order by columns): docs/reads.md


@dataclasses.dataclass(frozen=True)
class IngestRequest:
    dataset_id: uuid.UUID
    writer: str


def json_object(raw: bytes, what: str, example: str) -> dict[str, Any]:
    """The body as a JSON object, or BadInput saying what is wrong with it."""
    if not raw.strip():
        raise BadInput(f"the {what} request has no body; send a JSON object such as {example}")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadInput(f"the {what} request body is not UTF-8 text; send a JSON object such as {example}") from None
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"the {what} request body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"send a JSON object such as {example}"
        ) from None
    if not isinstance(value, dict):
        raise BadInput(f"the {what} request body is a JSON {_kind(value)}, not an object; send e.g. {example}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _no_unknown(obj: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> None:
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise BadInput(
            f"unknown field(s) {', '.join(repr(k[:100]) for k in unknown[:5])} in the {what} request; "
            f"its fields are {', '.join(allowed)}"
        )


def _string(obj: Mapping[str, Any], key: str, what: str, example: str) -> str:
    if key not in obj or obj[key] is None:
        raise BadInput(f"the {what} request needs {key!r}; send e.g. {example}")
    value = obj[key]
    if not isinstance(value, str):
        raise BadInput(f"{key!r} must be a string, got a JSON {_kind(value)}")
    return value


def _uuid(value: str) -> uuid.UUID:
    return parse_uuid(value[:100], "dataset_id")  # a UUID is at most 45 characters: the rest is not echoed back


def _short(name: str, what: str) -> str:
    if len(name) > 100:  # no reader or writer is named like that; the rest is not echoed back
        raise BadInput(f"{what} {name[:40]!r}… ({len(name)} characters) is not a known {what}")
    return name


def _reader(name: str) -> str:
    get_flag(READ, _short(name, "reader"))  # an unknown reader is refused with the known ones
    return name


def read_request(obj: Mapping[str, Any]) -> ReadRequest:
    _no_unknown(obj, ("reader", "dataset_id", "columns", "limit", "order", *COMPUTE_FIELDS), "read")
    reader = _reader(_string(obj, "reader", "read", READ_EXAMPLE))
    dataset_id = _uuid(_string(obj, "dataset_id", "read", READ_EXAMPLE))
    columns = obj.get("columns")
    if columns is not None:
        if not isinstance(columns, list) or not all(isinstance(c, str) and c for c in columns):
            raise BadInput(
                f"'columns' must be an array of column names (non-empty strings), got a JSON {_kind(columns)}"
                + (" with other values in it" if isinstance(columns, list) else "")
                + "; omit it for every column"
            )
        if len(columns) > MAX_COLUMNS:
            raise BadInput(f"'columns' names {len(columns)} columns; at most {MAX_COLUMNS} (omit it for every column)")
    limit = obj.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT):
        shown = json.dumps(limit)[:50]
        raise BadInput(f"'limit' must be a whole number from 0 to {MAX_LIMIT}, got {shown}; omit it for every row")
    order = obj.get("order")
    if any(obj.get(k) is not None for k in COMPUTE_FIELDS) or isinstance(order, list):
        # a structured read: the one declared request (routing/request.py) checks every field, one line per refusal
        query = parse_query({k: v for k, v in obj.items() if k not in ("reader", "dataset_id")})
        return ReadRequest(reader, dataset_id, tuple(columns) if columns else None, limit, order == "row_index", query)
    if order is not None and order not in ORDERS:
        raise BadInput(
            f"'order' must be {' or '.join(repr(o) for o in ORDERS)}, got {json.dumps(order)[:50]}; "
            "omit it for the engine's order"
        )
    return ReadRequest(reader, dataset_id, tuple(columns) if columns else None, limit, order == "row_index")


def ingest_request(obj: Mapping[str, Any]) -> IngestRequest:
    _no_unknown(obj, ("dataset_id", "writer"), "ingest")
    writer = _string(obj, "writer", "ingest", INGEST_EXAMPLE)
    check_writer(_short(writer, "writer"))  # unknown, or locked to pg: refused with the reason
    dataset_id = _uuid(_string(obj, "dataset_id", "ingest", INGEST_EXAMPLE))
    return IngestRequest(dataset_id, writer)


@dataclasses.dataclass(frozen=True)
class FallbackRequest:
    reader: str
    dataset_id: uuid.UUID
    reason: str


def fallback_request(obj: Mapping[str, Any]) -> FallbackRequest:
    """A fallback an app's own router took: a reader that can read Iceberg, a dataset id, the error (not empty)."""
    _no_unknown(obj, ("reader", "dataset_id", "reason"), "fallback")
    reader = _reader(_string(obj, "reader", "fallback", FALLBACK_EXAMPLE))
    flag = get_flag(READ, reader)
    if flag.ceiling == "off":
        raise BadInput(
            f"reader {reader} never reads Iceberg (its ceiling is off: {flag.ceiling_reason or 'not servable'}), "
            "so it cannot fall back to Postgres; the readers that can: "
            + ", ".join(r.name for r in READERS.values() if r.ceiling != "off")
        )
    dataset_id = _uuid(_string(obj, "dataset_id", "fallback", FALLBACK_EXAMPLE))
    reason = _string(obj, "reason", "fallback", FALLBACK_EXAMPLE).strip()
    if not reason:
        raise BadInput(f"'reason' is empty; say why the Iceberg read failed, e.g. {FALLBACK_EXAMPLE}")
    return FallbackRequest(reader, dataset_id, reason)


def query_params(params: Mapping[str, str], allowed: tuple[str, ...], required: tuple[str, ...], what: str) -> dict:
    """A GET endpoint's query string: only ``allowed`` names, ``required`` present."""
    _no_unknown(params, allowed, what)
    missing = [k for k in required if not params.get(k)]
    if missing:
        example = "&".join(f"{k}=…" for k in required)
        raise BadInput(f"{what} needs the query parameter(s) {', '.join(missing)}; e.g. ?{example}")
    return {k: params[k] for k in allowed if k in params}


def route_params(params: Mapping[str, str]) -> tuple[str, uuid.UUID]:
    got = query_params(params, ("reader", "dataset_id"), ("reader", "dataset_id"), "GET /lakehouse/route")
    return _reader(got["reader"]), _uuid(got["dataset_id"])


def flags_params(params: Mapping[str, str]) -> uuid.UUID:
    got = query_params(params, ("dataset_id",), ("dataset_id",), "GET /lakehouse/flags")
    return _uuid(got["dataset_id"])
