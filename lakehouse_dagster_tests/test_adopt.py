"""Adopting a live database: the app's tables exist in the foundation shape, with rows, before any of our
migrations ran (not created by migration 001). After `migrate` the app's writes still work and are
tracked, `lakehouse sync` of an adopted dataset succeeds, and one poller tick asks for every tabular
dataset, the empty one included."""

from __future__ import annotations

import json
import threading
import time
import uuid

import dagster as dg
import psycopg
import pytest
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.dagster.defs.mirror.sensors import mirror_poller
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.schema.migrate import FILL_MARK, fill_change_tracking, migrate
from lakehouse_dagster.testing.cli import run_cli
from lakehouse_dagster.testing.foundation import APP_INSERT_ROW, app_dataset, app_workspace, create_foundation
from lakehouse_dagster.testing.pg import with_db

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]


def _cli(*args):
    return run_cli(*args)  # in-process (testing/cli.py), as a subprocess would see it


@pytest.fixture
def adopted(pg_admin_dsn, tmp_path, monkeypatch):
    """A database holding only the foundation-shape app tables and their rows; env set for it."""
    name = f"a_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
    dsn = with_db(pg_admin_dsn, name)
    with connect(dsn) as conn:
        create_foundation(conn)
        ws = app_workspace(conn, "live")
        ids = {
            "full": app_dataset(conn, ws, "full", SCHEMA, rows=10),
            "sparse": app_dataset(conn, ws, "sparse", SCHEMA, rows=[0, 5, 10]),
            "empty": app_dataset(conn, ws, "empty", SCHEMA),
            "files": app_dataset(conn, ws, "files", [], kind="manifest", rows=3, row=lambda i: {"uri": f"s3://b/{i}"}),
        }
        conn.execute(
            "insert into pipelines (id, workspace_id, name, spec) values (%s, %s, 'p', %s)",
            (uuid.uuid4(), ws, Jsonb({"nodes": [{"type": "dataset", "data": {"datasetId": str(ids["full"])}}]})),
        )
    env = {
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_HOME": str(tmp_path / "home"),
        "LAKEHOUSE_WAREHOUSE": (tmp_path / "warehouse").as_uri(),
        "LAKEHOUSE_NAMESPACE": "lakehouse",
        "LAKEHOUSE_ACTOR": "pytest",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "warehouse").mkdir()
    yield dsn, ids
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("drop database if exists {} with (force)").format(psycopg.sql.Identifier(name)))


def _tracking(conn, d):
    return conn.execute(
        "select rows_version, rows_rewrite_version, max_row_index, rows_xid is not null from datasets where id = %s",
        (d,),
    ).fetchone()


def _migrate(how: str, dsn: str) -> str:
    """Migrate the adopted database; returns what was reported as applied."""
    if how == "cli":
        out = _cli("db", "migrate")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        return out.stdout
    with connect(dsn) as conn:
        return ", ".join(migrate(conn))


