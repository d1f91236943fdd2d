"""The production topology of deploy/, as separate processes on this machine: `dagster instance migrate` first, then a
code server (`dagster code-server start`), `dagster-webserver` and `dagster-daemon`, all from deploy/dagster.yaml and
deploy/workspace.yaml, with Dagster's stock DefaultRunLauncher and a bare ``postgresql://`` DAGSTER_PG_URL, and the
settings' defaults (the mirror streams). An append to a dataset reaches its Iceberg table through the mirror_stream run
the poller started, and GraphQL shows that run alive (STARTED, its shard's heartbeat fresh) and the partition's
materialization it logged. (The dataset is mirrored once in the test's own process before the
topology starts, so the one change the topology mirrors is the append: it keeps the test short.)

Every process this test started is swept at the end, even on failure (each in its own session; anything else with
this test's DAGSTER_HOME, e.g. a run worker, too). On a failure the tail of each process's log is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
import psycopg
import pytest
import yaml
from psycopg import sql

from lakehouse_dagster.cli.dsn import conninfo_to_url
from lakehouse_dagster.dagster.code_server import KILL_AFTER_S
from lakehouse_dagster.lake.catalog import load_catalog, table_identifier
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.testing.pg import with_db
from lakehouse_dagster.tracking import datasets

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
LOCATION = "lakehouse_dagster"
SCHEMA = [{"name": "n", "type": "int64"}, {"name": "s", "type": "string"}]
TERMINAL = {"SUCCESS", "FAILURE", "CANCELED"}
STOP_WITHIN_S = 10  # issue 44: each process of the topology stops within 10 s of SIGTERM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exe(name: str) -> list[str]:
    path = BIN / name
    if path.exists():
        return [str(path)]
    return [sys.executable, "-m", {"dagster": "dagster", "dagster-webserver": "dagster_webserver"}.get(name, name)]


# ---------------------------------------------------------------------------------------------------------
# the files themselves


def test_deploy_dagster_yaml_is_the_repositorys_minus_the_warm_launcher():
    repo = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    deploy = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    assert "WarmRunLauncher" in json.dumps(repo["run_launcher"])
    assert "run_launcher" not in deploy  # Dagster's DefaultRunLauncher
    assert {k: v for k, v in repo.items() if k != "run_launcher"} == deploy
    assert deploy["storage"]["custom"]["config"] == {"postgres_url": {"env": "DAGSTER_PG_URL"}}

    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    (entry,) = workspace["load_from"]
    assert entry["grpc_server"]["location_name"] == LOCATION

    # the Dockerfile serves the module the repository's workspace.yaml loads
    module = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"][0]["python_module"]["module_name"]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in dockerfile
    assert f'"-m", "{module}"' in dockerfile and '"--location-name", "lakehouse_dagster"' in dockerfile
    # the code server under the wrapper that passes a SIGTERM on to its runs (dagster/code_server.py)
    assert '"python", "-m", "lakehouse_dagster.dagster.code_server"' in dockerfile
    helm = yaml.safe_load((DEPLOY / "helm-values.yaml").read_text())
    (user,) = helm["dagster-user-deployments"]["deployments"]
    assert user["dagsterApiGrpcArgs"][:2] == ["-m", module] and user["port"] == 4000
    assert user["envSecrets"] == [{"name": "lakehouse-env"}]
    assert helm["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"
    limits = helm["concurrency"]["runs"]["tagConcurrencyLimits"]
    assert {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert helm["concurrency"]["runs"]["maxConcurrentRuns"] == deploy["concurrency"]["runs"]["max_concurrent_runs"]


# ---------------------------------------------------------------------------------------------------------
# the topology


class Topology:
    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp = tmp
        self.home = tmp / "dagster_home"
        self.home.mkdir()
        shutil.copyfile(DEPLOY / "dagster.yaml", self.home / "dagster.yaml")
        self.code_port = _free_port()
        self.web_port = _free_port()
        self.url = f"http://127.0.0.1:{self.web_port}"
        self.env = {
            **env,
            "DAGSTER_HOME": str(self.home),
            "DAGSTER_CODE_SERVER_HOST": "127.0.0.1",
            "DAGSTER_CODE_SERVER_PORT": str(self.code_port),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def run(self, name: str, argv: list[str], timeout: float) -> None:
        with open(self.log(name), "w") as out:
            done = subprocess.run(
                argv, env=self.env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
            )
        assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{self.tail(name)}"

    def start(self, name: str, argv: list[str]) -> None:
        with open(self.log(name), "w") as out:
            self.procs[name] = subprocess.Popen(
                argv, env=self.env, cwd=self.tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def tail(self, name: str, n: int = 40) -> str:
        path = self.log(name)
        lines = path.read_text(errors="replace").splitlines() if path.exists() else ["(no log)"]
        return "\n".join(lines[-n:])

    def diagnostics(self) -> str:
        parts = []
        for name in sorted({p.stem for p in self.tmp.glob("*.log")}):
            proc = self.procs.get(name)
            state = "" if proc is None else f" (exit {proc.returncode})" if proc.poll() is not None else " (running)"
            parts.append(f"----- {name}{state} -----\n{self.tail(name)}")
        return "\n".join(parts)

    def check_alive(self, what: str) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited {proc.returncode} while waiting for {what}\n{self.diagnostics()}")

    def wait(self, what: str, probe, timeout: float, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self.check_alive(what)
            try:
                ok, last = probe()
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:  # not listening yet
                ok, last = False, repr(exc)
            if ok:
                return last
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout} s waiting for {what}; last seen: {last}\n{self.diagnostics()}")

    def gql(self, query: str, variables: dict | None = None) -> dict:
        req = urllib.request.Request(
            self.url + "/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"GraphQL HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}\n{self.diagnostics()}")
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def own_processes(self) -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid == os.getpid():
                    continue
                if p.environ().get("DAGSTER_HOME") == str(self.home) and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return found

    def sweep(self) -> None:
        for proc in self.procs.values():  # a clean stop first: each is the leader of its own session
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        for p in self.own_processes():  # run workers or servers that left their group
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture
def dagster_url(pg_admin_dsn):
    """Dagster's own database on the test server, as a bare ``postgresql://`` URL."""
    name = f"dg_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = conninfo_to_url(with_db(pg_admin_dsn, name))
    assert url.startswith("postgresql://")
    yield url
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


