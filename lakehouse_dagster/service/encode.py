"""The two bodies a read streams: Arrow IPC stream format (the default) and NDJSON, one record batch at a time.

Arrow: the schema message, one encapsulated message per batch (``RecordBatch.serialize``: one buffer per batch,
no Python object per value), the end-of-stream marker — what ``pyarrow.ipc.open_stream`` and apache-arrow's
``RecordBatchReader`` read. A stream cut short has no end-of-stream marker and an incomplete chunked body.

NDJSON: one JSON object per row, keys in the projection's order. Timestamps and dates as ISO 8601 text (UTC),
NaN and ±Infinity as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has no such numbers), json
columns as their JSON text (a string, as in the Arrow stream).
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pyarrow as pa

from lakehouse_dagster.core.errors import LakehouseError

ARROW_STREAM = "application/vnd.apache.arrow.stream"
NDJSON = "application/x-ndjson"
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class NotAcceptable(LakehouseError):
    """The Accept header asks for a format the read endpoint does not stream."""

    exit_code = 2
    http_status = 406


def pick_format(accept: str | None) -> str:
    """The response format an Accept header asks for: Arrow unless NDJSON is named first."""
    if not accept:
        return ARROW_STREAM
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        if media in (ARROW_STREAM, NDJSON):
            return media
        if media in ("*/*", "application/*"):
            return ARROW_STREAM
    raise NotAcceptable(
        f"Accept: {accept[:200]!r} names no format this endpoint streams; ask for {ARROW_STREAM} (the default) "
        f"or {NDJSON}"
    )


class ArrowEncoder:
    media_type = ARROW_STREAM

    def __init__(self, schema: pa.Schema):
        self.schema = schema

    def start(self) -> bytes | memoryview:
        return memoryview(self.schema.serialize())

    def batch(self, batch: pa.RecordBatch) -> bytes | memoryview:
        return memoryview(batch.serialize())

    def end(self) -> bytes | memoryview:
        return _EOS


class NdjsonEncoder:
    media_type = NDJSON

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self._convert = [_converter(f.type) for f in schema]
        self._keys = [json.dumps(f.name, ensure_ascii=False) for f in schema]

    def start(self) -> bytes | memoryview:
        return b""

    def batch(self, batch: pa.RecordBatch) -> bytes | memoryview:
        columns = [conv(col.to_pylist()) for conv, col in zip(self._convert, batch.columns)]
        lines = []
        for row in zip(*columns):
            lines.append("{" + ",".join(f"{k}:{v}" for k, v in zip(self._keys, row)) + "}\n")
        return "".join(lines).encode()

    def end(self) -> bytes | memoryview:
        return b""


def _dump(value) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _float(value) -> str:
    if value is None:
        return "null"
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return repr(float(value))


def _temporal(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        value = value.astimezone(dt.UTC)
    return '"' + value.isoformat() + '"'


def _converter(typ: pa.DataType):
    if pa.types.is_decimal(typ):  # an exact sum of int64 (decimal128(38, 0)): digits as text, as JavaScript keeps them
        return lambda values: ["null" if v is None else '"' + str(int(v)) + '"' for v in values]
    if pa.types.is_floating(typ):
        return lambda values: [_float(v) for v in values]
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        return lambda values: [_temporal(v) for v in values]
    return lambda values: [_dump(v) for v in values]


def encoder_for(media_type: str, schema: pa.Schema) -> ArrowEncoder | NdjsonEncoder:
    return ArrowEncoder(schema) if media_type == ARROW_STREAM else NdjsonEncoder(schema)
