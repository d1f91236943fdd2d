"""The ASGI app: Starlette routes over the same functions the CLI and the jobs call.

Blocking work (psycopg, pyiceberg, pyarrow, the writers) runs in worker threads, never on the event loop, in
pools of their own so that one kind of request cannot starve the others: reads, ingests (which may wait for G3),
the control requests (route, flags: a STRICT route may wait 30 s on the barrier), /metrics, and /readyz (two
threads of its own: readiness never waits behind a route or a scrape).

A pool's slot is held until the work it admitted ends, not until its request stops waiting (``service/slots.py`` ``run_holding``): a
request that gives up at ``api_timeout_seconds`` leaves its thread running, and that thread still counts. An
ingest's dataset is marked running for as long as its thread lives: a retry of the same dataset meanwhile is
answered at once (409, Retry-After), never queued behind it as one more thread, session and G3 waiter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.lowlevel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.flags import READ
from lakehouse_dagster.api.flips import checked_write
from lakehouse_dagster.api.reads import REFUSED, resolve_read_source
from lakehouse_dagster.core.errors import Backpressure, LakehouseError, ReadRefused, first_line
from lakehouse_dagster.core.settings import ServiceSettings, Settings
from lakehouse_dagster.service import bodies
from lakehouse_dagster.service.encode import pick_format
from lakehouse_dagster.service.errors import (
    IngestRunning,
    IngestStillRunning,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    error_response,
    is_backpressure,
    log_answer,
    status_of,
)
from lakehouse_dagster.service.fallbacks import record_reported_fallback
from lakehouse_dagster.service.guard import ENDPOINTS, Guard
from lakehouse_dagster.service.metrics import CONTENT_TYPE
from lakehouse_dagster.service.read_stream import ReadStream
from lakehouse_dagster.service.reads import OpenRead, open_read
from lakehouse_dagster.service.slots import DONE, NOT_STARTED, RUNNING, blocking, run_holding
from lakehouse_dagster.service.state import INGEST_THREADS, RunningIngest, Service

log = logging.getLogger("lakehouse_dagster.service")

MAX_OPEN_READS = 64  # streams open at once (a slow client keeps its stream, and a pg one its connection, open)
SOURCE_HEADER = {"pg": "postgres", "iceberg": "iceberg"}  # X-Lakehouse-Source, as the runbooks' app names them


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
    return Guard(app, svc, host)  # type: ignore[return-value]  # an ASGI app, as uvicorn takes it


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


def _endpoint(svc: Service, handler: Callable[[Service, Request], Any]):
    async def run(request: Request) -> Response:
        try:
            return await handler(svc, request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a one-line JSON error
            return error_response(exc, f"{request.method} {request.url.path}: ")

    return run


async def _body(request: Request, service: ServiceSettings) -> bytes:
    """The request body, at most ``api_max_body_bytes``, within ``api_timeout_seconds``."""
    limit = service.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; at most {limit} are accepted")
    chunks, size = [], 0
    try:
        with anyio.fail_after(service.timeout_seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"the request body is over {limit} bytes; at most {limit} are accepted")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {service.timeout_seconds:g} s; send it at once"
        ) from None
    return b"".join(chunks)


# --- endpoints ------------------------------------------------------------------------------------------------


async def healthz(svc: Service, request: Request) -> Response:
    return JSONResponse({"status": "alive"})


async def readyz(svc: Service, request: Request) -> Response:
    assert svc.db is not None
    parts = await blocking(svc.ready, svc.db.probe)  # its own threads: a held route never delays it
    if all(v == "ok" for v in parts.values()):
        return JSONResponse({"status": "ready", **parts})
    broken = ", ".join(f"{k} {v}" for k, v in parts.items() if v != "ok")
    return JSONResponse(
        {"error": f"not ready: {broken}; retry shortly", **parts}, status_code=503, headers={"Retry-After": "2"}
    )


async def metrics(svc: Service, request: Request) -> Response:
    body = await blocking(svc.scrapes, svc.metrics.render)
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

    return JSONResponse(await blocking(svc.control, decide))


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

    return JSONResponse(await blocking(svc.control, resolve))


_router_log = logging.getLogger("lakehouse_dagster.read_router")


async def fallback(svc: Service, request: Request) -> Response:
    """A fallback an app's own router took, recorded as the read router records its own (service/fallbacks.py)."""
    req = bodies.fallback_request(
        bodies.json_object(await _body(request, svc.settings.service), "fallback", bodies.FALLBACK_EXAMPLE)
    )
    db = svc.db
    assert db is not None
    out = await blocking(svc.control, record_reported_fallback, db, req, _router_log)
    svc.metrics.read_fallbacks.labels(req.reader).inc()  # the counter the service's own fallbacks move
    return JSONResponse(out)


