"""Per-dataset cost inside a mirror batch (issue 11): identity readiness reads only the files it has not verified
(per-file facts, parity/file_identity.py) and still fails on what is written behind the mirror's back; the batch's
checks give the same verdicts as the checks that read every row. Real Postgres, real Iceberg, real Dagster runs."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pytest
from pyiceberg.types import StringType

from lakehouse_dagster.defs.mirror_batch import mirror_batch_job
from lakehouse_dagster.defs.partitions import datasets_partitions
from lakehouse_dagster.defs.resources import LakehouseResource
from lakehouse_dagster.iceberg.catalog import load_catalog
from lakehouse_dagster.parity.health import identity_ready
from lakehouse_dagster.store import datasets as ds
from lakehouse_dagster_tests.test_canary import make_dataset, rogue_overwrite, rows_for, sync, table_of


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


def _identity(settings, dsn, conn, d, cached=True):
    return identity_ready(load_catalog(settings, dsn), settings, d, conn if cached else None)


def _live_files(settings, dsn, d) -> int:
    table = table_of(settings, dsn, d)
    return len(list(table.scan().plan_files()))


def _append_behind_the_back(settings, dsn, d, change) -> None:
    """A real Iceberg append through pyiceberg (not the mirror): rows shaped like the table's, changed by ``change``."""
    table = table_of(settings, dsn, d)
    some = table.scan(limit=2).to_arrow()
    table.append(change(some).cast(table.schema().as_arrow()))


def test_identity_after_an_append_reads_only_the_new_file(conn, dsn, settings):
    d = make_dataset(conn, 30)
    sync(settings, dsn, d)
    first = _identity(settings, dsn, conn, d)
    assert first.passed, first.description
    assert first.metadata["files_read"] == _live_files(settings, dsn, d) == 1
    assert first.metadata["files_cached"] == 0 and first.metadata["rows"] == 30

    ds.insert_rows(conn, d, rows_for(5, start=30))
    assert sync(settings, dsn, d).mode == "incremental"
    after = _identity(settings, dsn, conn, d)
    assert after.passed, after.description
    assert _live_files(settings, dsn, d) == 2
    assert (after.metadata["files_read"], after.metadata["files_cached"]) == (1, 1)  # the new file only
    assert after.metadata["rows"] == 35 and after.metadata["distinct_row_index"] == 35

    again = _identity(settings, dsn, conn, d)
    assert (again.metadata["files_read"], again.metadata["files_cached"]) == (0, 2)
    # the same verdict and counts as reading every row
    full = _identity(settings, dsn, conn, d, cached=False)
    assert full.passed and full.metadata["files_read"] == 2
    assert {k: again.metadata[k] for k in ("rows", "row_index", "row_id", "created_at", "distinct_row_index")} == \
        {k: full.metadata[k] for k in ("rows", "row_index", "row_id", "created_at", "distinct_row_index")}


def test_identity_fails_on_a_duplicated_row_index_appended_behind_the_back(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).passed  # facts of the mirror's file stored
    # a file whose one row repeats an existing __row_index: its range overlaps the verified file's
    _append_behind_the_back(settings, dsn, d, lambda t: t.slice(0, 1))
    h = _identity(settings, dsn, conn, d)
    assert not h.passed and "1 duplicated __row_index" in h.description
    assert h.metadata["read"].startswith("every row") and "overlap" in h.metadata["read"]


def test_identity_fails_on_a_duplicate_inside_a_new_file_above_the_max(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).passed
    # two rows with the same new __row_index, above every verified one: only the new file's own facts show it
    _append_behind_the_back(settings, dsn, d, lambda t: t.set_column(
        t.schema.get_field_index("__row_index"), "__row_index", pa.array([500, 500], pa.int64())))
    h = _identity(settings, dsn, conn, d)
    assert not h.passed and "1 duplicated __row_index" in h.description
    assert (h.metadata["read"], h.metadata["files_read"], h.metadata["files_cached"]) == ("new files only", 1, 1)


def test_identity_fails_on_a_null_identity_value_appended_behind_the_back(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).passed
    _append_behind_the_back(settings, dsn, d, lambda t: t.set_column(
        t.schema.get_field_index("__row_index"), "__row_index", pa.array([900, 901], pa.int64())).set_column(
        t.schema.get_field_index("__row_id"), "__row_id", pa.array([None, "x"], pa.string())))
    h = _identity(settings, dsn, conn, d)
    assert not h.passed and "1 row(s) with a null __row_id" in h.description
    assert h.metadata["files_read"] == 1


