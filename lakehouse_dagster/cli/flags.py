"""`lakehouse flags|write-flags list|set|clear|history`, `write-flags candidates|complete`, and `lakehouse read` (a reader through the router)."""

from __future__ import annotations

import logging
import sys

from lakehouse_dagster.cli.common import Result, add_command, table
from lakehouse_dagster.flags.registry import MODES, READ, REGISTRY, WRITE  # no psycopg: a usage error answers at once

_KIND_WORD = {READ: "reader", WRITE: "writer"}


def register(sub) -> None:
    """Long on purpose: the argparse table of the flags and write-flags verbs, one block per verb."""
    for command, kind, help_text in (
        ("flags", READ, "read flags: which engine serves each reader (off < shadow < iceberg < iceberg_only)"),
        ("write-flags", WRITE, "write flags: where each writer lands (pg < iceberg_native)"),
    ):
        p = sub.add_parser(command, help=help_text, description=help_text)
        actions = p.add_subparsers(dest=f"{command}_action", required=True, metavar="ACTION")
        word = _KIND_WORD[kind]

        ls = add_command(actions, "list", _list, help="registry defaults, ceilings, classes and every runtime override")
        ls.add_argument(
            "--dataset", help="also show the effective mode (and why) of every " + word + " for this dataset"
        )

        st = add_command(actions, "set", _set, help="set a runtime override (no scope = global)")
        st.add_argument("name", help=f"the {word}, e.g. {next(iter(REGISTRY[kind]))}")
        st.add_argument("mode", help=" < ".join(MODES[kind]))
        _scope_args(st)
        st.add_argument("--note", help="why (kept with the override and in the audit)")

        cl = add_command(actions, "clear", _clear, help="drop an override (back to the next scope or the default)")
        cl.add_argument("name", help=f"the {word}")
        _scope_args(cl)
        cl.add_argument("--note", help="why (kept in the audit)")

        hi = add_command(actions, "history", _history, help="the audit of every set and clear, newest first")
        hi.add_argument("name", nargs="?", help=f"only this {word}")
        _scope_args(hi)
        hi.add_argument("--limit", type=int, default=50, help="at most this many entries (default 50)")
        parsers = [ls, st, cl, hi]
        if kind == READ:
            fl = add_command(
                actions,
                "flip",
                _flip,
                help="the read-flip runbook step: canary preflight, gated set, verify through the router",
            )
            fl.add_argument("name", help="the reader, e.g. export.stream")
            fl.add_argument("mode", nargs="?", default="iceberg", help="iceberg (default) or iceberg_only")
            _flip_args(fl)
            parsers.append(fl)
        if kind == READ:
            parsers += _readers_args(actions)
            parsers += _soak_args(actions)
        if kind == WRITE:
            wf = add_command(
                actions,
                "flip",
                _wflip,
                help="the write-flip runbook step: fresh canary, gated set to iceberg_native, verify",
            )
            wf.add_argument("name", help="the writer, e.g. sync.full")
            _flip_args(wf)
            parsers.append(wf)
            bf = add_command(
                actions,
                "backfill",
                _backfill,
                help="after a rollback to pg: copy the rows only Iceberg holds into dataset_rows "
                "(identity preserved, one transaction), so the mirror may run again",
            )
            bf.add_argument("--dataset", required=True, help="dataset uuid")
            parsers.append(bf)
            cp = add_command(
                actions,
                "complete",
                _complete,
                help="retire a native dataset's Postgres rows (refused unless native past the soak, reverse parity ok, "
                "no Postgres-locked consumer): the reverse off, dataset_rows deleted in short batches, resumable",
            )
            _scope_args(cp)
            cp.add_argument(
                "--export-to",
                help="first write the rows as Parquet into this new or empty directory (or, at a wider scope, the one an earlier run used: it resumes)",
            )
            cp.add_argument("--note", help="why (kept in the audit)")
            cp.add_argument(
                "--status", action="store_true", help="print the complete marks and their audit; change nothing"
            )
            cp.add_argument("--limit", type=int, default=50, help="--status: audit entries shown (default 50)")
            parsers.append(cp)
            parsers += _reverse_args(actions)
            ca = add_command(
                actions,
                "candidates",
                _candidates,
                help="the runbook's step 2b (SAFE / BLOCKED) plus what each dataset still lacks for a flip",
            )
            ca.add_argument("--writer", default="sync.full", help="the writer to flip (default sync.full)")
            parsers.append(ca)
        for p_ in parsers:
            p_.set_defaults(kind=kind, command_name=command)

    rd = add_command(
        sub, "read", _read, help="exercise a reader through the read router: prints the decision and the rows"
    )
    rd.add_argument("--reader", required=True, help="the reader whose flag routes the read, e.g. export.stream")
    rd.add_argument("--dataset", required=True, help="dataset uuid")
    rd.add_argument("--columns", help="comma-separated columns (default: identity columns + every column)")
    rd.add_argument("--limit", type=int, default=20, help="at most N rows (default 20)")
    rd.add_argument("--order-by-row-index", action="store_true", help="order by __row_index (default: engine order)")
    rd.add_argument(
        "--query",
        help="a structured read as a JSON object (where, aggregate, row_ids, after_row_index, row_index, order, "
        "columns, limit: docs/reads.md); replaces --columns/--limit/--order-by-row-index",
    )


