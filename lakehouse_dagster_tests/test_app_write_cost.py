"""Migration 020 (what the live app pays for its writes), on a real Postgres: the one-dataset fast path of
change tracking and the maintained digest through a per-expression row-hash function must record what
the 018/015 triggers recorded — statements over a registered and an unregistered dataset, statements too
large for the array path, a value the hash cannot type, a row-hash function that went missing — and
a transaction of many small writes must not pile up subtransaction XIDs."""

from __future__ import annotations

import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.parity import canary, maintained
from lakehouse_dagster.parity.errors import MaintainedDigestUnavailable
from lakehouse_dagster.schema.names import DIGEST_ARRAY_ROWS
from lakehouse_dagster.testing.parity import pg_maintained, pg_reference
from lakehouse_dagster.tracking import datasets
from lakehouse_dagster_tests.test_canary import evaluate, make_dataset, rows_for, sync


def _state(conn, d):
    return conn.execute(
        "select rows_version, rows_rewrite_version, max_row_index from datasets where id = %s", (d,)
    ).fetchone()


def _registered(conn, d) -> bool:
    return conn.execute("select count(*) from lakehouse_pg_digest_state where dataset_id = %s", (d,)).fetchone()[0] == 1


def _register(conn, d) -> None:
    assert maintained.ensure_pg(conn, d, datasets.get_dataset(conn, d).columns) == "registered+filled"


def _insert_both(conn, a, b, base: int, n: int = 3) -> None:
    """One statement writing n rows into each of two datasets."""
    rows = rows_for(2 * n, base)
    conn.execute(
        "insert into dataset_rows (dataset_id, row_index, data)"
        " select u.d, u.i, u.j from unnest(%s::uuid[], %s::bigint[], %s::jsonb[]) as u(d, i, j)",
        ([a] * n + [b] * n, [base + k for k in range(n)] * 2, [Jsonb(r) for r in rows]),
    )


def test_one_statement_over_a_registered_and_an_unregistered_dataset(conn, dsn):
    a = make_dataset(conn, 10, name="a")
    b = make_dataset(conn, 10, name="b")
    _register(conn, a)
    va, vb = _state(conn, a), _state(conn, b)

    _insert_both(conn, a, b, 100)  # an append to both: the several-datasets path of change tracking
    after_a, after_b = _state(conn, a), _state(conn, b)
    assert after_a[0] == after_b[0] > max(va[0], vb[0])  # one version for the statement, as before
    assert after_a[1:] == (va[1], 102) and after_b[1:] == (vb[1], 102)  # appends: no rewrite
    assert pg_maintained(dsn, a) == pg_reference(dsn, a)

    conn.execute(
        'update dataset_rows set data = data || \'{"s": "both"}\' where dataset_id = any(%s) and row_index in (1, 101)',
        ([a, b],),
    )
    assert pg_maintained(dsn, a) == pg_reference(dsn, a)
    ra, rb = _state(conn, a), _state(conn, b)
    assert ra[0] == ra[1] == rb[0] == rb[1] > after_a[0]  # a rewrite of both
    conn.execute("delete from dataset_rows where dataset_id = any(%s) and row_index >= 100", ([a, b],))
    assert pg_maintained(dsn, a) == pg_reference(dsn, a)
    assert _state(conn, a)[1] > ra[1] and _state(conn, b)[1] > rb[1]

    assert not _registered(conn, b)  # the unregistered dataset got no delta rows
    assert (
        conn.execute("select count(*) from lakehouse_pg_digest_deltas where dataset_id = %s", (b,)).fetchone()[0] == 0
    )


def test_one_dataset_fast_path_records_what_the_018_triggers_recorded(conn):
    d = make_dataset(conn, 5)
    v0 = _state(conn, d)
    datasets.insert_rows(conn, d, rows_for(2, 5), start_index=5)  # an append
    v1 = _state(conn, d)
    assert v1[0] > v0[0] and v1[1] == v0[1] and v1[2] == 6
    datasets.insert_rows(conn, d, rows_for(1, 9), start_index=2_000)  # a gap is still an append
    assert _state(conn, d)[1:] == (v0[1], 2_000)
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 1", (d,))
    v2 = _state(conn, d)
    assert v2[0] == v2[1] > v1[0] and v2[2] == 2_000  # a delete is a rewrite; the max stays (a high-water mark)
    datasets.insert_rows(conn, d, rows_for(1, 20), start_index=1)  # below the max: a rewrite
    v3 = _state(conn, d)
    assert v3[0] == v3[1] > v2[0]
    conn.execute("update dataset_rows set row_index = 5_000 where dataset_id = %s and row_index = 0", (d,))
    v4 = _state(conn, d)
    assert v4[0] == v4[1] > v3[0] and v4[2] == 5_000  # an update raises the max to the row it moved
    conn.execute("update dataset_rows set data = data where dataset_id = %s and row_index = -1", (d,))  # no rows
    assert _state(conn, d) == v4  # a statement that touched no row changes nothing, as before


