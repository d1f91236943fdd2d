"""`lakehouse catalog migrate`: the datasets' tables moved from the SQL catalog to SeaweedFS's REST catalog (and back)
without rewriting a data file, per table under its lock (G3), resumable, each moved table verified by a canary.

The SQL catalog's warehouse is a plain bucket on SeaweedFS's S3 (the REST catalog serves its own table bucket), so
both catalogs read the same files; the test counts them."""

from __future__ import annotations

import json
import uuid

import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.catalog_copy import live_files
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "a", "type": "int64"}, {"name": "s", "type": "string"}]


@pytest.fixture
def sql_on_s3(settings, seaweed, monkeypatch) -> Settings:
    """The SQL catalog (the default) with its warehouse in a bucket of SeaweedFS's S3, and the REST catalog configured
    beside it (LAKEHOUSE_CATALOG_URI + credential) as an operator about to migrate has it."""
    import boto3

    bucket = f"sql-{uuid.uuid4().hex[:10]}"
    for k, v in {**seaweed.env, "LAKEHOUSE_CATALOG_TYPE": "sql", "LAKEHOUSE_WAREHOUSE": f"s3://{bucket}"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LAKEHOUSE_NAMESPACE", f"m_{uuid.uuid4().hex[:10]}")
    s3 = boto3.client(  # the keys given: boto3's default session keeps the first keys it found in this process
        "s3",
        endpoint_url=seaweed.s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=seaweed.key,
        aws_secret_access_key=seaweed.secret,
    )
    s3.create_bucket(Bucket=bucket)
    return Settings.from_env()


def _dataset(conn, ws, name: str, rows: int) -> uuid.UUID:
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"a": i, "s": f"{name} {i}"} for i in range(rows)])
    return d


def _json(lh, *args: str) -> dict:
    code, out, err = lh(*args, "--json")
    data = json.loads(out)
    data["exit"] = code
    return data


def _outcomes(data) -> dict[str, str]:
    return {d["dataset_id"]: d["outcome"] for d in data["datasets"]}


def test_migrate_to_rest_moves_every_table_untouched_resumes_and_the_way_back_catches_up(
    conn, dsn, sql_on_s3, seaweed, lh, monkeypatch
):
    ws = datasets.create_workspace(conn, "w")
    a, b, c = (_dataset(conn, ws, n, r) for n, r in (("a", 5), ("b", 7), ("c", 3)))
    never = _dataset(conn, ws, "never", 2)  # never mirrored: no table to move
    sql = load_catalog(sql_on_s3, dsn)
    # The tables' first snapshots were committed an hour ago: a REST server refuses a snapshot older than the table's
    # last update (less a minute), as Iceberg's own metadata builder does; the replay must not send it as it was.
    import time as real_time
    import types

    import pyiceberg.table.snapshots

    with monkeypatch.context() as past:
        past.setattr(pyiceberg.table.snapshots, "time", types.SimpleNamespace(time=lambda: real_time.time() - 3600))
        for d in (a, b, c):
            sync_dataset(dsn, sql, sql_on_s3, d)
    datasets.insert_rows(conn, a, [{"a": 5, "s": "a 5"}], start_index=5)
    sync_dataset(dsn, sql, sql_on_s3, a)  # two snapshots, two data files
    files = {d: live_files(sql.load_table(table_identifier(sql_on_s3, d))) for d in (a, b, c)}
    rest_settings = sql_on_s3.replace(catalog={"type": "rest", "warehouse": seaweed.warehouse})
    rest = load_catalog(rest_settings, dsn)
    args = ("catalog", "migrate", "--to", "rest", "--how", "replay", "--warehouse", seaweed.warehouse)

    dry = _json(lh, *args, "--dry-run")
    assert _outcomes(dry) == {
        str(a): "would-create",
        str(b): "would-create",
        str(c): "would-create",
        str(never): "no-table",
    }
    assert all(load_table_or_none(rest, table_identifier(sql_on_s3, d)) is None for d in (a, b, c))

    # b is being written (a sync holds its lock): skipped as busy, the others move
    with connect(dsn) as holder, dataset_lock(holder, b):
        first = _json(lh, *args, "--lock-wait-seconds", "0.2")
    assert _outcomes(first) == {str(a): "moved", str(b): "busy", str(c): "moved", str(never): "no-table"}
    assert first["exit"] == 1  # something is left: run it again
    by_id = {x["dataset_id"]: x for x in first["datasets"]}
    assert (by_id[str(a)]["snapshots"], by_id[str(a)]["files"], by_id[str(a)]["verdict"]) == (2, 2, "ok")
    for d in (a, c):
        moved = rest.load_table(table_identifier(sql_on_s3, d))
        assert moved.metadata_location.startswith(seaweed.warehouse + "/")  # the REST catalog's own metadata
        assert live_files(moved) == files[d]  # the very same data files: nothing rewritten, nothing copied
        assert all(f.startswith(sql_on_s3.catalog.warehouse + "/") for f in files[d])

    # the source goes on meanwhile (no downtime): the next run catches a up, moves b, leaves c
    datasets.set_schema(conn, a, [*SCHEMA, {"name": "x", "type": "float64"}])  # a new column: a new schema too
    datasets.insert_rows(conn, a, [{"a": 6, "s": "a 6", "x": 0.5}], start_index=6)
    sync_dataset(dsn, sql, sql_on_s3, a)
    again = _json(lh, *args, "--workers", "3")  # tables at once: the same outcomes
    assert _outcomes(again) == {str(a): "caught-up", str(b): "moved", str(c): "already", str(never): "no-table"}
    assert again["exit"] == 0
    rest_a, sql_a = rest.load_table(table_identifier(sql_on_s3, a)), sql.load_table(table_identifier(sql_on_s3, a))
    assert live_files(rest_a) == live_files(sql_a) and rest_a.schema().fields == sql_a.schema().fields
    assert "x" in rest_a.schema().column_names

    # the cutover: the processes now use the REST catalog; a sync commits there, the canary agrees
    for k, v in {"LAKEHOUSE_CATALOG_TYPE": "rest", "LAKEHOUSE_WAREHOUSE": seaweed.warehouse}.items():
        monkeypatch.setenv(k, v)
    datasets.insert_rows(conn, c, [{"a": 3, "s": "c 3"}], start_index=3)
    assert sync_dataset(dsn, rest, rest_settings, c).mode == "incremental"
    assert evaluate(dsn, rest, rest_settings, c).verdict == "ok"
    assert sql.load_table(table_identifier(sql_on_s3, c)).scan().to_arrow().num_rows == 3  # the SQL table stayed

    # the way back: --to sql catches the SQL table up with what was committed on REST
    back = _json(lh, "catalog", "migrate", "--to", "sql", "--how", "replay", "--warehouse", sql_on_s3.catalog.warehouse)
    # (a and b take only the property SeaweedFS added, schema.name-mapping.default: no snapshot)
    assert _outcomes(back) == {str(a): "caught-up", str(b): "caught-up", str(c): "caught-up", str(never): "no-table"}
    assert {x["dataset_id"]: x["snapshots"] for x in back["datasets"]} == {
        str(a): 0,
        str(b): 0,
        str(c): 1,
        str(never): 0,
    }
    sql_c = sql.load_table(table_identifier(sql_on_s3, c))
    assert sql_c.scan().to_arrow().num_rows == 4
    assert evaluate(dsn, sql, sql_on_s3, c).verdict == "ok"


