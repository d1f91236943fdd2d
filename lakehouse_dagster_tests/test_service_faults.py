"""The service under faults, each with its own `lakehouse serve` process: SIGTERM with requests in flight (within
the bound, and past it), the request time bound (a held ingest answers 504 and still lands whole; a slow body 408;
a reader that stops reading is cut and its read freed), and a Postgres restart (/readyz fails, then the service
recovers without a restart of its own)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.schema.migrate import migrate
from lakehouse_dagster.sources import set_source
from lakehouse_dagster.testing.service import ServiceProcess, new_token
from lakehouse_dagster.tracking import datasets

pytestmark = pytest.mark.slow  # a lakehouse serve process per test, signals, a Postgres restart, a 24 s load run

SCHEMA = [{"name": "n", "type": "int64"}, {"name": "name", "type": "string"}]


def _env(dsn: str, root: Path, **extra: str) -> dict[str, str]:
    (root / "warehouse").mkdir(exist_ok=True)
    return {
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_HOME": str(root / "home"),
        "LAKEHOUSE_WAREHOUSE": (root / "warehouse").as_uri(),
        "LAKEHOUSE_NAMESPACE": "lakehouse",
        "LAKEHOUSE_FLAG_TTL_SECONDS": "0",
        "LAKEHOUSE_SOAK_SECONDS": "0",
        "LAKEHOUSE_API_BATCH_ROWS": "1000",
        **extra,
    }


def _sourced(conn, rows: int, slow_seconds: float = 0) -> uuid.UUID:
    table = f"src_{uuid.uuid4().hex[:10]}"
    conn.execute(f"create table public.{table} (n bigint primary key, name text)")
    conn.execute(f"insert into public.{table} select g, 'r' || g from generate_series(1, {rows}) g")
    ws = datasets.create_workspace(conn, "w")
    d = datasets.create_dataset(conn, ws, table, SCHEMA)
    query = f"select s.n, s.name from public.{table} s" + (f", pg_sleep({slow_seconds})" if slow_seconds else "")
    set_source(conn, d, {"type": "postgres", "query": query})
    return d


def _big(conn, rows: int) -> uuid.UUID:
    ws = datasets.create_workspace(conn, "big")
    d = datasets.create_dataset(conn, ws, "big", SCHEMA)
    conn.execute(
        "insert into dataset_rows (dataset_id, row_index, data) select %s, g,"
        " jsonb_build_object('n', g, 'name', repeat('ü', 150) || g) from generate_series(0, %s) g",
        (d, rows - 1),
    )
    return d


def _post(server: ServiceProcess, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(
        server.url + path, json=body, headers={"Authorization": f"Bearer {server.token}"}, timeout=120, **kw
    )


def _refuses_connections(server: ServiceProcess) -> bool:
    try:
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
        return False
    except OSError:
        return True


def _wait(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _sleeping_source(dsn: str) -> bool:
    with connect(dsn) as c:
        return c.execute(
            "select exists(select 1 from pg_stat_activity where query like '%pg_sleep%' and state = 'active'"
            " and pid <> pg_backend_pid())"
        ).fetchone()[0]


def test_sigterm_stops_accepting_and_finishes_the_requests_in_flight(dsn, conn, tmp_path):
    d_ingest = _sourced(conn, 25, slow_seconds=3)
    d_read = _big(conn, 60_000)
    server = ServiceProcess(
        _env(dsn, tmp_path), tmp_path / "serve.log", token=new_token(), args=("--graceful-seconds", "60")
    ).wait_ready()
    results: dict[str, object] = {}

    def ingest():
        results["ingest"] = _post(server, "/lakehouse/ingest", {"dataset_id": str(d_ingest), "writer": "sync.full"})

    def slow_read():
        rows = 0
        with httpx.stream(
            "POST",
            server.url + "/lakehouse/read",
            json={"reader": "export.stream", "dataset_id": str(d_read), "columns": ["n"]},
            headers={"Authorization": f"Bearer {server.token}", "Accept": "application/x-ndjson"},
            timeout=120,
        ) as resp:
            results["read_status"] = resp.status_code
            for _line in resp.iter_lines():
                rows += 1
                if rows % 10_000 == 0:
                    time.sleep(0.5)  # a slow consumer: the stream is still going when SIGTERM comes
        results["read_rows"] = rows

    threads = [threading.Thread(target=ingest), threading.Thread(target=slow_read)]
    [t.start() for t in threads]
    _wait(lambda: _sleeping_source(dsn) and "read_status" in results, "both requests to be in flight")
    server.proc.send_signal(signal.SIGTERM)
    _wait(lambda: _refuses_connections(server), "the listening socket to close", timeout=10)
    assert server.proc.poll() is None  # still finishing what it had
    [t.join(120) for t in threads]
    assert server.proc.wait(30) == 0
    ingest_resp = results["ingest"]
    assert isinstance(ingest_resp, httpx.Response) and ingest_resp.status_code == 200, ingest_resp
    assert ingest_resp.json()["rows"] == 25
    assert results["read_status"] == 200 and results["read_rows"] == 60_000
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d_ingest,)).fetchone()[0] == 25
    assert "stopped (SIGTERM)" in server.log_text()


def test_sigterm_past_the_bound_exits_and_names_the_ingest_it_cut(dsn, conn, tmp_path):
    d = _sourced(conn, 5)
    server = ServiceProcess(
        _env(dsn, tmp_path), tmp_path / "serve.log", token=new_token(), args=("--graceful-seconds", "2")
    ).wait_ready()
    with connect(dsn) as holder, dataset_lock(holder, d):  # the ingest waits for G3: it will not end in time
        t = threading.Thread(
            target=lambda: _post(server, "/lakehouse/ingest", {"dataset_id": str(d), "writer": "sync.full"})
        )
        t.start()
        _wait(lambda: "ds=" in json.dumps(_locks_waiting(dsn)), "the ingest to wait for the dataset lock")
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(30)  # a stop that hangs fails here; the log says the 2 s bound cut the ingest
    t.join(30)
    assert code == 1
    assert "1 ingest(s) still running past the 2 s bound are cut as by a crash" in server.log_text()
    assert f"sync.full ds={d}" in server.log_text()
    # it was waiting for G3: nothing was written or recorded
    assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 0
    assert conn.execute("select count(*) from iceberg_sync_log where dataset_id = %s", (d,)).fetchone()[0] == 0


def _locks_waiting(dsn: str) -> list:
    with connect(dsn) as c:
        waiting = c.execute("select count(*) from pg_locks where locktype = 'advisory' and not granted").fetchone()[0]
    return ["ds=waiting"] if waiting else []


def test_the_request_bound_504_for_a_held_ingest_408_for_a_slow_body_and_a_stalled_reader_cut(dsn, conn, tmp_path):
    d = _sourced(conn, 7)
    big = _big(conn, 60_000)
    server = ServiceProcess(
        _env(dsn, tmp_path, LAKEHOUSE_API_TIMEOUT_SECONDS="2"), tmp_path / "serve.log", token=new_token()
    ).wait_ready()
    try:
        with connect(dsn) as holder:
            with dataset_lock(holder, d):
                t0 = time.monotonic()
                resp = _post(server, "/lakehouse/ingest", {"dataset_id": str(d), "writer": "sync.full"})
                assert resp.status_code == 504 and 1.5 < time.monotonic() - t0  # waited its 2 s (the error says so)
                assert resp.json()["error"].startswith(f"ingest sync.full of dataset {d} is still running after 2 s")
            # the lock is free: the ingest goes on by itself and lands whole
            _wait(
                lambda: conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == 7,
                "the held ingest to finish on its own",
            )
        _wait(  # its log line comes just after the commit the wait above saw
            lambda: "finished after its request timed out: 7 rows via pg" in server.log_text(),
            "the held ingest's log line",
        )

        with socket.create_connection(("127.0.0.1", server.port)) as s:  # a body that never comes
            s.sendall(
                b"POST /lakehouse/read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {server.token}\r\n\r\n".encode()
                + b'{"reader":'
            )
            s.settimeout(10)
            answer = b""
            while b"}" not in answer:
                chunk = s.recv(4096)
                assert chunk, answer
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 2 s" in answer

        s = socket.create_connection(("127.0.0.1", server.port))  # a reader that stops reading
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw = json.dumps({"reader": "export.stream", "dataset_id": str(big)}).encode()
        s.sendall(
            b"POST /lakehouse/read HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {server.token}\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
            + raw
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        _wait(lambda: "the client read nothing for 2 s" in server.log_text(), "the stalled stream to be cut", 20)
        with connect(dsn) as c:
            held = c.execute(
                "select count(*) from pg_stat_activity where application_name = 'lakehouse-serve'"
                " and (state <> 'idle' or backend_xmin is not null)"
            ).fetchone()[0]
        assert held == 0  # freed while the stalled client still holds its socket open
        s.close()
    finally:
        server.stop()


def _pg(root: Path, verb: str) -> dict:
    """`lakehouse pg start|stop` in its own process (as an operator restarts the embedded server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    done = subprocess.run(
        [sys.executable, "-m", "lakehouse_dagster.cli.main", "pg", verb, "--json"],
        env={**env, "LAKEHOUSE_HOME": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def own_postgres():
    """A Postgres of this test's own, to restart."""
    root = Path(tempfile.mkdtemp(prefix="lh-restart-"))
    try:
        yield _pg(root, "start")["dsn"], root
    finally:
        _pg(root, "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_a_postgres_restart_fails_readyz_then_the_service_recovers_by_itself(own_postgres):
    dsn, root = own_postgres
    with connect(dsn) as conn:
        migrate(conn)
        d = _big(conn, 500)
    server = ServiceProcess(_env(dsn, root), root / "serve.log", token=new_token()).wait_ready()
    try:
        with server.client(retries=0) as client:
            assert client.ready()["postgres"] == "ok"
            assert client.read("export.stream", d).table.num_rows == 500
            assert _pg(root, "stop")["stopped"] is True
            down = httpx.get(server.url + "/readyz", headers={"Authorization": f"Bearer {server.token}"}, timeout=30)
            assert down.status_code == 503 and down.json()["postgres"].startswith("unreachable")
            assert down.json()["error"].startswith("not ready: postgres unreachable")
            failed = _post(server, "/lakehouse/read", {"reader": "export.stream", "dataset_id": str(d)})
            assert failed.status_code == 503 and failed.headers["retry-after"]
            assert failed.json()["error"].startswith("Postgres is unreachable")
            assert httpx.get(server.url + "/healthz").status_code == 200  # alive, not ready
            assert _pg(root, "start")["started"] is True
            _wait(
                lambda: (
                    httpx.get(
                        server.url + "/readyz", headers={"Authorization": f"Bearer {server.token}"}, timeout=30
                    ).status_code
                    == 200
                ),
                "readyz after the restart",
            )
            assert client.read("export.stream", d, order="row_index").table.column("n").to_pylist() == list(range(500))
            assert client.route("export.stream", d)["reason"] == "pg@off"
            assert "lakehouse_status_up 1.0" in client.metrics()
        assert server.proc.poll() is None  # the same process throughout
    finally:
        server.stop()


def test_the_python_client_raises_on_a_stream_cut_short_and_never_returns_fewer_rows(dsn, conn, tmp_path):
    d = _big(conn, 60_000)  # ~20 MB: far more than the socket buffers hold when the server dies
    server = ServiceProcess(_env(dsn, tmp_path), tmp_path / "serve.log", token=new_token()).wait_ready()
    try:
        with server.client() as client:
            assert client.read("export.stream", d, columns=["n"]).table.num_rows == 60_000  # whole when not cut
            got = 0
            with pytest.raises((OSError, ValueError, http.client.HTTPException)) as cut:
                with client.stream("export.stream", d) as s:
                    for batch in s:
                        got += batch.num_rows
                        if got == batch.num_rows:  # after the first batch, the service dies mid-stream
                            server.proc.kill()
                            server.proc.wait(30)
            assert 0 < got < 60_000, got
            assert "IncompleteRead" in repr(cut.value) or "incomplete" in str(cut.value).lower(), repr(cut.value)
    finally:
        server.stop()


def test_a_read_that_fails_mid_stream_is_cut_never_short_and_frees_its_read(dsn, conn, tmp_path):
    """A read that fails after the headers are out (its Postgres session killed) cuts the stream: no end marker, so
    the client raises instead of returning fewer rows; the cut is counted and logged; the service stays whole."""
    d = _big(conn, 60_000)  # 60 batches of 1,000 rows, ~20 MB: most of it is still unread when the read fails
    server = ServiceProcess(_env(dsn, tmp_path), tmp_path / "serve.log", token=new_token()).wait_ready()

    def cut_count() -> float:
        for line in client.metrics().splitlines():
            if line.startswith('lakehouse_read_streams_cut_total{why="read_failed"} '):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    try:
        with server.client() as client:
            before = cut_count()
            got = 0
            with pytest.raises((OSError, ValueError, http.client.HTTPException)) as cut:
                with client.stream("export.stream", d) as s:
                    for batch in s:
                        got += batch.num_rows
                        if got == batch.num_rows:  # the read's own Postgres session dies after the first batch
                            killed = conn.execute(
                                "select pg_terminate_backend(pid) from pg_stat_activity"
                                " where application_name = 'lakehouse-serve' and backend_xmin is not null"
                            ).fetchall()
                            assert killed == [(True,)], killed
            assert 0 < got < 60_000, got
            assert "IncompleteRead" in repr(cut.value) or "incomplete" in str(cut.value).lower(), repr(cut.value)
            _wait(lambda: f"read export.stream ds={d} from pg ended after" in server.log_text(), "the cut's log line")
            assert "the read failed mid-stream (" in server.log_text()
            assert cut_count() == before + 1
            # the broken connection is dropped, not handed to the next read: the same read, whole
            assert client.read("export.stream", d, columns=["n"]).table.num_rows == 60_000
    finally:
        server.stop()


def test_the_service_streams_on_jemalloc_unless_the_operator_names_a_pool(dsn, conn, tmp_path):
    """pyarrow's default pool (mimalloc) ran one export in four at half speed on a 2-core VM; the service chooses
    jemalloc (core/arrow_memory.py) and says so in its first line. An operator's ARROW_DEFAULT_MEMORY_POOL wins."""
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
        chosen = "jemalloc"
    except NotImplementedError:  # a pyarrow without jemalloc: the service keeps the default
        chosen = pa.default_memory_pool().backend_name
    d = _big(conn, 3_000)
    for extra, pool in (({}, chosen), ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "system")):
        root = tmp_path / (pool + str(len(extra)))
        root.mkdir()
        server = ServiceProcess(_env(dsn, root, **extra), root / "serve.log", token=new_token()).wait_ready()
        try:
            assert f"; Arrow memory: {pool}; " in server.log_text()
            with server.client() as client:
                assert client.read("export.stream", d, columns=["n"]).table.num_rows == 3_000
        finally:
            server.stop()


def _lock_waiters(dsn: str) -> int:
    with connect(dsn) as c:
        return c.execute(
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and pid <> pg_backend_pid()"
        ).fetchone()[0]


def test_a_retried_ingest_while_the_first_still_runs_is_refused_at_once_and_queues_nothing(dsn, conn, tmp_path):
    """The first ingest holds G3 past the request bound (504); retries of the same dataset are answered 409 at once
    with Retry-After — no thread, session or lock waiter queued behind it — and another dataset is still served."""
    d = _sourced(conn, 7, slow_seconds=8)
    other = _sourced(conn, 3)
    server = ServiceProcess(
        _env(dsn, tmp_path, LAKEHOUSE_API_TIMEOUT_SECONDS="2"), tmp_path / "serve.log", token=new_token()
    ).wait_ready()
    try:
        first = _post(server, "/lakehouse/ingest", {"dataset_id": str(d), "writer": "sync.full"})
        assert first.status_code == 504 and "is still running after 2 s" in first.json()["error"], first.text
        assert _sleeping_source(dsn)  # it started, and runs on
        for _ in range(3):
            retry = _post(server, "/lakehouse/ingest", {"dataset_id": str(d), "writer": "sync.full"})
            # answered at once: a 409 naming the running ingest, and nothing waits on the dataset's lock (no clock)
            assert retry.status_code == 409 and int(retry.headers["retry-after"]) >= 2, retry.text
            assert retry.json()["error"].startswith(f"ingest sync.full of dataset {d} has been running for ")
            assert _lock_waiters(dsn) == 0  # nothing waits on the dataset's G3 lock behind the running ingest
        assert _post(server, "/lakehouse/ingest", {"dataset_id": str(other), "writer": "sync.full"}).json()["rows"] == 3
        _wait(lambda: not _sleeping_source(dsn), "the first ingest to finish on its own", timeout=30)
        _wait(lambda: "finished after its request timed out: 7 rows via pg" in server.log_text(), "its log line")
        table = conn.execute("select name from datasets where id = %s", (d,)).fetchone()[0]
        set_source(conn, d, {"type": "postgres", "query": f"select s.n, s.name from public.{table} s"})  # fast now
        again = _post(server, "/lakehouse/ingest", {"dataset_id": str(d), "writer": "sync.full"})
        assert again.status_code == 200, again.text  # once it ended, the dataset takes ingests again
        assert conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0] == 7
        assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 7
    finally:
        server.stop()


def test_a_slot_is_held_until_the_work_it_admitted_ends_and_a_504_only_said_of_work_that_started():
    """``run_holding`` (service/slots.py): past the wait the thread runs on and keeps its slot; a request that got
    no slot in time never runs its work."""
    from lakehouse_dagster.service.slots import NOT_STARTED, RUNNING
    from lakehouse_dagster.service.slots import run_holding as _run_holding

    ran, late, ended = [], [], []
    release = threading.Event()

    def slow():
        ran.append("slow")
        release.wait(10)
        return "slow done"

    async def main():
        import anyio

        limiter = anyio.CapacityLimiter(1)
        first = await _run_holding(limiter, 0.2, slow, lambda v, e: late.append((v, e)), ended.append)
        assert first == (RUNNING, None) and limiter.borrowed_tokens == 1  # held past the request's wait
        second = await _run_holding(limiter, 0.2, lambda: ran.append("never"), lambda v, e: None, ended.append)
        assert second == (NOT_STARTED, None)
        release.set()
        with anyio.fail_after(10):
            while limiter.borrowed_tokens:
                await anyio.sleep(0.01)

    import anyio

    anyio.run(main)
    assert ran == ["slow"] and ended == [False, False]
    _wait(lambda: late == [("slow done", None)], "the late outcome", timeout=5)


def test_a_web_page_cannot_call_the_service_through_the_operators_browser(dsn, conn, tmp_path):
    """No token on loopback: a cross-origin simple POST (text/plain, an Origin), a body of no JSON type and a
    DNS-rebound Host are refused in one line and write nothing; the Python client still works."""
    d = _sourced(conn, 4)
    server = ServiceProcess(_env(dsn, tmp_path), tmp_path / "serve.log", token=None).wait_ready()
    body = json.dumps({"dataset_id": str(d), "writer": "sync.full"})
    url = server.url + "/lakehouse/ingest"
    try:
        page = httpx.post(
            url, content=body, headers={"Content-Type": "text/plain", "Origin": "http://evil.example"}, timeout=30
        )
        assert page.status_code == 403, page.text
        assert page.json()["error"].startswith("cross-origin request refused (Origin 'http://evil.example')")
        as_json = httpx.post(
            url, content=body, headers={"Content-Type": "application/json", "Origin": "null"}, timeout=30
        )
        assert as_json.status_code == 403  # a sandboxed frame's Origin too
        plain = httpx.post(url, content=body, headers={"Content-Type": "text/plain"}, timeout=30)
        assert plain.status_code == 415, plain.text
        assert plain.json()["error"] == (
            "POST /lakehouse/ingest takes a JSON body: send Content-Type: application/json (Content-Type 'text/plain')"
        )
        untyped = httpx.post(url, content=body.encode(), timeout=30)
        assert untyped.status_code == 415 and "(no Content-Type)" in untyped.json()["error"]
        rebound = httpx.post(
            url, content=body, headers={"Content-Type": "application/json", "Host": f"evil.example:{server.port}"}
        )
        assert rebound.status_code == 403, rebound.text
        assert rebound.json()["error"].startswith(f"Host 'evil.example:{server.port}' is not this service's address")
        site = httpx.get(server.url + "/readyz", headers={"Sec-Fetch-Site": "cross-site"}, timeout=30)
        assert site.status_code == 403
        assert conn.execute("select count(*) from iceberg_sync_log where dataset_id = %s", (d,)).fetchone()[0] == 0
        assert conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0] == 0
        with server.client() as client:  # a program on this machine: no Origin, JSON, Host 127.0.0.1
            assert client.ingest(d, "sync.full")["rows"] == 4
            assert client.ready()["postgres"] == "ok"
        local = httpx.get(f"http://localhost:{server.port}/readyz", timeout=30)
        assert local.status_code == 200, local.text
    finally:
        server.stop()


def test_readyz_and_metrics_answer_at_once_beside_routes_held_on_the_barrier(dsn, conn, tmp_path):
    """Capture mode after-commit: a STRICT route waits (up to 30 s) for the WAL consumer's lock. Ten of them fill
    the control threads; /readyz and /metrics have their own and still answer at once."""
    from lakehouse_dagster.tracking.capture import CONSUME_LOCK

    d = _big(conn, 5)
    conn.execute("update lakehouse_digest_capture set mode = 'after-commit'")
    server = ServiceProcess(_env(dsn, tmp_path), tmp_path / "serve.log", token=new_token()).wait_ready()
    auth = {"Authorization": f"Bearer {server.token}"}
    routes: list[int] = []

    def held_route() -> None:
        url = f"{server.url}/lakehouse/route?reader=studio.preview&dataset_id={d}"
        routes.append(httpx.get(url, headers=auth, timeout=90).status_code)

    try:
        with connect(dsn) as holder:
            holder.execute("select pg_advisory_lock(%s, %s)", CONSUME_LOCK)
            threads = [threading.Thread(target=held_route) for _ in range(10)]
            [t.start() for t in threads]
            _wait(lambda: _lock_waiters(dsn) >= 8, "the routes to wait on the barrier")
            for _ in range(3):
                # answered while the barrier is still held (released only below): neither waits on it, no clock
                ready = httpx.get(server.url + "/readyz", headers=auth, timeout=60)
                assert ready.status_code == 200, ready.text
                scraped = httpx.get(server.url + "/metrics", headers=auth, timeout=60)
                assert scraped.status_code == 200
                assert "lakehouse_status_up 1.0" in scraped.text
            assert routes == []  # the routes are still held
            holder.execute("select pg_advisory_unlock(%s, %s)", CONSUME_LOCK)
        [t.join(90) for t in threads]
        assert len(routes) == 10
    finally:
        server.stop()


def test_the_services_postgres_sessions_have_keepalives_and_a_statement_timeout_per_kind(dsn, settings):
    """Every session of ServiceDb: TCP keepalives and tcp_user_timeout (a silent peer found dead in about
    api_pg_dead_after_seconds), a statement timeout by kind of work (a stalled statement is cut); an ingest's DSN
    carries the keepalives (and still connects, through psycopg and ADBC alike)."""

    import adbc_driver_postgresql.dbapi as adbc
    import psycopg

    from lakehouse_dagster.core.db import adbc_uri
    from lakehouse_dagster.service.db import CONTROL, READ, ServiceDb

    tuned = settings.replace(
        service={"read_statement_seconds": 1.5, "control_statement_seconds": 7, "pg_dead_after_seconds": 12}
    )
    db = ServiceDb(dsn, tuned)
    try:
        with db.connection(READ) as c:
            assert c.execute("show statement_timeout").fetchone()[0] == "1500ms"
            params = c.info.get_parameters()
            assert (params["keepalives"], params["keepalives_idle"], params["keepalives_count"]) == ("1", "4", "3")
            assert params["tcp_user_timeout"] == "12000" and int(params["keepalives_interval"]) >= 1
            with pytest.raises(psycopg.errors.QueryCanceled):  # cut by the server (a 30 s sleep ends without error)
                c.execute("select pg_sleep(30)")  # a statement that stalls is cut by the server
        with db.connection(CONTROL) as c:
            assert c.execute("show statement_timeout").fetchone()[0] == "7s"
        assert db.resolver().conn.execute("show statement_timeout").fetchone()[0] == "7s"
        assert db.probe() == {"postgres": "ok", "catalog": "ok"}
        with connect(db.ingest_dsn) as c:
            assert c.info.get_parameters()["tcp_user_timeout"] == "12000"
            assert c.execute("show statement_timeout").fetchone()[0] == "0"  # G3 may wait 30 min
        with adbc.connect(adbc_uri(db.ingest_dsn)) as a, a.cursor() as cur:
            cur.execute("select 1")
            assert cur.fetchone() == (1,)
    finally:
        db.close()


def test_load_with_a_postgres_restart_in_the_middle_every_answer_retriable_and_served_after(own_postgres):
    """4 clients for 24 s of reads (Iceberg and Postgres) and ingests, Postgres killed and restarted (-m immediate)
    at 6 s: every answer is a 200 or a 5xx with Retry-After, none carries a stack trace, no request sent once Postgres is
    back is cut (one streaming from Postgres at the kill can only be: the client raises), and
    every request sent once Postgres has been back for 5 s is served — by the same server process."""
    from lakehouse_dagster.core.settings import Settings
    from lakehouse_dagster.flags.overrides import set_override
    from lakehouse_dagster.lake.catalog import load_catalog
    from lakehouse_dagster.mirror.sync import sync_dataset
    from lakehouse_dagster.testing.service_faults import run_load_with_restart

    dsn, root = own_postgres
    env = _env(dsn, root, LAKEHOUSE_MAX_CONCURRENT_INGEST="2")
    settings = Settings.from_env().replace(
        postgres={"dsn": dsn},
        project={"home": root / "home"},
        catalog={"warehouse": env["LAKEHOUSE_WAREHOUSE"], "namespace": "lakehouse"},
    )
    catalog = load_catalog(settings, dsn)
    with connect(dsn) as conn:
        migrate(conn)
        readable = [_big(conn, 3_000) for _ in range(3)]
        sourced = [_sourced(conn, 200) for _ in range(2)]
        set_override(conn, "read", "export.stream", "iceberg", note="faults", actor="pytest")
    for d in readable:
        sync_dataset(dsn, catalog, settings, d)
    server = ServiceProcess(env, root / "serve.log", token=new_token()).wait_ready()
    try:
        report = run_load_with_restart(
            server, root / "pg", readable, sourced, clients=4, seconds=24, restart_at=6, recovery_seconds=5
        )
        print(report.line())
        # a read streaming from Postgres at the kill may be cut (the client raises, never fewer rows); none after
        assert report.unexpected_count == 0 and report.cut_after_back == 0, report.unexpected
        assert report.tracebacks == 0
        assert report.after_recovery_not_served == 0 and report.after_recovery, report.after_recovery
        # how soon: bench/bench_service_faults.py measures it (a figure, not a property a loaded machine keeps)
        assert report.first_ok_after_back_seconds is not None
        assert server.proc.poll() is None  # recovered by itself: the same process throughout
        assert "Traceback" not in server.log_text()
    finally:
        server.stop()
