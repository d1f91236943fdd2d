"""`lakehouse serve`: the HTTP service the live app calls (service/; the runbooks' ML_RUNNER_URL)."""

from __future__ import annotations

import argparse
import logging
import sys

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.cli.up import API_PORT as DEFAULT_PORT
from lakehouse_dagster.cli.up import check_port_free, port_number
from lakehouse_dagster.core.arrow_memory import prefer_jemalloc

# Dagster's console format (its runs' and sensors' records): `lakehouse up` relays both, in one format
LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"


def register(sub) -> None:
    p = add_command(
        sub,
        "serve",
        _serve,
        help="serve the HTTP API the live app calls: read, ingest, route, flags, metrics (docs/service.md)",
        description=(
            "Runs in the foreground until SIGTERM or Ctrl-C, then finishes the requests in flight within "
            "--graceful-seconds. Every endpoint but /healthz asks for the bearer token LAKEHOUSE_API_TOKEN; "
            "without one it listens on loopback only."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--graceful-seconds",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long requests in flight may take to finish (default 30)",
    )


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{value:g} is not between 1 and 3600 seconds")
    return value


def _serve(ctx, args) -> Result:
    # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.service.server import check_can_serve, serve  # lazy: see above

    settings = ctx.settings  # bad LAKEHOUSE_* values are refused here
    auth = check_can_serve(settings.service, args.host)  # refusals first: nothing is opened before these
    check_port_free(args.host, args.port)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT, stream=sys.stderr)
    host = f"[{args.host}]" if ":" in args.host else args.host
    pool = prefer_jemalloc()  # main() chose it already; the name for the ready line
    logging.getLogger("lakehouse_dagster.service").info(
        f"listening on http://{host}:{args.port} (auth: {auth}; Arrow memory: {pool}; Postgres and catalog opening)"
    )
    code = serve(settings, ctx.dsn, args.host, args.port, graceful_seconds=args.graceful_seconds)
    return Result({"event": "stopped", "exit_code": code}, "", exit_code=code)
