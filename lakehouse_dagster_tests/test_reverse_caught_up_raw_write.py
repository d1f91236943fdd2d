"""Issue 42: "a Postgres-side write to a native dataset is detected in O(1), alerted and refused". The reverse mirror
answered an apply of a caught-up dataset (its position at the table's snapshot) NOOP before its O(1) rows_version
check, so the live app's raw write into dataset_rows was not reported until a native commit gave the apply something
to copy. Now every apply but a full re-sync compares rows_version first: the CLI and the apply say the same."""

from __future__ import annotations

import time

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


@pytest.mark.slow  # a stream of its own: over 8 s beside the suite
def test_the_stream_refuses_the_same_way_at_the_next_native_commit(conn, dsn, settings, lh):
    """The stream asks for an apply when a native commit is due (a caught-up dataset is not asked again): at that
    commit its apply is refused with the CLI's line, backed off, nothing written."""
    from lakehouse_dagster.mirror.reverse import position
    from lakehouse_dagster.mirror.stream import ReverseFailed

    from .test_mirror_stream import Stream
    from .test_reverse_driver import _wait_position

    d = ready_native(conn, dsn, settings, lh, "sync.append")
    snap = native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    with Stream(settings.replace(mirror={"retry_failed_after_seconds": 60}), dsn) as s:
        _wait_position(conn, d, snap)
        datasets.insert_rows(conn, d, [row(50)])  # the live app's raw write
        kept = _pg_rows(conn, d)
        native_write(conn, dsn, settings, d, "sync.append", [row(7)], start=7)
        t0 = time.time()
        while not (failed := [e for e in s.events if isinstance(e, ReverseFailed)]):
            assert time.time() - t0 < 30, "the stream yielded no refusal"
            time.sleep(0.05)
    (first,) = failed
    assert first.dataset_id == d and first.error.startswith("PostgresWritten: refused: dataset"), first.error
    code, _, err = lh("reverse", "sync", "--dataset", str(d))
    assert code == 6 and err.strip().endswith(first.error.removeprefix("PostgresWritten: ")), (err, first.error)
    assert _pg_rows(conn, d) == kept and position(conn, d).snapshot_id == snap


def test_rows_the_forward_mirror_synced_before_a_re_flip_are_not_taken_for_a_raw_write(conn, dsn, settings, lh):
    """A writer rolled back to pg, a pg write while Postgres was the truth, the forward mirror's sync of it, the writer
    flipped native again: rows_version moved since the reverse's last apply, but every row Postgres holds is in
    Iceberg (the mirror's sync covered that rows_version). The reverse applies the next native commit; it refused
    ("those rows are not in Iceberg") until an operator forced a full re-sync."""
    from lakehouse_dagster.mirror.sync import sync_dataset

    from .native_helpers import runbook_ready
    from .test_reverse_mirror import _same_as_table

    d = ready_native(conn, dsn, settings, lh, "sync.append")
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(6)], start=6)
    assert apply_reverse(dsn, catalog, settings, d).how == "append"
    lh("write-flags", "set", "sync.append", "pg", "--dataset", str(d), check=True)
    datasets.insert_rows(conn, d, [row(60)])  # Postgres the truth: a plain write
    sync_dataset(dsn, catalog, settings, d)  # the forward mirror takes it into Iceberg
    runbook_ready(conn, dsn, settings, d)
    lh("write-flags", "set", "sync.append", "iceberg_native", "--dataset", str(d), check=True)
    native_write(conn, dsn, settings, d, "sync.append", [row(61)], start=61)
    assert apply_reverse(dsn, catalog, settings, d).how in ("append", "full")
    _same_as_table(conn, settings, dsn, d)
    # and a raw write after that is still refused
    datasets.insert_rows(conn, d, [row(70)])
    with pytest.raises(PostgresWritten):
        apply_reverse(dsn, catalog, settings, d)
