"""G2/G3 across database sessions, and the `lakehouse sync` command as an operator runs it."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import Backpressure
from lakehouse_dagster.core.guards import admission_slot, dataset_lock
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.cli import run_cli
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "n", "type": "int64"}]


def _dataset(conn, rows=1000):
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, "d", SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i} for i in range(rows)])
    return d


@pytest.mark.slow  # over 8 s beside the suite (docs/benchmarks.md, The suite)
def test_g2_refuses_past_the_admission_bound_and_writes_nothing(conn, dsn, settings):
    d = _dataset(conn)
    with connect(dsn) as other, admission_slot(other, 1):
        with pytest.raises(Backpressure, match="ingest slots are busy"):
            sync_dataset(dsn, load_catalog(settings, dsn), settings.replace(sync={"max_concurrent": 1}), d)
    assert conn.execute("select count(*) from iceberg_sync_log").fetchone()[0] == 0
    # with the slot free again the same call goes through
    r = sync_dataset(dsn, load_catalog(settings, dsn), settings.replace(sync={"max_concurrent": 1}), d)
    assert r.total_rows == 1000


def test_g3_same_dataset_syncs_serialise(conn, dsn, settings):
    d = _dataset(conn)
    catalog = load_catalog(settings, dsn)
    order: list[str] = []
    with connect(dsn) as holder:
        with dataset_lock(holder, d):
            t = threading.Thread(target=lambda: order.append(sync_dataset(dsn, catalog, settings, d).mode))
            t.start()
            t.join(1.5)
            assert t.is_alive(), "a second sync of the same dataset must wait for the first"
            order.append("holder released")
        t.join(60)
    assert order == ["holder released", "full"]


def test_concurrent_full_syncs_of_one_dataset_both_succeed(conn, dsn, settings):
    d = _dataset(conn, 5000)
    catalog = load_catalog(settings, dsn)
    errors, modes = [], []

    def run():
        try:
            modes.append(sync_dataset(dsn, catalog, settings, d, mode="full").mode)
        except Exception as exc:  # pragma: no cover - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert errors == [] and modes == ["full"] * 3
    table = catalog.load_table(table_identifier(settings, d))
    assert table.scan().to_arrow().num_rows == 5000  # never doubled


def _cli(*args):
    return run_cli(*args)  # in-process (testing/cli.py), as a subprocess would see it


def test_cli_sync_json_and_refusals(conn, dsn, settings):
    d = _dataset(conn, 10)
    out = _cli("sync", "--dataset", str(d), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["syncs"][0]["dataset_id"] == str(d) and data["syncs"][0]["total_rows"] == 10
    again = _cli("sync", "--dataset", str(d))
    assert again.returncode == 0 and "noop" in again.stdout

    bad = _cli("sync", "--dataset", "12345")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a valid UUID" in bad.stderr
    missing = _cli("sync", "--dataset", str(uuid.uuid4()))
    assert missing.returncode == 3 and "does not exist" in missing.stderr
    usage = _cli("sync")
    assert usage.returncode == 2 and "--dataset" in usage.stderr
    assert conn.execute("select count(*) from iceberg_sync_log").fetchone()[0] == 2


def test_mirror_refuses_a_dataset_written_iceberg_native(conn, dsn, settings):
    from lakehouse_dagster.core.errors import BadInput
    from lakehouse_dagster.flags import set_override

    d = _dataset(conn, 10)
    first = sync_dataset(dsn, load_catalog(settings, dsn), settings, d)
    set_override(conn, "write", "sync.append", "iceberg_native", dataset=str(d), actor="pytest")
    datasets.insert_rows(conn, d, [{"n": 99}])
    with pytest.raises(BadInput, match="iceberg-native"):
        sync_dataset(dsn, load_catalog(settings, dsn), settings, d, mode="full")
    table = load_catalog(settings, dsn).load_table(table_identifier(settings, d))
    assert table.current_snapshot().snapshot_id == first.snapshot_id
    assert conn.execute("select count(*) from iceberg_sync_log where dataset_id = %s", (d,)).fetchone()[0] == 1
