"""POST /lakehouse/fallback (issue 33, item 10): a fallback an app's own router took (the runbooks' app keeps
lib/lakehouse/read-router.ts and asks GET /lakehouse/route), reported through the Python client, lands in the same
places as a fallback the in-process read router took — the soak's incidents, the service's metric, the dataset's
partition page (the recorder, read back through GraphQL) and the migration overview. Bad input writes nothing.
The server is test_service.py's (one real `lakehouse serve` process per module)."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from lakehouse_dagster.flags.incidents import FALLBACK, latest_incidents
from lakehouse_dagster.status.overview import compute_overview
from lakehouse_dagster.tracking import datasets

from . import test_service as service
from .conftest import pg_dagster_instance
from .test_partition_page_truth import _ui, page
from .test_recorder import Recorder
from .test_service import _break_table_files, _metric

world, client = service.world, service.client  # the fixtures of test_service.py's server, for this module
COUNTER = 'lakehouse_read_fallbacks_total{reader="export.stream"}'


def _fallbacks(world, d) -> list[tuple]:
    with world.conn() as conn:
        return conn.execute(
            "select reader, dataset_id, error, xid is not null from lakehouse_read_fallbacks where dataset_id = %s"
            " order by id",
            (d,),
        ).fetchall()


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_a_fallback_the_app_reports_shows_where_the_routers_own_do(world, client, pg_admin_dsn, tmp_path):
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    own = world.dataset(12, name="own-router")  # the service's read router falls back itself
    world.flag("export.stream", "iceberg", own)
    _break_table_files(world, own)
    assert client.read("export.stream", own).reason == "pg@fallback"
    app = world.dataset(12, name="app-router")  # the app's router fell back and says so
    world.flag("export.stream", "iceberg", app)
    before = _metric(client, COUNTER)

    got = client.fallback("export.stream", app, "ml-runner: connection reset reading s3://…/data/0001.parquet")
    assert (got["recorded"], got["reader"], got["dataset_id"], got["dataset_name"], got["mode"]) == (
        True,
        "export.stream",
        str(app),
        "app-router",
        "iceberg",
    )
    # the same row as the router's own (reader, dataset, error, a transaction id the recorder reads)
    (row,) = _fallbacks(world, app)
    assert row == ("export.stream", app, "ml-runner: connection reset reading s3://…/data/0001.parquet", True)
    assert [r[0] for r in _fallbacks(world, own)] == ["export.stream"] and _fallbacks(world, own)[0][3]
    # the metric, and the router's log line
    assert _metric(client, COUNTER) == before + 1
    assert f"[read-router] export.stream ds={app} iceberg read failed → PG fallback: ml-runner" in (
        world.server.log_text()
    )
    # the soak: an incident of that reader on that dataset, exactly like the router's own
    with world.conn() as conn:
        found = latest_incidents(conn, [own, app], since)
        ov = compute_overview(conn, world.settings)
    for d in (own, app):
        assert [(i.what, i.reader) for i in found[d]] == [(FALLBACK, "export.stream")], d
    assert "connection reset" in found[app][0].detail
    # the overview: both need attention for a read fallback, counted by reader
    listed = {a.dataset_id: a for a in ov.attention}
    for d in (own, app):
        assert "read fallback" in listed[d].problems
        assert listed[d].reason.startswith("export.stream fell back to Postgres 1 time(s) in the last 24 h")
    assert ov.fallbacks["export.stream"] >= 2 and ov.problems["read fallback"] >= 2
    # the partition page, after one recorder tick
    home = tmp_path / "dagster_home"
    home.mkdir()
    with pg_dagster_instance(pg_admin_dsn, home) as (instance, _):
        rec = Recorder(instance, world.dsn)
        for _ in range(20):  # the first ticks page through everything the module's server wrote so far
            if rec.tick() == []:
                break
        with _ui(instance) as ui:
            for d in (own, app):
                shown = page(ui, d)["latest_fallback"]
                assert shown.startswith("export.stream fell back to Postgres at "), shown
            assert page(ui, app)["latest_fallback"].endswith(
                ": ml-runner: connection reset reading s3://…/data/0001.parquet"
            )


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            {"reader": "export.streem", "dataset_id": "{app}", "reason": "x"},
            400,
            "unknown reader 'export.streem'",
        ),
        ({"reader": "export.stream", "dataset_id": "not-a-uuid", "reason": "x"}, 400, "dataset_id 'not-a-uuid' is not"),
        (
            {"reader": "export.stream", "dataset_id": "00000000-0000-4000-8000-000000000000", "reason": "x"},
            404,
            "dataset 00000000-0000-4000-8000-000000000000 does not exist",
        ),
        ({"reader": "sdk.files.list", "dataset_id": "{app}", "reason": "x"}, 400, "reader sdk.files.list never reads"),
        ({"reader": "export.stream", "dataset_id": "{app}", "reason": "  "}, 400, "'reason' is empty"),
        ({"reader": "export.stream", "dataset_id": "{app}"}, 400, "the fallback request needs 'reason'"),
        ({"reader": "export.stream", "dataset_id": "{app}", "reason": "x", "at": 1}, 400, "unknown field(s) 'at'"),
        ({"reader": "export.stream", "dataset_id": "{files}", "reason": "x"}, 400, "is a manifest dataset"),
    ],
)
def test_bad_fallback_reports_are_refused_in_one_line_and_write_nothing(world, body, status, message):
    with world.conn() as conn:
        files = datasets.create_dataset(conn, world.workspace, "files", [], kind="manifest")
    app = world.dataset(3, name="bad-reports")
    body = {k: (v.format(app=app, files=files) if isinstance(v, str) else v) for k, v in body.items()}
    resp = httpx.post(
        world.server.url + "/lakehouse/fallback",
        json=body,
        headers={"Authorization": f"Bearer {world.server.token}"},
        timeout=30,
    )
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert message in error and "\n" not in error, error
    with world.conn() as conn:
        assert (
            conn.execute(
                "select count(*) from lakehouse_read_fallbacks where dataset_id = any(%s)", ([app, files],)
            ).fetchone()[0]
            == 0
        )
