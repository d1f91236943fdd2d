"""`lakehouse backfill`: copy the rows only Iceberg holds back into dataset_rows.

After a writer is rolled back to pg, Postgres lacks what was written natively (mirror/native_run.py)
and the mirror refuses to overwrite the table. The backfill makes Postgres hold every row of the table's
current snapshot, identity preserved (``__row_index``/``__row_id``/``__created_at`` become
``row_index``/``row_id``/``created_at``; typed values become the jsonb the mirror types back to the same
values), so the next mirror is a no-op or a pure append — or, when Postgres had to change below the
mirrored rows, a full sync of identical content.

  * Streamed: the rows go from the data files, batch by batch, through ADBC's binary COPY into a temporary
    table (memory bounded by a batch), and Postgres builds the rows from it (the pg path's jsonb expression,
    sources/pg_rows.py). After native appends only the files those snapshots added are copied (Postgres
    holds everything below them); after a native overwrite, the whole snapshot.
  * One transaction: the copy, the repairs and the ``lakehouse_pg_reconciled`` record commit together;
    a crash or Ctrl-C leaves Postgres as it was and the marker standing, and a re-run starts over.
  * Under the dataset lock (G3): no mirror or native write of the dataset runs meanwhile. Refused while
    a writer of the dataset still resolves iceberg_native (Postgres would go stale again at once).
  * Two repairs so that nothing is dropped or duplicated: after a native sync.full (an overwrite),
    Postgres rows older than the newest native commit that the table no longer holds were superseded
    by it and are removed; rows written on the pg path after the rollback that are not in Iceberg keep
    their order but move above the table's max ``__row_index`` when they would collide.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid

from psycopg import sql
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import adbc_uri, connect, fetch_value
from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.copy_back import IDENTITY as _IDENTITY
from lakehouse_dagster.lake.copy_back import counted as _counted
from lakehouse_dagster.lake.copy_back import data_expr as _data_expr
from lakehouse_dagster.lake.copy_back import snapshot_batches as _batches
from lakehouse_dagster.mirror.native_run import iceberg_only
from lakehouse_dagster.tracking import sync_log
from lakehouse_dagster.tracking.datasets import Column, get_dataset, reverse_apply, row_writes
from lakehouse_dagster.tracking.datasets.rows import TABLE as ROWS_TABLE
from lakehouse_dagster.tracking.datasets.rows import count_rows

_log = logging.getLogger(__name__)
_TMP = "lakehouse_backfill_rows"


@dataclasses.dataclass(frozen=True)
class BackfillResult:
    dataset_id: uuid.UUID
    snapshot_id: int | None
    copied: int  # Iceberg rows inserted into dataset_rows
    removed: int  # stale Postgres rows a native overwrite had superseded
    moved: int  # pg-path rows written after the rollback, moved above the table's max __row_index
    pg_rows: int  # rows in dataset_rows afterwards
    seconds: float
    nothing_to_do: bool = False

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}

    def summary(self) -> str:
        """What `lakehouse backfill` and the backfill job say."""
        if self.nothing_to_do:
            return f"dataset {self.dataset_id}: Iceberg holds no rows Postgres lacks; nothing to backfill"
        return (
            f"dataset {self.dataset_id}: backfilled from snapshot {self.snapshot_id} in {self.seconds:.2f}s — "
            f"{self.copied} row(s) copied into {ROWS_TABLE} (identity preserved), {self.removed} stale row(s) "
            f"removed, {self.moved} pg-path row(s) moved above the table's rows; {ROWS_TABLE} now holds "
            f"{self.pg_rows}; the mirror may run again (lakehouse sync --dataset {self.dataset_id})"
        )


def backfill(dsn: str, catalog: Catalog, settings: Settings, dataset_id, *, actor: str) -> BackfillResult:
    """Make dataset_rows hold every row of the table's current snapshot (see the module docstring)."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    started = time.perf_counter()
    with connect(dsn) as conn:
        dataset = get_dataset(conn, ds_id)
        if dataset.kind != "tabular":
            raise BadInput(f"dataset {ds_id} is a {dataset.kind} dataset; only tabular datasets have Iceberg rows")
        with dataset_lock(conn, ds_id):
            if native_dataset_ids(conn, [ds_id]):
                raise BadInput(
                    f"dataset {ds_id} is still written iceberg-native (a writer flag resolves to "
                    "iceberg_native): roll the writer back first (lakehouse write-flags set <writer> pg "
                    f"--dataset {ds_id}), then backfill; nothing was written"
                )
            table = load_table_or_none(catalog, table_identifier(settings, ds_id))
            found = iceberg_only(conn, catalog, settings, ds_id, table=table)
            if found is None or table is None:  # (found is None whenever there is no table)
                n = count_rows(conn, ds_id)
                return BackfillResult(ds_id, None, 0, 0, 0, n, time.perf_counter() - started, nothing_to_do=True)
            present = {f.name for f in table.schema().fields}
            columns = [c for c in dataset.columns if c.name in present]
            names = [*(n for n in _IDENTITY if n in present), *(c.name for c in columns)]
            copied, removed, moved = _copy_and_apply(conn, dsn, table, ds_id, columns, names, found, actor)
            n = count_rows(conn, ds_id)
    return BackfillResult(ds_id, found.snapshot_id, copied, removed, moved, n, time.perf_counter() - started)


