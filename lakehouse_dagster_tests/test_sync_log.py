"""The one definition of the latest succeeded sync, and datasets.mirrored_version following it."""

from __future__ import annotations

import uuid

from lakehouse_dagster.tracking import datasets
from lakehouse_dagster.tracking.sync_log import latest_succeeded

SCHEMA = [{"name": "n", "type": "int64"}]


def _log(conn, d, status, version, finished):
    sid = uuid.uuid4()
    conn.execute(
        "insert into iceberg_sync_log (dataset_id, sync_id, status, source_version, snapshot_id, finished_at)"
        " values (%s, %s, %s, %s, %s, now() + make_interval(secs => %s))",
        (d, sid, status, version, version * 10 if status == "succeeded" else None, finished),
    )
    return sid


def _mirrored(conn, d):
    return conn.execute("select mirrored_version from datasets where id = %s", (d,)).fetchone()[0]


def test_latest_succeeded_and_mirrored_version_follow_the_log(conn):
    ws = datasets.create_workspace(conn, "w")
    d, other = datasets.create_dataset(conn, ws, "d", SCHEMA), datasets.create_dataset(conn, ws, "o", SCHEMA)
    assert latest_succeeded(conn, d) is None and _mirrored(conn, d) is None
    _log(conn, d, "succeeded", 3, 1)
    second = _log(conn, d, "succeeded", 5, 2)
    _log(conn, d, "failed", 7, 3)  # a later failure does not move it
    _log(conn, other, "succeeded", 9, 4)
    got = latest_succeeded(conn, d)
    assert (got.sync_id, got.source_version, got.snapshot_id) == (second, 5, 50)
    assert _mirrored(conn, d) == 5 and _mirrored(conn, other) == 9
    # a step retry reuses the sync id: the row goes back to running, and that sync no longer counts
    conn.execute("update iceberg_sync_log set status = 'running', finished_at = null where sync_id = %s", (second,))
    assert latest_succeeded(conn, d).source_version == 3 and _mirrored(conn, d) == 3
    conn.execute("delete from iceberg_sync_log where dataset_id = %s", (d,))
    assert latest_succeeded(conn, d) is None and _mirrored(conn, d) is None


def test_behind_index_holds_only_datasets_behind(conn):
    ws = datasets.create_workspace(conn, "w")
    ids = [datasets.create_dataset(conn, ws, f"d{i}", SCHEMA) for i in range(3)]
    for d in ids:
        datasets.insert_rows(conn, d, [{"n": 1}])
    version = conn.execute("select rows_version from datasets where id = %s", (ids[0],)).fetchone()[0]
    _log(conn, ids[0], "succeeded", version, 1)
    conn.execute("set enable_seqscan = off")
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            "explain select id from datasets where kind = 'tabular' and coalesce(mirrored_version, -1) < rows_version"
        )
    )
    assert "datasets_mirror_behind_idx" in plan
    behind = {
        r[0]
        for r in conn.execute(
            "select id from datasets where kind = 'tabular' and coalesce(mirrored_version, -1) < rows_version"
        )
    }
    assert behind == set(ids[1:])
