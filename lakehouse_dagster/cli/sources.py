"""`lakehouse sources set|show --dataset <uuid>`: a dataset's source for the source writers."""

from __future__ import annotations

from lakehouse_dagster.cli.common import ArgumentParser, Result, json_parent
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.ids import parse_uuid


def register(sub) -> None:
    p = sub.add_parser("sources", help="set or show a dataset's source (files, postgres table/query, cdc table)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=ArgumentParser)
    s = verbs.add_parser("set", parents=[json_parent()], help="validate and store a dataset's source")
    s.add_argument("--dataset", required=True, metavar="UUID")
    kind = s.add_mutually_exclusive_group(required=True)
    kind.add_argument("--files", metavar="PATH|GLOB|S3-URI", help="Parquet/CSV/NDJSON files")
    kind.add_argument("--postgres-table", metavar="SCHEMA.TABLE")
    kind.add_argument("--postgres-query", metavar="SQL", help="one SELECT, run read-only on the source")
    kind.add_argument("--cdc-table", metavar="SCHEMA.TABLE", help="an append-only change table")
    s.add_argument("--format", choices=("parquet", "csv", "ndjson"), help="files: default from the extension")
    s.add_argument("--cursor-column", metavar="COL", help="postgres: column whose max is stored (incremental)")
    s.add_argument("--position-column", metavar="COL", help="cdc: strictly increasing position (LSN, sequence)")
    s.add_argument("--op-column", metavar="COL", help="cdc: the operation column")
    s.add_argument(
        "--dsn-env",
        metavar="VAR",
        help="environment variable holding the source's DSN (default: the project's Postgres); only the name is stored",
    )
    s.set_defaults(func=_set)
    sh = verbs.add_parser("show", parents=[json_parent()], help="a dataset's source and its ingest state")
    sh.add_argument("--dataset", required=True, metavar="UUID")
    sh.set_defaults(func=_show)


def _spec(args) -> dict:
    if args.files is not None:
        for flag in ("cursor_column", "position_column", "op_column", "dsn_env"):
            if getattr(args, flag):
                raise BadInput(f"--{flag.replace('_', '-')} does not apply to --files")
        return {"type": "files", "uri": args.files, **({"format": args.format} if args.format else {})}
    if args.format:
        raise BadInput("--format applies to --files only")
    if args.cdc_table is not None:
        if args.cursor_column:
            raise BadInput("--cursor-column does not apply to --cdc-table (use --position-column)")
        return {
            "type": "cdc",
            "table": args.cdc_table,
            "position_column": args.position_column,
            "op_column": args.op_column,
            "dsn_env": args.dsn_env,
        }
    if args.position_column or args.op_column:
        raise BadInput("--position-column/--op-column apply to --cdc-table only")
    where = {"table": args.postgres_table} if args.postgres_table is not None else {"query": args.postgres_query}
    return {"type": "postgres", **where, "cursor_column": args.cursor_column, "dsn_env": args.dsn_env}


def _set(ctx, args) -> Result:
    ds_id = parse_uuid(args.dataset, "dataset id")
    spec_dict = _spec(args)
    from lakehouse_dagster.api.sources import (
        polling_cost,
        set_source,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    spec = set_source(ctx.conn, ds_id, spec_dict, settings=ctx.settings)
    cost = polling_cost(spec, ctx.dsn)
    data = {
        "dataset_id": str(ds_id),
        "source": spec.to_json(),
        "default_writer": spec.default_writer,
        "writers": list(spec.writers),
        "polling": cost,
    }
    return Result(data, f"{ds_id}: source set to {spec.describe()}; default writer {spec.default_writer}\n  {cost}")


def _show(ctx, args) -> Result:
    ds_id = parse_uuid(args.dataset, "dataset id")
    from lakehouse_dagster.api.datasets import (
        current_state,
        public_cursor,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.lake import (
        load_table_or_none,
        table_identifier,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.api.sources import (
        get_source,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    spec = get_source(ctx.conn, ds_id)
    if spec is None:
        return Result(
            {"dataset_id": str(ds_id), "source": None},
            f"{ds_id}: no source (set one with: lakehouse sources set --dataset {ds_id} ...)",
        )
    table = load_table_or_none(ctx.catalog, table_identifier(ctx.settings, ds_id))
    state = current_state(ctx.conn, ds_id, table, spec.to_json())
    last = None if not state else {k: state.get(k) for k in ("seq", "sync_id", "path", "writer")}
    data = {
        "dataset_id": str(ds_id),
        "source": spec.to_json(),
        "default_writer": spec.default_writer,
        "writers": list(spec.writers),
        "cursor": public_cursor(state),
        "last_ingest": last,
    }
    text = (
        f"{ds_id}: {spec.describe()}\n  default writer {spec.default_writer}; cursor {data['cursor']}; "
        f"last ingest {last or 'never'}"
    )
    return Result(data, text)
