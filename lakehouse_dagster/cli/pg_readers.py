"""`lakehouse pg-readers add|list|remove`: which datasets the readers held on Postgres read
(flags/reader_datasets.py)."""

from __future__ import annotations

from lakehouse_dagster.cli.common import Result, add_command, table
from lakehouse_dagster.cli.common import scope_args as _scope_args

HELP = (
    "declare which datasets the readers held on Postgres read (locked ones; compute readers until flipped): "
    "a write flip of such a dataset with its reverse off, and its complete, are refused"
)


def register(sub) -> None:
    add_pg_readers(sub, "pg-readers", help=HELP)


def add_pg_readers(sub, name: str, help: str | None):
    """The `pg-readers` verb's parser under ``name``: its own, or its old name's (an alias: cli/moved.py)."""
    rp = sub.add_parser(name, **({} if help is None else {"help": help}))
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
    return rp


def _readers_add(ctx, args) -> Result:
    from lakehouse_dagster.api.datasets import ids_in_workspace  # lazy, as below
    from lakehouse_dagster.api.flags import (
        declare,
        native_dataset_ids,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    d = declare(
        ctx.conn,
        args.reader,
        dataset=args.dataset,
        workspace=args.workspace,
        note=args.note,
        actor=ctx.settings.project.actor,
    )
    text = (
        f"{d.reader} reads {d.scope} {d.scope_id} from dataset_rows: a write flip of "
        f"{'it' if d.scope == 'dataset' else 'its datasets'} is refused while this stands"
    )
    ids = [d.scope_id] if d.scope == "dataset" else ids_in_workspace(ctx.conn, d.scope_id)
    stale = sorted(native_dataset_ids(ctx.conn, ids), key=str)
    if stale:  # a fact recorded too late: say so, the gate cannot undo a flip
        text += (
            f"\nwarning: {len(stale)} of these dataset(s) are already written iceberg-native, so {d.reader} "
            f"reads stale Postgres for them: {', '.join(map(str, stale[:10]))}; roll the writer back "
            "(lakehouse write-flags set <writer> pg --dataset <id>) and backfill"
        )
    return Result({**d.as_dict(), "native_dataset_ids": [str(i) for i in stale]}, text)


def _readers_list(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
        declared,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    rows = [d.as_dict() for d in declared(ctx.conn, args.reader)]
    return Result(rows, table(rows, ["reader", "scope", "scope_id", "note", "declared_by", "declared_at"]))


def _readers_remove(ctx, args) -> Result:
    from lakehouse_dagster.api.flags import (
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
