"""The HTTP service (`lakehouse serve`) against baselines measured in the same run.

    .venv/bin/python bench/bench_service.py [--rows 2000000] [--scale 1000000,4000000] [--clients 32]
                                            [--seconds 30] [--demo-rows 200000] [--repeats 5]
                                            [--skip export,rss,load]

export  a full export of a --rows dataset (the demo-shaped generator, bench/_common.py) as an Arrow stream over
        HTTP through the read router (Iceberg, pinned snapshot), against reading the same snapshot in-process with
        pyiceberg (``scan().to_arrow()``, and its batch reader) — rows/s and the ratio (target ≥ 0.8×), of the
        medians and of the best of --repeats alternated runs, after one warm run of each. Beside it, same run: the
        server's own work in-process (the same batches read and Arrow-encoded, no HTTP); a server on pyarrow's
        default allocator, mimalloc (the service chooses jemalloc, core/arrow_memory.py); the same export read
        through httpx (the client's transport before it streamed through http.client); CPU-s of each side. This
        process uses the service's allocator too, so the in-process baselines are measured at their steadiest
rss     the server's peak RSS (VmHWM) after one full export, a fresh server process per --scale size: flat when
        memory is bounded by the batch
load    --clients concurrent clients for --seconds on the demo workspace (seeded with --demo-rows): each loop
        picks a 1,000-row read (80%: export.stream from Iceberg or studio.digest from Postgres, a random demo
        dataset) or an ingest (20%: a random sourced demo dataset, its default writer), no retries; p50/p99 per
        kind and the status codes — the gate is 0 errors other than 503 (G2 at LAKEHOUSE_MAX_CONCURRENT_INGEST=2)
Not a test: figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import admin_dsn, fresh_database, make_dataset, mirror_settings  # noqa: E402
from lakehouse_dagster.core.arrow_memory import prefer_jemalloc  # noqa: E402
from lakehouse_dagster.core.db import connect  # noqa: E402
from lakehouse_dagster.flags.overrides import set_override  # noqa: E402
from lakehouse_dagster.lake.catalog import table_identifier  # noqa: E402
from lakehouse_dagster.mirror.sync import sync_dataset  # noqa: E402
from lakehouse_dagster.routing.projection import projection_for  # noqa: E402
from lakehouse_dagster.service.batches import iceberg_stream  # noqa: E402
from lakehouse_dagster.service.encode import ArrowEncoder  # noqa: E402
from lakehouse_dagster.testing.service import ServiceProcess, new_token  # noqa: E402
from lakehouse_dagster.tracking.datasets import get_dataset  # noqa: E402


def _env(settings, dsn: str, **extra: str) -> dict[str, str]:
    return {
        "LAKEHOUSE_PG_DSN": dsn,
        "LAKEHOUSE_HOME": str(settings.project.home),
        "LAKEHOUSE_WAREHOUSE": settings.catalog.warehouse,
        "LAKEHOUSE_NAMESPACE": settings.catalog.namespace,
        **extra,
    }


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid``, or of this process."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _http_export(server: ServiceProcess, dataset_id, cpu: list | None = None) -> tuple[int, float]:
    server_cpu, client_cpu = _cpu_seconds(server.proc.pid), _cpu_seconds()
    t = time.perf_counter()
    rows = 0
    with server.client() as client, client.stream("export.stream", dataset_id) as s:
        assert s.source == "iceberg", s.reason
        for batch in s:
            rows += batch.num_rows
    seconds = time.perf_counter() - t
    if cpu is not None:
        cpu.append((_cpu_seconds(server.proc.pid) - server_cpu, _cpu_seconds() - client_cpu))
    return rows, seconds


class _HttpxBody:
    """The response body through httpx (h11) as pyarrow's stream reader reads it: the client's former path."""

    def __init__(self, response):
        self._chunks, self._buf, self.closed = response.iter_raw(), bytearray(), False

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf += chunk
        n = len(self._buf) if n < 0 else min(n, len(self._buf))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def readable(self) -> bool:
        return True


def _httpx_export(server: ServiceProcess, dataset_id, cpu: list) -> tuple[int, float]:
    import httpx
    import pyarrow as pa
    import pyarrow.ipc as ipc

    server_cpu, client_cpu = _cpu_seconds(server.proc.pid), _cpu_seconds()
    t = time.perf_counter()
    body = {"reader": "export.stream", "dataset_id": str(dataset_id)}
    auth = {"Authorization": f"Bearer {server.token}"}
    with httpx.stream("POST", server.url + "/lakehouse/read", json=body, headers=auth, timeout=300) as resp:
        rows = sum(b.num_rows for b in ipc.open_stream(pa.PythonFile(_HttpxBody(resp), mode="r")))
    seconds = time.perf_counter() - t
    cpu.append((_cpu_seconds(server.proc.pid) - server_cpu, _cpu_seconds() - client_cpu))
    return rows, seconds


def _dataset(admin: str, db: str, rows: int, namespace: str):
    dsn = fresh_database(admin, db)
    d, gen_s = make_dataset(dsn, rows)
    settings, catalog = mirror_settings(dsn, namespace)
    t = time.perf_counter()
    sync = sync_dataset(dsn, catalog, settings, d)
    with connect(dsn) as conn:
        set_override(conn, "read", "export.stream", "iceberg", dataset=d, note="bench", actor="bench")
    print(f"  {rows:,} rows generated in {gen_s:.1f} s, mirrored in {time.perf_counter() - t:.1f} s", flush=True)
    return dsn, d, settings, catalog, sync.snapshot_id


def _service_stream(table, snapshot: int, dataset, rows_per_batch: int) -> int:
    """The server's own work for one export, in-process: the same batches read and Arrow-encoded, no HTTP."""
    stream = iceberg_stream(table, snapshot, dataset, projection_for(dataset, None), rows_per_batch)
    encoder = ArrowEncoder(stream.schema)
    n = len(encoder.start())
    try:
        while (batch := stream.next_batch()) is not None:
            n += len(encoder.batch(batch))
    finally:
        stream.close()
    return stream.rows


