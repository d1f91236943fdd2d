"""Files sources: list a local path, glob or s3:// URI, and read Parquet/CSV/NDJSON as typed Arrow batches.

Files are read in batches (Parquet row groups / CSV blocks / NDJSON lines), never whole, through
pyarrow.fs, so memory follows the batch size. A file is identified by path + size + modification time
(``fingerprint``): ``sync.append`` ingests the files whose fingerprint it has not seen.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import os
from collections.abc import Iterator, Sequence
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.settings import S3Settings
from lakehouse_dagster.sources.convert import convert_batch, convert_records, loads
from lakehouse_dagster.sources.errors import BadValue, SourceError
from lakehouse_dagster.sources.spec import SourceSpec
from lakehouse_dagster.tracking.datasets import Column

_MAGIC = set("*?[")
NDJSON_BATCH = 20_000  # lines parsed into Python objects at once (their memory is ~1 KB a row)


@dataclasses.dataclass(frozen=True)
class SourceFile:
    uri: str  # what operators see: a local path or s3://bucket/key
    path: str  # the filesystem's path
    size: int
    mtime_ns: int

    @property
    def fingerprint(self) -> str:
        return f"{self.size}:{self.mtime_ns}"


def filesystem(uri: str, s3: S3Settings) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it. s3:// takes the standard AWS variables and, for an
    S3-compatible store, LAKEHOUSE_S3_ENDPOINT."""
    if uri.startswith("s3://"):
        kwargs: dict = {}
        if s3.endpoint:
            parsed = urlparse(s3.endpoint if "://" in s3.endpoint else "https://" + s3.endpoint)
            kwargs.update(endpoint_override=parsed.netloc, scheme=parsed.scheme)
        if s3.region:
            kwargs["region"] = s3.region
        return pafs.S3FileSystem(**kwargs), uri[len("s3://") :]
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))


def _display(uri: str, path: str) -> str:
    return "s3://" + path if uri.startswith("s3://") else path


def list_files(spec: SourceSpec, s3: S3Settings) -> list[SourceFile]:
    """The source's files, sorted by path (the order rows are ingested in)."""
    uri = spec.need("uri")
    fs, path = filesystem(uri, s3)
    parts = path.split("/")
    magic_at = next((i for i, p in enumerate(parts) if _MAGIC & set(p)), None)
    try:
        if magic_at is None:
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.File:
                infos = [info]
            elif info.type == pafs.FileType.Directory or uri.startswith("s3://"):
                infos = [
                    i
                    for i in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
                    if i.type == pafs.FileType.File
                ]
            else:
                infos = []
        else:
            base = "/".join(parts[:magic_at]) or "/"
            infos = [
                i
                for i in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
                if i.type == pafs.FileType.File and fnmatch.fnmatchcase(i.path, path)
            ]
    except OSError as exc:
        raise BadInput(f"files source {spec.uri}: cannot list it ({_one_line(exc)})") from None
    out = [
        SourceFile(
            _display(uri, i.path), i.path, int(i.size or 0), int(i.mtime_ns or 0) if i.mtime_ns is not None else 0
        )
        for i in infos
        if not os.path.basename(i.path).startswith((".", "_"))  # hidden / _SUCCESS markers
    ]
    return sorted(out, key=lambda f: f.uri)


def check_location(spec: SourceSpec, s3: S3Settings) -> list[SourceFile]:
    """For set_source: the location must be listable; a local non-glob path must exist."""
    uri = spec.need("uri")
    if not uri.startswith("s3://") and not (_MAGIC & set(uri)):
        _, path = filesystem(uri, s3)
        if not os.path.exists(path):
            raise BadInput(f"files source {spec.uri}: no such file or directory (check the path)")
    if not uri.startswith("s3://") and (_MAGIC & set(uri)):
        _, path = filesystem(uri, s3)
        base = "/".join(p for p in path.split("/")[: next(i for i, p in enumerate(path.split("/")) if _MAGIC & set(p))])
        if not os.path.isdir(base or "/"):
            raise BadInput(f"files source {spec.uri}: directory {base} does not exist (check the glob)")
    return list_files(spec, s3)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def read_files(
    files: Sequence[SourceFile], spec: SourceSpec, s3: S3Settings, columns: Sequence[Column], batch_rows: int
) -> Iterator[pa.RecordBatch]:
    """Typed batches of every file, in order; SourceError names the file and row of a bad value."""
    fs, _ = filesystem(spec.need("uri"), s3)
    for f in files:
        yield from _read_one(fs, f, spec.need("format"), columns, batch_rows)


def _located(f: SourceFile, first_row: int, what: str, exc: BadValue) -> SourceError:
    return SourceError(
        f"file {f.uri} {what} {first_row + exc.index} column {exc.column}: expected {exc.expected}, got {exc.got}"
    )


def _read_one(fs, f: SourceFile, fmt: str, columns: Sequence[Column], batch_rows: int) -> Iterator[pa.RecordBatch]:
    names = [c.name for c in columns]
    row = 1  # 1-based data row (CSV: the header is not counted; NDJSON: the line number)
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(fs.open_input_file(f.path))
            present = [n for n in names if n in pf.schema_arrow.names]
            for batch in pf.iter_batches(batch_size=min(batch_rows, 131_072), columns=present):
                try:
                    yield convert_batch(batch, columns)
                except BadValue as exc:
                    raise _located(f, row, "row", exc) from None
                row += batch.num_rows
        elif fmt == "csv":
            reader = pacsv.open_csv(
                fs.open_input_stream(f.path),
                read_options=pacsv.ReadOptions(block_size=4 << 20),
                convert_options=pacsv.ConvertOptions(
                    column_types={n: pa.string() for n in names},
                    include_columns=names,
                    include_missing_columns=True,
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                ),
            )
            for batch in reader:
                try:
                    yield convert_batch(batch, columns, text=True)
                except BadValue as exc:
                    raise _located(f, row, "row", exc) from None
                row += batch.num_rows
        else:
            yield from _read_ndjson(fs, f, columns, min(batch_rows, NDJSON_BATCH))
    except (SourceError, GeneratorExit):
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        raise SourceError(f"file {f.uri}: cannot read it as {fmt} ({_one_line(exc)})") from None


def _read_ndjson(fs, f: SourceFile, columns, batch_rows: int) -> Iterator[pa.RecordBatch]:
    with fs.open_input_stream(f.path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8")
        records: list[dict] = []
        lines: list[int] = []
        for number, line in enumerate(text, start=1):
            if not line.strip():
                continue
            try:
                obj = loads(line)
            except (json.JSONDecodeError, ValueError):
                raise SourceError(f"file {f.uri} line {number}: not a valid JSON object") from None
            if not isinstance(obj, dict):
                raise SourceError(f"file {f.uri} line {number}: a JSON line must be an object")
            records.append(obj)
            lines.append(number)
            if len(records) >= batch_rows:
                yield _ndjson_batch(f, records, lines, columns)
                records, lines = [], []
        if records:
            yield _ndjson_batch(f, records, lines, columns)


def _ndjson_batch(f, records, lines, columns) -> pa.RecordBatch:
    try:
        return convert_records(records, columns)
    except BadValue as exc:
        raise SourceError(
            f"file {f.uri} line {lines[exc.index]} column {exc.column}: expected {exc.expected}, got {exc.got}"
        ) from None
