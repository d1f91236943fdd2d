"""`flags|write-flags list|set|clear|history`: the overrides, and the rollback report of a writer moved back to pg."""

from __future__ import annotations

import sys

from lakehouse_dagster.api.flags import READ, REGISTRY, WRITE  # no psycopg: a usage error answers at once
from lakehouse_dagster.cli.common import Result, table
from lakehouse_dagster.cli.flags.shared import _KIND_WORD, _change_data, _where


def _list(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        FlagResolver,
        list_overrides,
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
        from lakehouse_dagster.api.datasets import (
            get_dataset,
        )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

        ds = get_dataset(ctx.conn, args.dataset)
        resolver = FlagResolver.from_settings(ctx.conn, ctx.settings.flags)
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
    from lakehouse_dagster.api.flags import PROVEN_READERS, proofs, threshold  # lazy: psycopg only when a verb runs
    from lakehouse_dagster.core.ids import parse_uuid  # lazy: the CLI imports a verb's machinery only when it runs

    needed = threshold(ctx.conn, ctx.settings).reads  # the one value every process on this database applies
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
    from lakehouse_dagster.api.flags import (
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
        actor=ctx.settings.project.actor,
    )
    text = (
        f"{change.flag.name}: {change.before or '(no override)'} → {change.after} {_where(change.scope)}"
        f" (by {ctx.settings.project.actor}{'; note: ' + change.audit.note if change.audit and change.audit.note else ''}); "
        f"other processes see it within {ctx.settings.flags.ttl_seconds:g}s"
    )
    return _with_rollback(ctx, args, leaving, Result(_change_data(change), text))


def _leaving_native(ctx, args, mode):
    """A writer change: the datasets it moves off iceberg_native (computed before the change)."""
    if args.kind != WRITE or mode not in (None, "pg"):
        return []
    from lakehouse_dagster.api.flips import (
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
    from lakehouse_dagster.api.flips import (
        rollback_lines,
        rolled_back,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rolled = rolled_back(ctx.conn, ctx.catalog, ctx.settings, leaving)
    result.data["rolled_back"] = [r.as_dict() for r in rolled]
    result.text = "\n".join([result.text, *rollback_lines(args.name, rolled)])
    return result


def _clear(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        clear_flag,
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
        actor=ctx.settings.project.actor,
    )
    if not change.changed:
        text = f"{change.flag.name}: no override {_where(change.scope)} to clear; nothing changed"
    else:
        text = (
            f"{change.flag.name}: cleared {change.before} {_where(change.scope)} (back to the next scope or the "
            f"registry default {change.flag.default}); other processes see it within {ctx.settings.flags.ttl_seconds:g}s"
        )
    left = narrower_overrides(ctx.conn, change.flag.kind, change.flag.name, change.scope)
    data = {
        **_change_data(change),
        "narrower_remaining": [{"scope": o.scope, "scope_id": o.scope_id, "mode": o.mode} for o in left],
    }
    text = "\n".join([text, *remaining_lines(ctx.conn, change.flag, left)])
    return _with_rollback(ctx, args, leaving, Result(data, text))


def _history(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
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