def test_register_on_seaweedfs_is_refused_and_leaves_nothing_in_the_target(conn, dsn, sql_on_s3, seaweed, lh):
    """SeaweedFS 4.48 takes only a metadata file inside its table bucket, and serves empty metadata for one it did not
    write: the move is refused in one line and no table is left half-made in the REST catalog."""
    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "a", 3)
    sync_dataset(dsn, load_catalog(sql_on_s3, dsn), sql_on_s3, d)
    out = _json(lh, "catalog", "migrate", "--to", "rest", "--warehouse", seaweed.warehouse)
    [moved] = out["datasets"]
    assert moved["outcome"] == "failed" and out["exit"] == 1
    assert "\n" not in moved["detail"] and moved["detail"]
    rest = load_catalog(sql_on_s3.replace(catalog={"type": "rest", "warehouse": seaweed.warehouse}), dsn)
    assert load_table_or_none(rest, table_identifier(sql_on_s3, d)) is None


def test_migrate_needs_the_rest_catalog_configured(conn, dsn, settings, lh, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_CATALOG_URI", raising=False)
    code, _, err = lh("catalog", "migrate", "--to", "rest", "--dry-run")
    assert code == 2 and "LAKEHOUSE_CATALOG_URI" in err and err.count("\n") == 1


def test_the_job_moves_the_tables_as_the_cli_does(conn, dsn, sql_on_s3, seaweed):
    import dagster as dg

    from lakehouse_dagster.dagster.defs.resources import LakehouseResource
    from lakehouse_dagster.dagster.defs.runbooks.catalog import catalog_migrate_job

    ws = datasets.create_workspace(conn, "w")
    d = _dataset(conn, ws, "a", 3)
    sync_dataset(dsn, load_catalog(sql_on_s3, dsn), sql_on_s3, d)
    config = {"to": "rest", "how": "replay", "warehouse": seaweed.warehouse}
    with dg.DagsterInstance.ephemeral() as instance:
        result = catalog_migrate_job.execute_in_process(
            run_config={"ops": {"catalog_migrate_op": {"config": config}}},
            resources={"lakehouse": LakehouseResource(pg_dsn=dsn)},
            instance=instance,
        )
    assert result.success
    assert [m["outcome"] for m in result.output_for_node("catalog_migrate_op")] == ["moved"]
    rest = load_catalog(sql_on_s3.replace(catalog={"type": "rest", "warehouse": seaweed.warehouse}), dsn)
    assert rest.load_table(table_identifier(sql_on_s3, d)).scan().to_arrow().num_rows == 3
