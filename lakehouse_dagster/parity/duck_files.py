"""DuckDB over Iceberg data files with columns found by field id (lake/parquet_ids.py's rule, in SQL).

``read_parquet(files, union_by_name = true)`` finds columns by Parquet name: a column another engine wrote under a
sanitised name (Iceberg-Java and pyiceberg write ``col with space ü`` as ``col_x20with_x20space_x20ü``, same field
id) reads as NULL and the digest says a false MISMATCH. DuckDB's ``read_parquet(..., schema = MAP {field_id:
{name, type, default_value}})`` reads by field id instead, a field id a file lacks as the default (NULL, as Iceberg
reads a column added later). A file with no field id at all is read by name, as before, and the two kinds are
united by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

_DUCK_TYPES: dict[type, str] = {
    LongType: "BIGINT",
    IntegerType: "INTEGER",
    StringType: "VARCHAR",
    DoubleType: "DOUBLE",
    FloatType: "FLOAT",
    BooleanType: "BOOLEAN",
    TimestamptzType: "TIMESTAMPTZ",
    TimestampType: "TIMESTAMP",
    DateType: "DATE",
    BinaryType: "BLOB",
    UUIDType: "UUID",
}


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclasses.dataclass(frozen=True)
class FileSource:
    """A DuckDB FROM item over some data files, its parameters, and which wanted columns some file holds."""

    sql: str
    params: dict
    present: frozenset[str]


def file_source(
    con, paths: Sequence[str], fields: Mapping[str, tuple[int | None, IcebergType]], param: str
) -> FileSource:
    """The FROM item reading ``paths`` (local Parquet files) with ``fields`` (Iceberg name → (field id, type)) found
    by field id; ``param`` names its parameters (``$<param>_ids``, ``$<param>_names``). One metadata read of
    every file (``parquet_schema``), as the by-name reader already did to learn the files' columns. A field
    without an id (a pin built without the table's schema) makes every file read by name."""
    rows = con.execute("select file_name, name, field_id from parquet_schema($p)", {"p": list(paths)}).fetchall()
    known = all(fid is not None for fid, _ in fields.values())
    with_ids = {f for f, _, fid in rows if fid is not None} if known else set()
    by_id = [p for p in paths if p in with_ids]
    by_name = [p for p in paths if p not in with_ids]
    ids_in_files = {int(fid) for f, _, fid in rows if fid is not None}
    names_in_files = {name for f, name, _ in rows if f not in with_ids}
    typed = {n: (fid, _DUCK_TYPES.get(type(t))) for n, (fid, t) in fields.items()}
    present = {n for n, (fid, duck) in typed.items() if by_id and fid in ids_in_files and duck is not None}
    present |= {n for n in fields if by_name and n in names_in_files}
    parts, params = [], {}
    if by_id:
        schema = ", ".join(
            f"{fid}: {{name: {_literal(n)}, type: {_literal(duck)}, default_value: NULL}}"
            for n, (fid, duck) in typed.items()
            if duck is not None
        )
        parts.append(f"read_parquet(${param}_ids, schema = MAP {{{schema}}})")
        params[f"{param}_ids"] = by_id
    if by_name:
        parts.append(f"read_parquet(${param}_names, union_by_name = true)")
        params[f"{param}_names"] = by_name
    sql = parts[0] if len(parts) == 1 else f"(select * from {parts[0]} union all by name select * from {parts[1]})"
    return FileSource(sql, params, frozenset(present))
