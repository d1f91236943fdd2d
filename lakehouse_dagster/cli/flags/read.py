"""`lakehouse read`: a reader exercised through the read router, its decision and its rows."""

from __future__ import annotations

import logging
import sys

from lakehouse_dagster.cli.common import Result, table


def _read(ctx, args) -> Result:
    from lakehouse_dagster.api.reads import (
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

    from lakehouse_dagster.api.reads import (
        parse_query,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.errors import (
        BadInput,
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
