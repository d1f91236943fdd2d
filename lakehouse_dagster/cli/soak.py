"""`lakehouse soak set|show`: the stored soak every process reads, readers' and writers' gates alike
(flags/soak_setting.py)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table

HELP = "the soak of the widening rules, stored for the CLI and every Dagster process (readers and writers)"


def register(sub) -> None:
    add_soak(sub, "soak", help=HELP)


def add_soak(sub, name: str, help: str | None):
    """The `soak` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    sp = sub.add_parser(name, **({} if help is None else {"help": help}))
    verbs = sp.add_subparsers(dest="soak_action", required=True, metavar="VERB")
    st = add_command(verbs, "set", _soak_set, help="store the soak in seconds (audited); 0: no waiting, same order")
    st.add_argument("seconds", help="whole seconds, e.g. 3600; 0 drops the waiting, never the order")
    st.add_argument("--note", help="why (kept in the audit)")
    sh = add_command(
        verbs, "show", _soak_show, help="the soak every process applies now, where it comes from, its audit"
    )
    sh.add_argument("--limit", type=int, default=10, help="audit entries shown (default 10)")
    return sp


def _soak_set(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        set_soak,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    before, after = set_soak(ctx.conn, args.seconds, note=args.note, actor=ctx.settings.project.actor)
    was = f"{before.seconds} s" if before else "nothing stored"
    text = (
        f"soak: {was} → {after.seconds} s, stored (by {after.set_by}{'; note: ' + after.note if after.note else ''}); "
        "the CLI and every Dagster process apply it from their next flag change"
        + (
            "; 0 drops the waiting, not the order (dataset → workspace → global, writers one at a time)"
            if after.seconds == 0
            else ""
        )
    )
    return Result(
        {"before": before.as_dict() if before else None, "after": after.as_dict()}, text + _env_note(ctx, after)
    )


def _soak_show(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        current_soak,
        soak_history,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    now = current_soak(ctx.conn, ctx.settings)
    rows = soak_history(ctx.conn, args.limit)
    lines = [f"soak: {now.describe()}" + _env_note(ctx, now), "", "audit (newest first)"]
    lines.append(table(rows, ["at", "before", "after", "actor", "note"]))
    return Result({"soak": now.as_dict(), "history": rows}, "\n".join(lines))


def _env_note(ctx, now) -> str:
    """LAKEHOUSE_SOAK_SECONDS set in this shell but overruled by the stored value: say it is ignored."""
    if (
        now.source != "stored"
        or not ctx.settings.rollout.soak_seconds_given
        or ctx.settings.rollout.soak_seconds == now.seconds
    ):
        return ""
    return (
        f"\nnote: LAKEHOUSE_SOAK_SECONDS={ctx.settings.rollout.soak_seconds} in this shell is ignored: the stored soak "
        f"({now.seconds} s) applies to every process"
    )
