"""Rollout plans as moves of the model (issue 42, item 6): a reader plan of the model's reader started, advanced by
the real controller (plans/controller.py ``advance``) with the model playing the Dagster glue — each flip it asks
for set through the lifecycle (past the flip gates, as every flag verb of the model), each analysis recorded as the
canary would (ok, or a MISMATCH drawn) — interrupted at its fault point (``rollout-after-step``), and aborted.

The oracle: every flag change a plan makes (its flips, its abort's restores, auto-rollback's pins) is a legal
lifecycle move; no plan widens past evidence against it — once a MISMATCH was recorded since it started on a
dataset its stages so far (or the one starting) cover, or one of its flips was refused, it never sets a flag again,
only restores; an abort leaves every key it set at its value before the plan, unless rolled back since or refused
by a gate (and then named)."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import strategies as st

from lakehouse_dagster.core.errors import FlipRefused, LakehouseError
from lakehouse_dagster.core.failpoints import FailpointError
from lakehouse_dagster.flags.overrides import set_override
from lakehouse_dagster.flags.soak_setting import set_soak
from lakehouse_dagster.lifecycle import illegal
from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.parity.canary import MISMATCH, OK, Verdict
from lakehouse_dagster.plans import actions, controller, store
from lakehouse_dagster.runbooks.auto_rollback import record_and_roll_back
from lakehouse_dagster.testing.lifecycle_model.crashes import armed
from lakehouse_dagster.testing.lifecycle_model.oracle import READER, WRITERS, ModelParts
from lakehouse_dagster.testing.lifecycle_model.steps import rule

PLAN_TABLES = (
    "lakehouse_rollout_events",
    "lakehouse_rollout_flags",
    "lakehouse_rollout_steps",
    "lakehouse_rollout_stages",
    "lakehouse_rollout_plans",
)
LIVE = (store.ACTIVE, store.ABORTING, "paused")


class PlanMoves(ModelParts):
    """Mixed into the model's machine (base.py): needs ``conn``, ``ids``, ``ws``, ``o``, ``settings`` and ``_saw``."""

    settings: Any = None  # set by run()
    plan: Any = None  # the live plan's id

    def _plans_start(self) -> None:
        set_soak(self.conn, 0, note="the model: no waiting between stages", actor="model")
        self.plan = None
        self.plan_runs: dict[str, controller.RunState] = {}
        self.plan_scopes: set = set()  # the datasets its flips so far cover
        self.plan_evidence: set = set()  # the datasets with a MISMATCH recorded since it started
        self.plan_refused = False  # one of its flips was refused
        self._audit_mark()

    # -- the flag audit: what the verbs of a plan changed, applied to the oracle one legal move at a time ----------
    def _audit_max(self) -> int:
        return self.conn.execute("select coalesce(max(id), 0) from lakehouse_flag_audit").fetchone()[0]

    def _audit_mark(self) -> None:
        """From here on, what the audits (flags, reverse) record is what a verb of the project did, not the model."""
        self.audit_seen = self._audit_max()
        self.reverse_seen = self.conn.execute("select coalesce(max(id), 0) from lakehouse_reverse_audit").fetchone()[0]

    def _follow_reverse_audit(self) -> None:
        """Every audited reverse setting since ``reverse_seen`` (a writer plan arms the reverse before its flips),
        applied to the oracle; each a legal move."""
        rows = self.conn.execute(
            "select id, action, scope, scope_id, after_enabled, note from lakehouse_reverse_audit where id > %s"
            " order by id",
            (self.reverse_seen,),
        ).fetchall()
        for rid, action, scope, sid, after, note in rows:
            self.reverse_seen = rid
            before = {d: self.o.state(d) for d in self.ids}
            key = (scope, sid if scope != "global" else None)
            if action == "clear":
                self.o.reverse.pop(key, None)
            else:
                self.o.reverse[key] = after
            for d in self.ids:
                moved = not before[d].same_place(self.o.state(d))
                assert not moved or self.o.may_move(before[d], self.o.state(d), S.REVERSE), f"{note}: {d}"
            if note and "reverse armed" in note:
                self._saw("plan armed the reverse")

    def _covered(self, scope: str, sid) -> set:
        if scope == "dataset":
            return {sid}
        if scope == "workspace":
            return {d for d in self.ids if self.o.ws_of[d] == sid}
        return set(self.ids)

    def _follow_audit(self) -> None:
        """Every audited flag change since ``audit_seen`` (set when a plan move begins: what the model's own verbs
        did before is in the oracle already): each a legal move of the oracle's state; a plan's set never
        after evidence against it on what it covers."""
        rows = self.conn.execute(
            "select id, action, kind, name, scope, scope_id, after_mode, note from lakehouse_flag_audit"
            " where id > %s order by id",
            (self.audit_seen,),
        ).fetchall()
        self._follow_reverse_audit()  # armed before the flips of the same tick
        for aid, action, kind, name, scope, sid, after_mode, note in rows:
            self.audit_seen = aid
            if kind not in ("read", "write"):
                continue
            key = (kind, name, scope, sid if scope != "global" else None)
            before = {d: self.o.state(d) for d in self.ids}
            if action == "clear":
                self.o.overrides.pop(key, None)
            else:
                self.o.overrides[key] = after_mode
            verb = S.WRITER_FLAG if kind == "write" else S.READER_FLAG
            for d in self.ids:
                after = self.o.state(d)
                moved = not before[d].same_place(after)
                assert not moved or self.o.may_move(before[d], after, verb), f"{note}: {d} {before[d]} → {after}"
                assert illegal(after) is None, f"{note}: {d} {after}"
            if self.plan is not None and note and note.startswith(f"rollout {self.plan}") and "aborted" not in note:
                covers = self.plan_scopes | self._covered(scope, key[3])
                assert not self.plan_refused, f"plan {self.plan} set a flag after one of its flips was refused: {note}"
                bad = self.plan_evidence & covers
                assert not bad, f"plan {self.plan} widened to {scope} past a MISMATCH on {bad}: {note}"
                self.plan_scopes = covers
                self._saw("plan flip" if kind == "read" else "writer plan flip")

    # -- moves ------------------------------------------------------------------------------------------------------
    @rule(writer=st.sampled_from([None, None, *WRITERS]), prepare=st.booleans())
    def plan_start(self, writer, prepare):
        """A reader plan (``writer`` None) or a writer plan (to iceberg_native, the reverse armed before each flip):
        one dataset of workspace 0, workspace 0, then global; every dataset canaried ok first. ``prepare``: a writer
        plan's operator first readies every dataset the runbook's way (mirrored, caught up, every reader on Iceberg),
        or the plan has no candidate but by chance."""
        if self.plan is not None:
            return
        if writer is not None and prepare:
            for i in range(len(self.ids)):
                self._prepare_for_writer(i)
        for i, d in enumerate(self.ids):
            n, version = self.conn.execute(
                "select (select count(*) from dataset_rows where dataset_id = %s), rows_version from datasets"
                " where id = %s",
                (d, d),
            ).fetchone()
            record_and_roll_back(
                self.conn,
                Verdict(d, f"d{i}", OK, pg_count=n, iceberg_count=n, pg_version=version),
                settings=self.settings,
            )
        now = "    analysis: {retry_every: 0s}\n"  # an inconclusive analysis asks again at the next tick
        head = f"reader: {READER}" if writer is None else f"writer: {writer}\nmode: iceberg_native"
        text = f"{head}\nstages:\n  - datasets: 1\n{now}"
        if writer in (None, "sync.full"):  # the writers widen in order (sync.full first): the others stay narrow
            text += f"  - workspace: {self.ws[0]}\n{now}  - global: true\n{now}"
        try:
            plan_id, _ = actions.start(self.conn, self.settings, text, actor="model")
        except LakehouseError as exc:
            assert "nothing" in str(exc) or "lakehouse " in str(exc) or "order" in str(exc), str(exc)
            self._saw("plan start refused")
            return
        self.plan, self.plan_runs, self.plan_scopes = plan_id, {}, set()
        self.plan_evidence, self.plan_refused = set(), False
        self._saw("plan started" if writer is None else "writer plan started")

    def _prepare_for_writer(self, i: int) -> None:
        """The moves that make dataset ``i`` a write flip's candidate (the model with Iceberg: ready.py's, for real)."""
        self.first_snapshot(i)
        self.every_reader_flag("iceberg", i)

    def _live(self) -> bool:
        return getattr(self, "plan", None) is not None

    def _run_ask(self, ask: controller.RunAsk, mismatch_on: int | None) -> None:
        """What the Dagster glue would launch for ``ask``, run here at once; the outcome goes to the lookup."""
        p = ask.params
        run_id = f"model-{uuid.uuid4()}"
        if ask.job == controller.ANALYSIS:
            for j, raw in enumerate(p["dataset_ids"]):
                d = uuid.UUID(str(raw))
                n = self.conn.execute("select count(*) from dataset_rows where dataset_id = %s", (d,)).fetchone()[0]
                bad = mismatch_on is not None and j == mismatch_on % len(p["dataset_ids"])
                v = Verdict(d, str(d), MISMATCH if bad else OK, pg_count=n, iceberg_count=n + bad)
                record_and_roll_back(self.conn, v, source="rollout-analysis", run_id=run_id, settings=self.settings)
                if bad:
                    self.plan_evidence.add(d)
                    self._saw("plan analysis MISMATCH")
            self.plan_runs[ask.step_key] = controller.RunState(run_id, controller.SUCCEEDED)
            return
        failed = self._flip_run(p)
        if failed is not None:
            self.plan_runs[ask.step_key] = controller.RunState(run_id, controller.FAILED, failed)
            self.plan_refused = True
            self._saw(f"plan {p['kind']} flip run failed")
            return
        self.plan_runs[ask.step_key] = controller.RunState(run_id, controller.SUCCEEDED)

    def _flip_run(self, p: dict) -> str | None:
        """A flip run the controller asked for (its params ``p``): here the flag set through the lifecycle, past the
        gates (the model with Iceberg runs the write_flip job's steps instead: ready.py). None, or why it failed."""
        scope = {"dataset": p["scope_id"]} if p["scope"] == "dataset" else {}
        if p["scope"] == "workspace":
            scope = {"workspace": p["scope_id"]}
        try:
            set_override(self.conn, p["kind"], p["name"], p["mode"], note=p["note"], actor="model (plan)", **scope)
        except FlipRefused as exc:
            return str(exc)
        return None

    @rule(
        ticks=st.sampled_from([1, 2, 3, 4, 0]), mismatch_on=st.sampled_from([0, 1, 2, None, None]), crash=st.booleans()
    )
    def plan_advance(self, ticks, mismatch_on, crash):
        """``ticks`` controller steps (0: an operator's abort instead) of the live plan, each with the runs it asks for. ``mismatch_on``: the
        analyses record a MISMATCH on that one of their datasets. ``crash``: the first tick is interrupted at
        ``rollout-after-step`` (its step rows committed, the runs not yet asked for): the next must ask again,
        under the same run keys. No plan live: nothing (no precondition: the draws never depend on the world's
        state, so a failing sequence replays — steps.py)."""
        if not self._live():
            return
        if ticks == 0:
            self._plan_abort()
            return
        self._audit_mark()  # what the model's own verbs did is in the oracle already
        for tick in range(ticks):
            try:
                with armed("rollout-after-step" if crash and tick == 0 else None):
                    asks, _ = controller.advance(self.conn, self.settings, self.plan, lambda _: dict(self.plan_runs))
            except FailpointError:
                self._saw("plan step interrupted")
                asks = []
            for ask in asks:
                if ask.step_key not in self.plan_runs:  # Dagster launches a run key once
                    self._run_ask(ask, mismatch_on)
            self._follow_audit()
            self._plan_settled()
            if self.plan is None:
                return

    def _plan_abort(self) -> None:
        """An operator's abort, then ticks until it is over: every key the plan set back at its value before."""
        self._audit_mark()
        try:
            actions.abort(self.conn, self.settings.project, self.plan, actor="model", reason="the model")
        except LakehouseError as exc:  # over already (finished or aborted by the controller)
            assert "nothing to abort" in str(exc), str(exc)
        for _ in range(4):
            if store.get(self.conn, self.plan).state != store.ABORTING:
                break
            for ask in controller.advance(self.conn, self.settings, self.plan, lambda _: dict(self.plan_runs))[0]:
                self.plan_runs.setdefault(ask.step_key, controller.RunState("model", controller.SUCCEEDED))
        self._follow_audit()
        self._saw("plan aborted")
        self._plan_settled()

    def _plan_settled(self) -> None:
        """Once the plan is over: aborted, every key it set is at its value before (or named as left)."""
        p = store.get(self.conn, self.plan)
        if p.state in LIVE:
            return
        if p.state == "aborted":
            current = {
                (k, n, s, i): m
                for k, n, s, i, m in self.conn.execute(
                    "select kind, name, scope, scope_id, mode from lakehouse_flag_overrides"
                ).fetchall()
            }
            for k in store.flag_keys(self.conn, self.plan):
                now = current.get((k["kind"], k["name"], k["scope"], k["scope_id"]))
                detail = k["restore_detail"] or ""
                # left as it is, and said why: rolled back since the plan set it, refused by a gate, never flipped
                left = "rolled back since" in detail or detail.startswith(("REFUSED", "not changed by the plan"))
                assert now == k["before_mode"] or left, (k, now)
            self._saw("plan aborted, flags restored")
        else:
            assert not (self.plan_evidence & self.plan_scopes), f"plan {self.plan} {p.state} past a MISMATCH"
            self._saw(f"plan {p.state}")
        self.plan = None
