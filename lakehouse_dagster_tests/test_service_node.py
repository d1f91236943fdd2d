"""The TypeScript client (clients/typescript) under Node against a live `lakehouse serve`: its own `npm ci` from the
committed package-lock.json in a copy of the client, then `node --test` — routed reads, a structured read (issue 43:
where + aggregate from Iceberg and from Postgres, equal; a keyset page; a refusal), ingest, route, flags, fallbacks.
Skipped, saying why, without node or npm. Marked ``e2e`` (a server process and an npm install: tens of seconds)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.incidents import FALLBACK, latest_incidents
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.lake.catalog import load_catalog
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.testing.service import ServiceProcess, new_token
from lakehouse_dagster.tracking import datasets

CLIENT = Path(__file__).resolve().parents[1] / "clients" / "typescript"
SCHEMA = [{"name": "n", "type": "int64"}, {"name": "name", "type": "string"}]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        shutil.which("node") is None or shutil.which("npm") is None,
        reason="node and npm are needed to run the TypeScript client's tests (Node 20 or newer)",
    ),
]


def _dataset(conn, ws, name: str, rows: int):
    d = datasets.create_dataset(conn, ws, name, SCHEMA)
    datasets.insert_rows(conn, d, [{"n": i, "name": f"{name} {i} ✓"} for i in range(rows)])
    return d


def test_the_typescript_client_against_a_live_server(conn, dsn, settings: Settings, tmp_path):
    work = tmp_path / "client"
    shutil.copytree(CLIENT, work, ignore=shutil.ignore_patterns("node_modules"))
    installed = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=work, capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    ws = datasets.create_workspace(conn, "node")
    iceberg = _dataset(conn, ws, "iceberg", 2500)
    synced = sync_dataset(dsn, load_catalog(settings, dsn), settings, iceberg)
    set_override(conn, "read", "export.stream", "iceberg", dataset=iceberg, note="node", actor="pytest")
    postgres = _dataset(conn, ws, "postgres", 5)
    conn.execute("create table public.node_src (n bigint primary key, name text)")
    conn.execute("insert into public.node_src select g, 'src ' || g from generate_series(1, 9) g")
    ingest = datasets.create_dataset(conn, ws, "ingest", SCHEMA)
    set_source(conn, ingest, {"type": "postgres", "table": "public.node_src"})

    env = {k: v for k, v in os.environ.items() if k.startswith("LAKEHOUSE_")}
    env.update({"LAKEHOUSE_FLAG_TTL_SECONDS": "0", "LAKEHOUSE_API_BATCH_ROWS": "1000"})
    expect = {
        "iceberg": {
            "id": str(iceberg),
            "rows": 2500,
            "snapshot_id": str(synced.snapshot_id),
            "columns": ["__row_index", "__row_id", "__created_at", "n", "name"],
            "first_n": 0,
            "second_name": "iceberg 1 ✓",
        },
        "postgres": {"id": str(postgres), "first_rows": [{"n": i, "name": f"postgres {i} ✓"} for i in range(3)]},
        "ingest": {"id": str(ingest), "rows": 9},
    }
    with ServiceProcess(env, tmp_path / "serve.log", token=new_token()) as server:
        node_env = {
            **os.environ,
            "LAKEHOUSE_URL": server.url,
            "LAKEHOUSE_API_TOKEN": server.token,
            "LAKEHOUSE_TEST_EXPECT": json.dumps(expect),
        }
        ran = subprocess.run(
            ["node", "--test", "test/"], cwd=work, env=node_env, capture_output=True, text=True, timeout=300
        )
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    assert "# pass 8" in out and "# fail 0" in out and "# skipped 0" in out, out
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (ingest,)).fetchone()[0] == 9
    # the fallback node reported is the row the read router writes for its own (what the soak and pages read)
    fallbacks = conn.execute(
        "select reader, error from lakehouse_read_fallbacks where dataset_id = %s", (iceberg,)
    ).fetchall()
    assert fallbacks == [("graph.kuzu", "ml-runner: read timed out (reported by node)")]
    with conn.transaction():
        found = latest_incidents(conn, [iceberg], dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10))
    assert [(i.what, i.reader) for i in found[iceberg]] == [(FALLBACK, "graph.kuzu")]
    assert server.token not in server.log_text()
