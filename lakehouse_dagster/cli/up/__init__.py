"""`lakehouse up`: everything on one machine — Postgres, schema, demo data, Dagster webserver + daemon.

Steps, in order (bad input is refused before the first one, so a refusal writes nothing):

1. Postgres: ``LAKEHOUSE_PG_DSN`` if set, else the embedded server under ``$LAKEHOUSE_HOME/pg``
   (started here unless it already runs).
2. ``migrate`` (idempotent), then the demo workspace (idempotent; ``--no-demo`` skips it).
3. Dagster's own storage: ``DAGSTER_PG_URL`` (or ``LAKEHOUSE_DAGSTER_PG_DSN``) if set, else a database
   ``dagster`` on the same server (created if missing).
4. ``DAGSTER_HOME=$LAKEHOUSE_HOME/dagster`` with the project's ``dagster.yaml`` copied in; with ``--catalog rest``
   SeaweedFS (``weed mini``: an S3 gateway and an Iceberg REST catalog, lake/seaweed.py) under
   ``$LAKEHOUSE_HOME/seaweed``, its credentials kept there owner-only, and every process started below gets the
   ``LAKEHOUSE_CATALOG_*`` settings of it (the warehouse on its S3).
5. ``dagster dev -h HOST -p PORT -w workspace.yaml`` as one supervised child in its own session, and beside it
   ``lakehouse serve`` on ``--api-port`` (the live app's API, docs/service.md) with the bearer token from
   ``LAKEHOUSE_API_TOKEN``, or else the one kept in ``$LAKEHOUSE_HOME/api-token`` (made once, owner-only).
6. ``ready`` once the UI and the API answer and the mirror stream holds every shard (at most STREAMS_READY_WAIT_S
   later; the line then says the shards not held yet go through batch runs meanwhile).

Why ``dagster dev`` rather than ``dagster-webserver`` + ``dagster-daemon run`` side by side: it runs exactly
those two processes, but behind one shared code server, so the code location (pyiceberg, pyarrow, ...) is
loaded once instead of twice — it matters on a 2-core machine — and it already shuts both down cleanly
through its IPC pipes and stops when either dies. We supervise it from the outside: one SIGINT for a clean
shutdown, SIGKILL to its process group when that takes too long or a second Ctrl-C arrives, the process
group is swept afterwards (run workers), then SeaweedFS, and Postgres is stopped last if this command started it.

The package: this face (the verb: ``register``, ``_up``), ``checks.py`` (the refusals before the first step),
``dagster_home.py`` (Dagster's storage and home, the API token, the soak), ``services.py`` (SeaweedFS, the embedded
Postgres's stop, the ``dagster dev`` command), ``supervise.py`` (the children, until they exit or we stop them),
``shared.py`` (a console line, an error's first line, a connection).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.cli.demo import positive_int
from lakehouse_dagster.cli.dsn import conninfo_to_url, display_dsn
from lakehouse_dagster.cli.up.checks import (
    API_PORT,
    CATALOGS,
    catalog_name,
    check_port_free,
    hold_home_lock,
    loopback_host,
    port_number,
)
from lakehouse_dagster.cli.up.dagster_home import (
    API_TOKEN_FILE,
    DAGSTER_DB,
    DAGSTER_URL_ENV,
    PROJECT_ROOT,
    _seed_soak,
    api_token,
    dagster_storage_url,
    ensure_dagster_database,
    prepare_dagster_home,
    project_file,
)
from lakehouse_dagster.cli.up.services import (
    SEAWEED_CREDENTIALS,
    SEAWEED_DIR,
    dagster_dev_cmd,
    start_seaweed,
    stop_postgres,
    stop_seaweed,
)
from lakehouse_dagster.cli.up.shared import _connect, _first_line, _say
from lakehouse_dagster.cli.up.supervise import CLEAN_SHUTDOWN_SECONDS, STREAMS_READY_WAIT_S, Child, supervise
from lakehouse_dagster.core.errors import BadInput, LakehouseError

__all__ = [
    "API_PORT",
    "API_TOKEN_FILE",
    "CATALOGS",
    "CLEAN_SHUTDOWN_SECONDS",
    "DAGSTER_DB",
    "DAGSTER_URL_ENV",
    "PROJECT_ROOT",
    "SEAWEED_CREDENTIALS",
    "SEAWEED_DIR",
    "STREAMS_READY_WAIT_S",
    "Child",
    "api_token",
    "catalog_name",
    "check_port_free",
    "dagster_dev_cmd",
    "dagster_storage_url",
    "ensure_dagster_database",
    "hold_home_lock",
    "loopback_host",
    "port_number",
    "prepare_dagster_home",
    "project_file",
    "register",
    "start_seaweed",
    "stop_postgres",
    "stop_seaweed",
    "supervise",
]


def register(sub) -> None:
    p = add_command(
        sub,
        "up",
        _up,
        help="start everything: Postgres (embedded unless LAKEHOUSE_PG_DSN), schema, demo, Dagster webserver + daemon",
        description=(
            "Start the whole stack in the foreground; Ctrl-C stops Dagster and (if started here) the embedded Postgres. "
            "Data lives under $LAKEHOUSE_HOME (default ./.lakehouse): pg/, dagster/, warehouse/."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="loopback address for the Dagster UI (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=3000, help="port of the Dagster UI (default 3000)")
    p.add_argument(
        "--api-port",
        type=port_number,
        default=API_PORT,
        help=f"port of the live app's API, lakehouse serve (default {API_PORT})",
    )
    p.add_argument("--no-demo", action="store_true", help="do not seed the demo workspace")
    p.add_argument(
        "--catalog",
        type=catalog_name,
        default=None,
        metavar="{sql,rest}",
        help="the Iceberg catalog: sql (pyiceberg's SQL catalog on the same Postgres) or rest (starts SeaweedFS "
        "beside it: an Iceberg REST catalog, the warehouse on its S3; needs pip install -e '.[rest]'); "
        "default: LAKEHOUSE_CATALOG_TYPE, else sql",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="relay Dagster's whole console: every run's DEBUG events, beta warnings, the sensor daemon's per-tick "
        "lines (default: INFO and above, without those; the UI's event log has everything either way)",
    )
    p.add_argument(
        "--demo-rows",
        type=positive_int,
        default=1_000_000,
        metavar="N",
        help="rows of the big demo dataset when it is first seeded (default 1000000)",
    )


def _up(ctx, args) -> Result:  # noqa: C901
    # -- refusals first: nothing is written or started before these pass
    """Long on purpose: the start-up sequence (Postgres, schema, demo, Dagster, the ready line, the shutdown) reads top to bottom in the order an operator sees it, each step's failure message beside it."""
    host = loopback_host(args.host)
    settings = ctx.settings  # bad LAKEHOUSE_* values are refused here
    workspace_file = project_file("workspace.yaml")
    project_file("dagster.yaml")
    check_port_free(host, args.port)
    if args.api_port == args.port:
        raise BadInput(f"--api-port {args.api_port} is the Dagster UI's --port too; pick another")
    check_port_free(host, args.api_port)
    for name in (DAGSTER_URL_ENV, "LAKEHOUSE_DAGSTER_PG_DSN"):
        if os.environ.get(name):
            conninfo_to_url(os.environ[name], what=name)
    if args.catalog == "rest":
        from lakehouse_dagster.api.lake import (
            require_weed,
        )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

        require_weed()  # not installed: refused here, before anything is written

    home = settings.project.home
    pgdata = home / "pg"
    started_pg = False
    embedded = not settings.postgres.dsn
    t_start = time.perf_counter()
    if not embedded:
        _connect(settings.postgres.dsn).close()  # unreachable: refused before anything is written
    lock = hold_home_lock(home)  # noqa: F841 - held (open) until this process exits
    seaweed = None
    try:
        if embedded:
            from lakehouse_dagster.cli.pg import (
                embedded_info,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
            from lakehouse_dagster.core.embedded import (
                start_embedded,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            started_pg = embedded_info(pgdata) is None
            try:
                dsn = start_embedded(pgdata)
            except Exception as exc:
                raise LakehouseError(
                    f"could not start the embedded Postgres in {pgdata}: {_first_line(exc)} (see {pgdata / 'log'})"
                ) from None
            _say(f"embedded Postgres {'started' if started_pg else 'already running'}: {display_dsn(dsn)}")
        else:
            dsn = settings.postgres.dsn
            _say(f"Postgres from LAKEHOUSE_PG_DSN: {display_dsn(dsn)}")

        # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
        from lakehouse_dagster.api import capture  # lazy: see above
        from lakehouse_dagster.api.schema import migrate  # lazy: see above
        from lakehouse_dagster.demo.workspace import seed_demo  # lazy: see above

        with _connect(dsn) as conn:
            applied = migrate(conn)
            _say(f"migrations applied: {', '.join(applied)}" if applied else "schema up to date")
            for note in capture.upgrade_from_previous_release(conn):  # tracking/capture/upgrade.py
                _say(note)
            demo = None
            if not args.no_demo:
                _say("seeding the demo workspace (once; the big dataset is generated inside Postgres)...")
                demo = seed_demo(conn, big_rows=args.demo_rows)
                if demo["created"]:
                    big = max(d["rows"] or 0 for d in demo["datasets"])
                    _say(
                        f"demo workspace seeded in {demo['seconds']:.1f} s ({len(demo['datasets'])} datasets, "
                        f"largest {big:,} rows)"
                    )
                else:
                    _say("demo workspace already present")
            _seed_soak(conn, settings, demo=demo is not None and embedded)
            dagster_url, dagster_url_source = dagster_storage_url(conn, dsn)
        _say(f"Dagster storage: {display_dsn(dagster_url)} ({dagster_url_source})")

        dagster_home = prepare_dagster_home(home)
        catalog_env: dict[str, str] = {}
        catalog_info: dict[str, Any] = {"type": args.catalog or settings.catalog.type}
        if args.catalog == "rest":
            seaweed = start_seaweed(home / SEAWEED_DIR)
            catalog_env = seaweed.env
            catalog_info.update(
                uri=seaweed.catalog_uri,
                warehouse=seaweed.warehouse,
                s3_endpoint=seaweed.s3_endpoint,
                credentials_file=str(home / SEAWEED_DIR / SEAWEED_CREDENTIALS),
            )
        elif args.catalog == "sql":
            catalog_env = {"LAKEHOUSE_CATALOG_TYPE": "sql"}
        if settings.catalog.warehouse.startswith("file://") and args.catalog != "rest":
            Path(urllib.parse.urlparse(settings.catalog.warehouse).path).mkdir(parents=True, exist_ok=True)

        env = dict(os.environ)
        # `dagster dev` is marked superseded by `dg dev` (a separate package); the warning is noise here.
        env["PYTHONWARNINGS"] = ",".join(
            w for w in (env.get("PYTHONWARNINGS"), "ignore:Function `dev_command` is superseded") if w
        )
        env.update(
            {
                "LAKEHOUSE_HOME": str(home),
                "LAKEHOUSE_PG_DSN": dsn,
                DAGSTER_URL_ENV: dagster_url,
                "DAGSTER_HOME": str(dagster_home),
                **catalog_env,
            }
        )
        url_host = f"[{host}]" if ":" in host else host
        url = f"http://{url_host}:{args.port}"
        cmd = dagster_dev_cmd(host, args.port, workspace_file, debug=args.debug)
        api_url = f"http://{url_host}:{args.api_port}"
        token, token_file = api_token(home, settings.service.token)
        serve_cmd = [sys.executable, "-m", "lakehouse_dagster.cli.main", "serve", "--host", host]
        serve_cmd += ["--port", str(args.api_port)]
        service = Child("lakehouse serve", serve_cmd, {**env, "LAKEHOUSE_API_TOKEN": token}, api_url + "/healthz")
        ready_info = {
            "event": "ready",
            "url": url,
            "api_url": api_url,
            "api_token_file": None if token_file is None else str(token_file),
            "lakehouse_home": str(home),
            "dagster_home": str(dagster_home),
            "database": display_dsn(dsn),
            "embedded_postgres": embedded,
            "dagster_storage": display_dsn(dagster_url),
            "catalog": catalog_info,
            "migrations_applied": applied,
            "demo": demo,
        }
        _say(f"starting Dagster webserver + daemon on {url} (DAGSTER_HOME={dagster_home})")
        where = f"in {token_file} (owner-only)" if token_file else "from LAKEHOUSE_API_TOKEN"
        _say(f"starting the live app's API on {api_url}: its bearer token is {where}")
        streams = None
        if settings.stream.enabled and settings.mirror.enabled:
            streams = _streams_probe(dsn, settings.stream.shards, t_start)
        outcome = supervise(
            cmd,
            env=env,
            cwd=dagster_home,
            ready_url=url,
            ready_info=ready_info,
            as_json=args.json,
            t_start=t_start,
            service=service,
            debug=args.debug,
            streams=streams,
        )
    finally:
        if seaweed is not None:
            stop_seaweed(seaweed)
        if started_pg:
            stop_postgres(pgdata)
    if outcome["requested_stop"]:
        data = {"event": "stopped", **outcome}
        if args.json:
            # `up --json` speaks JSON lines (ready, then stopped): print this one compactly too, as text.
            args.json = False
            return Result(data, json.dumps(data))
        return Result(data, "lakehouse up: stopped")
    if outcome.get("service_exit_code") is not None and outcome["dagster_exit_code"] is None:
        raise LakehouseError(
            f"the live app's API (lakehouse serve) exited unexpectedly with code {outcome['service_exit_code']} "
            "(its log is above); everything stopped"
        )
    raise LakehouseError(
        f"Dagster exited unexpectedly with code {outcome['dagster_exit_code']} (its log is above); everything stopped"
    )


def _streams_probe(dsn: str, shards: int, t_start: float):
    """() -> (shards held by this stack's stream runs, shards): the ready line waits for every shard's stream, so a
    change made after it reaches Iceberg through the stream (about a second), not a batch run (several)."""
    from lakehouse_dagster.api.mirror import (
        shards_held,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    def probe() -> tuple[int, int]:
        try:
            with _connect(dsn) as conn:
                return shards_held(conn, shards, started_within_s=time.perf_counter() - t_start + 5), shards
        except (LakehouseError, psycopg.Error):
            return 0, shards

    return probe
