"""A dataset's source: what its writers ingest from, stored as JSON in ``datasets.source``.

  {"type": "files",    "uri": "<path | glob | s3://bucket/prefix/*.parquet>", "format": "parquet|csv|ndjson"}
  {"type": "postgres", "table": "schema.table" | "query": "select ...", "cursor_column": "<col>|null", "dsn_env": "<VAR>|null"}
  {"type": "cdc",      "table": "schema.table", "position_column": "<col>", "op_column": "<col>", "dsn_env": "<VAR>|null"}

``dsn_env`` names an environment variable holding the source's DSN (null: the project's own Postgres); the
DSN itself is never stored, printed or logged. Other ``type`` values (the demo's legacy ``demo``) mean
"no source".
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Literal, overload

from lakehouse_dagster.core.errors import BadInput

FORMATS = ("parquet", "csv", "ndjson")
TYPES = ("files", "postgres", "cdc")
WRITERS = ("sync.full", "sync.append", "sync.incremental", "cdc.append")  # the source writers (sources/writers.py)
_EXTENSIONS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".ndjson": "ndjson", ".jsonl": "ndjson"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEYS = {
    "files": {"type", "uri", "format"},
    "postgres": {"type", "table", "query", "cursor_column", "dsn_env"},
    "cdc": {"type", "table", "position_column", "op_column", "dsn_env"},
}


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    type: str
    uri: str | None = None
    format: str | None = None
    table: str | None = None
    query: str | None = None
    cursor_column: str | None = None
    position_column: str | None = None
    op_column: str | None = None
    dsn_env: str | None = None

    def need(self, field: str) -> str:
        """A field this source's type always has (``uri`` of a files source, ``table`` or ``query``, the order
        column of an incremental one): parse_source checks them, so only a spec built another way lacks one."""
        value = getattr(self, field)
        if not value:
            raise BadInput(
                f"this {self.type} source has no {field.replace('_', ' ')}; set it again with `lakehouse sources set`"
            )
        return value

    @property
    def default_writer(self) -> str:
        if self.type == "files":
            return "sync.append"
        if self.type == "cdc":
            return "cdc.append"
        return "sync.incremental" if self.cursor_column else "sync.full"

    @property
    def writers(self) -> tuple[str, ...]:
        """The writers this source can feed (sync.full re-reads everything, so every source has it)."""
        if self.type == "files":
            return ("sync.full", "sync.append")
        if self.type == "cdc":
            return ("sync.full", "cdc.append")
        return ("sync.full", "sync.append", "sync.incremental") if self.cursor_column else ("sync.full",)

    @property
    def order_column(self) -> str | None:
        """The column whose stored high-water mark makes reads resumable (cursor or CDC position)."""
        return self.position_column if self.type == "cdc" else self.cursor_column

    def describe(self) -> str:
        if self.type == "files":
            return f"files {self.uri} ({self.format})"
        where = f"table {self.table}" if self.table else "query"
        extra = f", cursor {self.cursor_column}" if self.cursor_column else ""
        if self.type == "cdc":
            extra = f", position {self.position_column}, op {self.op_column}"
        dsn = f", DSN from ${self.dsn_env}" if self.dsn_env else ""
        return f"{self.type} {where}{extra}{dsn}"

    def to_json(self) -> dict:
        if self.type == "files":
            return {"type": "files", "uri": self.uri, "format": self.format}
        if self.type == "postgres":
            out: dict[str, str | None] = {"type": "postgres"}
            out.update({"table": self.table} if self.table else {"query": self.query})
            return {**out, "cursor_column": self.cursor_column, "dsn_env": self.dsn_env}
        return {
            "type": "cdc",
            "table": self.table,
            "position_column": self.position_column,
            "op_column": self.op_column,
            "dsn_env": self.dsn_env,
        }

    def dsn(self, project_dsn: str) -> str:
        """The source's DSN: the named variable's value, or the project's own Postgres."""
        if not self.dsn_env:
            return project_dsn
        value = os.environ.get(self.dsn_env)
        if not value:
            raise BadInput(
                f"source DSN variable {self.dsn_env} is not set in this environment; export it "
                "(the DSN itself is never stored) or set the source with another --dsn-env"
            )
        return value


