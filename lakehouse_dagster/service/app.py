"""The ASGI app: Starlette routes over the same functions the CLI and the jobs call.

Blocking work (psycopg, pyiceberg, pyarrow, the writers) runs in worker threads, never on the event loop, in
three pools so that one kind of request cannot starve the others: reads, ingests (which may wait for G3), and
the short control requests (route, flags, readyz, metrics).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lakehouse_dagster.core.errors import Backpressure, LakehouseError, ReadRefused, first_line
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.registry import READ
from lakehouse_dagster.routing.read_router import REFUSED, resolve_read_source
from lakehouse_dagster.service import bodies
from lakehouse_dagster.service.db import ServiceDb
from lakehouse_dagster.service.encode import encoder_for, pick_format
from lakehouse_dagster.service.errors import (
    IngestStillRunning,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    error_response,
    status_of,
)
from lakehouse_dagster.service.fallbacks import record_reported_fallback
from lakehouse_dagster.service.metrics import CONTENT_TYPE, ServiceMetrics
from lakehouse_dagster.service.reads import OpenRead, open_read
from lakehouse_dagster.sources.writers import run_writer
from lakehouse_dagster.tracking.datasets import get_dataset

log = logging.getLogger("lakehouse_dagster.service")

PUBLIC_PATHS = ("/healthz",)
ENDPOINTS = (
    "/healthz",
    "/readyz",
    "/metrics",
    "/lakehouse/read",
    "/lakehouse/ingest",
    "/lakehouse/route",
    "/lakehouse/flags",
    "/lakehouse/fallback",
)
READ_THREADS, INGEST_THREADS, CONTROL_THREADS = 32, 64, 8
MAX_OPEN_READS = 64  # streams open at once (a slow client keeps its stream, and a pg one its connection, open)
SOURCE_HEADER = {"pg": "postgres", "iceberg": "iceberg"}  # X-Lakehouse-Source, as the runbooks' app names them


class Service:
    """What the endpoints share; ``db`` is opened at start-up (lifespan), off the event loop."""

    def __init__(self, settings: Settings, dsn: str):
        self.settings = settings
        self.dsn = dsn
        self.db: ServiceDb | None = None
        self.metrics = ServiceMetrics(None)
        self.reads = anyio.CapacityLimiter(READ_THREADS)
        self.ingests = anyio.CapacityLimiter(INGEST_THREADS)
        self.control = anyio.CapacityLimiter(CONTROL_THREADS)
        self.ingests_running: dict[int, str] = {}  # thread id -> "writer ds=<id>", for the shutdown's last word
        self.open_reads = 0  # read streams opened or opening (the event loop's own count: no lock)

    async def start(self) -> None:
        self.db = await anyio.to_thread.run_sync(ServiceDb, self.dsn, self.settings)
        self.metrics = ServiceMetrics(self.db)

    async def stop(self) -> None:
        if self.db is not None:
            await anyio.to_thread.run_sync(self.db.close)


def create_app(settings: Settings, dsn: str) -> Starlette:
    svc = Service(settings, dsn)

    @contextlib.asynccontextmanager
    async def lifespan(app) -> AsyncIterator[None]:
        await svc.start()
        log.info("connected to Postgres and the catalog; serving")
        yield
        await svc.stop()

    routes = [
        Route("/healthz", _endpoint(svc, healthz), methods=["GET"]),
        Route("/readyz", _endpoint(svc, readyz), methods=["GET"]),
        Route("/metrics", _endpoint(svc, metrics), methods=["GET"]),
        Route("/lakehouse/read", _endpoint(svc, read), methods=["POST"]),
        Route("/lakehouse/ingest", _endpoint(svc, ingest), methods=["POST"]),
        Route("/lakehouse/route", _endpoint(svc, route), methods=["GET"]),
        Route("/lakehouse/flags", _endpoint(svc, flags), methods=["GET"]),
        Route("/lakehouse/fallback", _endpoint(svc, fallback), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_exception})
    app.state.service = svc
    return _Guard(app, svc)  # type: ignore[return-value]  # an ASGI app, as uvicorn takes it


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as the service's JSON errors."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no endpoint {request.url.path[:200]}; the endpoints are {', '.join(ENDPOINTS)}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; use {exc.headers.get('Allow') if exc.headers else 'another method'}"
    else:
        message = exc.detail
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


class _Guard:
    """Outermost: bearer-token auth (constant-time compare; /healthz is open) and per-endpoint request metrics."""

    def __init__(self, app: ASGIApp, svc: Service):
        self.app = app
        self.svc = svc
        token = svc.settings.api_token
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "other"
        started = time.perf_counter()
        status = {"code": 500}

        async def counted_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if path not in PUBLIC_PATHS and not self._authorised(scope):
                response = JSONResponse(
                    {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await response(scope, receive, counted_send)
                return
            await self.app(scope, receive, counted_send)
        finally:
            m = self.svc.metrics
            m.http_requests.labels(endpoint, str(status["code"])).inc()
            m.http_seconds.labels(endpoint).observe(time.perf_counter() - started)

    def _authorised(self, scope: Scope) -> bool:
        if self._token is None:
            return True  # no token configured: loopback only (service/server.py refuses anything else)
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)
        return False


def _endpoint(svc: Service, handler: Callable[[Service, Request], Any]):
    async def run(request: Request) -> Response:
        try:
            return await handler(svc, request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a one-line JSON error
            return error_response(exc, f"{request.method} {request.url.path}: ")

    return run


async def _blocking(limiter: anyio.CapacityLimiter, fn: Callable[..., Any], *args) -> Any:
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


async def _body(request: Request, settings: Settings) -> bytes:
    """The request body, at most ``api_max_body_bytes``, within ``api_timeout_seconds``."""
    limit = settings.api_max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; at most {limit} are accepted")
    chunks, size = [], 0
    try:
        with anyio.fail_after(settings.api_timeout_seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the request body is over {limit} bytes; at most {limit} are accepted")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {settings.api_timeout_seconds:g} s; send it at once"
        ) from None
    return b"".join(chunks)


# --- endpoints ------------------------------------------------------------------------------------------------


async def healthz(svc: Service, request: Request) -> Response:
    return JSONResponse({"status": "alive"})


async def readyz(svc: Service, request: Request) -> Response:
    assert svc.db is not None
    parts = await _blocking(svc.control, svc.db.probe)
    if all(v == "ok" for v in parts.values()):
        return JSONResponse({"status": "ready", **parts})
    broken = ", ".join(f"{k} {v}" for k, v in parts.items() if v != "ok")
    return JSONResponse(
        {"error": f"not ready: {broken}; retry shortly", **parts}, status_code=503, headers={"Retry-After": "2"}
    )


async def metrics(svc: Service, request: Request) -> Response:
    body = await _blocking(svc.control, svc.metrics.render)
    return Response(body, media_type=CONTENT_TYPE)


async def route(svc: Service, request: Request) -> Response:
    reader, dataset_id = bodies.route_params(request.query_params)
    db = svc.db
    assert db is not None

    def decide() -> dict:
        with db.connection() as conn:
            d = resolve_read_source(conn, db.resolver(), reader, dataset_id, logger=_router_log).decision
        fresh = d.freshness
        out = {
            **d.as_dict(),
            "snapshot_id": _id_text(d.snapshot_id),
            "consistency": d.flag.consistency,
            "native": d.native,
            "rows_version": fresh.rows_version if fresh else None,
            "snapshot_covers_version": fresh.source_version if fresh else None,
        }
        if d.source == REFUSED:
            out["refusal"] = d.refusal()
        return out

    return JSONResponse(await _blocking(svc.control, decide))


async def flags(svc: Service, request: Request) -> Response:
    dataset_id = bodies.flags_params(request.query_params)
    db = svc.db
    assert db is not None

    def resolve() -> dict:
        with db.connection() as conn:
            dataset = get_dataset(conn, dataset_id)
        out: dict[str, Any] = {
            "dataset_id": str(dataset.id),
            "dataset_name": dataset.name,
            "readers": [],
            "writers": [],
        }
        for r in db.resolver().resolve_all(dataset.id):
            out["readers" if r.kind == READ else "writers"].append(
                {
                    "name": r.name,
                    "mode": r.mode,
                    "reason": r.reason,
                    "stored_mode": r.stored_mode,
                    "ceiling": r.ceiling,
                    **({"consistency": r.consistency} if r.kind == READ else {}),
                    "describe": r.describe(),
                }
            )
        return out

    return JSONResponse(await _blocking(svc.control, resolve))


_router_log = logging.getLogger("lakehouse_dagster.read_router")


async def fallback(svc: Service, request: Request) -> Response:
    """A fallback an app's own router took, recorded as the read router records its own (service/fallbacks.py)."""
    req = bodies.fallback_request(
        bodies.json_object(await _body(request, svc.settings), "fallback", bodies.FALLBACK_EXAMPLE)
    )
    db = svc.db
    assert db is not None
    out = await _blocking(svc.control, record_reported_fallback, db, req, _router_log)
    svc.metrics.read_fallbacks.labels(req.reader).inc()  # the counter the service's own fallbacks move
    return JSONResponse(out)


