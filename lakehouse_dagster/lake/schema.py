"""Dataset schema → Iceberg schema and Arrow schema, with the identity columns.

Type contract (the parity digest relies on it):
  string → string, int64 → long, float64 → double, boolean → boolean,
  timestamp → timestamptz (microseconds, UTC), date → date,
  json → string holding Postgres' jsonb text form of the value (one normal form: keys sorted, ", " / ": ").
A JSON null (or a missing key) is a null in every column type.
Identity columns come first: __row_index long (required), __row_id string (uuid text), __created_at timestamptz.
The dataset's column types are kept in the table property ``lakehouse.columns`` (json columns are strings).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    IcebergType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

from lakehouse_dagster.tracking.datasets import Column

COLUMNS_PROPERTY = "lakehouse.columns"

_ICEBERG: dict[str, IcebergType] = {
    "string": StringType(),
    "int64": LongType(),
    "float64": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": TimestamptzType(),
    "date": DateType(),
    "json": StringType(),
}

_ARROW: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "json": pa.string(),
}

# The identity columns in the dataset schema's own type names, with what each holds (Dagster's column schema).
IDENTITY_COLUMNS = (
    Column("__row_index", "int64"),
    Column("__row_id", "string"),
    Column("__created_at", "timestamp"),
)
IDENTITY_DESCRIPTIONS = {
    "__row_index": "identity: the row's position in the dataset, never null",
    "__row_id": "identity: the row's uuid",
    "__created_at": "identity: when the row was first written",
}

IDENTITY_ARROW = [
    pa.field("__row_index", pa.int64(), nullable=False),
    pa.field("__row_id", pa.string()),
    pa.field("__created_at", pa.timestamp("us", tz="UTC")),
]


def iceberg_type(column_type: str) -> IcebergType:
    return _ICEBERG[column_type]


def arrow_type(column_type: str) -> pa.DataType:
    return _ARROW[column_type]


def iceberg_schema(columns: Sequence[Column]) -> Schema:
    fields = [
        NestedField(1, "__row_index", LongType(), required=True),
        NestedField(2, "__row_id", StringType(), required=False),
        NestedField(3, "__created_at", TimestamptzType(), required=False),
    ]
    for i, col in enumerate(columns):
        fields.append(NestedField(4 + i, col.name, _ICEBERG[col.type], required=False))
    return Schema(*fields)


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    return pa.schema(IDENTITY_ARROW + [pa.field(c.name, _ARROW[c.type]) for c in columns])


def columns_property(columns: Iterable[Column]) -> str:
    return json.dumps([{"name": c.name, "type": c.type} for c in columns], separators=(",", ":"))
