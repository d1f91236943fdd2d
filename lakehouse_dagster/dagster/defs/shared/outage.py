"""A sensor's tick while Postgres is down (a restart, a failover, a dropped network): skipped with one line, not a
failed tick with psycopg's traceback in the UI. The tick's cursor stays where it was, as it would for a failed tick,
so the first tick once Postgres answers does what this one could not, once."""

import functools
from collections.abc import Callable
from typing import Any

import dagster as dg

from lakehouse_dagster.core.errors import postgres_unreachable


def skip_while_postgres_is_down(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a sensor's function (under ``@dg.sensor``; its parameters stay visible to Dagster's resource
    injection through ``functools.wraps``)."""

    @functools.wraps(fn)
    def tick(context: dg.SensorEvaluationContext, *args: Any, **kwargs: Any) -> Any:
        before = context.cursor
        try:
            return fn(context, *args, **kwargs)
        except Exception as exc:
            line = postgres_unreachable(exc)
            if line is None:
                raise
            if context.cursor != before:  # moved by context.update_cursor before the session went: put it back
                context.update_cursor(before)
            return dg.SkipReason(f"{line}: this tick did nothing; the next one does it once Postgres answers")

    return tick
