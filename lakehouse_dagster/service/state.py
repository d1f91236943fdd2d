"""What the endpoints share: the settings, the database, the metrics, the thread pools per kind of request, the
ingests still running and the reads open (service/app.py's module docstring: why pools of their own)."""

from __future__ import annotations

import time
import uuid

import anyio

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.service.db import ServiceDb
from lakehouse_dagster.service.metrics import ServiceMetrics

READ_THREADS, INGEST_THREADS, CONTROL_THREADS = 32, 64, 8
READY_THREADS, METRICS_THREADS = 2, 2  # /readyz and /metrics: their own, so a held route never delays them


class RunningIngest:
    """An ingest whose worker thread is running (or about to): in ``Service.ingesting`` until that thread ends."""

    def __init__(self, writer: str):
        self.writer = writer
        self.since = time.monotonic()
        self.abandoned = False  # its request was answered 504: a retry now is refused at once
        self.done = anyio.Event()


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
        self.ingesting: dict[
            uuid.UUID, RunningIngest
        ] = {}  # dataset -> its ingest whose thread still runs (loop's own)
        self.open_reads = 0  # read streams opened or opening (the event loop's own count: no lock)

    async def start(self) -> None:
        self.db = await anyio.to_thread.run_sync(ServiceDb, self.dsn, self.settings)
        self.metrics = ServiceMetrics(self.db)

    async def stop(self) -> None:
        if self.db is not None:
            await anyio.to_thread.run_sync(self.db.close)
