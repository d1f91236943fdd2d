"""The read path, the face the adapters import (the service first): a request checked and bound (routing/request.py),
the projection (projection.py), the router's decision (read_router.py), a read through it as `lakehouse read` and
the canary run it (exercise.py), the computed answers on each engine (pg_compute.py, iceberg_compute.py), the
Postgres cursor's query (pg_reader.py) and the native-safety guard (native_guard.py). Shadow reads: api/shadow.py.

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.routing.exercise import no_fallback_message, read_through_router
    from lakehouse_dagster.routing.iceberg_compute import read_iceberg_compute
    from lakehouse_dagster.routing.native_guard import report_key, report_lines, unsafe_native_datasets
    from lakehouse_dagster.routing.pg_compute import read_postgres_compute
    from lakehouse_dagster.routing.pg_reader import postgres_query, projected_schema
    from lakehouse_dagster.routing.projection import Projection, projection_for
    from lakehouse_dagster.routing.read_router import ICEBERG, REFUSED, ReadDecision, resolve_read_source
    from lakehouse_dagster.routing.request import COMPUTE_FIELDS, Query, bind, parse_query

_HOME = {
    "COMPUTE_FIELDS": "lakehouse_dagster.routing.request",
    "Query": "lakehouse_dagster.routing.request",
    "bind": "lakehouse_dagster.routing.request",
    "parse_query": "lakehouse_dagster.routing.request",
    "Projection": "lakehouse_dagster.routing.projection",
    "projection_for": "lakehouse_dagster.routing.projection",
    "ICEBERG": "lakehouse_dagster.routing.read_router",
    "REFUSED": "lakehouse_dagster.routing.read_router",
    "ReadDecision": "lakehouse_dagster.routing.read_router",
    "resolve_read_source": "lakehouse_dagster.routing.read_router",
    "no_fallback_message": "lakehouse_dagster.routing.exercise",
    "read_through_router": "lakehouse_dagster.routing.exercise",
    "read_postgres_compute": "lakehouse_dagster.routing.pg_compute",
    "read_iceberg_compute": "lakehouse_dagster.routing.iceberg_compute",
    "postgres_query": "lakehouse_dagster.routing.pg_reader",
    "projected_schema": "lakehouse_dagster.routing.pg_reader",
    "report_key": "lakehouse_dagster.routing.native_guard",
    "report_lines": "lakehouse_dagster.routing.native_guard",
    "unsafe_native_datasets": "lakehouse_dagster.routing.native_guard",
}

__all__ = [
    "COMPUTE_FIELDS",
    "ICEBERG",
    "Projection",
    "Query",
    "REFUSED",
    "ReadDecision",
    "bind",
    "no_fallback_message",
    "parse_query",
    "postgres_query",
    "projected_schema",
    "projection_for",
    "read_iceberg_compute",
    "read_postgres_compute",
    "read_through_router",
    "report_key",
    "report_lines",
    "resolve_read_source",
    "unsafe_native_datasets",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
