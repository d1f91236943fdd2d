"""A dataset made ready the runbook's way, and its write flip, as moves of the model with Iceberg (issue 42).

The other moves set flags past the gates, so a native ingest of the model met the first native write's gates
(routing/native_guard.py) unmet and was refused. Here an operator follows the runbook: the mirror syncs the dataset
in full (caught up, identity columns), every reader Iceberg can serve is read-flipped (``flip.preflight``: a real
canary, then the gated set), and — drawn — the writer is write-flipped as the ``write_flip`` job does it (preflight,
gated set, the step-3 checks, ``first_native_syncs``: the first native write from the dataset's files source and
the canary on it). A writer plan's flip runs (plans.py) are that job too here. After it, the service's and the
poller's ingests land natively (ingest.py).

The oracle: every flag change is a legal move (the audit, followed); a flip the job makes writes its first native
rows into Iceberg whole (the files not read yet, or all of them for ``sync.full``) or nothing; the first sync never
takes the pg path; and wherever a dataset is native with its reverse on, the reverse mirror's apply
(``apply_reverse``) leaves ``dataset_rows`` holding exactly the table's rows — or is refused (a raw app statement
wrote Postgres since), with nothing written."""

from __future__ import annotations

import logging

from hypothesis import strategies as st

from lakehouse_dagster.core.errors import LakehouseError, NothingToDo
from lakehouse_dagster.flags.registry import READ, WRITE
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.mirror.reverse import apply_reverse
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.runbooks import flip
from lakehouse_dagster.runbooks.first_sync import first_native_syncs, stop_message
from lakehouse_dagster.testing.lifecycle_model.oracle import READERS, WRITERS, ModelParts
from lakehouse_dagster.testing.lifecycle_model.steps import rule

log = logging.getLogger("lakehouse_dagster.model")