async def read(svc: Service, request: Request) -> Response:
    req = bodies.read_request(bodies.json_object(await _body(request, svc.settings), "read", bodies.READ_EXAMPLE))
    media = pick_format(request.headers.get("accept"))
    db = svc.db
    assert db is not None
    if svc.open_reads >= MAX_OPEN_READS:  # each open stream may hold a Postgres connection: bounded
        raise Unavailable(f"{MAX_OPEN_READS} reads are streaming from this service now; retry shortly")
    svc.open_reads += 1  # given back when the stream ends (_ReadStream), or below when none opens
    try:
        opened = await _abandonable(
            svc.reads, svc.settings.api_timeout_seconds, lambda: open_read(db, req), lambda o: o.stream.close()
        )
    except ReadRefused as exc:
        svc.open_reads -= 1
        refused = getattr(exc, "decision", None)
        if refused is not None:
            svc.metrics.read_decisions.labels(refused.reader, refused.reason).inc()
        raise
    except BaseException:
        svc.open_reads -= 1
        raise
    if opened is None:
        svc.open_reads -= 1
        raise Unavailable(
            f"the read could not start within {svc.settings.api_timeout_seconds:g} s (the service is busy); retry"
        )
    d = opened.decision
    svc.metrics.read_decisions.labels(d.reader, d.reason).inc()
    if opened.fallback_error is not None:
        svc.metrics.read_fallbacks.labels(d.reader).inc()
    headers = {
        "X-Lakehouse-Source": SOURCE_HEADER[d.source],
        "X-Lakehouse-Reason": d.reason,
        "X-Lakehouse-Mode": d.mode,
        "Cache-Control": "no-store",
    }
    if d.snapshot_id is not None:
        headers["X-Lakehouse-Snapshot-Id"] = str(d.snapshot_id)
    return _ReadStream(svc, req, opened, media, headers)


