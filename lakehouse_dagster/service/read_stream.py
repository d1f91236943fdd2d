"""A read's answer streamed batch by batch (``POST /lakehouse/read``): produced and encoded in worker threads, cut
when the client goes away or stalls, and its read closed in every case."""

from __future__ import annotations

import logging

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from lakehouse_dagster.service import bodies
from lakehouse_dagster.service.encode import encoder_for
from lakehouse_dagster.service.reads import OpenRead
from lakehouse_dagster.service.state import Service

log = logging.getLogger("lakehouse_dagster.service")


class ReadStream(Response):
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
        timeout = self.svc.settings.service.timeout_seconds
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
