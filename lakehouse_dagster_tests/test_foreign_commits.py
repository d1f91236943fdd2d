"""Commits the project did not make (issue 42, item 7): another Iceberg engine writing the project's tables.

The second writer is a plain pyiceberg client, not the project: its own SqlCatalog on the project's catalog tables
(the catalog name must be the project's, as for Iceberg-Java's JdbcCatalog), its own ``load_table``,
``append`` and snapshot producers, and none of the project's summary marks. What it does is what Spark + Iceberg-Java
did in the issue's reproduction: an append to a mirrored table, a ``replace`` that rewrites the same rows into new
files (Spark's ``rewrite_data_files``), and a rewrite whose Parquet files carry a sanitised column name under the
right field id (Iceberg-Java writes ``col with space ü`` as ``col_x20with_x20space_x20ü``).
"""

from __future__ import annotations

import datetime as dt
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import (
    _dataframe_to_data_files,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _OverwriteFiles

from lakehouse_dagster.cli.main import main as cli_main
from lakehouse_dagster.core.db import sqlalchemy_url
from lakehouse_dagster.core.errors import BadInput, ForeignCommit, SyncFailed
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.lake.maintenance import compact_small_files
from lakehouse_dagster.mirror.reaper import fence
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity import canary
from lakehouse_dagster.tracking import datasets

from .native_helpers import native_write, ready_native, row

SCHEMA = [{"name": "col with space ü", "type": "string"}, {"name": "n", "type": "int64"}]
SPACE = "col with space ü"
SANITISED = "col_x20with_x20space_x20ü"  # Iceberg-Java's AvroSchemaUtil.makeCompatibleName


def _rows(start: int, n: int) -> list[dict]:
    return [{SPACE: f"v{k} ü|x", "n": k * 7} for k in range(start, start + n)]


def _make(conn, n: int = 20) -> uuid.UUID:
    ws = datasets.create_workspace(conn, "ws")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, _rows(0, n))
    return d


def _sync(settings, dsn, d, **kw):
    return sync_dataset(dsn, load_catalog(settings, dsn), settings, d, **kw)


def _verdict(settings, dsn, d, **kw) -> canary.Verdict:
    return canary.evaluate(dsn, load_catalog(settings, dsn), settings, d, **kw)


def _engine(settings, dsn) -> SqlCatalog:
    """The other engine's catalog: not the project's (load_catalog), the same catalog tables and warehouse."""
    return SqlCatalog("lakehouse", uri=sqlalchemy_url(dsn), warehouse=settings.catalog.warehouse)


def _foreign_table(settings, dsn, d):
    return _engine(settings, dsn).load_table(table_identifier(settings, d))


def _foreign_append(settings, dsn, d, n: int, start: int = 10_000) -> int:
    """The other engine appends ``n`` rows (its own row indexes and ids); the snapshot id it committed."""
    table = _foreign_table(settings, dsn, d)
    schema = table.schema().as_arrow()
    cols = {
        "__row_index": pa.array(range(start, start + n), pa.int64()),
        "__row_id": pa.array([str(uuid.uuid4()) for _ in range(n)]),
        "__created_at": pa.array([dt.datetime.now(dt.UTC)] * n, schema.field("__created_at").type),
    }
    for field in schema:
        cols.setdefault(field.name, pa.nulls(n, field.type) if field.name != "n" else pa.array(range(n), pa.int64()))
    table.append(pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema))
    return table.current_snapshot().snapshot_id


class _ReplaceFiles(_OverwriteFiles):
    """Iceberg's ``replace`` operation, what Iceberg-Java's RewriteFiles (Spark's rewrite_data_files) commits:
    pyiceberg 0.12 has no producer for it (its summary update refuses the operation), so this one builds the
    overwrite's manifests and summary and then names the operation ``replace``."""

    def _summary(self, snapshot_properties=None) -> Summary:
        summary = super()._summary(snapshot_properties or {})
        return Summary(Operation.REPLACE, **summary.additional_properties)


