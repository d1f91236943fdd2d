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
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.cli.console import ConsoleFilter, relay
from lakehouse_dagster.cli.demo import positive_int
from lakehouse_dagster.cli.dsn import conninfo_to_url, dagster_url, display_dsn
from lakehouse_dagster.core.errors import BadInput, LakehouseError
from lakehouse_dagster.core.network import is_loopback
from lakehouse_dagster.core.process_group import terminate_group

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DAGSTER_DB = "dagster"
# The environment variable dagster.yaml reads its storage URL from.
DAGSTER_URL_ENV = "DAGSTER_PG_URL"
CLEAN_SHUTDOWN_SECONDS = 60
STREAMS_READY_WAIT_S = 60  # ready waits this long at most for the mirror stream to hold every shard
API_PORT = 3001  # `lakehouse serve` (the live app's ML_RUNNER_URL), beside the UI's 3000
CATALOGS = ("sql", "rest")
SEAWEED_DIR = "seaweed"  # under LAKEHOUSE_HOME: data/, weed.log, credentials (owner-only)


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


def catalog_name(raw: str) -> str:
    """--catalog: refused in one line (argparse's own ``choices`` refusal adds the whole usage)."""
    if raw not in CATALOGS:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a catalog; use sql or rest")
    return raw


def port_number(raw: str) -> int:

    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (1-65535)")
    return value


