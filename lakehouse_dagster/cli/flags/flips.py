"""`flags flip`, `write-flags flip`: the flip runbook steps (preflight canary, gated set, verify)."""

from __future__ import annotations

import logging
import sys

from lakehouse_dagster.api.flags import READ, WRITE  # no psycopg: a usage error answers at once
from lakehouse_dagster.cli.common import Result, table
from lakehouse_dagster.cli.flags.shared import _change_data, _scope_args


def _flip_args(p) -> None:
    _scope_args(p)
    p.add_argument("--note", help="why (kept with the override and in the audit)")
    p.add_argument("--no-smoke", action="store_true", help="skip the value-level check in the preflight canary")
    p.add_argument(
        "--reuse-minutes",
        type=int,
        default=60,
        help="reuse ok verdicts this recent at an unchanged Postgres version (default 60; 0: never)",
    )
    p.add_argument(
        "--max-datasets",
        type=int,
        default=500,
        help="refuse a flip whose preflight would canary more datasets (default 500)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=20,
        help="a workspace/global widen canaries this many moved datasets at random afresh, plus every "
        "one with no recent ok verdict (default 20)",
    )


NOTHING_CANARIED = "preflight canary: no dataset to check, the flip moves none"


def _preflight_and_flip(ctx, args, kind: str, mode: str):
    """Both flip verbs: the preflight table, then the gated flip, or the STOP result (nothing written)."""
    from lakehouse_dagster.api import (
        flips,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pre = flips.preflight(
        ctx.conn,
        ctx.dsn,
        ctx.catalog,
        ctx.settings,
        args.name,
        mode,
        kind=kind,
        dataset=args.dataset,
        workspace=args.workspace,
        smoke=not args.no_smoke,
        reuse_minutes=args.reuse_minutes,
        max_datasets=args.max_datasets,
        sample=args.sample,
    )
    checked = [c.as_dict() for c in pre.checked]
    lines = [table(checked, ["verdict", "reused", "name", "dataset_id", "detail"]) if checked else NOTHING_CANARIED]
    lines.append(pre.coverage())
    if not pre.go:
        stop = Result(
            {"preflight": checked, "coverage": pre.coverage(), "flipped": False},
            "\n".join(lines + [pre.stop_message()]),
            exit_code=1,
        )
        return pre, checked, lines, None, stop
    change = flips.flip(ctx.conn, pre, note=args.note, actor=ctx.settings.project.actor)
    return pre, checked, lines, change, None


def _flip(ctx, args) -> Result:
    from lakehouse_dagster.api import (
        flips,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pre, checked, lines, change, stop = _preflight_and_flip(ctx, args, READ, args.mode)
    if stop:
        return stop
    out = _Said(args, lines)
    out.add(
        f"{args.name}: {change.before or '(no override)'} → {change.after} ({pre.report.where}); "
        f"{len(pre.inert)} dataset(s) stay on Postgres until the mirror catches up (lagging/no-snapshot)",
        *pre.report.lines(),
    )
    out.flush()  # the preflight and the set, before the router's lines of the verify they precede
    # the runbook's "confirm the read-router logs reason=...": the router's line per read, in order with the rest
    verified = flips.verify(ctx.conn, ctx.catalog, ctx.settings, args.name, flips.moved_ids(pre), logger=out.logger())
    fell_back = [v for v in verified if v.fallback_error]
    if verified:
        out.add(table([v.as_dict() for v in verified], ["dataset_id", "source", "reason", "snapshot_id"]))
    if fell_back:
        out.add(flips.fallback_message(args.name, pre.scope, fell_back))
    data = {
        "preflight": checked,
        "coverage": pre.coverage(),
        "flipped": True,
        "change": _change_data(change),
        "scope": pre.report.as_dict(),
        "verify": [v.as_dict() for v in verified],
    }
    return Result(data, out.rest(), exit_code=1 if fell_back else 0)


def _wflip(ctx, args) -> Result:
    from lakehouse_dagster.api import (
        flips,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.reverse import (
        where_native_writes_land,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pre, checked, lines, change, stop = _preflight_and_flip(ctx, args, WRITE, "iceberg_native")
    if stop:
        return stop
    out = _Said(args, lines)
    verified = flips.verify_write(ctx.conn, args.name, flips.moved_ids(pre))
    out.add(
        f"{args.name}: {change.before or '(no override)'} → {change.after} ({pre.report.where}); "
        + where_native_writes_land(ctx.conn, flips.moved_ids(pre)),
        *pre.report.lines(),
    )
    rows = [{**v.as_dict(), "problems": "; ".join(v.problems)} for v in verified]
    if rows:
        out.add(
            table(rows, ["dataset_id", "writer_mode", "mirror_skips", "latest_sync", "row_count_matches", "problems"])
        )
    bad = [v for v in verified if v.problems]
    data = {
        "preflight": checked,
        "coverage": pre.coverage(),
        "flipped": True,
        "change": _change_data(change),
        "scope": pre.report.as_dict(),
        "verify": [v.as_dict() for v in verified],
    }
    if bad:
        out.add(
            f"{len(bad)} dataset(s) did not verify; roll back with: lakehouse write-flags set {args.name} pg"
            + ("" if pre.scope.scope_id is None else f" --{pre.scope.scope} {pre.scope.scope_id}")
        )
        return Result(data, out.rest(), exit_code=1)
    from lakehouse_dagster.api.flips import (
        first_native_syncs,
        stop_message,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if not pre.checked:
        return Result(data, out.rest())
    out.add(f"first native sync of {args.name}, then the canary on it (runbook step 3):")
    out.flush()  # everything so far, before the write router's and the sync's lines of the step that follows
    synced = first_native_syncs(
        ctx.conn, ctx.dsn, ctx.catalog, ctx.settings, args.name, flips.moved_ids(pre), logger=out.logger()
    )
    data["first_native_sync"] = [f.as_dict() for f in synced]
    out.add(table([f.as_dict() for f in synced], ["dataset_id", "verdict", "path", "rows", "snapshot_id", "detail"]))
    stop = stop_message(args.name, synced)
    if stop:
        out.add(stop)
    return Result(data, out.rest(), exit_code=1 if stop else 0)


class _Said:
    """What a flip verb says, in the order it happens (issue 33): in text mode each finished step is written to stdout
    and flushed before the next step logs, and the router's lines of that step go to stdout too, so a terminal, a
    file or one pipe of both streams reads preflight → set → verify in order. With --json stdout carries only the
    document: the lines are kept for it and the router's lines go to stderr."""

    def __init__(self, args, lines: list[str]) -> None:
        self.live = not getattr(args, "json", False)
        self.lines = list(lines)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def flush(self) -> None:
        if self.live and self.lines:
            sys.stdout.write("\n".join(self.lines).rstrip("\n") + "\n")
            sys.stdout.flush()
            self.lines = []

    def logger(self) -> logging.Logger:
        """The router's lines, one per read or write, on the stream the step's own lines use."""
        lg = logging.getLogger("lakehouse_dagster.cli.flip")
        for old in list(lg.handlers):
            lg.removeHandler(old)
        handler = logging.StreamHandler(sys.stdout if self.live else sys.stderr)  # flushed after every line
        handler.setFormatter(logging.Formatter("%(message)s"))
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
        return lg

    def rest(self) -> str:
        """The lines not written yet: the Result's text (emit prints it last)."""
        return "\n".join(self.lines)
