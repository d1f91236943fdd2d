"""`lakehouse db migrate|status`."""

from __future__ import annotations

from lakehouse_dagster.api import capture
from lakehouse_dagster.api.schema import applied_migrations, load_migrations, migrate
from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.core.db import redact


def register(sub) -> None:
    db = sub.add_parser("db", help="schema migrations of the project's Postgres")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    add_command(dbsub, "migrate", _migrate, help="apply pending migrations (idempotent)")
    add_command(dbsub, "status", _status, help="list migrations and whether each is applied")


def _migrate(ctx, args) -> Result:
    applied = migrate(ctx.conn)
    # A database the previous release left in a capture mode it no longer has (tracking/capture/upgrade.py).
    notes = capture.upgrade_from_previous_release(ctx.conn)
    text = f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied else "schema up to date"
    text = "\n".join([text, *notes])
    data = {"applied": applied, "database": redact(ctx.dsn)}
    if notes:
        data["capture_mode"] = notes
    return Result(data, text)


def _status(ctx, args) -> Result:
    done = applied_migrations(ctx.conn)
    data = [{"name": n, "applied_at": done.get(n)} for n in [m.name for m in load_migrations()]]
    text = "\n".join(f"{'applied' if d['applied_at'] else 'pending'}  {d['name']}" for d in data)
    return Result(data, text)