async def _abandonable(limiter, timeout: float, fn: Callable[[], Any], cleanup: Callable[[Any], None]) -> Any:
    """``fn()`` in a worker thread, waited for at most ``timeout`` s; None past it. A result that arrives after
    the wait was given up is handed to ``cleanup`` (a read's stream is closed, not leaked)."""
    lock = threading.Lock()
    state: dict[str, Any] = {"abandoned": False}

    def work():
        value = fn()
        with lock:
            if state["abandoned"]:
                cleanup(value)
                return None
            state["value"] = value
        return value

    with anyio.move_on_after(timeout):
        return await anyio.to_thread.run_sync(work, limiter=limiter, abandon_on_cancel=True)
    with lock:
        state["abandoned"] = True
        late = state.pop("value", None)
    if late is not None:
        await anyio.to_thread.run_sync(cleanup, late)
    return None


class _ReadStream(Response):
    """Streams an opened read batch by batch. Each batch is produced and encoded in a worker thread; a client
    that goes away, or reads nothing for ``api_timeout_seconds``, ends the stream, and the read is closed in
    every case (its Postgres cursor, transaction and connection, its open data file)."""

    def __init__(self, svc: Service, req: bodies.ReadRequest, opened: OpenRead, media: str, headers: dict[str, str]):
        self.status_code = 200
        self.media_type = media
        self.background = None
        self.init_headers(headers)  # no body: no Content-Length, the body is chunked
        self.svc, self.req, self.opened = svc, req, opened
        self.encoder = encoder_for(media, opened.stream.schema)
        self.cut: tuple[str, str] | None = None  # (metric label, what happened)
        self.done = False  # the last chunk is being sent: a disconnect now is the normal end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = self.opened.stream
        m = self.svc.metrics
        m.reads_in_flight.inc()
        try:
            async with anyio.create_task_group() as tg:

                async def body() -> None:
                    await self._send_all(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(body)
                while True:  # uvicorn answers every receive() after a disconnect at once: leave on the first
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        if not self.done:
                            self.cut = ("client_gone", "the client went away")
                            tg.cancel_scope.cancel()
                        break
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(stream.close)
                self.svc.open_reads -= 1
                m.reads_in_flight.dec()
                m.rows_served.labels(self.opened.decision.source).inc(stream.rows)
                if self.cut is not None:
                    m.streams_cut.labels(self.cut[0]).inc()
                    d = self.opened.decision
                    log.warning(
                        f"[service] read {d.reader} ds={d.dataset_id} from {d.source} ended after {stream.rows} rows: "
                        f"{self.cut[1]}; the stream was cut and its "
                        f"{'cursor, transaction and connection' if d.source == 'pg' else 'snapshot files'} released"
                    )

    async def _send_all(self, send: Send) -> None:
        timeout = self.svc.settings.api_timeout_seconds
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        def produce() -> bytes | memoryview | None:
            batch = self.opened.stream.next_batch()
            return None if batch is None else self.encoder.batch(batch)

        first = self.encoder.start()
        try:
            if first:
                await self._send_bounded(send, first, timeout)
            while True:
                try:
                    chunk = await anyio.to_thread.run_sync(produce, limiter=self.svc.reads)
                except Exception as exc:  # noqa: BLE001 - mid-stream: the headers are out, the stream is cut
                    error = " ".join(str(exc).split())[:300]
                    self.cut = ("read_failed", f"the read failed mid-stream ({type(exc).__name__}: {error})")
                    return  # without the last chunk: the server drops the connection, the client sees it incomplete
                if chunk is None:
                    break
                await self._send_bounded(send, chunk, timeout)
            self.done = True
            await send({"type": "http.response.body", "body": self.encoder.end(), "more_body": False})
        except TimeoutError:
            self.cut = ("client_stalled", f"the client read nothing for {timeout:g} s")

    @staticmethod
    async def _send_bounded(send: Send, chunk: bytes | memoryview, timeout: float) -> None:
        with anyio.fail_after(timeout):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def ingest(svc: Service, request: Request) -> Response:
    writer = "unknown"
    try:
        obj = bodies.json_object(await _body(request, svc.settings), "ingest", bodies.INGEST_EXAMPLE)
        if isinstance(obj.get("writer"), str):
            writer = obj["writer"]
        req = bodies.ingest_request(obj)
    except LakehouseError as exc:
        svc.metrics.ingest(writer, "refused" if status_of(exc) < 500 else "error")
        raise
    if svc.ingests.available_tokens < 1:
        svc.metrics.ingest(req.writer, "503")
        raise Backpressure(f"{INGEST_THREADS} ingest requests are already running in this service; retry later")
    db = svc.db
    assert db is not None
    outcome: dict[str, Any] = {}

    def work():
        ident = threading.get_ident()
        svc.ingests_running[ident] = f"{req.writer} ds={req.dataset_id}"
        try:
            result = run_writer(db.dsn, db.catalog, svc.settings, db.resolver(), req.dataset_id, req.writer, logger=log)
        except BaseException as exc:
            svc.metrics.ingest(req.writer, _outcome(exc))
            if outcome.get("abandoned"):
                log.warning(
                    f"[service] ingest {req.writer} ds={req.dataset_id} failed after its request timed out: "
                    f"{first_line(exc)}"
                )
            raise
        finally:
            svc.ingests_running.pop(ident, None)
        svc.metrics.ingest(req.writer, "ok")
        svc.metrics.rows_ingested.labels(result.path).inc(result.rows)
        if outcome.get("abandoned"):
            log.info(
                f"[service] ingest {req.writer} ds={req.dataset_id} finished after its request timed out: "
                f"{result.rows} rows via {result.path}"
            )
        return result

    timeout = svc.settings.api_timeout_seconds
    with anyio.move_on_after(timeout):
        result = await anyio.to_thread.run_sync(work, limiter=svc.ingests, abandon_on_cancel=True)
        body = json.loads(json.dumps(result.to_json(), default=str))
        body["snapshot_id"] = _id_text(result.snapshot_id)
        if await request.is_disconnected():
            log.info(
                f"[service] ingest {req.writer} ds={req.dataset_id}: the client went away before the answer; "
                f"the ingest finished whole ({result.rows} rows via {result.path}, sync {result.sync_id})"
            )
        return JSONResponse(body)
    outcome["abandoned"] = True
    raise IngestStillRunning(
        f"ingest {req.writer} of dataset {req.dataset_id} is still running after {timeout:g} s; it goes on and ends "
        "whole (committed or not at all) — retry later: a retry waits for it (G3) and finds nothing new if it landed"
    )


def _id_text(snapshot_id: int | None) -> str | None:
    """Snapshot ids are 63-bit: as text in JSON, so a JavaScript caller does not round them (as in the headers)."""
    return None if snapshot_id is None else str(snapshot_id)


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, Backpressure):
        return "503"
    status = status_of(exc)
    return "refused" if status < 500 else "error"