async def read(svc: Service, request: Request) -> Response:
    req = bodies.read_request(
        bodies.json_object(await _body(request, svc.settings.service), "read", bodies.READ_EXAMPLE)
    )
    media = pick_format(request.headers.get("accept"))
    db = svc.db
    assert db is not None
    if svc.open_reads >= MAX_OPEN_READS:  # each open stream may hold a Postgres connection: bounded
        raise ServiceUnavailable(f"{MAX_OPEN_READS} reads are streaming from this service now; retry shortly")
    svc.open_reads += 1  # given back when the stream ends (ReadStream), or by ``ended`` when none opens

    def late(opened: OpenRead | None, error: BaseException | None) -> None:  # its request gave up: freed here
        if opened is not None:
            opened.stream.close()

    def ended(kept: bool) -> None:  # a read still opening keeps its place until its thread ends
        if not kept:
            svc.open_reads -= 1

    try:
        status, opened = await run_holding(
            svc.reads, svc.settings.service.timeout_seconds, lambda: open_read(db, req), late, ended
        )
    except ReadRefused as exc:
        refused = getattr(exc, "decision", None)
        if refused is not None:
            svc.metrics.read_decisions.labels(refused.reader, refused.reason).inc()
        raise
    if status != DONE:
        raise ServiceUnavailable(
            f"the read could not start within {svc.settings.service.timeout_seconds:g} s (the service is busy); retry"
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
    return ReadStream(svc, req, opened, media, headers)


async def ingest(svc: Service, request: Request) -> Response:  # noqa: C901 - each answer (409, 503, 504, the result) told apart where its state is read
    """One writer's ingest of one dataset, at most one per dataset in this service: a retry of a running ingest
    waits for it or is refused at once, never queued behind its lock. Long on purpose: each answer (409, 503, 504,
    the result) is told apart where the state that decides it is read."""
    writer = "unknown"
    try:
        obj = bodies.json_object(await _body(request, svc.settings.service), "ingest", bodies.INGEST_EXAMPLE)
        if isinstance(obj.get("writer"), str):
            writer = obj["writer"]
        req = bodies.ingest_request(obj)
    except LakehouseError as exc:
        svc.metrics.ingest(writer, "refused" if status_of(exc) < 500 else "error")
        raise
    timeout = svc.settings.service.timeout_seconds
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
    entry = RunningIngest(req.writer)
    svc.ingesting[ds] = entry

    def work():
        ident = threading.get_ident()
        svc.ingests_running[ident] = f"{req.writer} ds={ds}"
        try:
            # None: checked_write opens a connection of its own (no statement timeout: a first native write's
            # canary) only for a writer that resolves native; a pg-path ingest needs none (issue 45)
            checked = checked_write(
                None, db.ingest_dsn, db.catalog, svc.settings, db.resolver(), ds, req.writer, logger=log
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

    status, result = await run_holding(svc.ingests, max(0.0, deadline - anyio.current_time()), work, late, ended)
    if status == NOT_STARTED:
        svc.metrics.ingest(req.writer, "503")
        raise ServiceUnavailable(
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