def test_statements_larger_than_the_array_path_keep_the_sums_exact(conn, dsn):
    d = make_dataset(conn, 0)
    _register(conn, d)
    n = DIGEST_ARRAY_ROWS + 200
    datasets.insert_rows(conn, d, rows_for(n), start_index=65_000)  # crosses a segment boundary
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute('update dataset_rows set data = data || \'{"s": "big"}\' where dataset_id = %s', (d,))
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute(
        'update dataset_rows set data = data || \'{"s": "small"}\' where dataset_id = %s and row_index < 65_010', (d,)
    )
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index %% 3 = 0", (d,))
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)
    assert _registered(conn, d)


def test_datasets_of_one_schema_share_one_row_hash_function_and_a_schema_change_gets_another(conn):
    a = make_dataset(conn, 3, name="a")
    b = make_dataset(conn, 3, name="b")
    _register(conn, a)
    _register(conn, b)
    fns = [r[0] for r in conn.execute("select hash_fn from lakehouse_pg_digest_state order by dataset_id")]
    assert len(fns) == 2 and fns[0] == fns[1]
    assert conn.execute("select to_regproc(%s) is not null", (fns[0],)).fetchone()[0]
    conn.execute('update datasets set schema = schema || \'[{"name": "extra", "type": "int64"}]\' where id = %s', (b,))
    _register(conn, b)
    fb = conn.execute("select hash_fn from lakehouse_pg_digest_state where dataset_id = %s", (b,)).fetchone()[0]
    assert fb != fns[0] and conn.execute("select to_regproc(%s) is not null", (fb,)).fetchone()[0]


def test_a_missing_row_hash_function_drops_the_registration_visibly_never_the_write(conn, dsn, settings):
    d = make_dataset(conn, 12)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).detail["digest"] == "maintained"
    fn = conn.execute("select hash_fn from lakehouse_pg_digest_state where dataset_id = %s", (d,)).fetchone()[0]
    conn.execute(f'drop function "{fn}"')  # e.g. an operator's cleanup
    datasets.insert_rows(conn, d, rows_for(2, 12))  # the app's write succeeds
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 14
    assert not _registered(conn, d)  # dropped in the writing transaction: no stale sum can be read
    sync(settings, dsn, d)
    v = evaluate(settings, dsn, d)  # registers again (the function is created again) and fills
    assert v.verdict == canary.OK and v.detail["maintained_prepare"]["postgres"] == "registered+filled"
    assert v.detail["digest"] == "maintained"
    assert conn.execute("select to_regproc(%s) is not null", (fn,)).fetchone()[0]
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_a_value_the_hash_cannot_type_drops_the_registration_and_the_canary_refills_it(conn, dsn, settings):
    d = make_dataset(conn, 12)
    sync(settings, dsn, d)
    assert evaluate(settings, dsn, d).detail["digest"] == "maintained"
    datasets.insert_rows(conn, d, [{"i": "not a number"}])  # one row, the array path: the write succeeds
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 13
    assert not _registered(conn, d)
    with pytest.raises(MaintainedDigestUnavailable, match="not registered"):  # what makes the canary read every row
        maintained.pg_segments(conn, d, datasets.get_dataset(conn, d).columns)
    conn.execute("""update dataset_rows set data = data || '{"i": 7}' where dataset_id = %s and row_index = 12""", (d,))
    sync(settings, dsn, d)
    v = evaluate(settings, dsn, d)
    assert v.verdict == canary.OK and v.detail["maintained_prepare"]["postgres"] == "registered+filled"
    assert v.detail["digest"] == "maintained" and pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_many_small_writes_in_one_transaction_assign_no_subtransaction_xids(conn, dsn):
    """015's exception block wrote the delta rows inside its subtransaction, so every statement on a
    registered dataset assigned a subtransaction XID; past 64 in one transaction the backend's subxid
    cache overflows and every snapshot on the server gets slower (015 here: 64, overflowed). The 020
    block only reads."""
    if not conn.execute("select to_regproc('pg_stat_get_backend_subxact') is not null").fetchone()[0]:
        pytest.skip("pg_stat_get_backend_subxact needs PostgreSQL 16+")
    d = make_dataset(conn, 5)
    _register(conn, d)
    with connect(dsn, autocommit=False) as c:
        for k in range(70):
            datasets.insert_rows(c, d, rows_for(1, 100 + k), start_index=100 + k)
        c.execute(
            'update dataset_rows set data = data || \'{"s": "x"}\' where dataset_id = %s and row_index = 101', (d,)
        )
        c.execute("delete from dataset_rows where dataset_id = %s and row_index = 102", (d,))
        c.execute("select pg_stat_clear_snapshot()")
        subxids = c.execute(
            "select s.subxact_count, s.subxact_overflowed from pg_stat_get_backend_idset() b,"
            " pg_stat_get_backend_subxact(b) s where pg_stat_get_backend_pid(b) = pg_backend_pid()"
        ).fetchone()
        c.commit()
    assert subxids == (0, False)
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def test_a_registration_from_before_020_stays_exact_and_the_migration_gives_it_a_function(conn, dsn):
    from lakehouse_dagster.schema.migrate import apply_functions, migration_sql

    d = make_dataset(conn, 5)
    _register(conn, d)
    conn.execute("update lakehouse_pg_digest_state set hash_fn = null where dataset_id = %s", (d,))  # as 015 left it
    datasets.insert_rows(conn, d, rows_for(3, 5))  # the set-based path
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 1", (d,))
    assert _registered(conn, d) and pg_maintained(dsn, d) == pg_reference(dsn, d)
    conn.execute(migration_sql("020_app_write_cost"))  # re-runnable: fills hash_fn for registrations that lack one
    apply_functions(conn)  # and the current change tracking again (020 defines an older one)
    assert conn.execute(
        "select hash_fn is not null from lakehouse_pg_digest_state where dataset_id = %s", (d,)
    ).fetchone()[0]
    datasets.insert_rows(conn, d, rows_for(2, 8))
    assert pg_maintained(dsn, d) == pg_reference(dsn, d)


