"""Maintained digests (parity/maintained.py) on a real Postgres and real Iceberg tables written by the
real mirror: per-file digests stored at write time or lazily, the Postgres sums kept by the triggers
through inserts, updates, deletes, concurrent writers and a fill racing them, the canary comparing
them (and agreeing with the full re-digest), divergences injected around the triggers, localisation
reading only the differing segments, and the mirror's parity check after a small append."""

from __future__ import annotations

import threading

import dagster as dg
import psycopg
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.parity import canary, maintained
from lakehouse_dagster.parity.digest import IcebergSide, pin_iceberg
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.testing.parity import grid_digest as _grid_digest
from lakehouse_dagster.testing.parity import pg_maintained, pg_reference
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.test_canary import (
    behind_the_mirrors_back,
    evaluate,
    make_dataset,
    rows_for,
    sync,
)


def spread_rows(conn, d, indexes, start=0):
    """Rows at chosen row indexes (several segments of the grid)."""
    rows = rows_for(len(indexes), start)
    for idx, row in zip(indexes, rows):
        datasets.insert_rows(conn, d, [row], start_index=idx)


# --- Iceberg: per data file ------------------------------------------------------------------------


def test_mirror_stores_a_digest_per_file_that_equals_the_full_duckdb_digest(conn, dsn, settings):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 1, 2, 70_000, 70_001, 200_000, 200_005])
    settings = settings.replace(
        sync={"chunk_rows": 3}, parity={"digest_on_write": True}
    )  # several files, segments spanning files
    sync(settings, dsn, d, mode="full")
    pin = pin_iceberg(load_catalog(settings, dsn), settings, d)
    columns = datasets.get_dataset(conn, d).columns
    stored = maintained.load_file_digests(conn, d, columns, pin.files)
    assert set(stored) == set(pin.files) and len(pin.files) == 3
    assert {
        r[0] for r in conn.execute("select computed_by from lakehouse_file_digests where dataset_id = %s", (d,))
    } == {"write"}
    segments, lo, hi = maintained.iceberg_segments(conn, pin, columns)
    assert (lo, hi) == (0, 200_005)
    with IcebergSide(pin, columns) as ice:
        assert segments == _grid_digest(ice, 0, 200_006)
        assert sorted(segments) == [0, 1, 3]
    assert segments == pg_reference(dsn, d)


def test_files_without_a_digest_are_digested_lazily_once(conn, dsn, settings):
    d = make_dataset(conn, 30)
    sync(settings.replace(parity={"digest_on_write": False}), dsn, d, mode="full")
    assert conn.execute("select count(*) from lakehouse_file_digests where dataset_id = %s", (d,)).fetchone()[0] == 0
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK and v.detail["digest"] == "maintained"
    assert v.detail["maintained_prepare"]["iceberg_files_digested"] == 1
    assert conn.execute("select computed_by from lakehouse_file_digests where dataset_id = %s", (d,)).fetchall() == [
        ("lazy",)
    ]
    again = evaluate(settings, dsn, d)
    assert again.verdict == canary.OK and again.detail["maintained_prepare"]["iceberg_files_digested"] == 0
    assert again.detail["maintained_prepare"]["postgres"] == "ready"


# --- Postgres: maintained by the triggers ----------------------------------------------------------


def test_triggers_keep_the_sums_through_inserts_updates_deletes(conn, dsn):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 1, 65_535, 65_536, 131_072])
    assert maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns) == "registered+filled"
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    datasets.insert_rows(conn, d, rows_for(50, 100), start_index=300_000)  # one multi-row statement, a new segment
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "changed"}\' where dataset_id = %s and row_index in (1, 65536, 300010)',
        (d,),
    )
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("update dataset_rows set row_index = row_index + 7 where dataset_id = %s and row_index = 65535", (d,))
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index >= 300020", (d,))
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("update dataset_rows set data = data where dataset_id = %s", (d,))  # no content change: no delta
    with conn.transaction():  # a rolled back write leaves nothing
        conn.execute("delete from dataset_rows where dataset_id = %s", (d,))
        raise psycopg.Rollback()
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("delete from dataset_rows where dataset_id = %s", (d,))
    assert pg_maintained(dsn, d) == {} == pg_reference(dsn, d)
    assert maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns) == "ready"


def retried(fn):
    # Two concurrent inserts into one dataset can deadlock in the change-tracking trigger (each holds
    # the FK's KEY SHARE lock on the datasets row and then asks FOR UPDATE): Postgres aborts one whole
    # transaction — its rows and its deltas together — and the writer retries, as the app would.
    for _ in range(20):
        try:
            return fn()
        except psycopg.errors.DeadlockDetected:
            continue
    raise AssertionError("still deadlocking after 20 attempts")