@pytest.mark.parametrize("how", ["python", "cli"])
def test_adopt_live_tables_then_app_writes_sync_and_poller(adopted, how):
    dsn, ids = adopted
    applied = _migrate(how, dsn)
    conn = connect(dsn)

    # (c) one tick of the real sensor asks for every tabular dataset, the empty one too, not the manifest
    with dg.DagsterInstance.ephemeral() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={"lakehouse": LakehouseResource(pg_dsn=dsn)})
        tick = mirror_poller(ctx)
    asked = sorted(d for r in tick.run_requests for d in r.run_config["ops"]["mirror_datasets"]["config"]["datasets"])
    assert asked == sorted(str(ids[k]) for k in ("full", "sparse", "empty"))

    # the fill ran after the DDL (and said so), stamping every dataset with its true max (-1: known empty)
    assert FILL_MARK in applied
    assert _tracking(conn, ids["sparse"])[2:] == (10, True)
    assert _tracking(conn, ids["empty"])[2:] == (-1, True)
    assert migrate(conn) == []  # idempotent, the fill included

    # (a) the live app's writes (foundation columns only) still work, and are tracked
    v0, rw0, _, _ = _tracking(conn, ids["sparse"])
    conn.execute(APP_INSERT_ROW, (ids["sparse"], 7, Jsonb({"n": 7})))  # below the max: not an append
    v1, rw1, mx1, _ = _tracking(conn, ids["sparse"])
    assert v1 > v0 and rw1 == v1 and mx1 == 10
    conn.execute(APP_INSERT_ROW, (ids["sparse"], 11, Jsonb({"n": 11})))  # above the max: an append
    v2, rw2, mx2, _ = _tracking(conn, ids["sparse"])
    assert v2 > v1 and rw2 == rw1 and mx2 == 11
    conn.execute(
        "update dataset_rows set data = %s where dataset_id = %s and row_index = 0",
        (Jsonb({"n": 100, "s": "upd"}), ids["full"]),
    )
    vf1, rwf1, _, _ = _tracking(conn, ids["full"])
    assert rwf1 == vf1 > 0
    conn.execute("delete from dataset_rows where dataset_id = %s and row_index = 9", (ids["full"],))
    vf2, rwf2, _, _ = _tracking(conn, ids["full"])
    assert rwf2 == vf2 > vf1
    conn.execute(
        "update datasets set schema = %s where id = %s",
        (Jsonb(SCHEMA + [{"name": "x", "type": "string"}]), ids["empty"]),
    )  # the app's own update

    # (b) `lakehouse sync` of an adopted dataset: a correct table, a succeeded log row, no traceback
    out = _cli("sync", "--dataset", str(ids["full"]), "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert json.loads(out.stdout)["syncs"][0]["total_rows"] == 9
    settings = Settings.from_env()
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, ids["full"]))
    got = sorted(zip(*table.scan().to_arrow().select(["__row_index", "n"]).to_pydict().values()))
    assert got == [(0, 100)] + [(i, i) for i in range(1, 9)]
    assert conn.execute(
        "select status, source_version, error from iceberg_sync_log where dataset_id = %s", (ids["full"],)
    ).fetchall() == [("succeeded", vf2, None)]
    assert conn.execute(
        "select row_count, status, mirrored_version from datasets where id = %s", (ids["full"],)
    ).fetchone() == (9, "ready", vf2)
    conn.close()


def test_an_unknown_max_row_index_never_passes_an_insert_as_an_append(adopted):
    """A dataset with rows whose max_row_index is NULL (not filled yet): the trigger does not trust -1."""
    dsn, ids = adopted
    with connect(dsn) as conn:
        migrate(conn)
        conn.execute("update datasets set max_row_index = null where id = %s", (ids["sparse"],))
        conn.execute(APP_INSERT_ROW, (ids["sparse"], 3, Jsonb({"n": 3})))
        v, rw, mx, _ = _tracking(conn, ids["sparse"])
        assert rw == v and mx == 10


def test_fill_is_resumable_and_never_lowers_a_concurrent_write(adopted):
    dsn, ids = adopted
    with connect(dsn) as conn:
        migrate(conn)
        # back to the state before the fill (as if it was interrupted), and forget it ran
        conn.execute(
            "update datasets set max_row_index = null, rows_xid = null, rows_version = 0, rows_rewrite_version = 0"
        )
        conn.execute("delete from lakehouse_migrations where name = %s", (FILL_MARK,))
        # the live app, mid-transaction on the dataset the fill reaches last: its trigger ran and holds the row
        held, free = max(ids["full"], ids["sparse"]), min(ids["full"], ids["sparse"])
        app = psycopg.connect(dsn)
        app.execute(APP_INSERT_ROW, (held, 50, Jsonb({"n": 50})))
        app_version = app.execute("select rows_version from datasets where id = %s", (held,)).fetchone()[0]
        done = {}
        filler = threading.Thread(target=lambda: done.setdefault("n", fill_change_tracking(connect(dsn))))
        filler.start()
        time.sleep(0.5)
        assert filler.is_alive()  # waits for the app's transaction, it does not overwrite it
        with psycopg.connect(dsn, autocommit=True) as other:  # ... and holds nothing the app needs meanwhile
            other.execute("set statement_timeout = '5s'")
            other.execute(APP_INSERT_ROW, (free, 20, Jsonb({"n": 20})))
        app.commit()
        app.close()
        filler.join(30)
        assert done["n"] == 3  # the three other datasets; the app's trigger had stamped `held`
        v, rw, mx, stamped = _tracking(conn, held)
        assert (v, mx, stamped) == (app_version, 50, True)
        assert _tracking(conn, free)[2:] == (20, True)
        # re-running changes nothing
        conn.execute("delete from lakehouse_migrations where name = %s", (FILL_MARK,))
        before = conn.execute("select id, rows_version, max_row_index from datasets order by id").fetchall()
        assert fill_change_tracking(conn) == 0
        assert conn.execute("select id, rows_version, max_row_index from datasets order by id").fetchall() == before