def _encoded(table, snapshot: int, dataset, rows_per_batch: int) -> list[bytes | memoryview]:
    stream = iceberg_stream(table, snapshot, dataset, projection_for(dataset, None), rows_per_batch)
    encoder = ArrowEncoder(stream.schema)
    chunks = [encoder.start()]
    try:
        while (batch := stream.next_batch()) is not None:
            chunks.append(encoder.batch(batch))
    finally:
        stream.close()
    return [*chunks, encoder.end()]


def _loopback(chunks: list[bytes | memoryview]) -> tuple[float, float]:
    """Seconds and CPU-s (both ends, kernel included) to move the export's bytes through loopback TCP with plain
    sockets: no HTTP, no decode — what moving the bytes costs at the least on this machine."""
    listener = socket.create_server(("127.0.0.1", 0))
    c, t = _cpu_seconds(), time.perf_counter()

    def sender() -> None:
        conn, _ = listener.accept()
        with conn:
            for chunk in chunks:
                conn.sendall(chunk)

    thread = threading.Thread(target=sender)
    thread.start()
    buf = memoryview(bytearray(4 << 20))
    with socket.create_connection(listener.getsockname()) as receiver:
        while receiver.recv_into(buf):
            pass
    thread.join()
    listener.close()
    return time.perf_counter() - t, _cpu_seconds() - c