def _foreign_replace(table, new_files: list[DataFile]) -> int:
    """Remove every live data file of ``table`` and add ``new_files`` in one ``replace`` snapshot."""
    old = [task.file for task in table.scan().plan_files()]
    tx = table.transaction()
    producer = _ReplaceFiles(operation=Operation.OVERWRITE, transaction=tx, io=table.io)
    for f in old:
        producer.delete_data_file(f)
    for f in new_files:
        producer.append_data_file(f)
    producer.commit()
    tx.commit_transaction()
    snap = table.refresh().current_snapshot()
    assert snap.summary.operation == Operation.REPLACE
    return snap.snapshot_id


def _rewrite_with_pyiceberg(settings, dsn, d) -> int:
    """The other engine's compaction: every row read back and written by pyiceberg's own file writer."""
    table = _foreign_table(settings, dsn, d)
    rows = table.scan().to_arrow()
    files = list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io))
    return _foreign_replace(table, files)


def _rewrite_like_iceberg_java(settings, dsn, d, tmp_path) -> int:
    """The other engine's compaction with Iceberg-Java's Parquet names: the column with a space is written as
    ``col_x20with_x20space_x20ü`` under its own field id (pyarrow, by hand), the stats keyed by field id."""
    table = _foreign_table(settings, dsn, d)
    schema = table.schema()
    rows = table.scan().to_arrow()
    fields = [
        pa.field(
            SANITISED if f.name == SPACE else f.name,
            rows.schema.field(f.name).type,
            nullable=f.name != "__row_index",
            metadata={b"PARQUET:field_id": str(f.field_id).encode()},
        )
        for f in schema.fields
    ]
    data = pa.Table.from_arrays([rows.column(f.name) for f in schema.fields], schema=pa.schema(fields))
    path = f"{table.location()}/data/spark-{uuid.uuid4()}.parquet"
    with table.io.new_output(path).create() as out:
        pq.write_table(data, out)
    with table.io.new_input(path).open() as f:
        meta = pq.read_metadata(f)
    by_path = parquet_path_to_id_mapping(schema)
    by_path[SANITISED] = by_path.pop(SPACE)
    stats = data_file_statistics_from_parquet_metadata(meta, compute_statistics_plan(schema, table.properties), by_path)
    df = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=stats.partition(table.metadata.spec(), schema),
        file_size_in_bytes=len(table.io.new_input(path)),
        sort_order_id=None,
        spec_id=table.metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **stats.to_serialized_dict(),
    )
    return _foreign_replace(table, [df])


def _table_state(settings, dsn, d) -> tuple:
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    return table.metadata_location, table.current_snapshot().snapshot_id, len(table.scan().to_arrow())


def test_a_foreign_append_on_a_mirrored_table_fails_the_next_sync_loud_and_changes_nothing(conn, dsn, settings):
    d = _make(conn)
    assert _sync(settings, dsn, d).total_rows == 20
    foreign = _foreign_append(settings, dsn, d, 10)
    datasets.insert_rows(conn, d, _rows(20, 5))
    before = _table_state(settings, dsn, d)
    assert before[2] == 30

    # the incremental sync (only appends in Postgres) would have kept them and said "25 in table"
    with pytest.raises(SyncFailed) as refused:
        _sync(settings, dsn, d)
    line = str(refused.value)
    assert "\n" not in line
    assert str(foreign) in line and "append" in line and "10 row" in line and "--revert-foreign" in line
    assert _table_state(settings, dsn, d) == before  # nothing committed
    status, row_count, error = conn.execute(
        "select status, row_count, error from datasets where id = %s", (d,)
    ).fetchone()
    assert (status, row_count) == ("errored", 20) and str(foreign) in error
    assert conn.execute(
        "select status from iceberg_sync_log where dataset_id = %s order by started_at desc limit 1", (d,)
    ).fetchone() == ("failed",)

    # a rewrite in Postgres (a partial or full sync) would have dropped them: refused too, so is a plain full sync
    conn.execute("update dataset_rows set data = data || '{\"n\": -1}' where dataset_id = %s and row_index = 3", (d,))
    for mode in ("auto", "full"):
        with pytest.raises(SyncFailed, match=str(foreign)):
            _sync(settings, dsn, d, mode=mode)
    assert _table_state(settings, dsn, d) == before

    # the operator's way out: a full re-sync that reverts it, by name
    r = _sync(settings, dsn, d, mode="full", revert_foreign=True)
    assert (r.mode, r.total_rows) == ("full", 25)
    assert str(foreign) in r.reason
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert len(table.scan().to_arrow()) == 25
    assert table.current_snapshot().summary.additional_properties["lakehouse.reverted-foreign"] == str(foreign)
    assert conn.execute("select row_count, status from datasets where id = %s", (d,)).fetchone() == (25, "ready")
    assert _verdict(settings, dsn, d).verdict == "ok"
    datasets.insert_rows(conn, d, _rows(25, 2))
    after = _sync(settings, dsn, d)
    assert (after.mode, after.total_rows) == ("incremental", 27)


