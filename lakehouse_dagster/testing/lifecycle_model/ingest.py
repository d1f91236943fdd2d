"""Source ingests as moves of the model with Iceberg (issue 42, item 1): each dataset has a files source (a CSV per
drawn file); ``POST /lakehouse/ingest`` and the source poller's ingest job both call
``runbooks.first_sync.checked_write`` (``run_writer``, a first native write canaried), so the model calls it too —
the service's way (any writer, drawn) and the poller's way (``sources.poll.pending_ingests`` asks, then the ingest
job's call per request). A native write interrupted at a fault point of the native path is here too (it needs
real tables).

The oracle: an ingest lands whole in the store that is the dataset's truth, or is refused with nothing written —
never in neither (bug 1: a pg writer beside a native one wrote ``dataset_rows``, which the reverse then deleted); the
poller never asks a pg writer of a dataset whose truth is Iceberg; the files an ingest read are never read again by
an append (the ingest state moves with the rows, on either path). A native write interrupted anywhere left the
table whole (its rows committed or none) and the next native write settles the rest: its rows land, the sync log
holds no ``running`` row, ``datasets.row_count`` is the table's count."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from lakehouse_dagster.core.errors import FlipRefused, LakehouseError
from lakehouse_dagster.core.failpoints import FailpointError
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lifecycle import WriteRefused
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.runbooks.first_sync import checked_write
from lakehouse_dagster.sources.poll import pending_ingests
from lakehouse_dagster.sources.stored import set_source
from lakehouse_dagster.testing.lifecycle_model.oracle import WRITERS, ModelParts
from lakehouse_dagster.testing.lifecycle_model.steps import rule

NATIVE_POINTS = (
    "after-first-file",
    "before-commit",
    "commit-start",
    "in-commit",
    "after-commit-before-log",
    "after-log",
)
log = logging.getLogger("lakehouse_dagster.model")


class IngestMoves(ModelParts):
    """Mixed into ``LifecycleWithIceberg`` (iceberg.py)."""

    def _sources_start(self) -> None:
        self.source_dir = Path(tempfile.mkdtemp(prefix="lh_model_sources_"))
        self.files: dict = {}  # dataset → file names in its source
        self.read: dict = {}  # dataset → the files its ingest state says were read
        for d in self.ids:
            (self.source_dir / str(d)).mkdir()
            set_source(
                self.conn,
                d,
                {"type": "files", "uri": str(self.source_dir / str(d) / "*.csv"), "format": "csv"},
                settings=self.lake_settings,
            )
            self.files[d], self.read[d] = [], set()

    def _drop_file(self, d) -> None:
        name = f"f{len(self.files[d]):04d}.csv"
        (self.source_dir / str(d) / name).write_text(f"a\n{self.next_index[d]}\n")
        self.next_index[d] += 1
        self.files[d].append(name)

    def _ingest(self, d, writer: str, how: str) -> str:
        """``checked_write`` as the service and the ingest job call it; judged against the oracle. Returns what
        happened: native | pg | nothing new | refused | gates."""
        truth = self.o.state(d).authority
        native = self.o.mode("write", writer, d) == "iceberg_native"
        new = [f for f in self.files[d] if f not in self.read[d]]
        replace = writer == "sync.full"
        self._audit_mark()
        try:
            checked = checked_write(
                self.conn,
                self.dsn,
                self.catalog,
                self.lake_settings,
                FlagResolver(self.conn, ttl_seconds=0),
                d,
                writer,
                logger=log,
            )
        except FlipRefused as exc:  # a first native write's gates (runbooks/first_sync.py): not mirrored yet, ...
            assert native and not isinstance(exc, WriteRefused), f"{how} {writer}: {exc}"
            assert "lakehouse " in str(exc), str(exc)
            assert self._iceberg_count(d)[0] == self.iceberg_rows.get(d, 0), "refused, written"
            self._saw(f"{how} ingest: first native write refused by the flip gates")
            return "gates"
        except WriteRefused as exc:
            assert native == (truth == S.POSTGRES), (
                f"{how} {writer} refused, path native={native}, truth {truth}: {exc}"
            )
            assert "nothing was written" in str(exc), str(exc)
            self._saw(f"{how} ingest refused")
            return "refused"
        r = checked.result
        if not r.new:  # nothing past the ingest state: nothing read, nothing written
            assert not replace and not new, f"{how} {writer} found nothing new; files not read yet: {new}"
            self._saw(f"{how} ingest: nothing new")
            return "nothing new"
        assert r.path == ("native" if native else "pg"), (r.path, native)
        wrong = "Iceberg" if native else "Postgres"
        assert (truth == S.ICEBERG) == native, f"{how} {writer} landed in {wrong}, not the truth ({truth})"
        rows = len(self.files[d]) if replace else len(new)
        assert r.rows == rows, f"{how} {writer} wrote {r.rows} row(s), the source had {rows} to read"
        self.read[d] = set(self.files[d])
        if native:
            counts = self.iceberg_rows
            counts[d] = rows if replace else counts.get(d, 0) + rows
            self.o.mirrored.add(d)
            self.tables.add(d)
            assert self._iceberg_count(d)[0] == counts[d], (d, self._iceberg_count(d), counts[d])
        else:
            self.o.pg_rows[d] = rows if replace else self.o.pg_rows[d] + rows
        self._follow_audit()  # a first native write's MISMATCH rolls its writer back: a legal move, or refused
        if native:
            self._reverse_check(d)  # the reverse on: Postgres holds the rows too
        self._saw(f"{how} ingest {'native' if native else 'pg'}")
        return "native" if native else "pg"

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS), new_file=st.booleans())
    def service_ingest(self, i, writer, new_file):
        """``POST /lakehouse/ingest {dataset_id, writer}``: the service's worker calls checked_write."""
        d = self.ids[i]
        if new_file:
            self._drop_file(d)
        self._ingest(d, writer, "service")

    @rule(new_file=st.sampled_from([None, 0, 1, 2]))
    def source_poller(self, new_file):
        """The source_poller's tick (pending_ingests) and the ingest job it asks for, per request."""
        if new_file is not None:
            self._drop_file(self.ids[new_file])
        asked, _, _ = pending_ingests(self.dsn, self.lake_settings, None, limit=10)
        for p in asked:
            truth = self.o.state(p.dataset_id).authority
            assert not (p.mode == "pg" and truth == S.ICEBERG), f"the poller asked {p.writer} on pg where {truth} rules"
            self._ingest(p.dataset_id, p.writer, "poller")
        if not asked:
            self._saw("poller: nothing asked")

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS), point=st.sampled_from(NATIVE_POINTS))
    def native_write_interrupted(self, i, writer, point):
        """A native write interrupted at ``point``; then the next native write, which must settle what was left."""
        d = self.ids[i]
        if self.o.state(d).authority != S.ICEBERG:
            return  # refused before any fault point (native_write checks that)
        counts = self.iceberg_rows
        before = counts.get(d, 0)
        replace = writer == "sync.full"
        raised = True
        try:
            self._native_one(d, writer, point)
            raised = False  # the write settled its own interruption (in-commit: "its snapshot is in the table")
        except (LakehouseError, FailpointError):  # the failpoint's error, raw or as the native path reports it
            pass
        got = self._iceberg_count(d)[0]
        whole = 1 if replace else before + 1
        assert got in (before, whole), f"a native write interrupted at {point} left {got} row(s) ({before} or {whole})"
        assert raised or got == whole, f"a native write interrupted at {point} returned but did not land"
        outcome = "committed" if got == whole else "not committed"
        self._saw(f"native write interrupted at {point}: {outcome}{'' if raised else ', settled in-line'}")
        counts[d] = got
        if got == whole:
            self.next_index[d] += 1
            self.o.mirrored.add(d)
            self.tables.add(d)
        self.native_write(i, "sync.append")  # the next verb: it lands (and asserts its count)
        running = self.conn.execute(
            "select count(*) from iceberg_sync_log where dataset_id = %s and status = 'running'", (d,)
        ).fetchone()[0]
        assert running == 0, f"{running} sync log row(s) of {d} still running after the next native write"
        row_count = self.conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0]
        assert row_count == counts[d], f"datasets.row_count {row_count}, the table holds {counts[d]}"
