"""`lakehouse demo seed|status`: the demo workspace (idempotent; see lakehouse_dagster/demo/workspace.py)."""

from __future__ import annotations

import argparse

from lakehouse_dagster.cli.common import Result, add_command
from lakehouse_dagster.core.errors import BadInput


def positive_int(raw: str) -> int:
    """argparse type: a whole number >= 1 (underscores allowed: 1_000_000)."""

    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} must be at least 1")
    return value


def register(sub) -> None:
    demo = sub.add_parser("demo", help="the demo workspace (datasets of several sizes and shapes, a pipeline)")
    demosub = demo.add_subparsers(dest="demo_command", required=True, metavar="ACTION")
    p = add_command(demosub, "seed", _seed, help="create the demo workspace once (does nothing if it exists)")
    p.add_argument(
        "--rows",
        type=positive_int,
        default=1_000_000,
        metavar="N",
        help="rows of the big 'events' dataset, generated inside Postgres (default 1000000)",
    )
    add_command(demosub, "status", _status, help="list the demo datasets and pipelines")


def require_schema(conn) -> None:
    from lakehouse_dagster.api.datasets import rows_table_missing  # here: a fast --help

    if rows_table_missing(conn):
        raise BadInput("the database has no lakehouse schema yet; run: lakehouse db migrate")


def describe(summary: dict) -> str:
    lines = []
    for d in summary["datasets"]:
        rows = "" if d["rows"] is None else f"{d['rows']:>9,}"
        lines.append(f"  {d['id']}  {d['kind']:<8}  {rows:>9} rows  {d['name']}")
    for p in summary["pipelines"]:
        lines.append(f"  {p['id']}  pipeline  {p['name']}")
    return "\n".join(lines)


def _seed(ctx, args) -> Result:
    from lakehouse_dagster.demo.workspace import seed_demo  # here: pyiceberg only when the verb runs

    require_schema(ctx.conn)
    summary = seed_demo(ctx.conn, big_rows=args.rows)
    if summary["created"]:
        head = f"demo workspace {summary['workspace_id']} seeded in {summary['seconds']:.1f} s"
    else:
        head = f"demo workspace {summary['workspace_id']} already present; nothing written"
    return Result(summary, head + "\n" + describe(summary))


def _status(ctx, args) -> Result:
    from lakehouse_dagster.demo.workspace import demo_summary  # here: pyiceberg only when the verb runs

    require_schema(ctx.conn)
    summary = demo_summary(ctx.conn)
    if not summary["present"]:
        return Result(summary, "no demo workspace (create it with: lakehouse demo seed)", exit_code=3)
    return Result(summary, f"demo workspace {summary['workspace_id']}\n" + describe(summary))