def test_a_cached_fact_is_not_trusted_for_a_file_it_was_not_computed_for(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).metadata["files_read"] == 1
    assert _identity(settings, dsn, conn, d).metadata["files_read"] == 0

    # a stored fact that disagrees with the file's manifest (rows) is computed again, and then agrees
    conn.execute("update lakehouse_file_identity set row_count = 3, distinct_row_index = 3 where dataset_id = %s", (d,))
    h = _identity(settings, dsn, conn, d)
    assert h.passed and h.metadata["files_read"] == 1 and h.metadata["rows"] == 10

    # a schema change: every file's facts are computed again under the new schema
    table = table_of(settings, dsn, d)
    with table.update_schema() as up:
        up.add_column("extra", StringType())
    table.append(table.scan(limit=0).to_arrow().cast(table_of(settings, dsn, d).schema().as_arrow()))
    h = _identity(settings, dsn, conn, d)
    assert h.passed and h.metadata["files_cached"] == 0 and h.metadata["files_read"] == _live_files(settings, dsn, d)

    # a rewrite: new files, no facts — and a duplicate in the rewritten rows is found
    rogue_overwrite(settings, dsn, d, lambda t: pa.concat_tables([t, t.slice(3, 1)]))
    h = _identity(settings, dsn, conn, d)
    assert not h.passed and "1 duplicated __row_index" in h.description
    assert h.metadata["files_cached"] == 0


def test_identity_fails_when_a_verified_file_is_gone(conn, dsn, settings):
    import os
    from urllib.parse import urlparse

    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).passed
    (task,) = table_of(settings, dsn, d).scan().plan_files()
    os.remove(urlparse(task.file.file_path).path)
    h = _identity(settings, dsn, conn, d)
    assert not h.passed and "missing" in h.description  # a check that cannot see the data says so


def _run_batch(instance, dsn, ids):
    instance.add_dynamic_partitions(datasets_partitions.name, [str(d) for d in ids])
    result = mirror_batch_job.execute_in_process(
        run_config={"ops": {"mirror_datasets": {"config": {"datasets": [str(d) for d in ids]}}}},
        resources={"lakehouse": LakehouseResource(pg_dsn=dsn)}, instance=instance, raise_on_error=False)
    return {(e.partition, e.check_name): e for e in result.get_asset_check_evaluations()}, result


def test_the_batch_checks_give_the_verdicts_of_the_checks_that_read_every_row(conn, dsn, settings, instance):
    good, dup = make_dataset(conn, 12, name="good"), make_dataset(conn, 12, name="dup")
    evals, result = _run_batch(instance, dsn, [good, dup])
    assert result.success
    assert all(e.passed for e in evals.values()) and len(evals) == 6
    # after an append to both and a duplicate written behind the mirror's back into one
    for d in (good, dup):
        ds.insert_rows(conn, d, rows_for(3, start=12))
    _append_behind_the_back(settings, dsn, dup, lambda t: t.slice(0, 1))
    evals, result = _run_batch(instance, dsn, [good, dup])
    for d in (good, dup):
        full = _identity(settings, dsn, conn, d, cached=False)  # the old check: every row read
        ev = evals[(str(d), "identity_ready")]
        assert ev.passed == full.passed and ev.description == full.description
    assert evals[(str(good), "identity_ready")].passed
    assert evals[(str(good), "identity_ready")].metadata["files_read"].value == 1  # only the appended file
    assert not evals[(str(dup), "identity_ready")].passed
    assert evals[(str(good), "parity")].passed and evals[(str(good), "snapshot_freshness")].passed
    # parity after the small append compared maintained sums, reading only the new file on the Iceberg side
    detail = evals[(str(good), "parity")].metadata["detail"].value
    assert detail["digest"] == "maintained" and detail["maintained_prepare"]["iceberg_files_digested"] == 1


def test_a_small_range_is_read_on_one_connection_and_gives_the_rows_the_split_readers_give(conn, dsn):
    from lakehouse_dagster.ingest.source import PinnedSnapshot, read_batches
    from lakehouse_dagster.store.datasets import get_dataset

    d = make_dataset(conn, 40)
    columns = get_dataset(conn, d).columns
    got = {}
    for split in (1, 10_000):  # split readers / the one reader a small range gets
        pinned = PinnedSnapshot(dsn, d)
        try:
            state = pinned.state(None)
            seen = []
            batches = read_batches(dsn, pinned, state, columns, after_row_index=None, readers=2, split_min_rows=split)
            for b in batches:
                seen.append(b)
            t = pa.Table.from_batches(seen).sort_by("__row_index")
            got[split] = [(r["__row_index"], r["__row_id"], r["s"], r["i"]) for r in t.to_pylist()]
        finally:
            pinned.close()
    assert len(got[1]) == 40 and got[1] == got[10_000]


def test_facts_of_files_a_snapshot_no_longer_holds_are_dropped(conn, dsn, settings):
    d = make_dataset(conn, 10)
    sync(settings, dsn, d)
    assert _identity(settings, dsn, conn, d).passed
    ds.insert_rows(conn, d, rows_for(3, start=10))
    sync(settings, dsn, d, mode="full")  # a full sync replaces the file
    h = _identity(settings, dsn, conn, d)
    assert h.passed and (h.metadata["files_read"], h.metadata["files_cached"]) == (1, 0)
    live = {t.file.file_path for t in table_of(settings, dsn, d).scan().plan_files()}
    stored = {r[0] for r in conn.execute("select file_path from lakehouse_file_identity where dataset_id = %s", (d,))}
    assert stored == live