def _copy_and_apply(
    pg, dsn: str, table, ds_id: uuid.UUID, columns: list[Column], names: list[str], found, actor: str
) -> tuple[int, int, int]:
    """The copy and every repair in ONE Postgres transaction, on an ADBC session (binary COPY from Arrow).
    Statements are composed with psycopg.sql and rendered by ``pg`` (identifiers and literals quoted).
    Long on purpose: everything that must commit together is in this one transaction, in order; split, the transaction boundary would hide between functions."""
    import adbc_driver_postgresql.dbapi as adbc  # lazy: the ADBC driver (native) only where a backfill runs

    tmp, ds = sql.Identifier(_TMP), sql.Literal(str(ds_id))
    in_iceberg = sql.SQL("exists (select 1 from {t} b where b.__row_id::uuid = r.row_id)").format(t=tmp)

    with adbc.connect(adbc_uri(dsn)) as conn:  # not autocommit: everything below commits together
        cur = conn.cursor()

        def one(stmt: sql.Composable):
            t = time.perf_counter()
            cur.execute(stmt.as_string(pg))
            _log.debug("backfill %.2fs: %s", time.perf_counter() - t, stmt.as_string(pg)[:80])
            return fetch_value(cur, "the result of a backfill statement")

        def run(stmt: sql.Composable) -> None:
            t = time.perf_counter()
            cur.execute(stmt.as_string(pg))
            _log.debug("backfill %.2fs: %s", time.perf_counter() - t, stmt.as_string(pg)[:80])

        run(sql.SQL("set local timezone to 'UTC'"))
        # an append-only lineage: only the files the native snapshots added (Postgres holds everything
        # below them); after a native overwrite, the whole snapshot
        cur.adbc_ingest(
            _TMP, _batches(table, found.snapshot_id, names, found.added_files), mode="create", temporary=True
        )
        run(sql.SQL("create index on {t} ((__row_id::uuid))").format(t=tmp))
        run(sql.SQL("analyze {t}").format(t=tmp))
        # every statement below joins the whole staged snapshot with the dataset's rows: hash joins, not one
        # index probe per row (the probes would also wade through the rows this transaction deleted)
        run(sql.SQL("set local enable_nestloop = off"))
        run(sql.SQL("select coalesce(min(__row_index), 0), coalesce(max(__row_index), -1) from {t}").format(t=tmp))
        ice_min, ice_max = (int(x) for x in cur.fetchone())
        # rows only Postgres holds; with only the appended files staged, the rows below them are shared
        only_pg = sql.SQL("r.dataset_id = {ds}::uuid and not {inice}{above}").format(
            ds=ds,
            inice=in_iceberg,
            above=sql.SQL("")
            if found.added_files is None
            else sql.SQL(" and r.row_index >= {}").format(sql.Literal(ice_min)),
        )
        removed = moved = 0
        if found.replaced:  # a native overwrite superseded every older Postgres row it does not hold
            removed = int(
                one(
                    _counted(
                        row_writes.delete_superseded_statement(only_pg, sql.Literal(found.last_native_at.isoformat()))
                    )
                )
            )
        extra_min = one(row_writes.min_row_index_statement(only_pg))
        if extra_min is not None and int(extra_min) <= ice_max:
            # rows written on the pg path after the rollback: park them below zero, then renumber them in
            # their order above the table's max __row_index (two steps: the primary key is checked per row)
            moved = int(one(_counted(row_writes.park_below_zero_statement(only_pg))))
            run(row_writes.renumber_parked_statement(ds, sql.Literal(ice_max)))
        copied = int(
            one(
                _counted(
                    reverse_apply.insert_staged_missing(reverse_apply.insert_staged(ds, _data_expr(columns), tmp), ds)
                )
            )
        )
        run(sync_log.reconciled_by_backfill(ds, found.snapshot_id, copied, removed, moved, actor))
        run(row_writes.recount_ready_statement(ds))
        conn.commit()
    return copied, removed, moved