def app_writer(dsn, d, k: int, errors: list) -> None:
    """One app connection: 15 rounds of a 5-row insert, a one-row update and a one-row delete."""
    try:
        with connect(dsn) as c:
            for j in range(15):
                base = 10_000 + k * 1000 + j * 10
                retried(lambda: datasets.insert_rows(c, d, rows_for(5, base), start_index=base))
                retried(
                    lambda: c.execute(
                        "update dataset_rows set data = data || jsonb_build_object('i', %s::int) "
                        "where dataset_id = %s and row_index = %s",
                        (j, d, k * 100 + j),
                    )
                )
                retried(
                    lambda: c.execute(
                        "delete from dataset_rows where dataset_id = %s and row_index = %s", (d, base + 4)
                    )
                )
    except Exception as exc:  # noqa: BLE001
        errors.append(exc)


def test_concurrent_writers_and_a_fill_racing_them_lose_nothing(conn, dsn):
    d = make_dataset(conn, 2000)
    columns = datasets.get_dataset(conn, d).columns
    errors = []

    threads = [threading.Thread(target=app_writer, args=(dsn, d, k, errors)) for k in range(4)]
    for t in threads:
        t.start()
    outcomes = [maintained.ensure_pg(conn, d, columns)]  # registration and fill while the writers run
    for t in threads:
        t.join()
    assert not errors, str(errors[0])
    assert outcomes == ["registered+filled"]
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    removed = maintained.compact_pg(conn, d, after=1)
    assert removed > 0
    assert conn.execute(
        "select count(*) = count(distinct seg) from lakehouse_pg_digest_deltas where dataset_id = %s", (d,)
    ).fetchone()[0]
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_a_value_the_hash_cannot_type_never_fails_the_app_write_and_drops_the_registration(conn, dsn):
    d = make_dataset(conn, 5)
    maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns)
    datasets.insert_rows(conn, d, [{"i": "not a number"}])  # the app's write succeeds
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 6
    assert conn.execute("select count(*) from lakehouse_pg_digest_state where dataset_id = %s", (d,)).fetchone()[0] == 0


def test_a_schema_change_drops_the_registration_and_the_file_digests_are_not_reused(conn, dsn, settings):
    d = make_dataset(conn, 12)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).detail["digest"] == "maintained"
    conn.execute('update datasets set schema = schema || \'[{"name": "extra", "type": "int64"}]\' where id = %s', (d,))
    assert conn.execute("select count(*) from lakehouse_pg_digest_state where dataset_id = %s", (d,)).fetchone()[0] == 0
    sync(settings, dsn, d)
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK and v.detail["digest"] == "maintained"
    hashes = {r[0] for r in conn.execute("select schema_hash from lakehouse_file_digests where dataset_id = %s", (d,))}
    assert len(hashes) == 2  # the old schema's digests are kept apart, never summed under the new one


# --- the canary ------------------------------------------------------------------------------------


def test_canary_compares_maintained_sums_and_the_full_redigest_agrees(conn, dsn, settings):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 5, 70_000, 140_000])
    datasets.insert_rows(conn, d, rows_for(40, 7))
    sync(settings, dsn, d)
    inc = evaluate(settings, dsn, d)
    assert inc.verdict == canary.OK and inc.detail["digest"] == "maintained", inc.detail
    full = evaluate(settings, dsn, d, full=True)
    assert full.verdict == canary.OK and full.detail["digest"] == "full" and full.detail["maintained_agrees"] is True
    assert (inc.pg_count, inc.pg_digest) == (full.pg_count, full.pg_digest) == (full.iceberg_count, full.iceberg_digest)
    # an append, mirrored incrementally: the canary digests only the new file and reads no Postgres row
    datasets.insert_rows(conn, d, rows_for(10, 500))
    assert sync(settings, dsn, d).mode == "incremental"
    after = evaluate(settings, dsn, d)
    assert after.verdict == canary.OK and after.detail["digest"] == "maintained"
    assert after.detail["maintained_prepare"]["iceberg_files_digested"] == 1
    assert after.detail["maintained_prepare"]["postgres"] == "ready"
    assert after.pg_count == inc.pg_count + 10
    assert evaluate(settings, dsn, d, full=True).pg_digest == after.pg_digest


def test_replica_role_write_moves_no_version_but_the_maintained_sum_catches_it(conn, dsn, settings):
    d = make_dataset(conn, 0)
    spread_rows(conn, d, [0, 1, 2, 70_000, 70_001])
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).verdict == canary.OK
    version = conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    with conn.transaction():
        conn.execute("set local session_replication_role = replica")
        conn.execute(
            'update dataset_rows set data = data || \'{"s": "drift"}\' where dataset_id = %s and row_index = 70001',
            (d,),
        )
    assert conn.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0] == version
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.MISMATCH and v.detail["digest"] == "maintained"
    assert v.mismatched_row_indexes == [70_001]
    assert v.detail["localisation"]["queries"] == 1  # straight to the one differing segment's rows


