"""Per-file identity facts: identity readiness that reads only the files it has not verified yet (issue 11).

Iceberg data files are immutable, so what identity readiness needs from a file — its rows, the non-null count of
each identity column, whether its ``__row_index`` values are unique, their min and max — is computed once, the
first time a check meets the file, and stored in ``lakehouse_file_identity`` (migration "021_file_identity").
A snapshot is identity-ready when every live file's facts say so and the files' ``__row_index`` ranges are
disjoint (then no value can repeat across files); overlapping ranges, delete files or files not on local disk
make the caller read every row instead (``Unavailable``).

A stored fact is trusted only for the file it was computed for: the same path, the same size, the same row
count as the manifest says, under the same table schema (id and identity field ids/types). A rewrite makes new
files (no facts), a schema change a new key (facts computed again), a file changed in place a different size,
and a fact that disagrees with the manifest is computed again; a local file that is gone fails the check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakehouse_dagster.lake.parquet_ids import columns_in_file
from lakehouse_dagster.parity.digest import local_path
from lakehouse_dagster.parity.errors import FileFactsUnavailable as Unavailable
from lakehouse_dagster.parity.maintained import _files_in_place

IDENTITY_COLUMNS = ("__row_index", "__row_id", "__created_at")


@dataclasses.dataclass(frozen=True)
class FileIdentity:
    rows: int
    row_index: int  # non-null __row_index values
    row_id: int
    created_at: int
    distinct_row_index: int
    min_row_index: int | None
    max_row_index: int | None


def fields_key(table, schema_id: int | None) -> str:
    """The schema a fact was computed under: its id and the identity fields' ids, names and types."""
    schema = (table.schemas().get(schema_id) if schema_id is not None else None) or table.schema()
    spec = [schema.schema_id] + [
        [f.field_id, f.name, str(f.field_type)] for f in schema.fields if f.name in IDENTITY_COLUMNS
    ]
    return hashlib.md5(json.dumps(spec).encode("utf-8")).hexdigest()


def load(conn: psycopg.Connection, dataset_id: uuid.UUID, key: str, sizes: dict[str, int]) -> dict[str, FileIdentity]:
    rows = conn.execute(
        """select file_path, file_size, row_count, row_index_nonnull, row_id_nonnull, created_at_nonnull,
                  distinct_row_index, min_row_index, max_row_index
             from lakehouse_file_identity where dataset_id = %s and fields_key = %s and file_path = any(%s)""",
        (dataset_id, key, list(sizes)),
    ).fetchall()
    return {
        r[0]: FileIdentity(*(int(v) for v in r[2:7]), r[7], r[8])  # type: ignore[call-arg]  # five counts, then the bounds
        for r in rows
        if sizes.get(r[0]) == r[1]
    }


def store(
    conn: psycopg.Connection, dataset_id: uuid.UUID, key: str, sizes: dict[str, int], facts: dict[str, FileIdentity]
) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """insert into lakehouse_file_identity (dataset_id, file_path, file_size, fields_key, row_count,
                 row_index_nonnull, row_id_nonnull, created_at_nonnull, distinct_row_index, min_row_index,
                 max_row_index)
               values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
               on conflict (dataset_id, file_path, file_size, fields_key) do update set
                 row_count = excluded.row_count, row_index_nonnull = excluded.row_index_nonnull,
                 row_id_nonnull = excluded.row_id_nonnull, created_at_nonnull = excluded.created_at_nonnull,
                 distinct_row_index = excluded.distinct_row_index, min_row_index = excluded.min_row_index,
                 max_row_index = excluded.max_row_index, computed_at = now()""",
            [
                (
                    dataset_id,
                    p,
                    sizes[p],
                    key,
                    f.rows,
                    f.row_index,
                    f.row_id,
                    f.created_at,
                    f.distinct_row_index,
                    f.min_row_index,
                    f.max_row_index,
                )
                for p, f in facts.items()
            ],
        )


