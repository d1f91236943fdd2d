"""Which column of a Parquet data file holds which Iceberg column: by field id, never by Parquet name.

Iceberg identifies a column by its field id; the Parquet name is only a label, and writers differ on it:
Iceberg-Java and pyiceberg 0.12 both write ``col with space ü`` as ``col_x20with_x20space_x20ü`` (Avro-compatible
names) under the same field id (seen in both engines' files). A reader that finds columns by name reads such a column as NULL
after another engine rewrote the file. Every reader of data files that does not go through pyiceberg's scan (the
compaction and copy-back reader, the service's file reader, the digests in parity/) maps through here. A file that
carries no field id at all (added to a table from outside, read through a name mapping) is read by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

FIELD_ID = b"PARQUET:field_id"


def parquet_ids(schema: pa.Schema) -> dict[int, str]:
    """Field id → Parquet name of a file's top-level columns (empty when the file carries no ids)."""
    out = {}
    for field in schema:
        raw = (field.metadata or {}).get(FIELD_ID)
        if raw is not None:
            out[int(raw)] = field.name
    return out


def columns_in_file(schema: pa.Schema, wanted: Mapping[str, int | None]) -> dict[str, str | None]:
    """For each wanted Iceberg column (name → field id), the file's column that holds it, or None when the file
    has none (a column added after the file was written: NULL, as Iceberg reads it). By field id; by name only
    when the file carries no field id at all (or the caller knows no id for the column)."""
    by_id = parquet_ids(schema)
    names = set(schema.names)
    return {
        name: by_id.get(fid) if by_id and fid is not None else (name if name in names else None)
        for name, fid in wanted.items()
    }
