"""One routed read, opened for streaming: the read router decides exactly as in-process (routing/read_router.py,
the same ``resolve_read_source`` and ``ReadSource.run``: freshness gate, fallback under ``iceberg`` logged and
recorded, none under ``iceberg_only``, a dataset written iceberg-native never from Postgres), and its executors
return opened, primed streams (service/batches.py) instead of whole tables.

A fallback can only happen before the first byte: ``iceberg_stream`` checks every data file and reads the first
batch while the router can still choose Postgres. An Iceberg error after that cuts the stream (logged; the
client sees an incomplete body, never rows from two engines).
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa

from lakehouse_dagster.api import shadow
from lakehouse_dagster.api.datasets import get_dataset
from lakehouse_dagster.api.reads import (
    ICEBERG,
    ReadDecision,
    bind,
    no_fallback_message,
    projection_for,
    read_iceberg_compute,
    read_postgres_compute,
    resolve_read_source,
)
from lakehouse_dagster.core.errors import LakehouseError, ReadRefused
from lakehouse_dagster.service.batches import BatchStream, iceberg_stream, postgres_stream
from lakehouse_dagster.service.bodies import ReadRequest
from lakehouse_dagster.service.db import ServiceDb
from lakehouse_dagster.service.errors import IcebergReadFailed

log = logging.getLogger("lakehouse_dagster.read_router")  # the router's own logger: one place for its lines


@dataclasses.dataclass
class OpenRead:
    decision: ReadDecision  # after a fallback: source pg, reason pg@fallback
    stream: BatchStream  # (a ShadowCopy of one in read mode shadow, when the read is sampled)
    fallback_error: str | None


def open_read(db: ServiceDb, req: ReadRequest) -> OpenRead:  # noqa: C901
    """Decide and open the read; the caller must ``stream.close()`` it. Blocking: run it off the event loop.
    Complex on purpose: the read's engine choice and its cleanup on every failure path in one try."""
    conn = db.take()
    handed_to_stream = False
    try:
        dataset = get_dataset(conn, req.dataset_id)  # NotFound for an unknown dataset
        proj = projection_for(dataset, req.columns, limit=req.limit, order_by_row_index=req.order_by_row_index)
        plan = bind(req.query, dataset) if req.query is not None else None  # a structured read (docs/reads.md)
        source = resolve_read_source(conn, db.resolver(), req.reader, dataset.id, logger=log)
        answer: pa.Table | None = None  # a structured read's Postgres answer (offered to a shadow comparison)
        batch_rows = db.settings.service.batch_rows
        if proj.limit:  # a 1,000-row read decodes 1,000 rows, not a whole batch of them
            batch_rows = min(batch_rows, proj.limit)

        def postgres(decision: ReadDecision) -> BatchStream:
            nonlocal handed_to_stream, answer
            handed_to_stream = True  # from here the stream gives the connection back when it closes
            if plan is not None:
                try:
                    answer = read_postgres_compute(conn, dataset, plan)
                except BaseException:
                    db.give(conn)
                    raise
                return _table_stream(answer, batch_rows, release=lambda: db.give(conn))
            return postgres_stream(conn, dataset, proj, batch_rows, release=lambda: db.give(conn))

        def iceberg(decision: ReadDecision) -> BatchStream:
            table = db.table(dataset.id, decision.snapshot_id)
            if plan is not None:
                return _table_stream(read_iceberg_compute(table, decision.snapshot_id, plan), batch_rows)
            return iceberg_stream(table, decision.snapshot_id, dataset, proj, batch_rows)

        try:
            result = source.run(postgres=postgres, iceberg=iceberg)
        except ReadRefused as exc:
            exc.decision = source.decision  # type: ignore[attr-defined]  # counted by the caller's metrics
            raise
        except LakehouseError:
            raise
        except Exception as exc:
            if source.decision.source == ICEBERG and not handed_to_stream:  # no fallback was allowed
                raise IcebergReadFailed(no_fallback_message(source.decision, exc)) from exc
            raise
    except BaseException:
        if not handed_to_stream:
            db.give(conn)
        raise
    if result.decision.source == ICEBERG:
        db.give(conn)  # an Iceberg stream needs no Postgres connection
    stream = result.value
    compared = shadow.shadowed(result.decision) is not None  # pg@shadow, or pg@reverse of a reader in mode shadow
    if compared and plan is not None and answer is not None and req.query is not None:
        # a structured answer is whole before its first byte: offered as it is, no copy of the stream
        pool = shadow.pool_for(db.settings.shadow, db.dsn)
        load = lambda: db.table(dataset.id, None)  # noqa: E731  (the worker loads it)
        served = dataclasses.replace(result, value=answer)
        shadow.offer_query(pool, served, plan, req.query, shadow.iceberg_answer(load, plan))
    elif compared and plan is None:
        pool = shadow.pool_for(db.settings.shadow, db.dsn)
        if pool.draw():  # only a sampled read is copied for its comparison

            def compare(rows: pa.Table) -> None:
                load = lambda: db.table(dataset.id, None)  # noqa: E731  (the worker loads it)
                served = dataclasses.replace(result, value=rows)
                shadow.offer_read(pool, served, dataset, proj, shadow.iceberg_side(load, proj), drawn=True)

            stream = ShadowCopy(stream, compare, pool)
    return OpenRead(result.decision, stream, result.fallback_error)


def _table_stream(table: pa.Table, batch_rows: int, release=lambda: None) -> BatchStream:
    """A structured read's answer (computed whole: its memory is the result's), streamed like any read."""
    return BatchStream(table.schema, iter(table.to_batches(max_chunksize=batch_rows)), release).prime()


class ShadowCopy:
    """A Postgres stream served in read mode shadow, copied as it goes so that, once the caller has read all of it,
    the same read can be compared with Iceberg off the request path (routing/shadow.py). A read cut short is not
    compared; one longer than ``shadow.MAX_STREAMED_ROWS`` stops being copied (counted as too-large)."""

    def __init__(self, inner: BatchStream, compare, pool: shadow.ShadowPool):
        self._inner, self._compare, self._pool = inner, compare, pool
        self._kept: list[pa.RecordBatch] | None = []
        self._rows, self._ended = 0, False

    def __getattr__(self, name: str):  # schema, rows, prime: the inner stream's
        return getattr(self._inner, name)

    def next_batch(self) -> pa.RecordBatch | None:
        batch = self._inner.next_batch()
        if batch is None:
            self._ended = True
        elif self._kept is not None:
            self._rows += batch.num_rows
            if self._rows > shadow.MAX_STREAMED_ROWS:
                self._kept = None
                self._pool.counts["too-large"] += 1
            else:
                self._kept.append(batch)
        return batch

    def close(self) -> None:
        kept, self._kept = self._kept, None
        self._inner.close()
        if self._ended and kept is not None:
            try:
                self._compare(pa.Table.from_batches(kept, schema=self._inner.schema))
            except Exception as exc:  # the caller has its rows: losing a comparison must not fail the read
                log.warning(f"[read-router] shadow read not queued: {type(exc).__name__}: {exc}")