def loopback_host(host: str) -> str:
    """The UI has no authentication: only loopback addresses are accepted."""
    if not is_loopback(host):
        raise BadInput(
            f"--host {host!r} is not a loopback address; the Dagster UI has no authentication, so it listens on "
            "127.0.0.1 / ::1 only (reach it from elsewhere through an SSH tunnel or an authenticating proxy)"
        )
    return host


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is not "in use"
        try:
            s.bind((host, port))
        except OSError as exc:
            raise BadInput(f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port") from None


def _connect(dsn: str) -> psycopg.Connection:
    from lakehouse_dagster.core.db import (
        connect,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    try:
        return connect(dsn, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise LakehouseError(f"cannot connect to Postgres at {display_dsn(dsn)}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def ensure_dagster_database(conn: psycopg.Connection, dsn: str) -> str:
    """A database ``dagster`` on the server ``conn`` talks to (created if missing); its URL."""
    exists = conn.execute("select 1 from pg_database where datname = %s", (DAGSTER_DB,)).fetchone()
    if not exists:
        try:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(DAGSTER_DB)))
        except psycopg.errors.DuplicateDatabase:  # created concurrently: fine
            pass
        except psycopg.Error as exc:
            raise LakehouseError(
                f"cannot create the database {DAGSTER_DB!r} for Dagster's storage on {display_dsn(dsn)} "
                f"({_first_line(exc)}); set {DAGSTER_URL_ENV} to a Postgres database Dagster may use"
            ) from None
    return dagster_url(dsn, DAGSTER_DB)


def dagster_storage_url(conn: psycopg.Connection, dsn: str) -> tuple[str, str]:
    """(url, where it came from) for dagster.yaml's storage."""
    for name in (DAGSTER_URL_ENV, "LAKEHOUSE_DAGSTER_PG_DSN"):
        given = os.environ.get(name)
        if given:
            _connect(conninfo_to_url(given, what=name)).close()  # fail now, in one line, not in three processes
            return dagster_url(given, what=name), name
    return ensure_dagster_database(conn, dsn), f"database {DAGSTER_DB!r} on the same server"


def project_file(name: str) -> Path:
    path = PROJECT_ROOT / name
    if not path.is_file():
        raise LakehouseError(
            f"{name} not found at {path}; lakehouse up runs from a source checkout (use scripts/start there)"
        )
    return path


def prepare_dagster_home(home: Path) -> Path:
    dagster_home = home / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(project_file("dagster.yaml"), dagster_home / "dagster.yaml")
    return dagster_home


def hold_home_lock(home: Path):
    """One `lakehouse up` per LAKEHOUSE_HOME: two would run two daemons on one Dagster instance."""

    home.mkdir(parents=True, exist_ok=True)
    f = open(home / ".lakehouse-up.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise BadInput(
            f"another lakehouse up (pid {holder}) is already running for {home}; stop it first, "
            "or set LAKEHOUSE_HOME to start a separate stack"
        ) from None
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    return f


def _say(msg: str) -> None:
    print(f"lakehouse up: {msg}", file=sys.stderr, flush=True)


def _up(ctx, args) -> Result:  # noqa: C901 - the start-up sequence in the order an operator sees it, each failure beside its step
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
        from lakehouse_dagster.lake.seaweed import (
            require_weed,
        )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

        require_weed()  # not installed: refused here, before anything is written

    home = settings.home
    pgdata = home / "pg"
    started_pg = False
    embedded = not settings.pg_dsn
    t_start = time.perf_counter()
    if not embedded:
        _connect(settings.pg_dsn).close()  # unreachable: refused before anything is written
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
            dsn = settings.pg_dsn
            _say(f"Postgres from LAKEHOUSE_PG_DSN: {display_dsn(dsn)}")

        # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
        from lakehouse_dagster.demo.workspace import seed_demo  # lazy: see above
        from lakehouse_dagster.schema.migrate import migrate  # lazy: see above
        from lakehouse_dagster.tracking import capture  # lazy: see above

        with _connect(dsn) as conn:
            applied = migrate(conn)
            _say(f"migrations applied: {', '.join(applied)}" if applied else "schema up to date")
            for note in capture.upgrade_from_previous_release(conn):  # tracking/capture.py
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
        catalog_info: dict[str, Any] = {"type": args.catalog or settings.catalog_type}
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
        if settings.warehouse.startswith("file://") and args.catalog != "rest":
            Path(urllib.parse.urlparse(settings.warehouse).path).mkdir(parents=True, exist_ok=True)

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
        token, token_file = api_token(home, settings.api_token)
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
        if settings.mirror_stream and settings.enable_iceberg_sync:
            streams = _streams_probe(dsn, settings.mirror_shards, t_start)
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
    from lakehouse_dagster.mirror.shards import (
        shards_held,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    def probe() -> tuple[int, int]:
        try:
            with _connect(dsn) as conn:
                return shards_held(conn, shards, started_within_s=time.perf_counter() - t_start + 5), shards
        except (LakehouseError, psycopg.Error):
            return 0, shards

    return probe


def dagster_dev_cmd(host: str, port: int, workspace_file: Path, *, debug: bool) -> list[str]:
    """``dagster dev`` with Dagster's own services (daemon, webserver) at WARNING: their INFO lines (the run queue
    and run monitoring each second, each sensor launch, the start and stop steps) are chatter on an idle stack; runs
    and sensors log through loggers of their own and still reach the console. ``--debug`` keeps Dagster's INFO."""
    return [
        *(sys.executable, "-m", "dagster", "dev", "-h", host, "-p", str(port), "-w", str(workspace_file)),
        *("--log-level", "info" if debug else "warning"),
    ]


def _seed_soak(conn: psycopg.Connection, settings, *, demo: bool) -> None:
    """Store the soak once, so every process of this stack (the CLI, the webserver, the daemon, each run) applies one
    value (flags/soak_setting.py): LAKEHOUSE_SOAK_SECONDS when set, else 0 for the demo on the embedded Postgres
    (the walkthrough widens at once), else the default hour. A stored soak is left as it is."""
    from lakehouse_dagster.flags.soak_setting import (
        current_soak,
        seed_soak,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if settings.soak_seconds_given or not demo:
        seconds, why = (
            settings.soak_seconds,
            (
                "LAKEHOUSE_SOAK_SECONDS"
                if settings.soak_seconds_given
                else "the default; LAKEHOUSE_SOAK_SECONDS is not set"
            ),
        )
    else:
        seconds, why = 0, "lowered for the demo: flips widen without waiting, still in the runbooks' order"
    seeded = seed_soak(conn, seconds, note=f"lakehouse up: {why}", actor=f"{settings.actor} (lakehouse up)")
    if seeded is None:
        _say(f"soak: {current_soak(conn, settings).describe()}")
        return
    _say(
        f"soak stored: {seeded.seconds} s ({why}); every process reads it — change it with "
        "lakehouse flags soak set <seconds>"
        + (" (a real migration soaks an hour: 3600)" if seeded.seconds == 0 else "")
    )


API_TOKEN_FILE = "api-token"


def api_token(home: Path, from_env: str | None) -> tuple[str, Path | None]:
    """The service's bearer token: LAKEHOUSE_API_TOKEN when set (no file), else the one kept in
    ``home/api-token``, made once (32 random bytes, URL-safe) with owner-only permissions; a kept file that
    others can read is narrowed to the owner. Never printed: only where it is."""
    if from_env:
        return from_env, None
    path = home / API_TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
            _say(f"{path} was readable by others: now owner-only")
        token = path.read_text().strip()
        if len(token) >= 16:
            return token, path
        raise LakehouseError(
            f"{path} holds no usable token (under 16 characters); delete it to make a new one"
        ) from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


SEAWEED_CREDENTIALS = "credentials"


def start_seaweed(root: Path):
    """SeaweedFS under ``root``, with the access key and secret kept in ``root/credentials`` (made once, owner-only),
    ready once its catalog answers with them; the kernel stops it if `lakehouse up` dies. Never prints the secret."""
    from lakehouse_dagster.lake.seaweed import (
        SeaweedServer,
        kept_credentials,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    credentials = kept_credentials(root / SEAWEED_CREDENTIALS)
    _say(f"starting SeaweedFS (S3 + Iceberg REST catalog) in {root}...")
    server = SeaweedServer(root, credentials=credentials, die_with_parent=True)
    _say(
        f"SeaweedFS ready: Iceberg REST catalog on {server.catalog_uri}, S3 on {server.s3_endpoint}, warehouse "
        f"{server.warehouse} (credentials in {root / SEAWEED_CREDENTIALS}, owner-only)"
    )
    return server


def stop_seaweed(server) -> None:
    """After Dagster and the API (nothing writes any more), before Postgres; a second Ctrl-C must not cut it short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server.close()
        _say("SeaweedFS stopped")
    except Exception as exc:
        _say(f"could not stop SeaweedFS cleanly: {_first_line(exc)} (its log: {server.log_path})")
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_postgres(pgdata: Path, *, quiet: bool = False) -> bool:
    """Stop the embedded server of ``pgdata``: ``pg_ctl stop`` (as its system user), else SIGINT to the
    postmaster (Postgres' own "fast shutdown"), which also works when pg_ctl cannot reach the directory
    (e.g. a parent directory lost its o+x). True if a running server was stopped."""
    from lakehouse_dagster.cli.pg import (
        embedded_info,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.embedded import (
        stop_embedded,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    say = (lambda msg: None) if quiet else _say
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave it half-stopped
    try:
        try:
            if stop_embedded(pgdata):
                say("embedded Postgres stopped")
                return True
        except Exception as exc:
            say(f"pg_ctl stop failed ({_first_line(exc)}); sending the postmaster a fast-shutdown signal")
        info = embedded_info(pgdata)
        if info is None:
            return False
        try:
            os.kill(info.pid, signal.SIGINT)
            info.process.wait(60)
            say("embedded Postgres stopped")
            return True
        except Exception as exc:
            say(f"could not stop the embedded Postgres in {pgdata}: {_first_line(exc)} (try: lakehouse pg stop)")
            return False
    finally:
        signal.signal(signal.SIGINT, previous)


def _child_setup() -> None:
    """In the child, before exec: default signal dispositions, and SIGINT when `lakehouse up` dies.

    A process started in the background by a shell inherits SIGINT as *ignored*, and Python then never raises
    KeyboardInterrupt: dagster dev would not hear our stop request. Resetting to the default fixes that.
    PR_SET_PDEATHSIG makes the kernel send SIGINT if `lakehouse up` dies (even by SIGKILL), so Dagster
    never outlives it.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def _load_libc():
    # Loaded in the parent: nothing should be imported between fork and exec.
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not Linux/glibc: the signal handlers in supervise() still cover Ctrl-C and SIGTERM
        return None


_LIBC = _load_libc() if sys.platform.startswith("linux") else None


def _is_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclasses.dataclass
class Child:
    """A second supervised process beside Dagster (``lakehouse serve``): its command, environment, health URL."""

    name: str
    cmd: list[str]
    env: dict
    ready_url: str
    proc: subprocess.Popen | None = None


def _start(
    cmd: list[str], env: dict, cwd: Path, as_json: bool, console: ConsoleFilter | None = None
) -> subprocess.Popen:
    """``console``: relay the child's output (both streams, in order) through that filter (cli/console.py), to
    stderr, where `lakehouse up:`'s own lines go (and with --json stdout carries only our JSON)."""
    if console is None:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup,
            stdout=sys.stderr if as_json else None,
        )
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_child_setup,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
    )
    assert proc.stdout is not None
    _RELAYS[proc.pid] = relay(proc.stdout, sys.stderr, console)
    return proc


_RELAYS: dict[int, threading.Thread] = {}  # a child's pid -> the thread relaying its console (joined at the end)


def supervise(  # noqa: C901 - one supervision loop: each child exit, signal and restart decision beside the state it reads
    cmd: list[str],
    *,
    env: dict,
    cwd: Path,
    ready_url: str,
    ready_info: dict[str, Any],
    as_json: bool,
    t_start: float,
    service: Child | None = None,
    debug: bool = False,
    streams: Callable[[], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Run ``cmd`` (Dagster) and ``service`` in their own sessions until one exits or we are asked to stop; then
    stop the other and sweep both process groups. ``streams``: () -> (shards held, shards); ready waits for all of
    them, at most STREAMS_READY_WAIT_S after Dagster answers (then the line says the rest goes through batch runs
    meanwhile). Long on purpose: the supervision loop — ready line, the two
    stop signals, the escalation to SIGKILL, the sweep — reads as one sequence."""
    if service is not None:
        service.proc = _start(service.cmd, service.env, cwd, as_json)
    proc = _start(cmd, env, cwd, as_json, ConsoleFilter(debug=debug))
    children = [proc] + ([service.proc] if service is not None and service.proc is not None else [])
    ready_info = {**ready_info, "dagster_pid": proc.pid}
    if service is not None and service.proc is not None:
        ready_info["api_pid"] = service.proc.pid
    state: dict[str, float | None] = {"signals": 0, "first_signal_at": None}

    def stop_children() -> None:
        for child in children:
            try:
                # dagster dev's clean shutdown of webserver, daemon, code server; uvicorn's graceful one
                child.send_signal(signal.SIGINT if child is proc else signal.SIGTERM)
            except ProcessLookupError:
                pass

    def on_signal(signum, frame):
        state["signals"] = (state["signals"] or 0) + 1
        if state["signals"] == 1:
            state["first_signal_at"] = time.monotonic()
            _say(f"{signal.Signals(signum).name}: stopping Dagster and the API (Ctrl-C again to kill them at once)...")
            stop_children()
        else:
            for child in children:
                _kill_group(child.pid, signal.SIGKILL)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    ready_at = None
    serving_at: float | None = None  # Dagster and the API answer; the streams may still be starting
    died_first: subprocess.Popen | None = None
    try:
        while any(c.poll() is None for c in children):
            time.sleep(0.5)
            if died_first is None and state["signals"] == 0:
                died_first = next((c for c in children if c.poll() is not None), None)
                if died_first is not None:  # one died on its own: the other goes too
                    state["first_signal_at"] = time.monotonic()
                    stop_children()
            urls = [ready_url + "/server_info"] + ([service.ready_url] if service is not None else [])
            held, shards = 0, 0
            if ready_at is None and state["signals"] == 0 and died_first is None and serving_at is None:
                if all(map(_is_ready, urls)):
                    serving_at = time.perf_counter()
            if ready_at is None and state["signals"] == 0 and died_first is None and serving_at is not None:
                if streams is not None:
                    held, shards = streams()
                    if held < shards and time.perf_counter() - serving_at < STREAMS_READY_WAIT_S:
                        continue
                ready_at = time.perf_counter()
                seconds = round(ready_at - t_start, 1)
                streaming = None if streams is None else {"shards": shards, "held": held}
                if as_json:
                    event = {**ready_info, "seconds_to_ready": seconds, "streams": streaming}
                    print(json.dumps(event, default=str), flush=True)
                else:
                    api = ""
                    if service is not None:
                        token = ready_info.get("api_token_file") or "LAKEHOUSE_API_TOKEN"
                        api = f"; the live app's API on {ready_info.get('api_url')} (token: {token})"
                    late = ""
                    if streams is not None and held < shards:
                        late = (
                            f"; the mirror stream holds {held} of {shards} shards yet: until it does, their changes"
                            " reach Iceberg through batch runs (seconds, not about one)"
                        )
                    print(
                        f"lakehouse up: ready in {seconds:.1f} s — open {ready_url}{api}{late}  "
                        "(Ctrl-C stops everything)",
                        flush=True,
                    )
            if (
                state["first_signal_at"] is not None
                and time.monotonic() - state["first_signal_at"] > CLEAN_SHUTDOWN_SECONDS
            ):
                _say(f"Dagster and the API did not stop within {CLEAN_SHUTDOWN_SECONDS} s; killing them")
                for child in children:
                    _kill_group(child.pid, signal.SIGKILL)
                state["first_signal_at"] = float("inf")
        # Whatever is left in the process groups (run workers, a stuck code server) goes too.
        for child in children:
            if _group_alive(child.pid):  # not the steps' log tails: a run's last lines still reach the console
                terminate_group(child.pid)
        deadline = time.monotonic() + 10
        while any(_group_alive(c.pid) for c in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        for child in children:
            _kill_group(child.pid, signal.SIGKILL)
        for child in children:  # what the last processes printed as they stopped (a stream run's hand-over line)
            thread = _RELAYS.pop(child.pid, None)
            if thread is not None:
                thread.join(5)
    finally:
        for child in children:
            if child.poll() is None:  # an exception in this loop: never leave a child behind
                _kill_group(child.pid, signal.SIGKILL)
                child.wait()
        for s, h in previous.items():
            signal.signal(s, h)
    svc_proc = service.proc if service is not None else None
    return {
        "requested_stop": bool(state["signals"]),
        "dagster_exit_code": proc.returncode if died_first in (None, proc) else None,
        "service_exit_code": None if svc_proc is None or died_first not in (None, svc_proc) else svc_proc.returncode,
        "seconds_to_ready": None if ready_at is None else round(ready_at - t_start, 1),
    }


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