def test_an_unchanged_dataset_still_says_so_when_a_foreign_commit_landed(conn, dsn, settings, capsys):
    """A noop sync reported the table's count from the project's own property ("1001 in table" for 1011). Through
    the CLI: exit 4 and one line, then the operator's --revert-foreign."""
    d = _make(conn)
    _sync(settings, dsn, d)
    foreign = _foreign_append(settings, dsn, d, 3)
    capsys.readouterr()
    assert cli_main(["sync", "--dataset", str(d)]) == 4
    err = capsys.readouterr().err.strip()
    assert f"snapshot {foreign} (append by another engine" in err and "+3 row(s)" in err and len(err.splitlines()) == 1
    with pytest.raises(BadInput, match="--revert-foreign is a full re-sync"):
        _sync(settings, dsn, d, mode="incremental", revert_foreign=True)
    assert cli_main(["sync", "--dataset", str(d), "--revert-foreign"]) == 0
    out = capsys.readouterr().out
    assert f"full (full requested to revert what another Iceberg engine committed ({foreign}))" in out
    assert "20 in table" in out


def test_a_foreign_replace_that_keeps_the_rows_is_accepted(conn, dsn, settings):
    d = _make(conn)
    _sync(settings, dsn, d)
    replaced = _rewrite_with_pyiceberg(settings, dsn, d)
    assert _verdict(settings, dsn, d).verdict == "ok"

    datasets.insert_rows(conn, d, _rows(20, 5))
    r = _sync(settings, dsn, d)
    assert (r.mode, r.rows, r.total_rows) == ("incremental", 5, 25)
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert table.current_snapshot().parent_snapshot_id == replaced
    assert len(table.scan().to_arrow()) == 25
    assert _verdict(settings, dsn, d).verdict == "ok"
    assert _verdict(settings, dsn, d, full=True).verdict == "ok"


def test_a_replace_that_changes_the_row_count_is_no_maintenance(conn, dsn, settings):
    d = _make(conn)
    _sync(settings, dsn, d)
    table = _foreign_table(settings, dsn, d)
    rows = table.scan().to_arrow().slice(0, 15)  # "compaction" that loses 5 rows
    files = list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io))
    bad = _foreign_replace(table, files)
    datasets.insert_rows(conn, d, _rows(20, 1))
    with pytest.raises(SyncFailed, match=f"snapshot {bad} \\(replace"):
        _sync(settings, dsn, d)


def test_a_sanitised_parquet_column_name_is_read_by_its_field_id(conn, dsn, settings, tmp_path):
    d = _make(conn)
    _sync(settings, dsn, d)
    assert _verdict(settings, dsn, d).verdict == "ok"
    _rewrite_like_iceberg_java(settings, dsn, d, tmp_path)

    for full in (False, True):  # the maintained sums (a new file digested lazily) and the full digest
        v = _verdict(settings, dsn, d, full=full, smoke=True)
        assert v.verdict == "ok", (full, v.detail)
        assert v.iceberg_digest == v.pg_digest and v.iceberg_count == 20

    # a project commit over it (an append, then a partial rewrite reading the file back) keeps the values
    datasets.insert_rows(conn, d, _rows(20, 3))
    assert _sync(settings, dsn, d).total_rows == 23
    conn.execute("update dataset_rows set data = data || '{\"n\": -5}' where dataset_id = %s and row_index = 4", (d,))
    assert _sync(settings, dsn, d).total_rows == 23
    assert _verdict(settings, dsn, d, full=True).verdict == "ok"