def compute(paths: Sequence[str], field_ids: Mapping[str, int | None]) -> dict[str, FileIdentity]:
    """The facts of local Parquet files, each read alone and only its identity columns (one file holds at most
    a chunk of rows: memory stays bounded by LAKEHOUSE_INGEST_CHUNK_ROWS). ``field_ids``: the table schema's
    (name → field id); a file's columns are found by field id (lake/parquet_ids.py). A column absent from a file
    (or from the table schema) counts as null in every row, as the full check reads it."""

    wanted = {c: field_ids[c] for c in IDENTITY_COLUMNS if c in field_ids}
    out = {}
    for path in paths:
        pf = pq.ParquetFile(path)
        found = {n: c for n, c in columns_in_file(pf.schema_arrow, wanted).items() if c is not None}
        cols = [c for c in IDENTITY_COLUMNS if c in found]
        read = pf.read(columns=[found[c] for c in cols])
        t = pa.table([read.column(found[c]) for c in cols], names=cols)
        rows = pf.metadata.num_rows

        def nonnull(name: str) -> int:
            return 0 if name not in cols else len(t[name]) - t[name].null_count

        lo = hi = None
        distinct = 0
        if "__row_index" in cols and nonnull("__row_index"):
            ri = t["__row_index"]
            distinct = pc.count_distinct(ri, mode="only_valid").as_py()
            mm = pc.min_max(ri)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
        out[path] = FileIdentity(
            rows, nonnull("__row_index"), nonnull("__row_id"), nonnull("__created_at"), distinct, lo, hi
        )
    return out


def snapshot_facts(conn: psycopg.Connection, pin, dataset_id: uuid.UUID) -> tuple[dict[str, int], int, int]:
    """(totals like IcebergSide.identity_stats, files read now, files whose facts were stored before) for the
    pinned snapshot, computing and storing the facts of its files that have none. ``Unavailable`` when the
    per-file facts cannot answer (read every row instead); ``maintained.Unavailable`` from the in-place test
    when a local file is gone or not its manifest's size."""

    if pin.has_deletes:
        raise Unavailable("the snapshot has delete files")
    if not pin.local:
        raise Unavailable("the data files are not on local disk")
    _files_in_place(pin)
    key = fields_key(pin.table, pin.schema_id)
    stored = load(conn, dataset_id, key, pin.sizes)
    trusted = {p: f for p, f in stored.items() if pin.records.get(p) in (None, f.rows)}
    missing = [p for p in pin.files if p not in trusted]
    computed = {}
    if missing:
        local = {lp: p for p in missing if (lp := local_path(p)) is not None}  # every one (pin.local)
        computed = {local[lp]: f for lp, f in compute(list(local), pin.field_ids or dict.fromkeys(pin.fields)).items()}
        wrong = [p for p, f in computed.items() if pin.records.get(p) not in (None, f.rows)]
        if wrong:
            raise Unavailable(
                f"data file {wrong[0]} has {computed[wrong[0]].rows} rows, its manifest says {pin.records[wrong[0]]}"
            )
        store(conn, dataset_id, key, pin.sizes, computed)
        # The snapshot moved on: facts of files it no longer holds (replaced, or another schema) are dropped.
        # (A check still reading an older snapshot only computes them again.)
        conn.execute(
            "delete from lakehouse_file_identity where dataset_id = %s and fields_key = %s"
            " and not (file_path = any(%s))",
            (dataset_id, key, list(pin.files)),
        )
        conn.execute(
            "delete from lakehouse_file_identity where dataset_id = %s and fields_key <> %s", (dataset_id, key)
        )
    facts = {**trusted, **computed}
    ranges = sorted(
        (f.min_row_index, f.max_row_index)
        for f in facts.values()
        if f.min_row_index is not None and f.max_row_index is not None
    )
    for (_, prev_hi), (lo, _) in zip(ranges, ranges[1:]):
        if lo <= prev_hi:
            raise Unavailable("the files' __row_index ranges overlap")
    totals = {"rows": 0, "row_index": 0, "row_id": 0, "created_at": 0, "distinct_row_index": 0}
    for f in facts.values():
        for k in totals:
            totals[k] += getattr(f, "rows" if k == "rows" else k)
    if pin.total_records is not None and totals["rows"] != pin.total_records:
        raise Unavailable(f"the files hold {totals['rows']} rows, the snapshot says {pin.total_records}")
    return totals, len(computed), len(trusted)
