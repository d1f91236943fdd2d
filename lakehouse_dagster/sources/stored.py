"""A dataset's source as stored in ``datasets.source``: set (validated against the dataset and the source
itself, nothing written on refusal) and get."""

from __future__ import annotations

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.core.settings import S3Settings, Settings
from lakehouse_dagster.sources.files import check_location, filesystem
from lakehouse_dagster.sources.pgsource import relation, source_columns, where_label
from lakehouse_dagster.sources.spec import SourceSpec, parse_source, stored_source
from lakehouse_dagster.tracking.datasets import Dataset, get_dataset, lookup, stamps


def get_source(conn: psycopg.Connection, dataset_id) -> SourceSpec | None:
    d = get_dataset(conn, dataset_id)
    raw = lookup.stored_source(
        conn, d.id, NotFound(f"dataset {d.id} does not exist (deleted while its source was read)")
    )
    return stored_source(raw)


def set_source(
    conn: psycopg.Connection, dataset_id, spec_dict: dict, *, settings: Settings | None = None
) -> SourceSpec:
    """Validate ``spec_dict`` against the dataset and what it points at, then store it."""
    spec = parse_source(spec_dict)
    d = get_dataset(conn, dataset_id)
    if d.kind != "tabular":
        raise BadInput(f"dataset {d.id} is a {d.kind} dataset; only tabular datasets take a source")
    if not d.columns:
        raise BadInput(f"dataset {d.id} declares no columns; set its schema before its source")
    if spec.type == "files":
        _check_files(spec, d, (settings or Settings.from_env()).s3)
    else:
        _check_postgres(conn, spec, d)
    stamps.store_source(conn, d.id, spec.to_json())
    return spec


def _check_files(spec: SourceSpec, d: Dataset, s3: S3Settings) -> None:

    files = check_location(spec, s3)
    if files and spec.format == "parquet":
        fs, _ = filesystem(spec.need("uri"), s3)
        try:
            names = set(pq.ParquetFile(fs.open_input_file(files[0].path)).schema_arrow.names)
        except Exception as exc:
            raise BadInput(f"files source {spec.uri}: {files[0].uri} is not a readable Parquet file ({exc})") from None
        if not names & {c.name for c in d.columns}:
            raise BadInput(
                f"files source {spec.uri}: {files[0].uri} has none of dataset {d.id}'s columns "
                f"({', '.join(c.name for c in d.columns)})"
            )


def _check_postgres(conn: psycopg.Connection, spec: SourceSpec, d: Dataset) -> None:

    if spec.dsn_env:
        names = source_columns(spec, spec.dsn(""))
    else:  # the project's own Postgres: look through this connection (its DSN may hold a password we lack)
        try:
            with conn.transaction():
                cur = conn.execute(sql.SQL("select * from {} limit 0").format(_relation(spec)))
                names = [c.name for c in cur.description or ()]
        except psycopg.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadInput(f"{where_label(spec)}: cannot read it ({first})") from None
    for key in ("cursor_column", "position_column", "op_column"):
        col = getattr(spec, key)
        if col and col not in names:
            raise BadInput(
                f"{where_label(spec)} has no column {col!r} (the {key.replace('_', ' ')}); it has {', '.join(names)}"
            )
    missing = [c.name for c in d.columns if c.name not in names]
    if missing:
        raise BadInput(
            f"{where_label(spec)} lacks dataset {d.id}'s column(s) {', '.join(missing)}; "
            "select them (alias in a query) or change the dataset's schema"
        )
    if spec.type == "cdc":
        declared = {c.name for c in d.columns}
        for col in (spec.op_column, spec.position_column):
            if col not in declared:
                raise BadInput(
                    f"cdc source: column {col!r} must be one of dataset {d.id}'s columns "
                    "(the operation and position are stored with each change row)"
                )


def _relation(spec: SourceSpec):

    return relation(spec)