def test_a_foreign_append_on_a_native_table_is_applied_and_explained(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 8)], start=6)
    catalog = load_catalog(settings, dsn)
    assert apply_reverse(dsn, catalog, settings, d).pg_rows == 8
    foreign = _foreign_append(settings, dsn, d, 4, start=100)

    r = apply_reverse(dsn, catalog, settings, d)
    assert (r.how, r.copied, r.pg_rows) == ("append", 4, 12), r.reason
    assert "another Iceberg engine" in r.reason and str(foreign) in r.reason
    assert "already holds every row" not in r.reason


def test_a_native_write_after_a_foreign_append_records_the_tables_true_count(conn, dsn, settings):
    """Found by the lifecycle model (a native write interrupted, then the next one settling it): the writer took the
    rows before its commit from the project's own ``lakehouse.row-count`` property, which another engine's commit
    does not move, so ``datasets.row_count`` (and the property) stayed short of the table by the foreign rows for
    ever. The count before a write is the current snapshot's when another engine made it."""
    d = ready_native(conn, dsn, settings, "sync.append")
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(6, 8)], start=6)
    _foreign_append(settings, dsn, d, 3, start=100)
    native_write(conn, dsn, settings, d, "sync.append", [row(8)], start=8)
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    live = table.scan().to_arrow().num_rows
    assert live == 12
    assert table.properties["lakehouse.row-count"] == "12"
    assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == live


def test_the_projects_compaction_never_compacts_another_engines_files_away(conn, dsn, settings):
    """The check sits in the writer's commit: a compaction (no sync in front of it) refuses too."""
    d = _make(conn, n=4)
    _sync(settings, dsn, d)
    for k in range(4, 10, 2):
        datasets.insert_rows(conn, d, _rows(k, 2))
        _sync(settings, dsn, d, mode="incremental")
    foreign = _foreign_append(settings, dsn, d, 5)
    before = _table_state(settings, dsn, d)
    with pytest.raises(ForeignCommit, match=f"snapshot {foreign}"):
        compact_small_files(conn, load_catalog(settings, dsn), settings, d, small_bytes=1 << 30, min_files=2)
    assert _table_state(settings, dsn, d) == before


def test_the_reapers_fence_on_top_of_a_foreign_commit_does_not_hide_it(conn, dsn, settings):
    d = _make(conn)
    _sync(settings, dsn, d)
    foreign = _foreign_append(settings, dsn, d, 2)
    fence(load_catalog(settings, dsn).load_table(table_identifier(settings, d)), "pytest: an unsettled sync")
    with pytest.raises(SyncFailed, match=f"snapshot {foreign} \\(append"):
        _sync(settings, dsn, d)


def test_a_foreign_rollback_behind_a_project_snapshot_is_a_data_change(conn, dsn, settings):
    d = _make(conn)
    first = _sync(settings, dsn, d).snapshot_id
    datasets.insert_rows(conn, d, _rows(20, 5))
    second = _sync(settings, dsn, d).snapshot_id
    _foreign_table(settings, dsn, d).manage_snapshots().rollback_to_snapshot(first).commit()
    datasets.insert_rows(conn, d, _rows(25, 1))
    with pytest.raises(
        SyncFailed, match=f"set its table back to snapshot {first}, behind the project's snapshot {second}"
    ):
        _sync(settings, dsn, d)
    r = _sync(settings, dsn, d, revert_foreign=True)
    assert (r.mode, r.total_rows) == ("full", 26)
    assert _verdict(settings, dsn, d).verdict == "ok"