@pytest.fixture
def topology(settings, dagster_url, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_")}
    env["DAGSTER_PG_URL"] = dagster_url
    env["LAKEHOUSE_SOAK_SECONDS"] = "0"
    env.pop("LAKEHOUSE_MIRROR_STREAM", None)  # the default, as deploy/ ships it: the mirror streams
    top = Topology(tmp_path, env)
    try:
        yield top
    finally:
        top.sweep()


WORKSPACE_Q = """
{ workspaceOrError { __typename
    ... on Workspace { locationEntries { name loadStatus
        locationOrLoadError { __typename ... on PythonError { message }
          ... on RepositoryLocation { name repositories { name sensors { name sensorState { status } } } } } } } } }
"""
DAEMONS_Q = """
{ instance { runLauncher { name } daemonHealth { allDaemonStatuses { daemonType required healthy } } } }
"""
MATERIALIZATIONS_Q = """
query($p: String!) { assetOrError(assetKey: {path: ["iceberg", "dataset_table"]}) { __typename
  ... on Asset { assetMaterializations(partitions: [$p], limit: 10) { runId partition timestamp
    metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }
"""
RUN_Q = """
query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId jobName status } } }
"""
FAILURES_Q = """
query($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection { events { __typename
  ... on ExecutionStepFailureEvent { error { message } } ... on RunFailureEvent { message } } } } }
"""


def _iceberg_rows(settings, dsn, dataset_id) -> list[int] | None:
    from lakehouse_dagster.lake.catalog import load_table_or_none

    table = load_table_or_none(load_catalog(settings, dsn), table_identifier(settings, dataset_id))
    return None if table is None else sorted(table.scan().to_arrow()["n"].to_pylist())


@pytest.mark.e2e
def test_the_production_topology_mirrors_a_change_visible_through_graphql(topology, settings, conn, dsn, monkeypatch):
    import dagster as dg

    t0 = time.monotonic()
    top = topology
    top.run("migrate", [*_exe("dagster"), "instance", "migrate"], timeout=120)
    monkeypatch.setenv("DAGSTER_PG_URL", top.env["DAGSTER_PG_URL"])
    with dg.DagsterInstance.from_config(str(top.home)) as inst:  # what the three processes will load
        assert type(inst.run_launcher).__name__ == "DefaultRunLauncher"
        assert type(inst.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert inst.run_monitoring_enabled
    with psycopg.connect(top.env["DAGSTER_PG_URL"]) as c:  # migrated: Dagster's tables exist before any process
        assert c.execute("select to_regclass('event_logs') is not null").fetchone()[0]

    ws = datasets.create_workspace(conn, "topology")
    ds = datasets.create_dataset(conn, ws, "clicks", SCHEMA)
    datasets.insert_rows(conn, ds, [{"n": k, "s": str(k)} for k in range(3)])
    sync_dataset(dsn, load_catalog(settings, dsn), settings, ds)
    assert _iceberg_rows(settings, dsn, ds) == [0, 1, 2]

    # the start order of docs/deploy.md: the code server (as the image runs it), and once it answers its health
    # check the webserver and the daemon, so neither meets an UNAVAILABLE code location
    top.start(
        "code-server",
        [sys.executable, "-m", "lakehouse_dagster.dagster.code_server", "-h", "127.0.0.1", "-p", str(top.code_port)]
        + ["-m", "lakehouse_dagster.dagster.definitions", "--location-name", LOCATION],
    )

    def code_server_serving():
        done = subprocess.run(
            [*_exe("dagster"), "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(top.code_port)],
            env=top.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return done.returncode == 0, done.stdout + done.stderr

    top.wait("the code server's health check", code_server_serving, 240, interval=2)
    workspace = str(DEPLOY / "workspace.yaml")
    top.start("webserver", [*_exe("dagster-webserver"), "-h", "127.0.0.1", "-p", str(top.web_port), "-w", workspace])
    top.start("daemon", [*_exe("dagster-daemon"), "run", "-w", workspace])

    def location_loaded():
        entries = top.gql(WORKSPACE_Q)["workspaceOrError"]["locationEntries"]
        return bool(entries) and entries[0]["loadStatus"] == "LOADED" and entries[0]["locationOrLoadError"][
            "__typename"
        ] == "RepositoryLocation", entries

    entries = top.wait("the code location to load through the code server", location_loaded, 240, interval=2)
    t_loaded = time.monotonic()
    assert [e["name"] for e in entries] == [LOCATION]
    sensors = {
        s["name"]: s["sensorState"]["status"] for s in entries[0]["locationOrLoadError"]["repositories"][0]["sensors"]
    }
    assert sensors["mirror_poller"] == "RUNNING"

    def daemons_healthy():
        inst = top.gql(DAEMONS_Q)["instance"]
        required = [d for d in inst["daemonHealth"]["allDaemonStatuses"] if d["required"]]
        return bool(required) and all(d["healthy"] for d in required), inst

    inst = top.wait("the daemon to be healthy", daemons_healthy, 90, interval=2)
    assert inst["runLauncher"]["name"] == "DefaultRunLauncher"

    # the poller starts the shard's stream run with the stock launcher (streaming is on by default); until it holds
    # the shard, batch runs would cover the dataset
    def stream_live():
        with psycopg.connect(dsn) as c:
            row = c.execute(
                "select run_id from lakehouse_mirror_streams where ended_at is null"
                " and heartbeat_at > now() - interval '5 seconds'"
            ).fetchone()
        return row is not None, row

    top.wait("the shard's stream run to hold its shard", stream_live, 240, interval=1)
    t_stream = time.monotonic()
    # an append to a dataset already mirrored (in this process, before: it keeps the test short) reaches Iceberg
    # through that stream run
    t_append = time.monotonic()
    datasets.insert_rows(conn, ds, [{"n": k, "s": str(k)} for k in range(3, 5)])
    top.wait(
        "the append in Iceberg",
        lambda: ((r := _iceberg_rows(settings, dsn, ds)) == list(range(5)), r),
        180,
    )
    append_to_iceberg = time.monotonic() - t_append

    # GraphQL: the partition's materializations, the last with the five rows, from a run that succeeded
    def materialized():
        asset = top.gql(MATERIALIZATIONS_Q, {"p": str(ds)})["assetOrError"]
        mats = asset.get("assetMaterializations") or []
        counts = [
            {m["label"]: m.get("intValue") for m in mat["metadataEntries"]}.get("dagster/row_count") for mat in mats
        ]
        return 5 in counts, mats

    mats = top.wait("the partition's materialization in GraphQL", materialized, 30)
    assert {m["partition"] for m in mats} == {str(ds)}
    latest = max(mats, key=lambda m: float(m["timestamp"]))
    assert {e["label"]: e.get("intValue") for e in latest["metadataEntries"]}["dagster/row_count"] == 5

    def run_state():  # a stream run lives on (STARTED) after its sync; a failed one would have ended
        run = top.gql(RUN_Q, {"id": latest["runId"]})["runOrError"]
        return run.get("status") in TERMINAL | {"STARTED"}, run

    run = top.wait("the mirror run's state", run_state, 60)
    if run["status"] not in ("STARTED", "SUCCESS"):
        events = top.gql(FAILURES_Q, {"id": run["runId"]})["logsForRun"].get("events", [])
        reasons = [
            e.get("error", {}).get("message") or e.get("message") for e in events if "Failure" in e["__typename"]
        ]
        pytest.fail(f"mirror run {run['runId']} ended {run['status']}: {reasons}\n{top.diagnostics()}")
    assert run["jobName"] == "mirror_stream", run
    with psycopg.connect(dsn) as c:
        live = c.execute(
            "select count(*) from lakehouse_mirror_streams where run_id = %s and ended_at is null"
            " and heartbeat_at > now() - interval '30 seconds'",
            (run["runId"],),
        ).fetchone()[0]
        assert live == 1, "the stream run holds its shard with a fresh heartbeat"
        assert (
            c.execute(
                "select count(*) from iceberg_sync_log where dataset_id = %s and status = 'succeeded'", (ds,)
            ).fetchone()[0]
            >= 2
        )
    print(
        f"topology: code location loaded after {t_loaded - t0:.1f} s; stream live after {t_stream - t0:.1f} s;"
        f" append -> Iceberg {append_to_iceberg:.1f} s;"
        f" all {time.monotonic() - t0:.1f} s"
    )

    # the stop procedure of docs/deploy.md: SIGTERM to each process alone (what a supervisor or a pod's termination
    # sends), the daemon first (no new run, no new tick), then the code server (its stream run hands its shard over),
    # then the webserver; each stops well within a pod's grace period (issue 44: the code server ignored SIGTERM
    # for over 70 s). The bound is generous: on a quiet machine each stop takes a second or two.
    stop_seconds = {}
    for name in ("daemon", "code-server", "webserver"):
        proc = top.procs[name]
        t_sigterm = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:  # longer than the code server's own SIGKILL deadline: a slow stop is reported with its time below
            proc.wait(KILL_AFTER_S + 15)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running {KILL_AFTER_S + 15} s after SIGTERM\n{top.diagnostics()}")
        stop_seconds[name] = round(time.monotonic() - t_sigterm, 1)
    print(f"topology: stopped after SIGTERM in {stop_seconds} s")
    assert all(s <= STOP_WITHIN_S for s in stop_seconds.values()), f"{stop_seconds}\n{top.diagnostics()}"
    assert not [p for p in top.own_processes() if p.status() != psutil.STATUS_ZOMBIE], "a run worker outlived them"
    with psycopg.connect(top.env["DAGSTER_PG_URL"]) as c:
        status = c.execute("select status from runs where run_id = %s", (run["runId"],)).fetchone()[0]
    assert status in ("SUCCESS", "CANCELED"), f"the stream run ended {status} on a normal stop"
    handed = [line for line in top.log("code-server").read_text(errors="replace").splitlines() if "handed over" in line]
    assert len(handed) == 1, top.tail("code-server", 80)  # the stream run's one line
    for name in ("webserver", "daemon"):  # started after the code server answered: no UNAVAILABLE traceback
        assert "UNAVAILABLE" not in top.log(name).read_text(errors="replace"), top.tail(name)
