"""The model with the writes that reach Iceberg (``LifecycleWithIceberg``)."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.flags.resolver import resolve_from
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import foreign_since_project
from lakehouse_dagster.lifecycle import WriteRefused
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.mirror.reverse import PostgresWritten, ReversePosition, _refuse_postgres_written
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.routing.write_router import WriteDecision, _write_native, native_write
from lakehouse_dagster.testing.lifecycle_model.base import Lifecycle
from lakehouse_dagster.testing.lifecycle_model.crashes import armed
from lakehouse_dagster.testing.lifecycle_model.ingest import IngestMoves
from lakehouse_dagster.testing.lifecycle_model.kills import KillMoves
from lakehouse_dagster.testing.lifecycle_model.oracle import WRITERS
from lakehouse_dagster.testing.lifecycle_model.ready import ReadyMoves
from lakehouse_dagster.testing.lifecycle_model.steps import rule
from lakehouse_dagster.tracking import datasets


class LifecycleWithIceberg(ReadyMoves, KillMoves, IngestMoves, Lifecycle):
    """The model with the writes that reach Iceberg (issue 42: "writes from every writer path"): the native path
    for real — ``route_write``'s locked half (G3, G2, the lifecycle's write hold, the authority check) committing
    through lake/writer.py into a real table of ``catalog`` —, another engine's append to that table (a pyiceberg
    client that is not the project), and a raw app statement on ``dataset_rows`` that no check of ours sees (the
    live app's row.edit), which the reverse mirror must detect in O(1) by ``rows_version``. The Iceberg row count
    is checked against the oracle after every native write. Slower (a table per dataset): a separate, smaller run."""

    catalog: Any = None  # set by run()
    lake_settings: Any = None

    def _world_start(self) -> None:
        self.tables: set = set()  # datasets whose table holds a snapshot (another engine appends only to those)
        self.iceberg_rows: dict = {}  # dataset → rows its table must hold
        self.readied: set = set()  # datasets an operator made ready the runbook's way (ready.py)
        self._sources_start()

    def _iceberg_count(self, d) -> tuple[int, int | None]:
        table = load_table_or_none(self.catalog, table_identifier(self.lake_settings, d))
        snap = table.current_snapshot() if table is not None else None
        if table is None or snap is None:
            return 0, None
        return table.scan().count(), snap.snapshot_id

    @rule(i=st.integers(0, 2))
    def first_snapshot(self, i):
        """The forward mirror's first snapshot for real: a full sync of the dataset into its table (so another
        engine finds tables of mirrored datasets too, where Postgres is the truth)."""
        d = self.ids[i]
        if d in self.o.mirrored or self.o.state(d).authority != S.POSTGRES:
            return
        sync_dataset(self.dsn, self.catalog, self.lake_settings, d, mode="full")
        self.o.mirrored.add(d)
        self.tables.add(d)
        self.iceberg_rows[d] = self.o.pg_rows[d]
        assert self._iceberg_count(d)[0] == self.o.pg_rows[d], (d, self._iceberg_count(d), self.o.pg_rows[d])
        self._saw("mirrored by a real sync")

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS), mode=st.sampled_from(["iceberg_native", "pg"]))
    def writer_at_dataset_scope(self, i, writer, mode):
        """The same verb as ``writer_flag``, drawn more often here: tables exist only once a dataset went native, so
        the moves in and out of ``native`` are what puts the writes below to work."""
        self._flag("write", writer, mode, i)

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS))
    def native_write(self, i, writer):
        """One row through the native path. Accepted iff Iceberg is the truth; a refusal writes nothing."""
        d = self.ids[i]
        truth = self.o.state(d).authority
        before_rows, before_snap = self._iceberg_count(d)
        try:
            self._native_one(d, writer)
        except WriteRefused as exc:
            assert truth == S.POSTGRES, f"a native write refused while Iceberg is the truth: {exc}"
            assert "nothing was written" in str(exc), str(exc)
            assert self._iceberg_count(d) == (before_rows, before_snap), "a refused native write wrote Iceberg"
            self._saw("native refused")
            return
        assert truth == S.ICEBERG, "a native write landed while Postgres is the truth"
        self.next_index[d] += 1
        counts = self.iceberg_rows  # per sequence: a fresh machine each time
        counts[d] = 1 if get_flag(WRITE, writer).iceberg_mode == "replace" else counts.get(d, 0) + 1
        self.tables.add(d)
        self.o.mirrored.add(d)  # Iceberg holds a snapshot of it (a succeeded sync log row: what `derive` reads)
        assert self._iceberg_count(d)[0] == counts[d], (d, self._iceberg_count(d), counts[d])
        self._saw("native accepted")

    def _native_one(self, d, writer: str, point: str | None = None) -> None:
        """One row (``a`` = the next index) through ``route_write``'s locked native half; ``point``: a fault point
        armed to interrupt it (crashes.py)."""
        start = self.next_index[d]
        dataset = datasets.get_dataset(self.conn, d)
        batch = pa.record_batch(
            [
                pa.array([start], pa.int64()),
                pa.array([str(uuid.uuid4())]),
                pa.array([dt.datetime.now(dt.UTC)], pa.timestamp("us", tz="UTC")),
                pa.array([start], pa.int64()),
            ],
            names=["__row_index", "__row_id", "__created_at", "a"],
        )
        write = native_write(self.catalog, self.lake_settings, dataset, [batch], writer=writer, conn=self.conn)
        decision = WriteDecision(writer, d, resolve_from(get_flag(WRITE, writer), {}))
        with armed(point):
            _write_native(self.conn, decision, write, self.lake_settings, self.catalog, logging.getLogger("model"))

    @rule(i=st.integers(0, 2))
    def foreign_append(self, i):
        """Another engine (a plain pyiceberg client, no project marks) appends a row to the dataset's table. Where
        Iceberg is the truth the row is the dataset's like a native one (the next native append keeps it); where
        Postgres is, the forward mirror must see a data change it did not make (lake/foreign.py) and refuse it."""
        if not self.tables:  # no precondition: the draws never depend on the world's state (steps.py)
            return
        tables = {}
        for x in sorted(self.tables, key=self.ids.index):  # drawn only where a table exists (item 4)
            tables[x] = self.catalog.load_table(table_identifier(self.lake_settings, x))
        d = list(tables)[i % len(tables)]
        table = tables[d]
        n = self.next_index[d]
        row = {"__row_index": n, "__row_id": str(uuid.uuid4()), "__created_at": dt.datetime.now(dt.UTC)}
        row["a"] = n
        table.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
        self.next_index[d] += 1
        counts = self.iceberg_rows
        counts[d] = counts.get(d, 0) + 1
        if self.o.state(d).authority == S.ICEBERG:
            self._saw("foreign append, Iceberg the truth")
            return
        chain = foreign_since_project(self.catalog.load_table(table_identifier(self.lake_settings, d)))
        assert chain.problem and "another Iceberg engine changed its table" in chain.problem, chain
        self._saw("foreign append seen by the mirror's check")

    @rule(i=st.integers(0, 2))
    def raw_app_statement(self, i):
        """The live app's own INSERT into dataset_rows, past every check of ours. Where Postgres is the truth it is
        simply a write; where Iceberg is, the reverse mirror must see it in O(1) (rows_version) and refuse."""
        d = self.ids[i]
        version = fetch_value(
            self.conn.execute("select rows_version from datasets where id = %s", (d,)), "rows_version"
        )
        start = self.next_index[d]
        self.conn.execute(
            "insert into dataset_rows (dataset_id, row_index, data) values (%s, %s, jsonb_build_object('a', %s::int))",
            (d, start, start),
        )
        self.next_index[d] += 1
        self.o.pg_rows[d] += 1
        if self.o.state(d).authority != S.ICEBERG:
            self._saw("raw statement, Postgres the truth")
            return
        at = ReversePosition(d, 0, "append", 0, 0, 0, dt.datetime.now(dt.UTC), rows_version=version)
        try:
            _refuse_postgres_written(self.conn, d, at)
        except PostgresWritten as exc:
            assert "nothing was written" in str(exc) and "lakehouse " in str(exc), str(exc)
            self._saw("raw statement detected by the reverse mirror")
        else:
            raise AssertionError(f"the reverse mirror did not see a raw write to {d}'s dataset_rows")
