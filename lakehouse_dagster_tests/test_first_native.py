"""The canary of a writer's first native sync: content columns for sync.full, the untouched prefix for
the appending writers. Real Postgres, real Iceberg, real digests in both engines."""

from __future__ import annotations

from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.runbooks.first_native_canary import evaluate_first_native

from .native_helpers import native_write, ready_native, row


def test_a_full_rewrite_of_the_same_rows_in_another_order_is_ok_on_content(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.full", rows=7)
    # same rows, reversed source order: every __row_index, __row_id and __created_at is new
    snap = native_write(conn, dsn, settings, d, "sync.full", [row(i) for i in reversed(range(7))], start=0)
    catalog = load_catalog(settings, dsn)
    v = evaluate_first_native(dsn, catalog, settings, d, "sync.full", snapshot_id=snap)
    assert (v.verdict, v.pg_count, v.iceberg_count, v.snapshot_id) == ("ok", 7, 7, snap)
    assert v.pg_digest == v.iceberg_digest and "content" in v.detail["compare"]
    # the canary of a native table says the same, plainly: identity-inclusive it differs by construction, so it
    # compares the content and names the identity assigned anew as expected
    detail = evaluate(dsn, catalog, settings, d).detail
    assert detail["agrees_with_postgres"] is True and detail["identity_assigned_anew"] is True
    assert "were assigned anew by the native write" in detail["reason"]


def test_a_changed_or_duplicated_row_is_a_mismatch(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.full", rows=5)
    catalog = load_catalog(settings, dsn)
    native_write(
        conn, dsn, settings, d, "sync.full", [row(0), row(1), {**row(2), "s": "changed"}, row(3), row(4)], start=0
    )
    v = evaluate_first_native(dsn, catalog, settings, d, "sync.full")
    assert v.verdict == "MISMATCH" and v.pg_count == v.iceberg_count == 5
    assert "differs from what Postgres held (content)" in v.detail["reason"]
    native_write(conn, dsn, settings, d, "sync.full", [row(0), row(1), row(2), row(3), row(4), row(4)], start=0)
    v = evaluate_first_native(dsn, catalog, settings, d, "sync.full")
    assert (v.verdict, v.iceberg_count) == ("MISMATCH", 6)


def test_an_append_leaves_the_rows_postgres_had_untouched(conn, dsn, settings):
    d = ready_native(conn, dsn, settings, "sync.append", rows=4)
    catalog = load_catalog(settings, dsn)
    native_write(conn, dsn, settings, d, "sync.append", [row(i) for i in range(4, 7)], start=4)
    v = evaluate_first_native(dsn, catalog, settings, d, "sync.append")
    assert (v.verdict, v.pg_count, v.detail["appended_rows"]) == ("ok", 4, 3)
    # an append that reuses row indexes Postgres already had is caught
    native_write(conn, dsn, settings, d, "sync.append", [row(9)], start=1)
    v = evaluate_first_native(dsn, catalog, settings, d, "sync.append")
    assert v.verdict == "MISMATCH" and "row_index 0..3" in v.detail["reason"]
