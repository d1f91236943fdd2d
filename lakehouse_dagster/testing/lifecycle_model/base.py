"""The model's machine: verbs at dataset / workspace / global scope past the gates, writes on the pg path,
complete, restores, first snapshots and MISMATCH verdicts, with the invariants checked after every step."""

from __future__ import annotations

import dataclasses
import uuid

import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from psycopg import sql

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.lifecycle_facts import derive, lifecycle_of
from lakehouse_dagster.flags.overrides import clear_override, set_override
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lifecycle import COMPLETE_VERB, WriteRefused, illegal, transition
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.parity.canary import MISMATCH, Verdict
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.runbooks.auto_rollback import FIRST_NATIVE_SYNC, REFUSED, ROLLED_BACK, record_and_roll_back
from lakehouse_dagster.sources.pg_rows import rows_transaction
from lakehouse_dagster.testing.lifecycle_model.crashes import CrashMoves
from lakehouse_dagster.testing.lifecycle_model.oracle import READER, READERS, SCHEMA, WRITERS, Oracle
from lakehouse_dagster.testing.lifecycle_model.plans import PLAN_TABLES, PlanMoves
from lakehouse_dagster.testing.lifecycle_model.steps import initialize, invariant, rule
from lakehouse_dagster.tracking import datasets


