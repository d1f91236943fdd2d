"""The lifecycle as a model (issue 42): random sequences of verbs at dataset / workspace / global scope — writer and
reader flags set and cleared past the gates (the lifecycle must hold without them), the reverse on / off / cleared,
complete started and finished, restores, the forward mirror's first snapshot — interleaved with writes on the pg
path, against a real Postgres. An oracle of our own keeps what the facts are, where every row written must be, and
which moves may happen; after every step it checks: the stored state is the true one, no state outside the table
exists, no accepted row is lost or doubled, a write into the store that is not the truth is refused with nothing
written, and every refusal names a legal way on.

Shared by test_lifecycle_model.py (a few dozen sequences in CI) and bench/bench_lifecycle_model.py (thousands).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import uuid
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from psycopg import sql

from lakehouse_dagster.core.db import connect, fetch_value
from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.lifecycle_facts import derive, lifecycle_of
from lakehouse_dagster.flags.overrides import clear_override, set_override
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.flags.resolver import resolve_from
from lakehouse_dagster.flags.reverse_setting import set_reverse
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.lake.foreign import foreign_since_project
from lakehouse_dagster.lifecycle import COMPLETE_VERB, WriteRefused, illegal, transition
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.mirror.reverse import PostgresWritten, ReversePosition, _refuse_postgres_written
from lakehouse_dagster.mirror.sync import sync_dataset
from lakehouse_dagster.parity.canary import MISMATCH, Verdict
from lakehouse_dagster.routing.write_router import WriteDecision, _write_native, native_write
from lakehouse_dagster.runbooks import complete as cp
from lakehouse_dagster.runbooks.auto_rollback import FIRST_NATIVE_SYNC, REFUSED, ROLLED_BACK, record_and_roll_back
from lakehouse_dagster.sources.pg_rows import rows_transaction
from lakehouse_dagster.tracking import datasets

SCHEMA = [{"name": "a", "type": "int64"}]
WRITERS = ("sync.full", "sync.append")
READER = "export.stream"


@dataclasses.dataclass
class Oracle:
    """What the facts are, in plain Python (not the project's precedence code), and where the rows must be."""

    ws_of: dict  # dataset → workspace
    overrides: dict = dataclasses.field(default_factory=dict)  # (kind, name, scope, id) → mode
    reverse: dict = dataclasses.field(default_factory=dict)  # (scope, id) → bool
    marks: dict = dataclasses.field(default_factory=dict)  # dataset → in_progress | complete | restoring | restored
    mirrored: set = dataclasses.field(default_factory=set)
    pg_rows: dict = dataclasses.field(default_factory=dict)  # dataset → rows dataset_rows must hold
    iceberg_only: dict = dataclasses.field(default_factory=dict)  # dataset → rows complete retired from Postgres

    def _pick(self, table: dict, key_of, d):
        for scope, sid in (("dataset", d), ("workspace", self.ws_of[d]), ("global", None)):
            if key_of(scope, sid) in table:
                return table[key_of(scope, sid)]
        return None

    def mode(self, kind: str, name: str, d) -> str:
        found = self._pick(self.overrides, lambda s, i: (kind, name, s, i), d)
        return found or ("pg" if kind == "write" else "off")

    def state(self, d) -> S.Facts:
        natives = tuple(sorted(w for w in WRITERS if self.mode("write", w, d) == "iceberg_native"))
        mark = self.marks.get(d)
        name = {"in_progress": S.COMPLETING, "complete": S.COMPLETE, "restoring": S.RESTORING}.get(mark or "")
        if name is None:
            if natives:
                name = S.NATIVE
            elif d in self.mirrored:
                name = S.READ_FLIPPED if self.mode("read", READER, d) in ("iceberg", "iceberg_only") else S.MIRRORED
            else:
                name = S.PG
        rev = self._pick(self.reverse, lambda s, i: (s, i), d)
        on = True if rev is None else rev
        return S.Facts(name, on if S.AUTHORITY[name] == S.ICEBERG else None, natives)

    def may_move(self, before: S.Facts, after: S.Facts, verb: str) -> bool:
        """The runbooks' rules, written out again on their own: where Iceberg alone holds rows nothing but a
        restore moves the dataset; complete only from native; the reverse stays off while Postgres lacks rows."""
        if before.same_place(after):
            return not (after.state != S.NATIVE and S.AUTHORITY[after.state] == S.ICEBERG and not after.native_writers)
        if before.state in (S.COMPLETING, S.COMPLETE, S.RESTORING):
            return verb in (COMPLETE_VERB, S.RESTORE) and after.state in (S.COMPLETE, S.RESTORING, S.NATIVE)
        if after.state in (S.COMPLETING, S.COMPLETE):
            return verb == COMPLETE_VERB and not after.reverse
        if verb == S.REVERSE:
            return before.state == after.state == S.NATIVE
        if verb == S.READER_FLAG:
            return {before.state, after.state} <= {S.MIRRORED, S.READ_FLIPPED}
        if verb == S.WRITER_FLAG:
            return S.NATIVE in (before.state, after.state) and S.AUTHORITY[before.state] != S.AUTHORITY[after.state]
        return False


class Lifecycle(RuleBasedStateMachine):
    dsn: str = ""

    @initialize()
    def start(self):
        self.conn = connect(self.dsn)
        with self.conn.transaction():
            for table in (
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
        self.o.pg_rows = {d: 0 for d in ids}
        self.o.iceberg_only = {d: 0 for d in ids}
        self.next_index = {d: 0 for d in ids}

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
        """The forward mirror's first snapshot (an event, not a verb): recorded when a reader of the state looks."""
        d = self.ids[i]
        if d in self.o.mirrored or self.o.state(d).authority != S.POSTGRES:
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
            what = f"write-flags complete --dataset {d}"
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
        record_and_roll_back(self.conn, v, source=FIRST_NATIVE_SYNC if writer else "canary")
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


class LifecycleWithIceberg(Lifecycle):
    """The model with the writes that reach Iceberg (issue 42: "writes from every writer path"): the native path
    for real — ``route_write``'s locked half (G3, G2, the lifecycle's write hold, the authority check) committing
    through lake/writer.py into a real table of ``catalog`` —, another engine's append to that table (a pyiceberg
    client that is not the project), and a raw app statement on ``dataset_rows`` that no check of ours sees (the
    live app's row.edit), which the reverse mirror must detect in O(1) by ``rows_version``. The Iceberg row count
    is checked against the oracle after every native write. Slower (a table per dataset): a separate, smaller run."""

    catalog: Any = None  # set by run()
    lake_settings: Any = None
    seen: dict = {}  # what happened, over every sequence of a run: {"native accepted": n, ...} (the bench prints it)

    def _saw(self, what: str) -> None:
        LifecycleWithIceberg.seen[what] = LifecycleWithIceberg.seen.get(what, 0) + 1

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
        self.__dict__.setdefault("iceberg_rows", {})[d] = self.o.pg_rows[d]
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
        try:
            _write_native(self.conn, decision, write, self.lake_settings, self.catalog, logging.getLogger("model"))
        except WriteRefused as exc:
            assert truth == S.POSTGRES, f"a native write refused while Iceberg is the truth: {exc}"
            assert "nothing was written" in str(exc), str(exc)
            assert self._iceberg_count(d) == (before_rows, before_snap), "a refused native write wrote Iceberg"
            self._saw("native refused")
            return
        assert truth == S.ICEBERG, "a native write landed while Postgres is the truth"
        self.next_index[d] += 1
        counts = self.__dict__.setdefault("iceberg_rows", {})  # per sequence: a fresh machine each time
        counts[d] = 1 if get_flag(WRITE, writer).iceberg_mode == "replace" else counts.get(d, 0) + 1
        self.o.mirrored.add(d)  # Iceberg holds a snapshot of it (a succeeded sync log row: what `derive` reads)
        assert self._iceberg_count(d)[0] == counts[d], (d, self._iceberg_count(d), counts[d])
        self._saw("native accepted")

    @rule(i=st.integers(0, 2))
    def foreign_append(self, i):
        """Another engine (a plain pyiceberg client, no project marks) appends a row to the dataset's table. Where
        Iceberg is the truth the row is the dataset's like a native one (the next native append keeps it); where
        Postgres is, the forward mirror must see a data change it did not make (lake/foreign.py) and refuse it."""
        tables = {}
        for x in self.ids:  # drawn among the datasets with a table: an engine appends to a table that exists
            found = load_table_or_none(self.catalog, table_identifier(self.lake_settings, x))
            if found is not None and found.current_snapshot() is not None:
                tables[x] = found
        if not tables:
            self._saw("foreign append skipped: no table yet")
            return
        d = list(tables)[i % len(tables)]
        table = tables[d]
        n = self.next_index[d]
        row = {"__row_index": n, "__row_id": str(uuid.uuid4()), "__created_at": dt.datetime.now(dt.UTC)}
        row["a"] = n
        table.append(pa.Table.from_pylist([row], schema=table.schema().as_arrow()))
        self.next_index[d] += 1
        counts = self.__dict__.setdefault("iceberg_rows", {})
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


def run(dsn: str, *, examples: int, steps: int, seed: int | None = None, catalog=None, lake_settings=None) -> None:
    """``examples`` random sequences of up to ``steps`` steps against ``dsn`` (raises on the first violation, with
    the shrunk sequence); ``seed`` None: derandomized (the same sequences every run, as CI wants). With
    ``catalog`` (and the ``lake_settings`` it was loaded with): the model with native writes into real tables."""
    machine: type[Lifecycle] = Lifecycle
    if catalog is not None:
        machine = LifecycleWithIceberg
        LifecycleWithIceberg.catalog, LifecycleWithIceberg.lake_settings = catalog, lake_settings
    machine.dsn = dsn
    case = machine.TestCase
    case.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=seed is None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    if seed is not None:
        from hypothesis import seed as with_seed  # lazy: only a seeded run (the bench) needs it

        with_seed(seed)(case.runTest)(case())
        return
    case().runTest()
