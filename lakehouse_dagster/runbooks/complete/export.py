"""A complete's ``--export-to``: the directory checked before anything is written (a re-run resumes in its own), and the
rows streamed as Parquet before any is deleted.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.flags.completed import (
    Completed,
    export_targets,
    mark_exported,
)
from lakehouse_dagster.lake.schema import arrow_schema
from lakehouse_dagster.mirror.pinned_read import select_query
from lakehouse_dagster.runbooks.complete.status import _audit
from lakehouse_dagster.tracking.datasets import get_dataset

EXPORT_PREFIX = "lakehouse-complete-"  # the export's own files (a partial one is replaced on resume)
EXPORT_FILE_ROWS = 1_000_000  # rows per Parquet file of an export


def _check_export_dir(export_to: str | None, mark: Completed | None) -> Path | None:
    """The export directory: absent, or empty, or (resuming an export that did not finish) holding only the
    export's own files. Anything else is refused before anything is written."""
    if export_to in (None, ""):
        return None
    path = Path(str(export_to)).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise BadInput(f"--export-to {path} exists and is not a directory; give a new or empty directory")
    if path.is_dir():
        others = [p.name for p in path.iterdir() if not (mark is not None and p.name.startswith(EXPORT_PREFIX))]
        if others:
            raise BadInput(
                f"--export-to {path} is not empty ({len(others)} entr{'y' if len(others) == 1 else 'ies'}, e.g. "
                f"{sorted(others)[0]}); give a new or empty directory, nothing was written"
            )
    return path


def _check_scope_export_dir(conn: psycopg.Connection, export_to: str) -> Path:
    """The parent of a scope's exports (``<export_to>/<dataset id>`` each): absent, empty, or holding only the
    directories an earlier run of a complete made, so that a re-run resumes (item 8 of issue 42): a directory
    named by a dataset whose complete mark records it as its export. Each dataset then resumes (an export cut short
    is started over), is skipped (complete: its export finished before any row was deleted) or is refused alone.
    Anything else in the parent is refused before anything is written."""
    path = Path(str(export_to)).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise BadInput(f"--export-to {path} exists and is not a directory; give a new or empty directory")
    if not path.is_dir():
        return path
    entries = list(path.iterdir())
    ours = _exports_of_marks(conn, [p for p in entries if p.is_dir()])
    others = sorted(p.name for p in entries if p not in ours)
    if others:
        raise BadInput(
            f"--export-to {path} is not empty ({len(others)} entr{'y' if len(others) == 1 else 'ies'} that no earlier "
            f"complete exported, e.g. {others[0]}); give a new or empty directory, or the one an earlier run of this "
            "complete used (it holds only the datasets' export directories); nothing was written"
        )
    return path


def _exports_of_marks(conn: psycopg.Connection, dirs: list[Path]) -> set[Path]:
    """Of ``dirs``, those named by a dataset id whose complete mark (any status) records that directory as its
    export: an earlier run's own (one query)."""
    named: dict[uuid.UUID, Path] = {}
    for p in dirs:
        try:
            named[uuid.UUID(p.name)] = p
        except ValueError:
            continue
    if not named:
        return set()
    rows = export_targets(conn, list(named))
    return {named[d] for d, to in rows if to is not None and to == str(named[d])}


def _export(conn: psycopg.Connection, ds_id: uuid.UUID, path: Path, chunk: int, actor: str) -> int:
    """The dataset's rows as Parquet into ``path`` (typed as its table, identity columns first, in row_index order),
    streamed: one chunk of rows in memory at a time, files of up to EXPORT_FILE_ROWS rows, each written as
    ``.partial`` and renamed when whole. Before any row is deleted; the mark records it done."""
    dataset = get_dataset(conn, ds_id)
    schema = arrow_schema(dataset.columns)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob(EXPORT_PREFIX + "*"):  # an export a crash cut short: start it over
        old.unlink()
    n, part = 0, 0
    writer: pq.ParquetWriter | None = None
    current: Path | None = None

    def close() -> None:
        nonlocal writer
        if writer is not None and current is not None:
            writer.close()
            current.rename(current.with_suffix(""))
        writer = None

    with conn.transaction(), conn.cursor(name=f"lakehouse_complete_export_{ds_id.hex}") as cur:
        cur.itersize = chunk
        cur.execute(select_query(ds_id, dataset.columns, None, None))
        in_file = 0
        while rows := cur.fetchmany(chunk):
            columns = list(zip(*rows))
            table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
            if writer is None or in_file >= EXPORT_FILE_ROWS:
                close()
                current = path / f"{EXPORT_PREFIX}{ds_id}-{part:05d}.parquet.partial"
                writer, in_file, part = pq.ParquetWriter(current, schema), 0, part + 1
            writer.write_table(table)
            in_file += len(rows)
            n += len(rows)
            failpoint("complete-export-after-chunk")
    close()
    with conn.transaction():
        mark_exported(conn, ds_id)
        _audit(conn, ds_id, "export", actor, n, {"export_to": str(path), "files": part})
    return n