def _readers_args(actions) -> list:
    """`flags readers add|list|remove`: which datasets the Postgres-locked readers read (reader_datasets.py)."""
    rp = actions.add_parser(
        "readers",
        help="declare which datasets the readers held on Postgres read (locked ones; compute readers until flipped): "
        "a write flip of such a dataset with its reverse off, and its complete, are refused",
    )
    verbs = rp.add_subparsers(dest="readers_action", required=True, metavar="VERB")
    add = add_command(
        verbs,
        "add",
        _readers_add,
        help="declare that a reader held on Postgres reads a dataset (or every dataset of a workspace)",
    )
    add.add_argument("reader", help="objects.sync, dashboards.aggregate, pipeline.expectations, ...")
    _scope_args(add)
    add.add_argument("--note", help="why (e.g. which dashboard)")
    ls = add_command(verbs, "list", _readers_list, help="every declaration")
    ls.add_argument("reader", nargs="?", help="only this reader")
    rm = add_command(verbs, "remove", _readers_remove, help="drop a declaration (the reader no longer reads it)")
    rm.add_argument("reader")
    _scope_args(rm)
    return [add, ls, rm]


def _reverse_args(actions) -> list:
    """`write-flags reverse status|sync|on|off|clear|history`: the reverse mirror (mirror/reverse.py)."""
    rp = actions.add_parser(
        "reverse",
        help="the reverse mirror: native Iceberg commits applied back to dataset_rows (a rollback needs no backfill)",
    )
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
    parsers = [st, sy, ck]
    for verb, fn, what in (
        ("on", _reverse_on, "turn the reverse on (no scope = global; the default is on)"),
        ("off", _reverse_off, "turn the reverse off (a later rollback then needs a backfill)"),
        ("clear", _reverse_clear, "drop the setting at a scope (back to the next scope or the default, on)"),
    ):
        p = add_command(verbs, verb, fn, help=what)
        _scope_args(p)
        p.add_argument("--note", help="why (kept with the setting and in the audit)")
        parsers.append(p)
    hi = add_command(verbs, "history", _reverse_history, help="the audit of every reverse setting change")
    hi.add_argument("--limit", type=int, default=20, help="at most this many entries (default 20)")
    return [*parsers, hi]


