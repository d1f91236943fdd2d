"""The ASGI app: Starlette routes over the same functions the CLI and the jobs call.

Blocking work (psycopg, pyiceberg, pyarrow, the writers) runs in worker threads, never on the event loop, in
pools of their own so that one kind of request cannot starve the others: reads, ingests (which may wait for G3),
the control requests (route, flags: a STRICT route may wait 30 s on the barrier), /metrics, and /readyz (two
threads of its own: readiness never waits behind a route or a scrape).

A pool's slot is held until the work it admitted ends, not until its request stops waiting (``_run_holding``): a
request that gives up at ``api_timeout_seconds`` leaves its thread running, and that thread still counts. An
ingest's dataset is marked running for as long as its thread lives: a retry of the same dataset meanwhile is
answered at once (409, Retry-After), never queued behind it as one more thread, session and G3 waiter.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import Backpressure, LakehouseError, ReadRefused, first_line
from lakehouse_dagster.core.network import is_loopback
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.registry import READ
from lakehouse_dagster.routing.read_router import REFUSED, resolve_read_source
from lakehouse_dagster.runbooks.first_sync import checked_write
from lakehouse_dagster.service import bodies
from lakehouse_dagster.service.db import ServiceDb
from lakehouse_dagster.service.encode import encoder_for, pick_format
from lakehouse_dagster.service.errors import (
    IngestRunning,
    IngestStillRunning,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    error_response,
    is_backpressure,
    log_answer,
    status_of,
)
from lakehouse_dagster.service.fallbacks import record_reported_fallback
from lakehouse_dagster.service.metrics import CONTENT_TYPE, ServiceMetrics
from lakehouse_dagster.service.reads import OpenRead, open_read
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
READY_THREADS, METRICS_THREADS = 2, 2  # /readyz and /metrics: their own, so a held route never delays them
BODY_TYPES = ("application/json",)  # what POST bodies must say they are (a browser's simple POST cannot)
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
        self.ready = anyio.CapacityLimiter(READY_THREADS)
        self.scrapes = anyio.CapacityLimiter(METRICS_THREADS)
        self.ingests_running: dict[int, str] = {}  # thread id -> "writer ds=<id>", for the shutdown's last word
        self.ingesting: dict[uuid.UUID, _Ingest] = {}  # dataset -> its ingest whose thread still runs (loop's own)
        self.open_reads = 0  # read streams opened or opening (the event loop's own count: no lock)

    async def start(self) -> None:
        self.db = await anyio.to_thread.run_sync(ServiceDb, self.dsn, self.settings)
        self.metrics = ServiceMetrics(self.db)

    async def stop(self) -> None:
        if self.db is not None:
            await anyio.to_thread.run_sync(self.db.close)


def create_app(settings: Settings, dsn: str, host: str = "127.0.0.1") -> Starlette:
    """``host``: the address served; without a token, only requests naming a loopback host are answered."""
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
    return _Guard(app, svc, host)  # type: ignore[return-value]  # an ASGI app, as uvicorn takes it


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as the service's JSON errors."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no endpoint {request.url.path[:200]}; the endpoints are {', '.join(ENDPOINTS)}"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; use {exc.headers.get('Allow') if exc.headers else 'another method'}"
    else:
        message = exc.detail
    log_answer(f"{request.method} {request.url.path[:200]}: ", exc.status_code, message)
    return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)


class _Guard:
    """Outermost: what a web page in the operator's browser could otherwise do (cross-origin requests, DNS
    rebinding, a ``text/plain`` simple POST), bearer-token auth (constant-time compare; /healthz is open) and
    per-endpoint request metrics."""

    def __init__(self, app: ASGIApp, svc: Service, host: str = "127.0.0.1"):
        self.app = app
        self.svc = svc
        token = svc.settings.api_token
        self._token = token.encode() if token else None
        # Without a token the Host is the defence against DNS rebinding (a page of evil.example whose name now
        # resolves to 127.0.0.1 is same-origin to itself): only loopback names are answered.
        self._hosts = None if token else {"localhost", "127.0.0.1", "::1", host.strip("[]").lower()}

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
            refusal = self._refusal(scope)
            if refusal is None and path not in PUBLIC_PATHS and not self._authorised(scope):
                refusal = JSONResponse(
                    {"error": "unauthorized"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
            if refusal is None and scope["method"] == "POST" and path in ENDPOINTS:
                refusal = _body_type_refusal(scope)
            if refusal is not None:
                said = json.loads(bytes(refusal.body))["error"]
                if refusal.status_code == 401:
                    said += f" ({self._why_unauthorised(scope)})"  # the log only: the caller learns no more
                log_answer(f"{scope['method']} {path[:200]}: ", refusal.status_code, said)
                await refusal(scope, receive, counted_send)
                return
            await self.app(scope, receive, counted_send)
        finally:
            m = self.svc.metrics
            m.http_requests.labels(endpoint, str(status["code"])).inc()
            m.http_seconds.labels(endpoint).observe(time.perf_counter() - started)

    def _refusal(self, scope: Scope) -> Response | None:
        """403 for a request a browser made on a page's behalf (the service has no pages: no Origin is its own)
        and, without a token, for a Host that is not a loopback name."""
        headers = {name: value for name, value in scope["headers"]}
        host = headers.get(b"host", b"").decode("latin-1")
        if self._hosts is not None:
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            name = name.strip("[]").lower()
            if name not in self._hosts and not is_loopback(name):
                return _forbidden(
                    f"Host {host[:100]!r} is not this service's address; without LAKEHOUSE_API_TOKEN only requests "
                    "to 127.0.0.1, localhost or ::1 are answered (a page of another site is refused)"
                )
        origin = headers.get(b"origin")
        if origin is not None and origin.decode("latin-1") not in (f"http://{host}", f"https://{host}"):
            return _forbidden(
                f"cross-origin request refused (Origin {origin.decode('latin-1')[:100]!r}): the service answers "
                "programs, not web pages; call it from the app's server side"
            )
        site = headers.get(b"sec-fetch-site")
        if site is not None and site not in (b"same-origin", b"none"):
            return _forbidden(
                f"cross-site request refused (Sec-Fetch-Site {site.decode('latin-1')[:30]}): the service answers "
                "programs, not web pages"
            )
        return None

    @staticmethod
    def _why_unauthorised(scope: Scope) -> str:
        """What was wrong with the credentials, for the log; never the token given."""
        value = next((v for name, v in scope["headers"] if name == b"authorization"), None)
        if value is None:
            return "no Authorization header: send Authorization: Bearer <LAKEHOUSE_API_TOKEN>"
        if value.partition(b" ")[0].lower() != b"bearer":
            return "the Authorization header is not a bearer token: send Authorization: Bearer <LAKEHOUSE_API_TOKEN>"
        return "the bearer token is not this service's LAKEHOUSE_API_TOKEN"

    def _authorised(self, scope: Scope) -> bool:
        if self._token is None:
            return True  # no token configured: loopback only (service/server.py refuses anything else)
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, given = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)
        return False


def _forbidden(message: str) -> Response:
    return JSONResponse({"error": message}, status_code=403)


def _body_type_refusal(scope: Scope) -> Response | None:
    """415 unless the body says it is JSON: a browser sends ``text/plain`` (or no type) cross-origin without a
    preflight; ``application/json`` it never sends without asking first."""
    given = b""
    for name, value in scope["headers"]:
        if name == b"content-type":
            given = value
            break
    media = given.split(b";", 1)[0].strip().lower().decode("latin-1")
    if media in BODY_TYPES:
        return None
    said = f"Content-Type {media[:60]!r}" if media else "no Content-Type"
    return JSONResponse(
        {"error": f"{scope['method']} {scope['path']} takes a JSON body: send Content-Type: application/json ({said})"},
        status_code=415,
    )


def _endpoint(svc: Service, handler: Callable[[Service, Request], Any]):
    async def run(request: Request) -> Response:
        try:
            return await handler(svc, request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a one-line JSON error
            return error_response(exc, f"{request.method} {request.url.path}: ")

    return run


async def _blocking(limiter: anyio.CapacityLimiter, fn: Callable[..., Any], *args) -> Any:
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


DONE, NOT_STARTED, RUNNING = "done", "not-started", "running"


async def _run_holding(  # noqa: C901 - the limiter, timeout and late-result handling of one blocking call share their state
    limiter: anyio.CapacityLimiter,
    timeout: float,
    fn: Callable[[], Any],
    late: Callable[[Any, BaseException | None], None],
    ended: Callable[[bool], None] | None = None,
) -> tuple[str, Any]:
    """``fn()`` in a worker thread that holds a slot of ``limiter`` until it returns, waited for at most
    ``timeout`` s in all (the wait for a slot included). Returns (DONE, its value) — its error is raised;
    (NOT_STARTED, None): no slot in time, ``fn`` never runs; (RUNNING, None): it started and goes on, its slot
    still held, and hands what it ends with to ``late(value, error)`` in its thread. ``ended(kept)`` runs on the
    event loop once, when the slot is let go of (by the thread, or here when ``fn`` never ran); ``kept``: the
    value goes to the caller (DONE without an error).

    anyio's ``abandon_on_cancel`` alone gives the limiter's token back when the wait is cancelled, while the
    thread runs on: the bound then counts requests waiting, not work running. Long on purpose: the slot's
    hand-over between the event loop and the thread is one protocol; split, its races would not read as one."""
    deadline = anyio.current_time() + timeout
    borrower = object()
    try:
        with anyio.move_on_after(timeout) as waited:
            await limiter.acquire_on_behalf_of(borrower)
    except BaseException:  # cancelled from outside while waiting (shutdown): anyio gave the slot back
        if ended is not None:
            ended(False)
        raise
    if waited.cancelled_caught:  # anyio gave the slot back, or never gave it
        if ended is not None:
            ended(False)
        return NOT_STARTED, None
    token = anyio.lowlevel.current_token()
    lock = threading.Lock()
    state: dict[str, Any] = {"started": False, "skipped": False, "abandoned": False}

    def release(kept: bool) -> None:
        limiter.release_on_behalf_of(borrower)
        if ended is not None:
            ended(kept)

    def work() -> Any:
        with lock:
            if state["skipped"]:
                return None
            state["started"] = True
        value, error = None, None
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, or to ``late``
            error = exc
        with lock:  # decided once: either the request takes the outcome, or ``late`` does
            abandoned = state["abandoned"]
            if not abandoned:
                state["outcome"] = (value, error)
        try:
            anyio.from_thread.run_sync(release, not abandoned and error is None, token=token)
        except RuntimeError:  # the event loop is gone (shutdown): nothing waits for the slot any more
            pass
        if abandoned:
            late(value, error)
            return None
        if error is not None:
            raise error
        return value

    def give_up() -> tuple[Any, BaseException | None] | None:
        """The wait ended before the work: its outcome if it just arrived, else skip it or leave it running."""
        with lock:
            outcome = state.get("outcome")
            if outcome is None:
                if state["started"]:
                    state["abandoned"] = True
                else:
                    state["skipped"] = True
        if state["skipped"]:
            release(False)
        return outcome

    try:
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            # a limiter of its own: ``limiter``'s slot, held above, is the bound (not anyio's token)
            own = anyio.CapacityLimiter(1)
            return DONE, await anyio.to_thread.run_sync(work, limiter=own, abandon_on_cancel=True)
    except BaseException:  # its error, or cancelled from outside (shutdown): then as past the timeout
        outcome = give_up()
        if outcome is not None and outcome[1] is None and outcome[0] is not None:
            late(outcome[0], None)  # a value no one will take
        raise
    outcome = give_up()
    if outcome is not None:  # it ended just as the wait did: its answer stands
        if outcome[1] is not None:
            raise outcome[1]
        return DONE, outcome[0]
    return (NOT_STARTED if state["skipped"] else RUNNING), None


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
    parts = await _blocking(svc.ready, svc.db.probe)  # its own threads: a held route never delays it
    if all(v == "ok" for v in parts.values()):
        return JSONResponse({"status": "ready", **parts})
    broken = ", ".join(f"{k} {v}" for k, v in parts.items() if v != "ok")
    return JSONResponse(
        {"error": f"not ready: {broken}; retry shortly", **parts}, status_code=503, headers={"Retry-After": "2"}
    )


async def metrics(svc: Service, request: Request) -> Response:
    body = await _blocking(svc.scrapes, svc.metrics.render)
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
    svc.open_reads += 1  # given back when the stream ends (_ReadStream), or by ``ended`` when none opens

    def late(opened: OpenRead | None, error: BaseException | None) -> None:  # its request gave up: freed here
        if opened is not None:
            opened.stream.close()

    def ended(kept: bool) -> None:  # a read still opening keeps its place until its thread ends
        if not kept:
            svc.open_reads -= 1

    try:
        status, opened = await _run_holding(
            svc.reads, svc.settings.api_timeout_seconds, lambda: open_read(db, req), late, ended
        )
    except ReadRefused as exc:
        refused = getattr(exc, "decision", None)
        if refused is not None:
            svc.metrics.read_decisions.labels(refused.reader, refused.reason).inc()
        raise
    if status != DONE:
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


class _Ingest:
    """An ingest whose worker thread is running (or about to): in ``Service.ingesting`` until that thread ends."""

    def __init__(self, writer: str):
        self.writer = writer
        self.since = time.monotonic()
        self.abandoned = False  # its request was answered 504: a retry now is refused at once
        self.done = anyio.Event()


async def ingest(svc: Service, request: Request) -> Response:  # noqa: C901 - each answer (409, 503, 504, the result) told apart where its state is read
    """One writer's ingest of one dataset, at most one per dataset in this service: a retry of a running ingest
    waits for it or is refused at once, never queued behind its lock. Long on purpose: each answer (409, 503, 504,
    the result) is told apart where the state that decides it is read."""
    writer = "unknown"
    try:
        obj = bodies.json_object(await _body(request, svc.settings), "ingest", bodies.INGEST_EXAMPLE)
        if isinstance(obj.get("writer"), str):
            writer = obj["writer"]
        req = bodies.ingest_request(obj)
    except LakehouseError as exc:
        svc.metrics.ingest(writer, "refused" if status_of(exc) < 500 else "error")
        raise
    timeout = svc.settings.api_timeout_seconds
    deadline = anyio.current_time() + timeout
    ds = req.dataset_id
    while (running := svc.ingesting.get(ds)) is not None:
        # Another ingest of this dataset runs in this service: it holds (or waits for) G3. Waiting for it here
        # costs nothing (no thread, no session); once its request gave up (a 504), a retry is answered at once.
        if not running.abandoned:
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                await running.done.wait()
        if svc.ingesting.get(ds) is running:
            svc.metrics.ingest(req.writer, "refused")
            raise IngestRunning(
                f"ingest {running.writer} of dataset {ds} has been running for "
                f"{time.monotonic() - running.since:.0f} s in this service; it ends whole on its own (committed or "
                "not at all) — retry after it ends: a retry then finds nothing new if it landed",
                retry_after=max(2, min(30, round(timeout))),
            )
    if svc.ingests.available_tokens < 1:
        svc.metrics.ingest(req.writer, "503")
        raise Backpressure(f"{INGEST_THREADS} ingest requests are already running in this service; retry later")
    db = svc.db
    assert db is not None
    entry = _Ingest(req.writer)
    svc.ingesting[ds] = entry

    def work():
        ident = threading.get_ident()
        svc.ingests_running[ident] = f"{req.writer} ds={ds}"
        try:
            with connect(db.ingest_dsn) as conn:  # its first native write canaried (runbooks/first_sync.py)
                checked = checked_write(
                    conn, db.ingest_dsn, db.catalog, svc.settings, db.resolver(), ds, req.writer, logger=log
                )
            for line in checked.lines():
                log.warning(f"[service] {line}")
            result = checked.result
        except BaseException as exc:
            svc.metrics.ingest(req.writer, _outcome(exc))
            raise
        finally:
            svc.ingests_running.pop(ident, None)
        svc.metrics.ingest(req.writer, "ok")
        svc.metrics.rows_ingested.labels(result.path).inc(result.rows)
        return result

    def late(result, error: BaseException | None) -> None:
        if error is not None:
            log.warning(
                f"[service] ingest {req.writer} ds={ds} failed after its request timed out: {first_line(error)}"
            )
        else:
            log.info(
                f"[service] ingest {req.writer} ds={ds} finished after its request timed out: "
                f"{result.rows} rows via {result.path}"
            )

    def ended(kept: bool) -> None:
        if svc.ingesting.get(ds) is entry:
            del svc.ingesting[ds]
        entry.done.set()

    status, result = await _run_holding(svc.ingests, max(0.0, deadline - anyio.current_time()), work, late, ended)
    if status == NOT_STARTED:
        svc.metrics.ingest(req.writer, "503")
        raise Unavailable(
            f"ingest {req.writer} of dataset {ds} could not start within {timeout:g} s (the service is busy); "
            "nothing was done — retry"
        )
    if status == RUNNING:
        entry.abandoned = True
        raise IngestStillRunning(
            f"ingest {req.writer} of dataset {ds} is still running after {timeout:g} s; it goes on and ends "
            "whole (committed or not at all) — retry after it ends (a retry meanwhile is refused at once with 409); "
            "a retry then finds nothing new if it landed"
        )
    body = json.loads(json.dumps(result.to_json(), default=str))
    body["snapshot_id"] = _id_text(result.snapshot_id)
    if await request.is_disconnected():
        log.info(
            f"[service] ingest {req.writer} ds={ds}: the client went away before the answer; "
            f"the ingest finished whole ({result.rows} rows via {result.path}, sync {result.sync_id})"
        )
    return JSONResponse(body)


def _id_text(snapshot_id: int | None) -> str | None:
    """Snapshot ids are 63-bit: as text in JSON, so a JavaScript caller does not round them (as in the headers)."""
    return None if snapshot_id is None else str(snapshot_id)


def _outcome(exc: BaseException) -> str:
    if is_backpressure(exc):
        return "503"
    status = status_of(exc)
    return "refused" if status < 500 else "error"