def _wait_until_blocked(conn, pid: int, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while conn.execute("select wait_event_type from pg_stat_activity where pid = %s", (pid,)).fetchone()[0] != "Lock":
        assert time.monotonic() < deadline, "the second writer never waited for the datasets row lock"
        time.sleep(0.01)


def test_an_append_that_waited_for_another_writer_draws_its_version_after_that_commit(conn, dsn):
    """023's one-statement append draws the version in its SET, before it meets the row lock. A writer
    that waits there must draw again once the holder commits (else the dataset's rows_version would move
    back): the holder here draws its own version only after the waiter's first draw."""
    import threading

    d = make_dataset(conn, 5)
    with connect(dsn, autocommit=False) as holder, connect(dsn, autocommit=False) as waiter:
        holder.execute("update datasets set updated_at = now() where id = %s", (d,))  # the app holds the row
        waiter_pid = waiter.execute("select pg_backend_pid()").fetchone()[0]
        done = threading.Event()

        def append_above() -> None:
            datasets.insert_rows(waiter, d, rows_for(1, 200), start_index=200)
            waiter.commit()
            done.set()

        t = threading.Thread(target=append_above)
        t.start()
        _wait_until_blocked(conn, waiter_pid)
        datasets.insert_rows(holder, d, rows_for(1, 100), start_index=100)  # an append too: the fast path
        held = holder.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        holder.commit()
        t.join(10)
        assert done.is_set()
    version, rewrite, mx = _state(conn, d)
    assert version > held  # the later commit carries the later version
    assert mx == 200 and rewrite == _state(conn, d)[1]
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 7


def test_an_append_that_another_writer_turned_into_a_rewrite_takes_the_full_path(conn, dsn):
    """The waiter's append test is evaluated again on the row the holder committed: rows above its own
    make it a rewrite (a row-range record, rows_rewrite_version = its version), as the 020 path decides."""
    import threading

    d = make_dataset(conn, 5)
    before = _state(conn, d)
    with connect(dsn, autocommit=False) as holder, connect(dsn, autocommit=False) as waiter:
        holder.execute("update datasets set updated_at = now() where id = %s", (d,))
        waiter_pid = waiter.execute("select pg_backend_pid()").fetchone()[0]
        t = threading.Thread(
            target=lambda: (datasets.insert_rows(waiter, d, rows_for(1, 100), start_index=100), waiter.commit())
        )
        t.start()
        _wait_until_blocked(conn, waiter_pid)
        datasets.insert_rows(holder, d, rows_for(1, 200), start_index=200)
        held = holder.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
        holder.commit()
        t.join(10)
    version, rewrite, mx = _state(conn, d)
    assert version == rewrite > held > before[0] and mx == 200
    assert conn.execute(
        "select min_idx, max_idx, prev_version from lakehouse_row_changes where dataset_id = %s and version = %s",
        (d, version),
    ).fetchall() == [(100, 100, before[1])]
