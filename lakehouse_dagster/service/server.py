"""Running the app: uvicorn, one process, graceful shutdown within a bound.

SIGTERM (or Ctrl-C) makes uvicorn stop accepting connections, close idle ones and wait up to ``graceful_seconds``
for requests in flight; past that it cancels them (a read's stream is closed and its connection freed). An
ingest's worker thread cannot be cancelled: one still running then is named in the log and the process exits
anyway — as a crash would, which the writers are built for (nothing half-committed; its ``running`` sync row is
settled by the next write of the dataset, mirror/reaper.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import uvicorn

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.network import is_loopback
from lakehouse_dagster.core.settings import ServiceSettings, Settings
from lakehouse_dagster.service.app import create_app

log = logging.getLogger("lakehouse_dagster.service")

MIN_TOKEN_CHARS = 16


def check_can_serve(service: ServiceSettings, host: str) -> str:
    """What auth the service runs with; BadInput when it must not start (nothing is opened before this)."""
    token = service.token
    if token is None:
        if not is_loopback(host):
            raise BadInput(
                f"--host {host} is not a loopback address and LAKEHOUSE_API_TOKEN is not set: the service would "
                "answer anyone; set LAKEHOUSE_API_TOKEN (the runbooks' ML_RUNNER_TOKEN) or listen on 127.0.0.1"
            )
        return "none (no LAKEHOUSE_API_TOKEN: loopback only, every local process may call it)"
    if len(token) < MIN_TOKEN_CHARS or token != token.strip():
        raise BadInput(
            f"LAKEHOUSE_API_TOKEN must be at least {MIN_TOKEN_CHARS} characters without surrounding spaces (it has "
            f"{len(token)}); make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return "bearer token (LAKEHOUSE_API_TOKEN)"


def serve(settings: Settings, dsn: str, host: str, port: int, *, graceful_seconds: float) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean stop, 1 when the start failed or ingests had to be cut."""
    app = create_app(settings, dsn, host)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        timeout_graceful_shutdown=int(max(1, graceful_seconds)),
        server_header=False,
        proxy_headers=False,
        log_config=None,  # the CLI configured logging (one format for uvicorn's lines and ours)
        access_log=True,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it is done: caught here, so the process ends by our
    # return code and the log says how it ended.
    stopped_by: list[str] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopped_by.append(signal.Signals(signum).name))
    server.run()
    if not server.started:
        return 1
    running = app.svc.ingests_running  # type: ignore[attr-defined]
    deadline = time.monotonic() + 2  # an ingest that finished just now is leaving its worker thread
    while running and time.monotonic() < deadline:
        time.sleep(0.05)
    if running:
        log.error(
            f"stopped; {len(running)} ingest(s) still running past the {graceful_seconds:g} s bound are cut "
            f"as by a crash (nothing half-committed; their sync rows are settled by the next write of each "
            f"dataset): {', '.join(running.values())}"
        )
        sys.stderr.flush()
        os._exit(1)
    log.info(f"stopped ({', '.join(dict.fromkeys(stopped_by)) or 'shut down'})")
    return 0
