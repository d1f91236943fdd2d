"""`lakehouse shadow-proof set|show`: the shadow proof a compute reader's flip needs, one stored value per database
(flags/proof.py ``threshold``)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table

HELP = (
    "the shadow proof a flip of objects.sync, dashboards.aggregate or pipeline.expectations needs: comparisons in a "
    "row, stored for the CLI and every Dagster process"
)


def register(sub) -> None:
    """`shadow-proof set|show`: how many shadow comparisons in a row a flip of a compute reader needs."""
    pp = sub.add_parser("shadow-proof", help=HELP)
    verbs = pp.add_subparsers(dest="proof_action", required=True, metavar="VERB")
    st = add_command(
        verbs, "set", _proof_set, help="store the comparisons in a row a flip needs (audited), for every process"
    )
    st.add_argument("reads", help="whole comparisons in a row, 1 or more, e.g. 300 (the default)")
    st.add_argument("--note", help="why (kept in the audit)")
    sh = add_command(
        verbs, "show", _proof_show, help="the threshold every process applies now, where it comes from, its audit"
    )
    sh.add_argument("--limit", type=int, default=10, help="audit entries shown (default 10)")


def _proof_set(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        set_threshold,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    before, after = set_threshold(ctx.conn, args.reads, note=args.note, actor=ctx.settings.project.actor)
    was = f"{before.reads} in a row" if before else "nothing stored"
    text = (
        f"shadow proof: {was} → {after.reads} in a row, stored (by {after.set_by}"
        f"{'; note: ' + args.note.strip() if args.note and args.note.strip() else ''}); every flip of a compute "
        "reader applies it from now on, in the CLI and every Dagster process"
    )
    return Result(
        {"before": before.as_dict() if before else None, "after": after.as_dict()}, text + _env_note(ctx, after.reads)
    )


def _proof_show(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        threshold,
        threshold_history,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    now = threshold(ctx.conn, ctx.settings)  # showing never stores
    rows = threshold_history(ctx.conn, args.limit)
    lines = [f"shadow proof: {now.describe()}" + _env_note(ctx, now.reads), "", "audit (newest first)"]
    lines.append(table(rows, ["at", "before", "after", "actor", "note"]))
    return Result({"threshold": now.as_dict(), "history": rows}, "\n".join(lines))


def _env_note(ctx, reads: int) -> str:
    """LAKEHOUSE_SHADOW_PROOF_READS set in this shell to another value: a flip from here would store it (proof.py)."""
    if not ctx.settings.shadow.proof_reads_given or ctx.settings.shadow.proof_reads == reads:
        return ""
    return (
        f"\nnote: LAKEHOUSE_SHADOW_PROOF_READS={ctx.settings.shadow.proof_reads} in this shell differs: a flip of a "
        f"compute reader from this shell would store {ctx.settings.shadow.proof_reads} for every process (audited); "
        "unset it to apply the stored value"
    )