@overload
def _str(raw: dict, key: str, what: str, *, required: Literal[True] = True) -> str: ...
@overload
def _str(raw: dict, key: str, what: str, *, required: bool) -> str | None: ...
def _str(raw: dict, key: str, what: str, *, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None or (isinstance(value, str) and not value.strip() and not required):
        if required:
            raise BadInput(f"source: {what} ({key!r}) is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"source: {key} must be a non-empty string")
    return value.strip()


def _ident(raw: dict, key: str, *, required: bool) -> str | None:
    value = _str(raw, key, f"the {key.replace('_', ' ')}", required=required)
    if value is not None and not _IDENT.match(value):
        raise BadInput(f"source: {key} {value!r} is not a plain column name (letters, digits, _)")
    return value


def _table(raw: dict) -> str:
    value = _str(raw, "table", "the table, as schema.table")
    if not _TABLE.match(value):
        raise BadInput(f"source: table {value!r} must be schema.table or table (letters, digits, _)")
    return value


def _dsn_env(raw: dict) -> str | None:
    value = raw.get("dsn_env")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _ENV.match(value):
        raise BadInput("source: dsn_env must name an environment variable (letters, digits, _), not hold a DSN")
    return value


def infer_format(uri: str) -> str | None:
    for ext, fmt in _EXTENSIONS.items():
        if uri.lower().rstrip("/").endswith(ext):
            return fmt
    return None


def parse_source(raw: dict) -> SourceSpec:
    """Validate a source spec's shape (not what it points at: see set_source); BadInput with one reason."""
    if not isinstance(raw, dict):
        raise BadInput(f"source must be a JSON object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in TYPES:
        raise BadInput(f"source type {kind!r} is not supported; use one of {', '.join(TYPES)}")
    unknown = sorted(set(raw) - _KEYS[kind])
    if unknown:
        raise BadInput(
            f"source: unknown key(s) {', '.join(unknown)} for a {kind} source "
            f"(allowed: {', '.join(sorted(_KEYS[kind]))})"
        )
    if kind == "files":
        uri = _str(raw, "uri", "the file path, glob or s3:// URI")
        if "://" in uri and not uri.startswith("s3://"):
            raise BadInput(f"source: uri {uri!r}: only local paths, globs and s3:// URIs are supported")
        if uri.startswith("s3://") and not uri[5:].split("/", 1)[0]:
            raise BadInput(f"source: uri {uri!r} names no bucket (s3://bucket/prefix/...)")
        fmt = raw.get("format") or infer_format(uri)
        if fmt not in FORMATS:
            raise BadInput(
                f"source: format {fmt!r} is not one of {', '.join(FORMATS)} "
                "(give --format when the extension does not say)"
            )
        return SourceSpec("files", uri=uri, format=fmt)
    dsn_env = _dsn_env(raw)
    if kind == "postgres":
        has_table, has_query = raw.get("table") is not None, raw.get("query") is not None
        if has_table == has_query:
            raise BadInput("source: a postgres source needs exactly one of table or query")
        query = None
        if has_query:
            query = _str(raw, "query", "the query")
            if not re.match(r"^\s*(select|with|values|table)\b", query, re.I) or ";" in query.rstrip().rstrip(";"):
                raise BadInput("source: query must be one SELECT statement (it runs read-only on the source)")
            query = query.rstrip().rstrip(";")
        return SourceSpec(
            "postgres",
            table=_table(raw) if has_table else None,
            query=query,
            cursor_column=_ident(raw, "cursor_column", required=False),
            dsn_env=dsn_env,
        )
    position = _ident(raw, "position_column", required=True)
    op = _ident(raw, "op_column", required=True)
    if position == op:
        raise BadInput("source: position_column and op_column must be two different columns")
    return SourceSpec("cdc", table=_table(raw), position_column=position, op_column=op, dsn_env=dsn_env)


def stored_source(raw) -> SourceSpec | None:
    """``datasets.source`` as a spec; None when absent or of a legacy/unknown type."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, dict) or raw.get("type") not in TYPES:
        return None
    return parse_source(raw)