class Lifecycle(PlanMoves, CrashMoves, RuleBasedStateMachine):
    dsn: str = ""
    seen: dict = {}  # what happened, over every sequence of a run: {"plan flip": n, ...} (the bench prints it)

    def _saw(self, what: str) -> None:
        Lifecycle.seen[what] = Lifecycle.seen.get(what, 0) + 1

    @initialize()
    def start(self):
        self.conn = connect(self.dsn)
        with self.conn.transaction():
            for table in (
                *PLAN_TABLES,
                "lakehouse_flag_overrides",
                "lakehouse_reverse_settings",
                "lakehouse_completed",
                "lakehouse_lifecycle",
                "lakehouse_reverse_position",
                "iceberg_sync_log",
                "lakehouse_read_parity",
                "dataset_rows",
                "datasets",
                "workspaces",
            ):
                self.conn.execute(sql.SQL("delete from {}").format(sql.Identifier(table)))  # a fresh world
        ws = [datasets.create_workspace(self.conn, f"w{i}") for i in range(2)]
        ids = [datasets.create_dataset(self.conn, ws[i % 2], f"d{i}", SCHEMA) for i in range(3)]
        self.ids, self.ws = ids, ws
        self.o = Oracle({d: ws[i % 2] for i, d in enumerate(ids)})
        for d in ids:  # a row each: a plan's analysis passes only on evidence (an ok over rows)
            self.conn.execute(
                "insert into dataset_rows (dataset_id, row_index, data) values (%s, 9000000, '{\"a\": -1}')", (d,)
            )
        self.o.pg_rows = {d: 1 for d in ids}
        self.o.iceberg_only = {d: 0 for d in ids}
        self.next_index = {d: 0 for d in ids}
        self._plans_start()
        self._world_start()

    def _world_start(self) -> None:
        """What a variant of the model adds to the fresh world (iceberg.py: tables, sources)."""

    def teardown(self):
        if getattr(self, "conn", None) is not None:
            self.conn.close()

    # -- how a verb's outcome is judged ------------------------------------------------------------------------
    def _verb(self, verb: str, apply_oracle, run) -> None:
        """Run a verb; the oracle predicts, per dataset, whether its move is allowed; the verb must succeed iff all
        are, and a refusal must leave every fact as it was."""
        before = {d: self.o.state(d) for d in self.ids}
        snapshot = dataclasses.replace(
            self.o,
            overrides=dict(self.o.overrides),
            reverse=dict(self.o.reverse),
            marks=dict(self.o.marks),
            mirrored=set(self.o.mirrored),
            pg_rows=dict(self.o.pg_rows),
            iceberg_only=dict(self.o.iceberg_only),
        )
        apply_oracle()
        after = {d: self.o.state(d) for d in self.ids}
        fine = all(
            self.o.may_move(before[d], after[d], verb) and not illegal(after[d])
            for d in self.ids
            if not before[d].same_place(after[d]) or illegal(after[d])
        )
        try:
            run()
        except FlipRefused as exc:
            self.o = snapshot
            assert not fine, f"refused a legal {verb}: {exc}"
            assert "the way on: " in str(exc) or "backfill" in str(exc), str(exc)
            assert "lakehouse " in str(exc), str(exc)
            return
        assert fine, f"{verb} was allowed: {before} → {after}"

    # -- verbs -------------------------------------------------------------------------------------------------
    def _scope(self, which: int):
        if which == 0:
            return {"dataset": self.ids[0]}, ("dataset", self.ids[0])
        if which in (1, 2):
            return {"dataset": self.ids[which]}, ("dataset", self.ids[which])
        if which == 3:
            return {"workspace": self.ws[0]}, ("workspace", self.ws[0])
        return {}, ("global", None)

    def _flag(self, kind: str, name: str, mode: str | None, where: int) -> None:
        """A set (``mode``) or clear (None) of one flag at the scope ``where`` picks, past the gates."""
        kw, key = self._scope(where)
        full = (kind, name, *key)

        def oracle():
            if mode is None:
                self.o.overrides.pop(full, None)
            else:
                self.o.overrides[full] = mode

        def run():
            if mode is None:
                clear_override(self.conn, kind, name, actor="model", **kw)
            else:
                set_override(self.conn, kind, name, mode, actor="model", **kw)

        self._verb(S.WRITER_FLAG if kind == "write" else S.READER_FLAG, oracle, run)

    @rule(
        writer=st.sampled_from(WRITERS), mode=st.sampled_from(["pg", "iceberg_native", None]), where=st.integers(0, 4)
    )
    def writer_flag(self, writer, mode, where):
        self._flag("write", writer, mode, where)

    @rule(mode=st.sampled_from(["iceberg", "off", None]), where=st.integers(0, 4))
    def reader_flag(self, mode, where):
        self._flag("read", READER, mode, where)

    @rule(mode=st.sampled_from(["iceberg", None]), where=st.integers(0, 4))
    def every_reader_flag(self, mode, where):
        """Every reader Iceberg can serve set (or cleared) at one scope, one verb each: what the write-flip gates
        want before a writer moves (prerequisite #1), so writer plans find candidates."""
        for name in READERS:
            self._flag("read", name, mode, where)

    @rule(on=st.sampled_from([True, False, None]), where=st.integers(0, 4))
    def reverse(self, on, where):
        kw, key = self._scope(where)

        def oracle():
            if on is None:
                self.o.reverse.pop(key, None)
            else:
                self.o.reverse[key] = on

        self._verb(S.REVERSE, oracle, lambda: set_reverse(self.conn, on, note=None, actor="model", **kw))

    @rule(i=st.integers(0, 2))
    def first_snapshot(self, i):
        """The forward mirror's first snapshot, or its catch-up once mirrored (an event, not a verb): recorded when
        a reader of the state looks; caught up, a dataset may be a writer plan's candidate."""
        d = self.ids[i]
        if self.o.state(d).authority != S.POSTGRES:
            return
        self.conn.execute(  # the snapshot and the rows_version it covers: a reader on iceberg is served from it
            "insert into iceberg_sync_log"
            " (dataset_id, sync_id, status, has_identity, finished_at, snapshot_id, source_version)"
            " select %s, %s, 'succeeded', true, now(), 1, rows_version from datasets where id = %s",
            (d, uuid.uuid4(), d),
        )
        self.o.mirrored.add(d)

    @rule(i=st.integers(0, 2))
    def complete_start(self, i):
        """complete's start (its checks are complete.py's business, tested there): the transition and its effects."""
        d = self.ids[i]
        found = cp.Checked(d, f"d{i}", (), None, 0, None)

        def oracle():
            self.o.marks[d] = "in_progress"
            self.o.reverse[("dataset", d)] = False

        def run():
            what = f"lakehouse complete --dataset {d}"
            with transition(self.conn, COMPLETE_VERB, dataset_ids=[d], derive=derive, actor="model", what=what):
                cp._start(self.conn, d, found, None, "model", None)

        self._verb(COMPLETE_VERB, oracle, run)

    @rule(i=st.integers(0, 2))
    def complete_finish(self, i):
        d = self.ids[i]
        if self.o.marks.get(d) != "in_progress":
            return
        cp._delete_batches(self.conn, d, 1000, 100, "model")
        self.o.marks[d] = "complete"
        self.o.iceberg_only[d] += self.o.pg_rows[d]
        self.o.pg_rows[d] = 0

    @rule(i=st.integers(0, 2))
    def restore(self, i):
        """A restore: start (complete → restoring), the full re-sync (here: the retired rows put back as the reverse
        would), finish (restoring → native)."""
        d = self.ids[i]
        if self.o.marks.get(d) not in ("in_progress", "complete"):
            return

        def oracle():
            self.o.marks[d] = "restoring"
            self.o.reverse[("dataset", d)] = True

        self._verb(S.RESTORE, oracle, lambda: cp.start_restore(self.conn, d, "model"))
        if self.o.marks.get(d) != "restoring":
            return
        back = self.o.iceberg_only[d]
        if back:
            self.conn.execute(
                "insert into dataset_rows (dataset_id, row_index, data)"
                " select %s, 1000000 + g, jsonb_build_object('a', g) from generate_series(1, %s) g",
                (d, back),
            )
        self.o.pg_rows[d] += back
        self.o.iceberg_only[d] = 0

        def finish():
            self.o.marks[d] = "restored"

        self._verb(S.RESTORE, finish, lambda: cp.finish_restore(self.conn, d, "model", back, None))

    @rule(i=st.integers(0, 2), writer=st.sampled_from(WRITERS))
    def pg_write(self, i, writer):
        """A source writer's pg path: its rows and the authority check in one transaction."""
        d = self.ids[i]
        lifecycle_of(self.conn, [d])
        truth = self.o.state(d).authority
        start = self.next_index[d]
        try:
            with rows_transaction(
                self.dsn, self.conn, d, datasets.get_dataset(self.conn, d).columns, replace=False
            ) as tx:
                tx.check_authority(writer)
                tx.copy([pa.record_batch([pa.array([start], pa.int64())], names=["a"])], start_index=start)
        except WriteRefused as exc:
            assert truth == S.ICEBERG, f"a pg write refused while Postgres is the truth: {exc}"
            assert "nothing was written" in str(exc) and "lakehouse write-flags" in str(exc)
            return
        assert truth == S.POSTGRES, "a pg write landed while Iceberg is the truth"
        self.next_index[d] += 1
        self.o.pg_rows[d] += 1

    @rule(i=st.integers(0, 2), writer=st.sampled_from([None, *WRITERS]))
    def mismatch_rolled_back(self, i, writer):
        """A MISMATCH recorded for the dataset — a canary's, or (``writer``) its first native sync's — and what
        runbooks/auto_rollback.py rolls back for it, through the flip gates and the lifecycle like an operator's
        verb. A rollback it claims must be a legal move (never a writer back to pg where Iceberg alone holds rows);
        one it cannot make is refused loudly with the reason, and nothing is claimed that was not written."""
        d = self.ids[i]
        v = Verdict(d, f"d{i}", MISMATCH, detail={"writer": writer} if writer else {})
        before = {x: self.o.state(x) for x in self.ids}
        record_and_roll_back(self.conn, v, source=FIRST_NATIVE_SYNC if writer else "canary", settings=self.settings)
        if self._live():
            self.plan_evidence.add(d)  # evidence against the live plan (plans.py: it may not widen past it)
        out = v.detail["auto_rollback"]
        assert out["error"] is None, out
        for action in out["actions"]:
            if action["status"] == REFUSED:
                assert action["detail"] and "AUTO-ROLLBACK REFUSED" in " ".join(out["lines"]), out
                continue
            if action["status"] != ROLLED_BACK:
                continue
            kind = action["kind"]  # read | write
            self.o.overrides[(kind, action["flag"], "dataset", d)] = action["after"]
            after = self.o.state(d)
            verb = S.WRITER_FLAG if kind == "write" else S.READER_FLAG
            legal = before[d].same_place(after) or self.o.may_move(before[d], after, verb)
            assert legal and not illegal(after), f"auto-rollback moved {d}: {before[d]} → {after} ({action})"
            before[d] = after

    # -- what must hold after every step --------------------------------------------------------------------------
    @invariant()
    def the_stored_state_is_the_true_one_and_legal(self):
        if not getattr(self, "ids", None):
            return
        stored = lifecycle_of(self.conn, self.ids, actor="model")
        for d in self.ids:
            assert stored[d] == self.o.state(d), (d, stored[d], self.o.state(d))
            assert illegal(stored[d]) is None

    @invariant()
    def no_row_is_lost_or_doubled(self):
        if not getattr(self, "ids", None):
            return
        counts: dict[uuid.UUID, int] = dict(
            self.conn.execute(
                "select dataset_id, count(*) from dataset_rows where dataset_id = any(%s::uuid[]) group by 1",
                (self.ids,),
            ).fetchall()
        )
        for d in self.ids:
            assert counts.get(d, 0) == self.o.pg_rows[d], (d, counts.get(d, 0), self.o.pg_rows[d])