def _reverse_status(ctx, args) -> Result:
    from lakehouse_dagster.core.ids import (
        parse_uuid,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.mirror.reverse import (
        reverse_states,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.tracking.datasets import (
        get_dataset,
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
    from lakehouse_dagster.core.ids import (
        parse_uuid,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.runbooks.reverse_parity import (
        check_reverse_parity,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.tracking.datasets import (
        get_dataset,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    ds_id = parse_uuid(args.dataset, "dataset id")
    get_dataset(ctx.conn, ds_id)  # an unknown dataset: NotFound, one line
    c = check_reverse_parity(
        ctx.conn, ctx.dsn, ctx.catalog, ctx.settings, ds_id, repair=not args.no_repair, actor=ctx.settings.actor
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
    from lakehouse_dagster.core.errors import (
        BadInput,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.mirror.reverse import (
        apply_due,
        apply_reverse,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if args.dataset:
        r = apply_reverse(ctx.dsn, ctx.catalog, ctx.settings, args.dataset, actor=ctx.settings.actor, full=args.full)
        return Result(r.as_dict(), r.summary())
    if args.full:
        raise BadInput("--full re-syncs one dataset: give --dataset <uuid>; nothing was written")
    batch = apply_due(ctx.dsn, ctx.catalog, ctx.settings, actor=ctx.settings.actor)
    lines = [r.summary() for r in batch.applied] + [f"dataset {d}: failed — {e}" for d, e in batch.failed]
    text = "\n".join(lines) if lines else "every native dataset with the reverse on is caught up; nothing to apply"
    result = Result(batch.as_dict(), text)
    if batch.failed:
        result.exit_code = 1
    return result


def _reverse_change(ctx, args, enabled) -> Result:
    from lakehouse_dagster.flags.reverse_setting import (
        set_reverse,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    c = set_reverse(
        ctx.conn, enabled, dataset=args.dataset, workspace=args.workspace, note=args.note, actor=ctx.settings.actor
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
                "(lakehouse write-flags reverse on --dataset <id>) or roll the writer back"
            )
    return Result(data, text)


def _stranded_by_reverse_off(conn) -> list[tuple]:
    """(id, name) of the native datasets failing the gates because their reverse is off (gates.postgres_consumer_blockers)."""
    from lakehouse_dagster.routing.native_guard import (
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
    from lakehouse_dagster.flags.reverse_setting import (
        reverse_history,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rows = reverse_history(ctx.conn, args.limit)
    return Result(
        {"history": rows}, table(rows, ["at", "action", "scope", "scope_id", "before", "after", "actor", "note"])
    )


def _soak_args(actions) -> list:
    """`flags soak set|show`: the stored soak every process reads (flags/soak_setting.py)."""
    sp = actions.add_parser(
        "soak",
        help="the soak of the widening rules, stored for the CLI and every Dagster process (readers and writers)",
    )
    verbs = sp.add_subparsers(dest="soak_action", required=True, metavar="VERB")
    st = add_command(verbs, "set", _soak_set, help="store the soak in seconds (audited); 0: no waiting, same order")
    st.add_argument("seconds", help="whole seconds, e.g. 3600; 0 drops the waiting, never the order")
    st.add_argument("--note", help="why (kept in the audit)")
    sh = add_command(
        verbs, "show", _soak_show, help="the soak every process applies now, where it comes from, its audit"
    )
    sh.add_argument("--limit", type=int, default=10, help="audit entries shown (default 10)")
    return [st, sh]


def _soak_set(ctx, args) -> Result:
    from lakehouse_dagster.flags.soak_setting import (
        set_soak,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    before, after = set_soak(ctx.conn, args.seconds, note=args.note, actor=ctx.settings.actor)
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
    from lakehouse_dagster.flags.soak_setting import (
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
    if now.source != "stored" or not ctx.settings.soak_seconds_given or ctx.settings.soak_seconds == now.seconds:
        return ""
    return (
        f"\nnote: LAKEHOUSE_SOAK_SECONDS={ctx.settings.soak_seconds} in this shell is ignored: the stored soak "
        f"({now.seconds} s) applies to every process"
    )


def _readers_add(ctx, args) -> Result:
    from lakehouse_dagster.flags.native import (
        native_dataset_ids,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.flags.reader_datasets import (
        declare,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    d = declare(
        ctx.conn, args.reader, dataset=args.dataset, workspace=args.workspace, note=args.note, actor=ctx.settings.actor
    )
    text = (
        f"{d.reader} reads {d.scope} {d.scope_id} from dataset_rows: a write flip of "
        f"{'it' if d.scope == 'dataset' else 'its datasets'} is refused while this stands"
    )
    ids = (
        [d.scope_id]
        if d.scope == "dataset"
        else [r[0] for r in ctx.conn.execute("select id from datasets where workspace_id = %s", (d.scope_id,))]
    )
    stale = sorted(native_dataset_ids(ctx.conn, ids), key=str)
    if stale:  # a fact recorded too late: say so, the gate cannot undo a flip
        text += (
            f"\nwarning: {len(stale)} of these dataset(s) are already written iceberg-native, so {d.reader} "
            f"reads stale Postgres for them: {', '.join(map(str, stale[:10]))}; roll the writer back "
            "(lakehouse write-flags set <writer> pg --dataset <id>) and backfill"
        )
    return Result({**d.as_dict(), "native_dataset_ids": [str(i) for i in stale]}, text)


def _readers_list(ctx, args) -> Result:
    from lakehouse_dagster.flags.reader_datasets import (
        declared,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rows = [d.as_dict() for d in declared(ctx.conn, args.reader)]
    return Result(rows, table(rows, ["reader", "scope", "scope_id", "note", "declared_by", "declared_at"]))


def _readers_remove(ctx, args) -> Result:
    from lakehouse_dagster.flags.reader_datasets import (
        remove,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    scope_txt = f"dataset {args.dataset}" if args.dataset else f"workspace {args.workspace}"
    gone = remove(ctx.conn, args.reader, dataset=args.dataset, workspace=args.workspace)
    text = (
        f"{args.reader}: declaration for {scope_txt} removed"
        if gone
        else f"{args.reader}: no declaration for {scope_txt}; nothing changed"
    )
    return Result({"reader": args.reader, "removed": gone}, text)


def _scope_args(p) -> None:
    p.add_argument("--dataset", help="dataset uuid (most specific scope)")
    p.add_argument("--workspace", help="workspace uuid")


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


def _where(scope) -> str:
    return "globally" if scope.scope_id is None else f"for {scope}"


def _list(ctx, args) -> Result:
    from lakehouse_dagster.flags.overrides import list_overrides  # the verbs' imports: psycopg only when one runs
    from lakehouse_dagster.flags.resolver import (
        FlagResolver,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    kind = args.kind
    registry = [
        {
            "name": f.name,
            "class": f.consistency,
            "default": f.default,
            "ceiling": f.ceiling,
            "ceiling_reason": f.ceiling_reason,
            "description": f.description,
            **({"proof": "shadow-proven flip" if f.proof else ""} if kind == READ else {}),
        }
        for f in REGISTRY[kind].values()
    ]
    overrides = [
        {
            "name": o.name,
            "scope": o.scope,
            "scope_id": o.scope_id,
            "mode": o.mode,
            "note": o.note,
            "set_by": o.set_by,
            "set_at": o.set_at,
            "known": o.name in REGISTRY[kind],
        }
        for o in list_overrides(ctx.conn, kind)
    ]
    data = {"kind": kind, "registry": registry, "overrides": overrides}
    word = _KIND_WORD[kind]
    cols = (
        ["name", "class", "default", "ceiling", "proof", "ceiling_reason"]
        if kind == READ
        else ["name", "default", "ceiling", "ceiling_reason"]
    )
    text = [
        f"{word}s (registry)",
        table(registry, cols),
        "",
        "runtime overrides",
        table(overrides, ["name", "scope", "scope_id", "mode", "note", "set_by", "set_at"]),
    ]
    if kind == READ:
        text += _consistency(ctx, data, None if not args.dataset else args.dataset)
    if args.dataset:
        from lakehouse_dagster.tracking.datasets import (
            get_dataset,
        )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

        ds = get_dataset(ctx.conn, args.dataset)
        resolver = FlagResolver.from_settings(ctx.conn, ctx.settings)
        effective = [
            {"name": r.name, "mode": r.mode, "reason": r.reason, "source": r.source, "stored_mode": r.stored_mode}
            for r in resolver.resolve_all(ds.id, kind)
        ]
        data["dataset_id"] = ds.id
        data["effective"] = effective
        text += [
            "",
            f"effective for dataset {ds.id} ({ds.name})",
            table(effective, ["name", "mode", "reason", "source", "stored_mode"]),
        ]
    return Result(data, "\n".join(text))


def _consistency(ctx, data: dict, dataset) -> list[str]:
    """The shadow consistency of the compute readers per dataset (flags/proof.py): what a flip of one is gated on."""
    from lakehouse_dagster.core.ids import parse_uuid  # lazy: the CLI imports a verb's machinery only when it runs
    from lakehouse_dagster.flags.proof import needed_reads, proofs  # lazy: as above
    from lakehouse_dagster.flags.registry import PROVEN_READERS  # lazy: as above

    needed = needed_reads(ctx.settings)
    ids = None if dataset is None else [parse_uuid(dataset, "dataset id")]
    found = proofs(ctx.conn, [r.name for r in PROVEN_READERS], ids)
    rows = [
        {**p.as_dict(needed), "consistency": p.describe(needed)}
        for _, p in sorted(found.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    ]
    data["shadow_consistency"] = rows
    return [
        "",
        f"shadow consistency of the compute readers (a flip needs {needed} in a row since the dataset's last "
        "change of schema: LAKEHOUSE_SHADOW_PROOF_READS)",
        table(rows, ["reader", "dataset_id", "consistency"]) if rows else "(no shadow read compared yet)",
    ]


def _set(ctx, args) -> Result:
    from lakehouse_dagster.flags.gates import (
        set_flag,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    leaving = _leaving_native(ctx, args, args.mode)
    change = set_flag(
        ctx.conn,
        args.kind,
        args.name,
        args.mode,
        dataset=args.dataset,
        workspace=args.workspace,
        note=args.note,
        actor=ctx.settings.actor,
    )
    text = (
        f"{change.flag.name}: {change.before or '(no override)'} → {change.after} {_where(change.scope)}"
        f" (by {ctx.settings.actor}{'; note: ' + change.audit.note if change.audit and change.audit.note else ''}); "
        f"other processes see it within {ctx.settings.flag_ttl_seconds:g}s"
    )
    return _with_rollback(ctx, args, leaving, Result(_change_data(change), text))


def _leaving_native(ctx, args, mode):
    """A writer change: the datasets it moves off iceberg_native (computed before the change)."""
    if args.kind != WRITE or mode not in (None, "pg"):
        return []
    from lakehouse_dagster.runbooks.rollback_report import (
        apply_reverse_first,
        leaving_native,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    leaving = leaving_native(ctx.conn, args.name, mode, dataset=args.dataset, workspace=args.workspace)
    # the reverse mirror applies what it has not yet, so Postgres holds every native row when the flag moves
    for ds_id, why in apply_reverse_first(ctx.dsn, ctx.catalog, ctx.settings, leaving).items():
        print(f"the reverse mirror could not catch up dataset {ds_id} before the rollback: {why}", file=sys.stderr)
    return leaving


def _with_rollback(ctx, args, leaving, result: Result) -> Result:
    """Add, per dataset moved back to pg, the rows and snapshots only Iceberg holds and the ways forward."""
    if not leaving:
        return result
    from lakehouse_dagster.runbooks.rollback_report import (
        rollback_lines,
        rolled_back,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rolled = rolled_back(ctx.conn, ctx.catalog, ctx.settings, leaving)
    result.data["rolled_back"] = [r.as_dict() for r in rolled]
    result.text = "\n".join([result.text, *rollback_lines(args.name, rolled)])
    return result


def _backfill(ctx, args) -> Result:
    from lakehouse_dagster.runbooks.complete import (
        backfill_or_restore,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    r = backfill_or_restore(ctx.dsn, ctx.catalog, ctx.settings, args.dataset, actor=ctx.settings.actor)
    return Result(r.as_dict(), r.summary())


def _complete(ctx, args) -> Result:
    from lakehouse_dagster.runbooks import (
        complete,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if args.status:
        if args.workspace:
            from lakehouse_dagster.core.errors import (
                BadInput,
            )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

            raise BadInput("--status takes --dataset <uuid> or no scope (every complete), not --workspace")
        found = complete.complete_status(ctx.conn, args.dataset, limit=args.limit)
        marks = [m.as_dict() for m in found["marks"]]
        lines = [
            table(marks, ["dataset_id", "status", "started_at", "finished_at", "rows_deleted", "batches", "export_to"])
            if marks
            else "no dataset was ever completed"
        ]
        if found["audit"]:
            lines += ["", "audit (newest first)", table(found["audit"], ["at", "dataset_id", "event", "rows", "actor"])]
        return Result({"marks": marks, "audit": found["audit"]}, "\n".join(lines))
    done = complete.complete_scope(
        ctx.dsn,
        ctx.catalog,
        ctx.settings,
        dataset=args.dataset,
        workspace=args.workspace,
        export_to=args.export_to,
        actor=ctx.settings.actor,
        note=args.note,
    )
    lines = [c.summary() for c in done.completed] + [r for _, r in done.refused]
    if not lines:
        lines = ["no native dataset in that scope is left to complete"]
    result = Result(done.as_dict(), "\n".join(lines))
    if done.refused or any(c.status != "complete" for c in done.completed):
        result.exit_code = 6 if done.refused else 1
    return result


def _clear(ctx, args) -> Result:
    from lakehouse_dagster.flags.gates import (
        clear_flag,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.flags.overrides import (
        narrower_overrides,
        remaining_lines,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    leaving = _leaving_native(ctx, args, None)
    change = clear_flag(
        ctx.conn,
        args.kind,
        args.name,
        dataset=args.dataset,
        workspace=args.workspace,
        note=args.note,
        actor=ctx.settings.actor,
    )
    if not change.changed:
        text = f"{change.flag.name}: no override {_where(change.scope)} to clear; nothing changed"
    else:
        text = (
            f"{change.flag.name}: cleared {change.before} {_where(change.scope)} (back to the next scope or the "
            f"registry default {change.flag.default}); other processes see it within {ctx.settings.flag_ttl_seconds:g}s"
        )
    left = narrower_overrides(ctx.conn, change.flag.kind, change.flag.name, change.scope)
    data = {
        **_change_data(change),
        "narrower_remaining": [{"scope": o.scope, "scope_id": o.scope_id, "mode": o.mode} for o in left],
    }
    text = "\n".join([text, *remaining_lines(ctx.conn, change.flag, left)])
    return _with_rollback(ctx, args, leaving, Result(data, text))


def _change_data(change) -> dict:
    return {
        "kind": change.flag.kind,
        "name": change.flag.name,
        "scope": change.scope.scope,
        "scope_id": change.scope.scope_id,
        "before": change.before,
        "after": change.after,
        "changed": change.changed,
        "audit_id": change.audit.id if change.audit else None,
    }


def _history(ctx, args) -> Result:
    from lakehouse_dagster.flags.overrides import (
        history,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    entries = history(ctx.conn, args.kind, args.name, dataset=args.dataset, workspace=args.workspace, limit=args.limit)
    data = [
        {
            "id": e.id,
            "at": e.at,
            "action": e.action,
            "name": e.name,
            "scope": e.scope,
            "scope_id": e.scope_id,
            "before": e.before_mode,
            "after": e.after_mode,
            "actor": e.actor,
            "note": e.note,
        }
        for e in entries
    ]
    return Result(data, table(data, ["at", "action", "name", "scope", "scope_id", "before", "after", "actor", "note"]))


NOTHING_CANARIED = "preflight canary: no dataset to check, the flip moves none"


def _preflight_and_flip(ctx, args, kind: str, mode: str):
    """Both flip verbs: the preflight table, then the gated flip, or the STOP result (nothing written)."""
    from lakehouse_dagster.runbooks import (
        flip,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pre = flip.preflight(
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
    change = flip.flip(ctx.conn, pre, note=args.note, actor=ctx.settings.actor)
    return pre, checked, lines, change, None


def _flip(ctx, args) -> Result:
    from lakehouse_dagster.runbooks import (
        flip,
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
    verified = flip.verify(ctx.conn, ctx.catalog, ctx.settings, args.name, flip.moved_ids(pre), logger=out.logger())
    fell_back = [v for v in verified if v.fallback_error]
    if verified:
        out.add(table([v.as_dict() for v in verified], ["dataset_id", "source", "reason", "snapshot_id"]))
    if fell_back:
        out.add(flip.fallback_message(args.name, pre.scope, fell_back))
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
    from lakehouse_dagster.flags.reverse_setting import (
        where_native_writes_land,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.runbooks import (
        flip,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    pre, checked, lines, change, stop = _preflight_and_flip(ctx, args, WRITE, "iceberg_native")
    if stop:
        return stop
    out = _Said(args, lines)
    verified = flip.verify_write(ctx.conn, args.name, flip.moved_ids(pre))
    out.add(
        f"{args.name}: {change.before or '(no override)'} → {change.after} ({pre.report.where}); "
        + where_native_writes_land(ctx.conn, flip.moved_ids(pre)),
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
    from lakehouse_dagster.runbooks.first_sync import (
        first_native_syncs,
        stop_message,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    if not pre.checked:
        return Result(data, out.rest())
    out.add(f"first native sync of {args.name}, then the canary on it (runbook step 3):")
    out.flush()  # everything so far, before the write router's and the sync's lines of the step that follows
    synced = first_native_syncs(
        ctx.conn, ctx.dsn, ctx.catalog, ctx.settings, args.name, flip.moved_ids(pre), logger=out.logger()
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


def _candidates(ctx, args) -> Result:
    from lakehouse_dagster.flags.candidates import (
        SAFE,
        write_flip_candidates,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    found = write_flip_candidates(ctx.conn, args.writer)
    data = [c.as_dict() for c in found]
    rows = [{**d, "ready": "yes" if d["ready"] else "no", "still needs": "; ".join(d["reasons"])} for d in data]
    ready = sum(c.ready for c in found)
    text = table(rows, ["verdict", "ready", "name", "row_count", "dataset_id", "writer_mode", "still needs"])
    piped = [c for c in found if c.runbook_verdict != SAFE]
    if piped:  # the reverse mirror keeps a native pipeline input's dataset_rows (docs/design/reverse-mirror.md)
        text += (
            f"\n{len(piped)} pipeline input(s): {sum(c.safe for c in piped)} SAFE with the reverse mirror on, "
            f"{sum(not c.safe for c in piped)} BLOCKED with it off (lakehouse write-flags reverse on --dataset <id>)"
        )
    text += (
        f"\n{len(found)} identity-ready dataset(s), {ready} ready to flip {args.writer}: "
        # the runbook's step 3 is the flip (preflight canary, gated set, verify, first native sync and its canary),
        # not a bare set
        f'lakehouse write-flags flip {args.writer} --dataset <id> --note "fase4 canary"'
    )
    return Result(data, text)


def _read(ctx, args) -> Result:
    from lakehouse_dagster.routing.exercise import (
        read_through_router,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    query = _structured(args.query) if getattr(args, "query", None) else None
    result, _, proj = read_through_router(
        ctx.conn,
        ctx.catalog,
        ctx.settings,
        args.reader,
        args.dataset,
        columns=None if query else args.columns,
        limit=None if query else args.limit,
        order_by_row_index=args.order_by_row_index,
        logger=_quiet_logger(),  # the decision is printed once, below (stdout); a fallback says why there too
        query=query,
    )
    rows = result.value.to_pylist()
    decision = result.decision
    data = {"decision": decision.as_dict(), "fallback_error": result.fallback_error, "rows": rows}
    # one router line per read: the decision (after a fallback, pg@fallback; the router's warning on stderr says why)
    shown = result.value.column_names if query else list(proj.columns)
    lines = [decision.log_line(), table(rows, shown), f"({len(rows)} row(s) from {decision.source})"]
    return Result(data, "\n".join(lines))


def _structured(text: str):
    """--query: a JSON object of a structured read's fields (routing/request.py checks them, one line each)."""
    import json  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    from lakehouse_dagster.core.errors import (
        BadInput,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.routing.request import (
        parse_query,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"--query is not valid JSON ({exc.msg} at column {exc.colno}); see docs/reads.md") from None
    if not isinstance(obj, dict):
        raise BadInput('--query must be a JSON object, e.g. \'{"aggregate": {"measures": [{"fn": "count"}]}}\'')
    return parse_query(obj)


def _quiet_logger() -> logging.Logger:
    """For a read whose decision the command prints itself (one router line per read): only the router's warnings
    and errors (an Iceberg read that failed, and why) reach stderr."""
    lg = logging.getLogger("lakehouse_dagster.cli.read_warnings")
    for old in list(lg.handlers):  # the stderr of this call (the tests run the CLI in-process, stderr redirected)
        lg.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    lg.addHandler(handler)
    lg.setLevel(logging.WARNING)
    lg.propagate = False
    return lg