class ReadyMoves(ModelParts):
    """Mixed into ``LifecycleWithIceberg`` (iceberg.py), before the plan moves (its write flips are the job's)."""

    def _pg_count(self, d) -> int:
        return self.conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]

    def _ready(self, d) -> bool:
        """Mirror synced in full, every servable reader read-flipped the runbook's way; False: a step refused."""
        if self.o.marks.get(d) or self.o.state(d).authority != S.POSTGRES:
            return False
        self._audit_mark()
        try:
            sync_dataset(self.dsn, self.catalog, self.lake_settings, d, mode="full", lock_timeout_s=10)
        except LakehouseError as exc:  # another engine's commit on its table, a table only Iceberg holds rows of, ...
            assert "nothing" in str(exc) or "lakehouse " in str(exc), str(exc)
            self._saw("ready: mirror sync refused")
            return False
        self.o.mirrored.add(d)
        self.tables.add(d)
        self.iceberg_rows[d] = self.o.pg_rows[d]
        assert self._iceberg_count(d)[0] == self.o.pg_rows[d], (d, self._iceberg_count(d), self.o.pg_rows[d])
        for name in READERS:
            try:
                pre = flip.preflight(
                    self.conn, self.dsn, self.catalog, self.lake_settings, name, "iceberg", kind=READ, dataset=d
                )
                flip.flip(self.conn, pre, note="model: the runbook's read flip", actor="model")
            except NothingToDo:
                continue
            except LakehouseError as exc:  # a canary not ok, a gate
                assert "lakehouse " in str(exc) or "canary" in str(exc), str(exc)
                self._follow_audit()
                self._saw("ready: read flip refused")
                return False
        self._follow_audit()
        self.readied.add(d)
        self._saw("ready: mirrored and read-flipped the runbook's way")
        return True

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS), write_flip=st.booleans(), new_file=st.booleans())
    def runbook_ready(self, i, writer, write_flip, new_file):
        """An operator readies dataset ``i``; ``write_flip``: then flips ``writer`` with the write_flip job (a new
        file in its source first when ``new_file``: its first native write has rows to land)."""
        d = self.ids[i]
        if not self._ready(d) or not write_flip:
            return
        if new_file:
            self._drop_file(d)
        p = {"name": writer, "scope": "dataset", "scope_id": str(d), "note": "model: the runbook's write flip"}
        failed = self._write_flip_job(p)
        self._follow_audit()
        self._saw("ready: write flip stopped" if failed else "ready: write flipped, first native write checked")

    def _flip_run(self, p: dict) -> str | None:
        """A plan's flip run: a writer's is the write_flip job (below), a reader's the flag set (plans.py)."""
        if p["kind"] == WRITE:
            return self._write_flip_job(p)
        return super()._flip_run(p)  # type: ignore[misc]

    def _prepare_for_writer(self, i: int) -> None:
        self._ready(self.ids[i])

    def _write_flip_job(self, p: dict) -> str | None:
        """The write_flip job's steps for ``p`` (a plan's flip params): preflight (the canary), the gated set, the
        step-3 checks, the first native syncs; None, or why it failed (a refusal, a STOP)."""
        scope = {p["scope"]: p["scope_id"]} if p["scope"] in ("dataset", "workspace") else {}
        name = p["name"]
        try:
            pre = flip.preflight(
                self.conn, self.dsn, self.catalog, self.lake_settings, name, "iceberg_native", kind=WRITE, **scope
            )
            flip.flip(self.conn, pre, note=p["note"], actor="model (write_flip)")
            moved = flip.moved_ids(pre)
            bad = [v for v in flip.verify_write(self.conn, name, moved) if v.problems]
            if bad:
                return f"verify: {bad[0].dataset_id}: {'; '.join(bad[0].problems)}"
            new = {d: [f for f in self.files[d] if f not in self.read[d]] for d in moved}
            before = {d: self.iceberg_rows.get(d, 0) for d in moved}
            synced = first_native_syncs(self.conn, self.dsn, self.catalog, self.lake_settings, name, moved, logger=log)
        except LakehouseError as exc:
            return str(exc)
        for f in synced:
            d = f.dataset_id
            assert f.path != "pg", f"the first sync of {name} after its write flip took the pg path: {f.detail}"
            if f.path is None or not f.rows and name != "sync.full":  # nothing written (failed, or nothing new)
                assert self._iceberg_count(d)[0] == before[d], f"a first native sync of {d} that wrote nothing did"
                continue
            rows = len(self.files[d]) if name == "sync.full" else len(new[d])
            assert f.rows == rows, f"the first native sync of {name} wrote {f.rows} row(s), the source had {rows}"
            self.read[d] = set(self.files[d])
            self.iceberg_rows[d] = rows if name == "sync.full" else before[d] + rows
            assert self._iceberg_count(d)[0] == self.iceberg_rows[d], (d, self._iceberg_count(d), self.iceberg_rows)
            self._saw(f"first native sync landed, canary {f.verdict}")
        self._follow_audit()  # a MISMATCH rolled the writer back: a legal move
        for f in synced:
            self._reverse_check(f.dataset_id)
        return stop_message(name, synced)

    def _reverse_check(self, d) -> None:
        """Native with its reverse on: the reverse mirror's apply brings ``dataset_rows`` to the table's rows
        exactly, or is refused with nothing written."""
        facts = self.o.state(d)
        if facts.state != S.NATIVE or not facts.reverse:
            return
        before = self._pg_count(d)
        try:
            r = apply_reverse(self.dsn, self.catalog, self.lake_settings, d, actor="model", lock_timeout_s=10)
        except LakehouseError as exc:
            assert self._pg_count(d) == before, f"a refused reverse apply wrote dataset_rows of {d}: {exc}"
            self._saw("reverse apply refused")
            return
        n, (got, snap) = self._pg_count(d), self._iceberg_count(d)
        if snap is None:  # no table yet (made native past the gates before any write): nothing to apply
            assert n == before, f"the reverse of {d} without a table changed dataset_rows: {before} → {n}"
            self._saw("reverse: no table yet, nothing applied")
            return
        # applied, or already at the table's snapshot — a raw app write since the last apply is refused (rows_version,
        # O(1)) before any "nothing to apply": either way Postgres holds the table's rows
        assert n == got, f"the reverse ({r.how}) left {n} row(s) of {d} in dataset_rows, its table holds {got}"
        if r.how == "noop":
            assert n == before, f"a reverse apply with nothing to apply changed dataset_rows of {d}: {before} → {n}"
            self._saw("reverse: nothing to apply")
            return
        self.o.pg_rows[d] = n
        self._saw("reverse applied: Postgres holds the table's rows")

    @rule(i=st.integers(0, 2))
    def reverse_tick(self, i):
        """The reverse mirror's tick for one dataset (mirror_poller / the stream): judged by ``_reverse_check``."""
        self._reverse_check(self.ids[i])
