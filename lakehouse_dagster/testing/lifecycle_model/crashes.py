"""Verbs interrupted at their fault points (core/failpoints.py, the crash harness's points) as moves of the model.

In-process: the failpoint is armed ``:raise`` for one firing (LAKEHOUSE_FAILPOINT, as the crash harness arms it),
so the verb stops at that point with an exception, not a SIGKILL; its open transaction is rolled back by the
session as a dead process's would be by Postgres, but its advisory locks go with the session only when the
connection is closed — here the model's session lives on (a lock is re-entrant per session, so the next verb on it
is not blocked). The crash harness (testing/crash_harness/) kills real processes at the same points; the model
checks what the next verb or the reaper makes of what was left."""

from __future__ import annotations

import contextlib
import os

import pyarrow as pa
from hypothesis import strategies as st

from lakehouse_dagster.core import failpoints
from lakehouse_dagster.core.failpoints import FailpointError
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.lifecycle import WriteRefused
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.sources.pg_rows import rows_transaction
from lakehouse_dagster.sources.writers import _failpoint_after_first
from lakehouse_dagster.testing.lifecycle_model.oracle import WRITERS, ModelParts
from lakehouse_dagster.testing.lifecycle_model.steps import rule
from lakehouse_dagster.tracking import datasets


@contextlib.contextmanager
def armed(point: str | None):
    """``point`` armed to raise once while the block runs (None: nothing armed)."""
    if point is None:
        yield
        return
    assert point in failpoints.POINTS, point
    before = os.environ.get(failpoints.ENV)
    os.environ[failpoints.ENV] = f"{point}:raise*1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(failpoints.ENV, None)
        else:
            os.environ[failpoints.ENV] = before
        failpoints.validate()  # re-read now: the next arming of the same point counts its firings afresh


class CrashMoves(ModelParts):
    """Mixed into the model's machine (base.py): verbs of the pg side interrupted at their fault points."""

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS))
    def pg_write_interrupted(self, i, writer):
        """A source writer's pg path interrupted after its first batch (``after-first-batch``): nothing of it may
        stay — not the first batch, not the ingest state — and the next write goes through as if it never ran."""
        d = self.ids[i]
        lifecycle_of(self.conn, [d])
        truth = self.o.state(d).authority
        start = self.next_index[d]
        batches = [pa.record_batch([pa.array([start + k], pa.int64())], names=["a"]) for k in range(2)]
        try:
            with (
                armed("after-first-batch"),
                rows_transaction(
                    self.dsn, self.conn, d, datasets.get_dataset(self.conn, d).columns, replace=False
                ) as tx,
            ):
                tx.check_authority(writer)
                tx.copy(_failpoint_after_first(batches), start_index=start)
        except WriteRefused:
            assert truth == S.ICEBERG, "a pg write refused while Postgres is the truth"
            return
        except FailpointError:
            assert truth == S.POSTGRES, "a pg write reached its first batch while Iceberg is the truth"
            self._saw("pg write interrupted after its first batch")
            return  # the invariant: dataset_rows holds what it held
        raise AssertionError("the armed after-first-batch point did not fire")

    @rule(i=st.integers(0, 2))
    def complete_interrupted(self, i):
        """complete's batches interrupted after one (``complete-after-batch``): the rows deleted so far are the
        completed part (Iceberg alone holds them), the dataset stays ``completing``; the next ``complete_finish``
        (the model's) or a restore settles it."""
        d = self.ids[i]
        if self.o.marks.get(d) != "in_progress":
            return
        try:
            with armed("complete-after-batch"):
                cp._delete_batches(self.conn, d, 1, 100, "model")
        except FailpointError:
            self._saw("complete interrupted after a batch")
        else:  # nothing left to delete: the first batch finished it
            self.o.marks[d] = "complete"
            self.o.iceberg_only[d] += self.o.pg_rows[d]
            self.o.pg_rows[d] = 0
            return
        left = self.conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]
        gone = self.o.pg_rows[d] - left
        assert 0 <= gone <= 1, f"one batch of 1 row deleted {gone} row(s) of {d}"
        self.o.pg_rows[d] = left
        self.o.iceberg_only[d] += gone
