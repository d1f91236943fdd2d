"""Schema, migrations and change tracking on a real Postgres."""

from __future__ import annotations

import pytest

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.schema.migrate import migrate
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "a", "type": "int64"}, {"name": "b", "type": "string"}]


def _version(conn, ds_id):
    return conn.execute(
        "select rows_version, rows_rewrite_version, max_row_index, rows_xid from datasets where id = %s", (ds_id,)
    ).fetchone()


def test_migrate_is_idempotent(conn):
    assert migrate(conn) == []  # the template already applied everything
    conn.execute("delete from lakehouse_migrations")
    assert len(migrate(conn)) >= 3  # every statement re-runs cleanly over existing objects


def test_append_bumps_version_but_not_rewrite(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    assert _version(conn, d)[:3] == (0, 0, -1)  # a new dataset is known empty (NULL would mean unknown)
    datasets.insert_rows(conn, d, [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    v1, rw1, mx1, xid1 = _version(conn, d)
    assert v1 > 0 and rw1 == 0 and mx1 == 1 and xid1 is not None
    datasets.insert_rows(conn, d, [{"a": 3, "b": "z"}])
    v2, rw2, mx2, _ = _version(conn, d)
    assert v2 > v1 and rw2 == 0 and mx2 == 2


def test_update_delete_and_backfill_count_as_rewrites(conn):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    other = datasets.create_dataset(conn, ws, "other", SCHEMA)
    datasets.insert_rows(conn, d, [{"a": i} for i in range(5)])
    datasets.insert_rows(conn, other, [{"a": 1}])
    before_other = _version(conn, other)
    conn.execute("update dataset_rows set data = '{\"a\": 9}' where dataset_id = %s and row_index = 2", (d,))
    v, rw, _, _ = _version(conn, d)
    assert rw == v
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 4", (d,))
    v2, rw2, mx, _ = _version(conn, d)
    assert rw2 == v2 > v and mx == 4
    datasets.insert_rows(conn, d, [{"a": 4}], start_index=4)  # fills a hole below max_row_index: not an append
    v3, rw3, _, _ = _version(conn, d)
    assert rw3 == v3 > v2
    assert _version(conn, other) == before_other  # untouched dataset did not move


def test_bad_schema_is_refused(conn):
    ws = datasets.create_workspace(conn, "w")
    with pytest.raises(BadInput, match="type 'decimal'"):
        datasets.create_dataset(conn, ws, "d", [{"name": "x", "type": "decimal"}])
    with pytest.raises(BadInput, match="reserved"):
        datasets.create_dataset(conn, ws, "d", [{"name": "__row_index", "type": "int64"}])
    assert conn.execute("select count(*) from datasets").fetchone()[0] == 0


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:s3cret@h:5432/db",
        "host=h password=s3cret dbname=db",
        "host=h password='s3 cret' dbname=db",
        "postgresql://u@h/db?password=s3cret&sslmode=require",
        "postgresql+psycopg://u:s3cret@h/db",
    ],
)
def test_redact_never_shows_the_password(dsn):
    from lakehouse_dagster.core.db import redact

    shown = redact(dsn)
    assert "s3" not in shown and "***" in shown and ("sslmode=require" in shown or "sslmode" not in dsn)


def test_concurrent_writers_never_move_a_version_backwards(conn, dsn):
    """A writer that starts while another holds the dataset must end with a larger version than the
    holder's last statement, even though it started first (a number drawn before the lock would lose)."""
    import threading

    from lakehouse_dagster.core.db import connect

    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    holder = connect(dsn, autocommit=False)
    waiter = connect(dsn, autocommit=False)
    holder.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 0, '{}')", (d,))
    done = threading.Event()

    def write():
        waiter.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 1, '{}')", (d,))
        waiter.commit()
        done.set()

    t = threading.Thread(target=write)
    t.start()
    assert not done.wait(1.0), "the second writer must wait for the datasets row lock"
    holder.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 2, '{}')", (d,))
    holder_version = holder.execute("select rows_version from datasets where id = %s", (d,)).fetchone()[0]
    holder.commit()
    t.join(30)
    assert done.is_set()
    assert _version(conn, d)[0] > holder_version
    holder.close()
    waiter.close()


def test_two_app_inserts_into_one_dataset_never_deadlock(conn, dsn):
    """An app statement holds KEY SHARE on the datasets row (its foreign-key check) before the change-tracking
    trigger locks it; a second writer in the same state must wait, not deadlock (it did with FOR UPDATE)."""
    import threading

    from lakehouse_dagster.core.db import connect

    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    first = connect(dsn, autocommit=False)
    second = connect(dsn, autocommit=False)
    # The first writer's FK check has run (KEY SHARE held), its trigger has not yet.
    first.execute("select 1 from datasets where id = %s for key share", (d,))
    errors: list[BaseException] = []

    def write():
        try:
            second.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 1, '{}')", (d,))
            second.commit()
        except BaseException as exc:  # a deadlock is reported to one of the two
            errors.append(exc)
            second.rollback()

    t = threading.Thread(target=write)
    t.start()
    t.join(2.0)  # past deadlock_timeout (1 s): a deadlock would have been detected by now
    try:
        first.execute("insert into dataset_rows (dataset_id, row_index, data) values (%s, 0, '{}')", (d,))
        first.commit()
    except BaseException as exc:
        errors.append(exc)
        first.rollback()
    t.join(30)
    assert not errors, errors
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 2
    assert _version(conn, d)[0] is not None
