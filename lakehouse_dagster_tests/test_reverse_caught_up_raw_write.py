"""Issue 42: "a Postgres-side write to a native dataset is detected in O(1), alerted and refused". The reverse mirror
answered an apply of a caught-up dataset (its position at the table's snapshot) NOOP before its O(1) rows_version
check, so the live app's raw write into dataset_rows was not reported until a native commit gave the apply something
to copy. Now every apply but a full re-sync compares rows_version first: the CLI and the apply say the same."""

from __future__ import annotations

import pytest

from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.reverse import PostgresWritten, apply_reverse
from lakehouse_dagster.tracking import datasets

from .native_helpers import native_write, row
from .test_reverse_mirror import _pg_rows, ready_native


def test_a_raw_write_into_a_caught_up_native_dataset_is_refused_by_the_next_apply(conn, dsn, settings, lh):
    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    assert apply_reverse(dsn, catalog, settings, d).how == "append"
    assert apply_reverse(dsn, catalog, settings, d).how == "noop"  # caught up, nothing written since
    datasets.insert_rows(conn, d, [row(50)])  # the live app's row.edit, locked to pg, past every check of ours
    kept = _pg_rows(conn, d)
    with pytest.raises(PostgresWritten) as refused:
        apply_reverse(dsn, catalog, settings, d)
    text = str(refused.value)
    assert f"refused: dataset {d} is native (Iceberg is its truth), but its dataset_rows was written" in text
    assert f"lakehouse reverse sync --dataset {d} --full" in text and "nothing was written" in text
    code, _, err = lh("reverse", "sync", "--dataset", str(d))
    assert code == 6 and "rows_version" in err and len(err.strip().splitlines()) == 1, err
    assert _pg_rows(conn, d) == kept  # never answered by a deletion
    # the operator accepts Iceberg's rows: the full re-sync does not look (asked for), then the apply is quiet again
    assert apply_reverse(dsn, catalog, settings, d, full=True).how == "full"
    assert apply_reverse(dsn, catalog, settings, d).how == "noop"
