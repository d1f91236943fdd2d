"""One read through the read router, as a reader does it: what `lakehouse read` and the read-flip
job's verify step run (the runbook's "exercise the reader and confirm the read-router reason").
In shadow mode the read is served by Postgres and offered for comparison off the request path (routing/shadow.py),
a structured read included."""

from __future__ import annotations

import logging
import uuid

import psycopg

from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lake.reader import load_dataset_table, read_iceberg
from lakehouse_dagster.routing import shadow
from lakehouse_dagster.routing.iceberg_compute import read_iceberg_compute
from lakehouse_dagster.routing.pg_compute import read_postgres_compute
from lakehouse_dagster.routing.pg_reader import read_postgres
from lakehouse_dagster.routing.projection import Projection, projection_for
from lakehouse_dagster.routing.read_router import ReadDecision, ReadResult, resolve_read_source
from lakehouse_dagster.routing.request import Query, bind
from lakehouse_dagster.tracking.datasets import Dataset, get_dataset


def read_through_router(
    conn: psycopg.Connection,
    catalog,
    settings: Settings,
    reader: str,
    dataset_id: uuid.UUID | str,
    *,
    columns: str | None = None,
    limit: int | None = 20,
    order_by_row_index: bool = False,
    resolver: FlagResolver | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    shadow_pool: shadow.ShadowPool | None = None,
    query: Query | None = None,
) -> tuple[ReadResult, Dataset, Projection]:
    """``shadow_pool``: where a shadow-mode read goes for comparison (default: the process's, from settings).
    ``query``: a structured read (where, aggregate, addressing, order by columns: docs/reads.md), answered by the
    Postgres or the Iceberg executor as the router decides; its ``columns``/``limit`` are the query's own."""

    dataset = get_dataset(conn, dataset_id)
    proj = projection_for(dataset, columns, limit=limit, order_by_row_index=order_by_row_index)
    plan = bind(query, dataset) if query is not None else None
    resolver = resolver or FlagResolver.from_settings(conn, settings.flags)
    source = resolve_read_source(conn, resolver, reader, dataset.id, logger=logger)

    def postgres(decision):
        if plan is not None:
            return read_postgres_compute(conn, dataset, plan)
        return read_postgres(conn, dataset, proj)

    def iceberg(decision):
        table_ = load_dataset_table(catalog, settings, dataset.id)
        if plan is not None:
            return read_iceberg_compute(table_, decision.snapshot_id, plan)
        return read_iceberg(
            table_,
            proj.columns,
            limit=proj.limit,
            order_by_row_index=proj.order_by_row_index,
            snapshot_id=decision.snapshot_id,
        )

    try:
        result = source.run(postgres=postgres, iceberg=iceberg)
    except LakehouseError:
        raise
    except Exception as exc:  # only iceberg_only gets here: no fallback, so the read fails
        raise LakehouseError(no_fallback_message(source.decision, exc)) from exc
    if shadow.shadowed(result.decision) is not None:  # pg@shadow, or a compute reader's pg@reverse in mode shadow
        pool = shadow_pool or shadow.pool_for(settings.shadow, settings.postgres.dsn or conn.info.dsn)
        load = lambda: load_dataset_table(catalog, settings, dataset.id)  # noqa: E731  (the worker loads it)
        if plan is not None and query is not None:
            shadow.offer_query(pool, result, plan, query, shadow.iceberg_answer(load, plan))
        else:
            shadow.offer_read(pool, result, dataset, proj, shadow.iceberg_side(load, proj))
    return result, dataset, proj


def no_fallback_message(d: ReadDecision, exc: BaseException) -> str:
    """Why an Iceberg read that failed was not served by Postgres, and what to do (the CLI's and the service's)."""
    error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    if d.native:
        return (
            f"{d.reader} ds={d.dataset_id}: iceberg read failed and the dataset is written iceberg-native, so "
            f"there is no PG fallback (Postgres is stale for it) ({error}); fix the table"
        )
    return (
        f"{d.reader} ds={d.dataset_id}: iceberg read failed and mode iceberg_only has no PG fallback "
        f"({error}); fix the table or set the reader back to iceberg"
    )