def bench_export(admin: str, rows: int, log_dir: Path, repeats: int = 5) -> dict:
    """Long on purpose: one loop alternates every side so that each sees the same machine, and the figures of all
    of them are reported together."""
    print(f"export: {rows:,} rows", flush=True)
    dsn, d, settings, catalog, snapshot = _dataset(admin, "lh_bench_service_export", rows, "bench_service")
    table = catalog.load_table(table_identifier(settings, d))
    with connect(dsn) as conn:
        dataset = get_dataset(conn, d)
    sides = ["http", "http_mimalloc", "service_stream", "to_arrow", "batch_reader", "http_via_httpx"]
    out: dict[str, list] = {k: [] for k in sides}
    cpu: dict[str, list] = {k: [] for k in sides}  # CPU-s per export: (server, client) or (in-process,)
    env = _env(settings, dsn)
    with (
        ServiceProcess(env, log_dir / "export.log", token=new_token()) as server,
        ServiceProcess({**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}, log_dir / "mi.log", token=new_token()) as mi,
    ):

        def in_process(fn) -> tuple[int, float, tuple]:
            t, c = time.perf_counter(), _cpu_seconds()
            n = fn()
            seconds = time.perf_counter() - t
            return n, seconds, (_cpu_seconds() - c,)

        def over_http(export, srv) -> tuple[int, float, tuple]:
            got: list = []
            n, seconds = export(srv, d, got)
            return n, seconds, got[0]

        run = {
            "http": lambda: over_http(_http_export, server),
            "http_mimalloc": lambda: over_http(_http_export, mi),
            "service_stream": lambda: in_process(
                lambda: _service_stream(table, snapshot, dataset, settings.service.batch_rows)
            ),
            "to_arrow": lambda: in_process(lambda: table.scan(snapshot_id=snapshot).to_arrow().num_rows),
            "batch_reader": lambda: in_process(
                lambda: sum(b.num_rows for b in table.scan(snapshot_id=snapshot).to_arrow_batch_reader())
            ),
            "http_via_httpx": lambda: over_http(_httpx_export, server),
        }
        for side in sides:  # warm: the first read loads the table's metadata, imports and thread pools
            run[side]()
        for _ in range(repeats):
            for side in sides:
                n, seconds, used = run[side]()
                assert n == rows, (side, n, rows)
                out[side].append(n / seconds)
                cpu[side].append(used)
    chunks = _encoded(table, snapshot, dataset, settings.service.batch_rows)
    loopback = sorted(_loopback(chunks) for _ in range(repeats))[repeats // 2]
    mb = sum(len(x) for x in chunks) / 1e6
    del chunks
    med = {k: statistics.median(v) for k, v in out.items()}
    best = {k: max(v) for k, v in out.items()}
    result = {
        "rows": rows,
        "rows_s_median": {k: round(v) for k, v in med.items()},
        "rows_s_best": {k: round(v) for k, v in best.items()},
        "ratio_http_to_pyiceberg": round(med["http"] / med["to_arrow"], 2),
        "ratio_http_to_pyiceberg_best": round(best["http"] / best["to_arrow"], 2),
        "ratio_http_to_service_stream": round(med["http"] / med["service_stream"], 2),
        "ratio_jemalloc_to_mimalloc": round(med["http"] / med["http_mimalloc"], 2),
        "slowest_run_to_median": {k: round(min(v) / med[k], 2) for k, v in out.items()},
        "ratio_http_to_http_via_httpx": round(med["http"] / med["http_via_httpx"], 2),
        "runs": {k: [round(x) for x in v] for k, v in out.items()},
        "loopback": {"mb": round(mb), "seconds": round(loopback[0], 3), "cpu_s": round(loopback[1], 2)},
        # CPU seconds per full export: what bounds the ratio when the machine has nothing else to do
        "cpu_s": {k: [round(statistics.median(c[i] for c in v), 2) for i in range(len(v[0]))] for k, v in cpu.items()},
    }
    c = result["cpu_s"]
    cores = len(os.sched_getaffinity(0))  # the cores this process may run on (a container may have fewer)
    arrow_wall = rows / med["to_arrow"]
    # the export's least work: the server's decode and encode, and moving its bytes; on `cores` perfectly shared
    # cores it takes at least that ÷ cores, against to_arrow's measured wall time
    floor_cpu = c["service_stream"][0] + loopback[1]
    result["ceiling_ratio_on_this_machine"] = round(arrow_wall * cores / floor_cpu, 2)
    print(
        f"  HTTP Arrow {med['http']:,.0f} rows/s · in-process pyiceberg to_arrow {med['to_arrow']:,.0f} rows/s "
        f"(batch reader {med['batch_reader']:,.0f}) → {result['ratio_http_to_pyiceberg']}× of the medians, "
        f"{result['ratio_http_to_pyiceberg_best']}× of the best runs (target ≥ 0.8×)",
        flush=True,
    )
    print(
        f"  the server's own work in-process (the same batches read and encoded, no HTTP) "
        f"{med['service_stream']:,.0f} rows/s → HTTP is {result['ratio_http_to_service_stream']}× of it",
        flush=True,
    )
    print(
        f"  the least an export costs here: the server's work {c['service_stream'][0]} CPU-s + moving its {mb:.0f} MB "
        f"through loopback TCP with plain sockets {loopback[1]:.2f} CPU-s ({loopback[0]:.2f} s); to_arrow takes "
        f"{arrow_wall:.2f} s at {c['to_arrow'][0]} CPU-s on {cores} cores → even a perfect server reaches at most "
        f"{result['ceiling_ratio_on_this_machine']}× of to_arrow on this machine",
        flush=True,
    )
    print(
        f"  the server on jemalloc (its default) {med['http']:,.0f} rows/s vs on pyarrow's mimalloc "
        f"{med['http_mimalloc']:,.0f} → {result['ratio_jemalloc_to_mimalloc']}×; slowest run ÷ median: "
        f"{result['slowest_run_to_median']['http']} vs {result['slowest_run_to_median']['http_mimalloc']}",
        flush=True,
    )
    print(
        f"  CPU-s per export: HTTP server {c['http'][0]} + client {c['http'][1]} (mimalloc: "
        f"{c['http_mimalloc'][0]} + {c['http_mimalloc'][1]}) · the server's work in-process "
        f"{c['service_stream'][0]} · pyiceberg to_arrow {c['to_arrow'][0]}",
        flush=True,
    )
    print(
        f"  the same export read through httpx: {med['http_via_httpx']:,.0f} rows/s, client "
        f"{c['http_via_httpx'][1]} CPU-s (the client's http.client path: "
        f"{result['ratio_http_to_http_via_httpx']}× its rows/s)",
        flush=True,
    )
    return result


def bench_rss(admin: str, sizes: list[int], log_dir: Path) -> dict:
    result = {}
    for rows in sizes:
        print(f"rss: {rows:,} rows", flush=True)
        dsn, d, settings, _, _ = _dataset(admin, f"lh_bench_service_rss_{rows}", rows, f"bench_rss_{rows}")
        with ServiceProcess(_env(settings, dsn), log_dir / f"rss_{rows}.log", token=new_token()) as server:
            idle = _peak_mb(server.proc.pid)
            n, s = _http_export(server, d)
            peak = _peak_mb(server.proc.pid)
        result[rows] = {"idle_peak_mb": round(idle), "peak_mb": round(peak), "rows_s": round(n / s)}
        print(f"  server peak RSS {peak:.0f} MB (idle {idle:.0f} MB), {n / s:,.0f} rows/s", flush=True)
    first, last = result[sizes[0]]["peak_mb"], result[sizes[-1]]["peak_mb"]
    print(f"  peak {sizes[-1]:,} rows ÷ {sizes[0]:,} rows: {last / first:.2f}×", flush=True)
    return {str(k): v for k, v in result.items()}


def bench_load(admin: str, clients: int, seconds: float, demo_rows: int, log_dir: Path) -> dict:
    from lakehouse_dagster.demo.workspace import seed_demo

    print(f"load: {clients} clients for {seconds:.0f} s on the demo ({demo_rows:,} rows in events)", flush=True)
    dsn = fresh_database(admin, "lh_bench_service_load")
    settings, catalog = mirror_settings(dsn, "bench_load")
    with connect(dsn) as conn:
        demo = seed_demo(conn, big_rows=demo_rows, home=settings.project.home)
        sourced = [
            (uuid.UUID(r[0].hex), r[1])
            for r in conn.execute(
                "select d.id, s.writer from datasets d cross join lateral (select case source->>'type'"
                " when 'files' then 'sync.append' when 'cdc' then 'cdc.append' else 'sync.full' end as writer) s"
                " where d.workspace_id = %s and source ? 'type' and source->>'type' <> 'demo'",
                (uuid.UUID(demo["workspace_id"]),),
            ).fetchall()
        ]
        set_override(conn, "read", "export.stream", "iceberg", note="bench", actor="bench")
    tabular = [uuid.UUID(x["id"]) for x in demo["datasets"] if x["kind"] == "tabular" and (x["rows"] or 0) > 0]
    for d in tabular:
        sync_dataset(dsn, catalog, settings, d)
    env = _env(settings, dsn, LAKEHOUSE_MAX_CONCURRENT_INGEST="2")
    latencies: dict[str, list[float]] = {"read": [], "ingest": []}
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    with ServiceProcess(env, log_dir / "load.log", token=new_token()) as server:
        stop_at = time.monotonic() + seconds

        def worker(seed: int) -> None:
            import httpx

            rnd = random.Random(seed)
            headers = {"Authorization": f"Bearer {server.token}"}
            with httpx.Client(base_url=server.url, headers=headers, timeout=300) as http:
                while time.monotonic() < stop_at:
                    if rnd.random() < 0.8:
                        kind = "read"
                        body = {
                            "reader": rnd.choice(["export.stream", "studio.digest"]),
                            "dataset_id": str(rnd.choice(tabular)),
                            "limit": 1000,
                        }
                    else:
                        kind = "ingest"
                        d, writer = rnd.choice(sourced)
                        body = {"dataset_id": str(d), "writer": writer}
                    t = time.perf_counter()
                    resp = http.post(f"/lakehouse/{kind}", json=body)
                    took = time.perf_counter() - t
                    with lock:
                        key = f"{kind} {resp.status_code}"
                        statuses[key] = statuses.get(key, 0) + 1
                        if resp.status_code == 200:
                            latencies[kind].append(took)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        [t.start() for t in threads]
        [t.join() for t in threads]
        wall = time.perf_counter() - t0
        peak = _peak_mb(server.proc.pid)

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    errors = {k: v for k, v in statuses.items() if not k.endswith((" 200", " 503"))}
    result = {
        "clients": clients,
        "seconds": round(wall, 1),
        "statuses": statuses,
        "errors_other_than_503": sum(errors.values()),
        "reads_per_s": round(len(latencies["read"]) / wall, 1),
        "read_p50_ms": round(pct(latencies["read"], 0.5), 1),
        "read_p99_ms": round(pct(latencies["read"], 0.99), 1),
        "ingests_per_s": round(len(latencies["ingest"]) / wall, 2),
        "ingest_p50_ms": round(pct(latencies["ingest"], 0.5), 1),
        "ingest_p99_ms": round(pct(latencies["ingest"], 0.99), 1),
        "server_peak_mb": round(peak),
    }
    print(
        f"  reads {result['reads_per_s']}/s p50 {result['read_p50_ms']} ms p99 {result['read_p99_ms']} ms · ingests "
        f"{result['ingests_per_s']}/s p50 {result['ingest_p50_ms']} ms p99 {result['ingest_p99_ms']} ms · "
        f"statuses {statuses} · errors other than 503: {result['errors_other_than_503']} · server peak "
        f"{peak:.0f} MB",
        flush=True,
    )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--scale", default="1000000,4000000")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--demo-rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5, help="alternated export runs (the median is reported)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: export, rss, load")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    print(f"Arrow memory pool of this process (the in-process baselines): {prefer_jemalloc()}", flush=True)
    skip = set(filter(None, args.skip.split(",")))
    admin = admin_dsn()
    log_dir = Path(__import__("tempfile").mkdtemp(prefix="lh-bench-service-"))
    out: dict = {"logs": str(log_dir)}
    if "export" not in skip:
        out["export"] = bench_export(admin, args.rows, log_dir, args.repeats)
    if "rss" not in skip:
        out["rss"] = bench_rss(admin, [int(x) for x in args.scale.split(",")], log_dir)
    if "load" not in skip:
        out["load"] = bench_load(admin, args.clients, args.seconds, args.demo_rows, log_dir)
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