def test_disabled_triggers_hide_a_change_from_the_maintained_sum_the_full_cross_check_catches_it(conn, dsn, settings):
    d = make_dataset(conn, 30)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).verdict == canary.OK
    behind_the_mirrors_back(
        conn, 'update dataset_rows set data = data || \'{"s": "x"}\' where dataset_id = %s and row_index = 17', (d,)
    )
    hidden = evaluate(settings, dsn, d)
    # Honest limit: with the triggers disabled by DDL the maintained Postgres sum is stale.
    assert hidden.verdict == canary.OK and hidden.detail["digest"] == "maintained"
    caught = evaluate(settings, dsn, d, full=True)
    assert caught.verdict == canary.MISMATCH and caught.mismatched_row_indexes == [17]
    assert caught.detail["maintained_stale"] == ["postgres"]
    # the stale sums were dropped: the next (maintained) canary fills them again from the rows
    again = evaluate(settings, dsn, d)
    assert again.detail["maintained_prepare"]["postgres"] == "registered+filled"
    assert (
        again.verdict == canary.MISMATCH
        and again.detail["digest"] == "maintained"
        and again.mismatched_row_indexes == [17]
    )


def test_stale_maintained_sums_never_give_a_verdict(conn, dsn, settings):
    """Maintained sums that disagree while the rows agree (a stale sum) fall back to the full digest."""
    d = make_dataset(conn, 20)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).verdict == canary.OK
    conn.execute("insert into lakehouse_pg_digest_deltas (dataset_id, seg, n, s) values (%s, 0, 0, 12345)", (d,))
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK and v.detail["digest"] == "full" and v.detail["maintained_stale"] == ["postgres"]
    assert evaluate(settings, dsn, d).detail["maintained_prepare"]["postgres"] == "registered+filled"


def test_scheduled_canary_does_a_full_redigest_every_nth_run(conn, dsn, settings):
    d = make_dataset(conn, 5)
    sync(settings, dsn, d)
    digests = []
    for _ in range(2 * canary.FULL_EVERY):
        full = canary.full_due(conn, d)
        v = evaluate(settings, dsn, d, full=full)
        auto_rollback.record_and_roll_back(conn, v, source="schedule")
        digests.append(v.detail["digest"])
    assert digests.count("full") == 2 and digests[canary.FULL_EVERY - 1] == "full"


# --- the mirror's parity check ---------------------------------------------------------------------


def test_the_mirrors_parity_check_after_a_small_append_reads_no_old_rows(conn, dsn, settings):
    from lakehouse_dagster.dagster.defs.parity.checks import parity
    from lakehouse_dagster_tests.test_parity_dagster import _evaluations, _materialize

    d = make_dataset(conn, 40)
    with dg.DagsterInstance.ephemeral() as instance:
        first = _evaluations(_materialize(instance, dsn, d, checks=(parity,)))["parity"]
        assert first.passed and first.metadata["detail"].value["digest"] == "maintained"
        datasets.insert_rows(conn, d, rows_for(3, 900))
        second = _evaluations(_materialize(instance, dsn, d, checks=(parity,)))["parity"]
    detail = second.metadata["detail"].value
    assert second.passed and detail["digest"] == "maintained"
    assert detail["maintained_prepare"]["postgres"] == "ready"
    assert detail["maintained_prepare"]["iceberg_files_digested"] == 1  # the appended file only
    assert second.metadata["pg_count"].value == 43


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_canary_job_full_when_tagged_and_every_nth_scheduled_run(conn, dsn, settings):
    from lakehouse_dagster.dagster.defs.parity.canary_schedule import PARTITION_TAG
    from lakehouse_dagster.dagster.defs.parity.checks import CANARY_TAG, FULL_TAG
    from lakehouse_dagster_tests.test_parity_dagster import _run_canary_job

    d = make_dataset(conn, 8)
    sync(settings, dsn, d)
    scheduled = {PARTITION_TAG: str(d), CANARY_TAG: "schedule"}
    with dg.DagsterInstance.ephemeral() as instance:
        ev, _ = _run_canary_job(instance, dsn, d, tags={PARTITION_TAG: str(d), FULL_TAG: "true"})
        assert ev["parity"].passed and ev["parity"].metadata["detail"].value["digest"] == "full"
        seen = [
            _run_canary_job(instance, dsn, d, tags=scheduled)[0]["parity"].metadata["detail"].value["digest"]
            for _ in range(canary.FULL_EVERY)
        ]
    assert seen == ["maintained"] * (canary.FULL_EVERY - 1) + ["full"]
