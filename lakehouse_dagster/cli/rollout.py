"""`lakehouse rollout plan|start|status|pause|resume|approve|abort`: rollout plans (plans/), advanced by the
`rollout_controller` sensor. A plan is a YAML file (FILE, or - for stdin) or the flags --reader/--writer,
--mode and --stage (repeatable, one stage as a YAML mapping, e.g. --stage 'datasets: 2, soak: 10m')."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from lakehouse_dagster.api.flags import current_soak
from lakehouse_dagster.cli.common import Result, add_command, table
from lakehouse_dagster.core.errors import BadInput


def register(sub) -> None:
    """Long on purpose: the argparse table of the rollout verbs, one block per verb."""
    p = sub.add_parser(
        "rollout",
        help="rollout plans: a reader or writer moved stage by stage by the rollout_controller",
        description="Rollout plans (docs/rollouts.md): dry-run, start, watch, pause, resume, approve, abort.",
    )
    actions = p.add_subparsers(dest="rollout_action", required=True, metavar="ACTION")

    pl = add_command(actions, "plan", _plan, help="dry-run: every flag change in order, the datasets each moves")
    _plan_args(pl)
    st = add_command(actions, "start", _start, help="start a plan (refused, naming the gate, if a gate would stop it)")
    _plan_args(st)

    ss = add_command(actions, "status", _status, help="each plan's stage, next action, blocking reason, history")
    ss.add_argument("id", nargs="?", help="one plan (its id or first 8 characters); none: the recent plans")
    ss.add_argument("--history", type=int, default=20, help="events shown per plan (default 20; 0: none)")

    for verb, func, help_text, opt in (
        ("pause", _pause, "pause a plan where it is", "--reason"),
        ("resume", _resume, "resume a paused plan", "--note"),
        ("approve", _approve, "approve the stage a plan waits at", "--note"),
        ("abort", _abort, "abort a plan: every flag it set goes back to its value before the plan", "--reason"),
    ):
        a = add_command(actions, verb, func, help=help_text)
        a.add_argument("id", help="the plan's id (or its first 8 characters)")
        a.add_argument(opt, dest="text", help="why (kept in the plan's history)")


def _plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="the plan file (YAML); - reads stdin; or give --reader/--writer and --stage")
    p.add_argument("--reader", help="instead of a file: the reader to move")
    p.add_argument("--writer", help="instead of a file: the writer to move")
    p.add_argument("--mode", help="the target mode (reader: iceberg or iceberg_only; writer: iceberg_native)")
    p.add_argument(
        "--stage",
        action="append",
        default=[],
        help="one stage as a YAML mapping, repeatable, in order: 'datasets: 2, soak: 10m', 'workspace: <uuid>', "
        "'global: true, approval: true'",
    )


def _source(args) -> tuple[str, str]:
    """(the plan's text, its origin for error lines)."""
    flags = args.reader or args.writer or args.mode or args.stage
    if args.file and flags:
        raise BadInput("give a plan FILE or --reader/--writer/--mode/--stage, not both")
    if args.file == "-":
        return sys.stdin.read(), "stdin"
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise BadInput(f"{args.file}: no such file; give the path of a plan file (YAML)")
        return path.read_text(encoding="utf-8"), args.file
    if not flags:
        raise BadInput("give a plan FILE (YAML), or --reader/--writer with --stage (see lakehouse rollout plan --help)")
    raw: dict = {}
    if args.reader:
        raw["reader"] = args.reader
    if args.writer:
        raw["writer"] = args.writer
    if args.mode:
        raw["mode"] = args.mode
    stages = []
    for i, text in enumerate(args.stage):
        body = text.strip()
        try:
            stage = yaml.safe_load(body if body.startswith("{") else "{" + body + "}")
        except yaml.YAMLError:
            raise BadInput(
                f"--stage {i + 1} ({text!r}) is not a mapping; write e.g. 'datasets: 2, soak: 10m'"
            ) from None
        stages.append(stage)
    raw["stages"] = stages
    return yaml.safe_dump(raw, sort_keys=False), "flags"


def _plan(ctx, args) -> Result:
    from lakehouse_dagster.api import plans  # lazy: the CLI imports a verb's machinery only when that verb runs

    text, origin = _source(args)
    rendered = plans.dry_run(ctx.conn, ctx.settings, text, origin)
    lines = rendered.lines() + ["dry-run: nothing written" + ("" if not rendered.problems else "; the plan is refused")]
    return Result(rendered.as_dict(), "\n".join(lines), 6 if rendered.problems else 0)


def _start(ctx, args) -> Result:
    from lakehouse_dagster.api import plans  # lazy: the CLI imports a verb's machinery only when that verb runs

    text, origin = _source(args)
    plan_id, rendered = plans.start(ctx.conn, ctx.settings, text, actor=ctx.settings.project.actor, origin=origin)
    lines = [f"started plan {plan_id} ({len(rendered.changes)} flag change(s)); the rollout_controller advances it"]
    lines += rendered.lines()
    lines.append(f"watch it: lakehouse rollout status {str(plan_id)[:8]}")
    return Result({"plan_id": str(plan_id), **rendered.as_dict()}, "\n".join(lines))


def _status(ctx, args) -> Result:
    from lakehouse_dagster.api import plans  # lazy: the CLI imports a verb's machinery only when that verb runs

    if args.history < 0:
        raise BadInput(f"--history {args.history} must be 0 or more")
    soak = current_soak(ctx.conn, ctx.settings).seconds
    if args.id:
        s = plans.plan_status(ctx.conn, plans.resolve_id(ctx.conn, args.id), soak_seconds=soak, history=args.history)
        return Result(s.as_dict(), "\n".join(s.lines(history=args.history > 0)))
    found = plans.recent_statuses(ctx.conn, soak_seconds=soak, history=args.history if args.json else 0)
    rows = [
        {
            "id": str(s.id)[:8],
            "flag": s.name,
            "mode": s.mode,
            "state": s.state,
            "stage": f"{s.stage}/{s.stages} {s.stage_what}",
            "phase": s.phase,
            "next": s.next_action[:80],
        }
        for s in found
    ]
    text = table(rows, ["id", "flag", "mode", "state", "stage", "phase", "next"]) if rows else "no rollout plan yet"
    return Result([s.as_dict() for s in found], text)


def _act(ctx, args, verb: str) -> Result:
    from lakehouse_dagster.api import plans  # lazy: the CLI imports a verb's machinery only when that verb runs

    plan_id = plans.resolve_id(ctx.conn, args.id)
    actor = ctx.settings.project.actor
    message = ""
    if verb == "pause":
        plans.pause(ctx.conn, plan_id, actor=actor, reason=args.text)
    elif verb == "resume":
        plans.resume(ctx.conn, plan_id, actor=actor, note=args.text)
    elif verb == "approve":
        plans.approve(ctx.conn, plan_id, actor=actor, note=args.text)
    else:
        outcome = plans.abort(ctx.conn, ctx.settings.project, plan_id, actor=actor, reason=args.text)
        message = outcome.message
        if outcome.restored is not None:
            message += "".join(f"\n  restored {r}" for r in outcome.restored.restored)
            message += "".join(f"\n  REFUSED {r}" for r in outcome.restored.refused)
    s = plans.plan_status(ctx.conn, plan_id, soak_seconds=current_soak(ctx.conn, ctx.settings).seconds, history=0)
    text = "\n".join(([message] if message else []) + s.lines(history=False))
    return Result(s.as_dict() | ({"message": message} if message else {}), text)


def _pause(ctx, args) -> Result:
    return _act(ctx, args, "pause")


def _resume(ctx, args) -> Result:
    return _act(ctx, args, "resume")


def _approve(ctx, args) -> Result:
    return _act(ctx, args, "approve")


def _abort(ctx, args) -> Result:
    return _act(ctx, args, "abort")
