"""`lakehouse reverse status|sync|check|on|off|clear|history`: the reverse mirror (mirror/reverse.py,
flags/reverse_setting.py).
"""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table
from lakehouse_dagster.cli.common import scope_args as _scope_args
from lakehouse_dagster.cli.common import where as _where

HELP = "the reverse mirror: native Iceberg commits applied back to dataset_rows (a rollback needs no backfill)"


def register(sub) -> None:
    add_reverse(sub, "reverse", help=HELP)


def add_reverse(sub, name: str, help: str | None):
    """The `reverse` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    rp = sub.add_parser(name, **({} if help is None else {"help": help}))
    verbs = rp.add_subparsers(dest="reverse_action", required=True, metavar="VERB")
    st = add_command(verbs, "status", _reverse_status, help="each native dataset: reverse on/off, position, behind")
    st.add_argument("--dataset", help="only this dataset (native or not)")
    sy = add_command(
        verbs, "sync", _reverse_sync, help="apply what is new now (one dataset, or every native dataset behind)"
    )
    sy.add_argument("--dataset", help="dataset uuid (default: every native dataset with the reverse on and behind)")
    sy.add_argument("--full", action="store_true", help="re-sync the dataset's rows in full (needs --dataset)")
    ck = add_command(
        verbs,
        "check",
        _reverse_check,
        help="parity both ways: dataset_rows against Iceberg (lagging / ok / MISMATCH); a MISMATCH is recorded and "
        "repaired by a full reverse re-sync, never a writer rollback",
    )
    ck.add_argument("--dataset", required=True, help="dataset uuid (native, reverse on)")
    ck.add_argument("--no-repair", action="store_true", help="record a MISMATCH, do not re-sync")
    for verb, fn, what in (
        ("on", _reverse_on, "turn the reverse on (no scope = global; the default is on)"),
        ("off", _reverse_off, "turn the reverse off (a later rollback then needs a backfill)"),
        ("clear", _reverse_clear, "drop the setting at a scope (back to the next scope or the default, on)"),
    ):
        p = add_command(verbs, verb, fn, help=what)
        _scope_args(p)
        p.add_argument("--note", help="why (kept with the setting and in the audit)")
    hi = add_command(verbs, "history", _reverse_history, help="the audit of every reverse setting change")
    hi.add_argument("--limit", type=int, default=20, help="at most this many entries (default 20)")
    return rp


def _reverse_status(ctx, args) -> Result:
    from lakehouse_dagster.api.datasets import (
        get_dataset,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.reverse import (
        reverse_states,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.ids import (
        parse_uuid,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    ids = [parse_uuid(args.dataset, "dataset id")] if args.dataset else None
    if ids:
        get_dataset(ctx.conn, ids[0])  # an unknown dataset: NotFound, one line
    states = reverse_states(ctx.conn, ctx.catalog, ctx.settings, ids)
    rows = [
        {
            "dataset": f"{s.name} ({s.dataset_id})",
            "state": s.state,
            "setting": f"{'on' if s.enabled else 'off'} ({s.source})",
            "position": s.position.snapshot_id if s.position else None,
            "applied_at": s.position.applied_at if s.position else None,
            "current": s.current_snapshot,
        }
        for s in states
    ]
    text = (
        table(rows, ["dataset", "state", "setting", "position", "applied_at", "current"])
        if rows
        else ("no dataset is written iceberg-native: the reverse mirror has nothing to keep")
    )
    return Result({"datasets": [s.as_dict() for s in states]}, text)


def _reverse_check(ctx, args) -> Result:
    from lakehouse_dagster.api.datasets import (
        get_dataset,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.reverse import (
        check_reverse_parity,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.ids import (
        parse_uuid,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    ds_id = parse_uuid(args.dataset, "dataset id")
    get_dataset(ctx.conn, ds_id)  # an unknown dataset: NotFound, one line
    c = check_reverse_parity(
        ctx.conn, ctx.dsn, ctx.catalog, ctx.settings, ds_id, repair=not args.no_repair, actor=ctx.settings.project.actor
    )
    data = {
        "verdict": None if c.verdict is None else c.verdict.as_dict(),
        "parity_id": c.parity_id,
        "repair": None if c.repair is None else c.repair.as_dict(),
        "repair_error": c.repair_error,
    }
    result = Result(data, f"dataset {ds_id}: {c.line()}")
    if c.verdict is not None and c.verdict.verdict == "MISMATCH":
        result.exit_code = 1  # the canary's EXIT_MISMATCH, repaired or not: it alerts
    return result


def _reverse_sync(ctx, args) -> Result:
    from lakehouse_dagster.api.reverse import (
        apply_due,
        apply_reverse,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.errors import (
        BadInput,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if args.dataset:
        r = apply_reverse(
            ctx.dsn, ctx.catalog, ctx.settings, args.dataset, actor=ctx.settings.project.actor, full=args.full
        )
        return Result(r.as_dict(), r.summary())
    if args.full:
        raise BadInput("--full re-syncs one dataset: give --dataset <uuid>; nothing was written")
    batch = apply_due(ctx.dsn, ctx.catalog, ctx.settings, actor=ctx.settings.project.actor)
    lines = [r.summary() for r in batch.applied] + [f"dataset {d}: failed — {e}" for d, e in batch.failed]
    text = "\n".join(lines) if lines else "every native dataset with the reverse on is caught up; nothing to apply"
    result = Result(batch.as_dict(), text)
    if batch.failed:
        result.exit_code = 1
    return result


def _reverse_change(ctx, args, enabled) -> Result:
    from lakehouse_dagster.api.reverse import (
        set_reverse,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    c = set_reverse(
        ctx.conn,
        enabled,
        dataset=args.dataset,
        workspace=args.workspace,
        note=args.note,
        actor=ctx.settings.project.actor,
    )

    def word(v):
        return "(no setting)" if v is None else ("on" if v else "off")

    where = _where(c.scope)
    if enabled is None and c.before is None:
        text = f"reverse: no setting {where} to clear; nothing changed"
    else:
        text = (
            f"reverse: {word(c.before)} → {word(c.after)} {where} (by {c.actor}{'; note: ' + c.note if c.note else ''})"
            + ("; the reverse mirror applies native commits from its next run" if enabled else "")
            + ("; a rollback to pg of these datasets will need a backfill" if enabled is False else "")
        )
    data = c.as_dict()
    if c.changed:  # the native datasets a pipeline or a locked reader reads that now fail the gates (reverse off)
        stranded = _stranded_by_reverse_off(ctx.conn)
        data["stranded"] = [{"dataset_id": str(i), "name": n} for i, n in stranded]
        if stranded:
            text += (
                f"\nwarning: {len(stranded)} native dataset(s) read from dataset_rows by a pipeline or a Postgres-locked "
                "reader now fail the write-flip gates, so their next native write is refused (native_safety reports "
                "them): " + ", ".join(f"{n} ({i})" for i, n in stranded[:20]) + " — turn the reverse back on "
                "(lakehouse reverse on --dataset <id>) or roll the writer back"
            )
    return Result(data, text)


def _stranded_by_reverse_off(conn) -> list[tuple]:
    """(id, name) of the native datasets failing the gates because their reverse is off (gates.postgres_consumer_blockers)."""
    from lakehouse_dagster.api.reads import (
        unsafe_native_datasets,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    _, unsafe = unsafe_native_datasets(conn)
    return [(b.dataset_id, b.name) for b in unsafe if any("reverse mirror" in r for r in b.reasons)]


def _reverse_on(ctx, args) -> Result:
    return _reverse_change(ctx, args, True)


def _reverse_off(ctx, args) -> Result:
    return _reverse_change(ctx, args, False)


def _reverse_clear(ctx, args) -> Result:
    return _reverse_change(ctx, args, None)


def _reverse_history(ctx, args) -> Result:
    from lakehouse_dagster.api.reverse import (
        reverse_history,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rows = reverse_history(ctx.conn, args.limit)
    return Result(
        {"history": rows}, table(rows, ["at", "action", "scope", "scope_id", "before", "after", "actor", "note"])
    )
