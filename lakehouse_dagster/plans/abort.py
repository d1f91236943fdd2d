"""Abort: every flag key the plan changed goes back to its value before the plan (an override set again, or cleared
when there was none), through the gated set/clear of the operator surfaces, audited ``rollout <id> aborted:
<reason>``. Widest first (global, workspaces, then datasets), so no moment lets a narrower key widen anything.

A key someone rolled back since the plan set it (auto-rollback's ``off`` on a MISMATCH, an operator's ``pg``) — now
below the mode the plan set it to, and no higher than before the plan — is left as it is: an abort never raises a
dataset back over a rollback.

Idempotent: a key already at its value before the plan is left alone and marked, so an abort interrupted halfway
(a killed daemon) finishes on the next tick without writing twice. A key the gates refuse to restore (a reader
of a dataset written iceberg-native may not go back to Postgres) is reported, loudly, and left as it is.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg

from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.core.settings import ProjectSettings
from lakehouse_dagster.flags.gates import clear_flag, set_flag
from lakehouse_dagster.flags.overrides import DATASET, WORKSPACE
from lakehouse_dagster.flags.registry import WRITE, rank
from lakehouse_dagster.flags.stored import stored_overrides
from lakehouse_dagster.mirror.reverse_lag import reverse_lags
from lakehouse_dagster.plans import store
from lakehouse_dagster.plans.store import ABORTED, ERROR, PlanRow

_WIDEST_FIRST = {"global": 0, WORKSPACE: 1, DATASET: 2}


@dataclasses.dataclass
class Restored:
    restored: list[str] = dataclasses.field(default_factory=list)  # "<scope>: <after> → <before>"
    unchanged: list[str] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)
    rolled_back: int = 0  # of ``unchanged``: keys rolled back since the plan set them, left as they are

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


ROLLED_BACK = "rolled back since the plan set it"


def _rolled_back(kind: str, now_mode: str | None, plan_set: str | None, before: str | None) -> bool:
    """The key is below the mode the plan set it to and no higher than before the plan: someone rolled it back."""
    if now_mode is None or plan_set is None:
        return False
    return rank(kind, now_mode) < rank(kind, plan_set) and (
        before is None or rank(kind, now_mode) <= rank(kind, before)
    )


def note_for(plan_id: uuid.UUID, reason: str | None) -> str:
    return f"rollout {plan_id} aborted: {reason or 'no reason given'}"[:1000]


def _where(scope: str, scope_id) -> str:
    return "global" if scope_id is None else f"{scope} {scope_id}"


def restore(conn: psycopg.Connection, project: ProjectSettings, p: PlanRow) -> Restored:
    """Restore the plan's keys and mark it aborted (inside the caller's transaction on the plan's row)."""
    touched = {  # key → the mode the plan set it to (its last flip of that key)
        (s.config.get("scope"), s.config.get("scope_id") or None): s.config.get("mode")
        for s in store.steps(conn, p.id, kind="flip", with_moved=False)
        if s.detail is None or not s.detail.startswith("skipped")
    }
    keys = [k for k in store.flag_keys(conn, p.id) if k["restored_at"] is None]
    keys.sort(key=lambda k: _WIDEST_FIRST.get(k["scope"], 3))
    current = stored_overrides(conn, p.kind, [p.name])[p.name]
    note = note_for(p.id, p.reason)
    actor = f"{project.actor} (rollout {p.short})"
    out = Restored()
    for k in keys:
        where = _where(k["scope"], k["scope_id"])
        key = (k["scope"], str(k["scope_id"]) if k["scope_id"] else None)
        now_mode = current.get((k["scope"], k["scope_id"]))
        before = k["before_mode"]
        if key not in touched or now_mode == before or _rolled_back(p.kind, now_mode, touched.get(key), before):
            detail = "not changed by the plan" if key not in touched else f"already {before or '(no override)'}"
            if key in touched and now_mode != before:
                detail = f"{now_mode}, {ROLLED_BACK}: left as it is"
                out.rolled_back += 1
            out.unchanged.append(f"{where}: {detail}")
            _mark(conn, p.id, k, detail)
            continue
        scope_kw = {"dataset": k["scope_id"]} if k["scope"] == DATASET else {}
        if k["scope"] == WORKSPACE:
            scope_kw = {"workspace": k["scope_id"]}
        try:
            if before is None:
                clear_flag(conn, p.kind, p.name, note=note, actor=actor, **scope_kw)
            else:
                set_flag(conn, p.kind, p.name, before, note=note, actor=actor, **scope_kw)
        except FlipRefused as exc:
            text = " ".join(str(exc).split())
            out.refused.append(f"{where}: stays {now_mode}: {text}")
            _mark(conn, p.id, k, f"REFUSED: {text}"[:2000])
            continue
        change = f"{now_mode or '(no override)'} → {before or '(no override)'}"
        out.restored.append(f"{where}: {change}")
        _mark(conn, p.id, k, f"restored: {change}")
    reason = f"{p.reason or 'no reason given'}; {len(out.restored)} flag key(s) restored to their value before the plan"
    if out.rolled_back:
        reason += f"; {out.rolled_back} rolled back since the plan set it, left as it is"
    if out.refused:
        reason += f"; {len(out.refused)} REFUSED by a gate and left as they are: " + "; ".join(out.refused[:5])
    summary: dict = out.as_dict()
    if p.kind == WRITE and (out.restored or out.rolled_back):
        summary["next"] = _after_writer_abort(conn, p)
    store.update(conn, p.id, state=ABORTED, blocking=None, ended_at=store.db_now(conn))
    store.event(
        conn, p.id, store.ABORTED_EVENT, stage=p.stage, severity=ERROR, reason=reason, actor=actor, detail=summary
    )
    return out


def _after_writer_abort(conn: psycopg.Connection, p: PlanRow) -> str:
    """What the abort of a writer plan leaves to do: nothing where the reverse mirror kept Postgres up to the last
    native commit (mirror/reverse_lag.py), a backfill where it was off or behind (Postgres only: one query)."""
    moved = {d for s in store.steps(conn, p.id, kind="flip") for d in s.moved}
    lags, _off = reverse_lags(conn, moved)
    kept = {d for d, lag in lags.items() if lag.caught_up}
    left = sorted(moved - kept)
    if not left:
        return (
            f"nothing: the reverse mirror kept Postgres up to the last native commit of every dataset the plan moved "
            f"({len(moved)}), so no row exists only in Iceberg and the forward mirror resumes at once"
        )
    shown = ", ".join(str(d) for d in left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    return (
        f"{len(left)} of {len(moved)} dataset(s) had the reverse mirror off or behind, so rows written iceberg-native "
        f"may exist only in Iceberg: lakehouse backfill --dataset <id> for {shown} (its rollback report "
        "says which rows), before Postgres serves them again"
    )


def _mark(conn: psycopg.Connection, plan_id: uuid.UUID, k: dict, detail: str) -> None:
    store.mark_flag_restored(conn, plan_id, k, detail)
