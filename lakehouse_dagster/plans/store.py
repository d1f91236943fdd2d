"""Plan state in Postgres (migration 0027): the plan, its stages, the runs it asked for, the value of every flag key
before the plan, and its events. Every transition of a plan happens in one transaction holding its row
(``lock``), so the controller, the CLI and the jobs never act on a plan at once.

Kept whole on purpose: the one owner of the five rollout tables, whose statements join them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.errors import UniqueViolation
from psycopg.types.json import Jsonb

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.plans.render import Rendered
from lakehouse_dagster.plans.spec import Analysis, Plan, Stage
from lakehouse_dagster.plans.window import parse_window
from lakehouse_dagster.status import recording

ACTIVE, PAUSED, ABORTING, ABORTED, FINISHED = "active", "paused", "aborting", "aborted", "finished"
LIVE = (ACTIVE, PAUSED, ABORTING)
WAITING, FLIPPING, SOAKING, ANALYZING = "waiting", "flipping", "soaking", "analyzing"
COMPLETING = "completing"  # a complete stage: its run retires the Postgres rows of the datasets the plan moved
# the steps whose runs change what Postgres or the flags hold: an abort waits until none of them is in flight
RUN_STEP_KINDS = ("flip", "complete")
INFO, WARNING, ERROR = "info", "warning", "error"

# The events an alert sender reads (the alerts sensor, where it exists): each with its severity.
STARTED, STAGE_STARTED, STAGE_FLIPPED, STAGE_PASSED = "started", "stage-started", "stage-flipped", "stage-passed"
APPROVAL_NEEDED, APPROVED, PAUSED_EVENT, RESUMED = "approval-needed", "approved", "paused", "resumed"
ABORTING_EVENT, ABORTED_EVENT, FINISHED_EVENT = "aborting", "aborted", "finished"


@dataclasses.dataclass(frozen=True)
class PlanRow:
    id: uuid.UUID
    kind: str
    name: str
    mode: str
    spec: dict
    rendered: dict
    state: str
    stage: int
    phase: str
    reason: str | None
    blocking: str | None
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    ended_at: dt.datetime | None

    @property
    def plan(self) -> Plan:
        return plan_from_stored(self.spec)

    @property
    def short(self) -> str:
        return str(self.id)[:8]


_PLAN_COLUMNS = (  # PlanRow's fields, in its order
    "id kind name mode spec rendered state stage phase reason blocking created_by created_at updated_at ended_at"
).split()
_SELECT_PLANS = sql.SQL("select {} from lakehouse_rollout_plans").format(
    sql.SQL(", ").join(map(sql.Identifier, _PLAN_COLUMNS))
)


@dataclasses.dataclass(frozen=True)
class StageRow:
    plan_id: uuid.UUID
    stage: int
    started_at: dt.datetime | None
    flipped_at: dt.datetime | None
    passed_at: dt.datetime | None
    approved_at: dt.datetime | None
    approved_by: str | None
    approval_note: str | None
    inconclusive_since: dt.datetime | None
    moved_count: int  # datasets the stage's flips moved (the ids stay in Postgres: a global stage holds them all)


@dataclasses.dataclass(frozen=True)
class StepRow:
    plan_id: uuid.UUID
    step_key: str
    stage: int
    kind: str  # flip | analysis | complete
    job: str
    config: dict
    status: str  # requested | succeeded | failed
    run_id: str | None
    moved: list[uuid.UUID]
    detail: str | None
    requested_at: dt.datetime
    finished_at: dt.datetime | None


_STEP_COLUMNS = "plan_id, step_key, stage, kind, job, config, status, run_id, moved, detail, requested_at, finished_at"


def plan_from_stored(d: dict) -> Plan:
    """The Plan back from ``Plan.as_dict()`` (durations already in seconds)."""

    def stage(s: dict) -> Stage:
        return Stage(
            kind=s["kind"],
            count=s.get("count"),
            workspaces=tuple(uuid.UUID(w) for w in s.get("workspaces") or ()),
            within=uuid.UUID(s["within"]) if s.get("within") else None,
            soak=s["soak"],
            approval=s["approval"],
            window=parse_window(s["window"]) if s.get("window") else None,
            max_datasets=s.get("max_datasets"),
            ok_within=s["ok_within"],
            analysis=Analysis(**s["analysis"]),
            export_to=s.get("export_to"),
        )

    kind, name = ("read", d["reader"]) if "reader" in d else ("write", d["writer"])
    return Plan(
        kind, name, d["mode"], tuple(stage(s) for s in d["stages"]), d.get("note"), bool(d.get("arm_reverse", True))
    )


def create(conn: psycopg.Connection, plan: Plan, rendered: Rendered, *, source: str | None, actor: str) -> uuid.UUID:
    """Store a plan that passed ``render`` (one transaction): the plan, its stages, the value before the plan of
    every flag key it will set, and its ``started`` event. One live plan per reader or writer."""
    plan_id = uuid.uuid4()
    try:
        with conn.transaction():
            conn.execute(
                "insert into lakehouse_rollout_plans (id, kind, name, mode, spec, source, rendered, created_by)"
                " values (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    plan_id,
                    plan.kind,
                    plan.name,
                    plan.mode,
                    Jsonb(plan.as_dict()),
                    source,
                    Jsonb(rendered.as_dict()),
                    actor,
                ),
            )
            with conn.cursor() as cur:
                cur.executemany(
                    "insert into lakehouse_rollout_stages (plan_id, stage) values (%s, %s)",
                    [(plan_id, i) for i in range(len(plan.stages))],
                )
            for c in rendered.changes:
                record_before(conn, plan_id, plan.kind, plan.name, c.scope, c.scope_id, c.before)
            event(conn, plan_id, STARTED, stage=0, actor=actor, detail={"changes": len(rendered.changes)})
    except UniqueViolation:
        live = conn.execute(
            "select id, state from lakehouse_rollout_plans where kind = %s and name = %s and state = any(%s)",
            (plan.kind, plan.name, list(LIVE)),
        ).fetchone()
        raise BadInput(
            f"plan {live[0] if live else '?'} for {plan.flag_word} {plan.name} is still {live[1] if live else 'live'}; "
            "one plan per reader or writer at a time: let it finish, or abort it (lakehouse rollout abort ID)"
        ) from None
    return plan_id


def record_before(
    conn: psycopg.Connection, plan_id: uuid.UUID, kind: str, name: str, scope: str, scope_id, before: str | None
) -> None:
    """The key's value before the plan touched it; the first record wins (a later one is the plan's own)."""
    conn.execute(
        "insert into lakehouse_rollout_flags (plan_id, kind, name, scope, scope_id, before_mode)"
        " values (%s, %s, %s, %s, %s, %s) on conflict do nothing",
        (plan_id, kind, name, scope, scope_id, before),
    )


def event(
    conn: psycopg.Connection,
    plan_id: uuid.UUID,
    what: str,
    *,
    stage: int | None = None,
    severity: str = INFO,
    reason: str | None = None,
    actor: str | None = None,
    detail: dict | None = None,
) -> int:
    return fetch_value(
        conn.execute(
            "insert into lakehouse_rollout_events (plan_id, stage, event, severity, reason, actor, detail)"
            " values (%s, %s, %s, %s, %s, %s, %s) returning id",
            (plan_id, stage, what, severity, reason, actor, Jsonb(detail) if detail is not None else None),
        ),
        "the id of the rollout event just inserted",
    )


def has_event(conn: psycopg.Connection, plan_id: uuid.UUID, what: str, stage: int) -> bool:
    return (
        conn.execute(
            "select 1 from lakehouse_rollout_events where plan_id = %s and event = %s and stage = %s limit 1",
            (plan_id, what, stage),
        ).fetchone()
        is not None
    )


def resolve_id(conn: psycopg.Connection, raw: str) -> uuid.UUID:
    """A plan id, or a unique prefix of one (8 characters, as `rollout status` shows them)."""
    text = str(raw).strip().lower()
    try:
        return _exists(conn, uuid.UUID(text))
    except ValueError:
        pass
    if len(text) < 4 or any(ch not in "0123456789abcdef-" for ch in text):
        raise BadInput(f"{raw!r} is not a plan id; copy it from lakehouse rollout status")
    rows = conn.execute(
        "select id from lakehouse_rollout_plans where id::text like %s order by created_at desc limit 2", (text + "%",)
    ).fetchall()
    if not rows:
        raise NotFound(f"no plan has an id starting {text!r}; see lakehouse rollout status")
    if len(rows) > 1:
        raise BadInput(f"{text!r} matches more than one plan; give more of the id")
    return rows[0][0]


def _exists(conn: psycopg.Connection, plan_id: uuid.UUID) -> uuid.UUID:
    if conn.execute("select 1 from lakehouse_rollout_plans where id = %s", (plan_id,)).fetchone() is None:
        raise NotFound(f"plan {plan_id} does not exist; see lakehouse rollout status")
    return plan_id


def get(conn: psycopg.Connection, plan_id: uuid.UUID) -> PlanRow:
    row = conn.execute(_SELECT_PLANS + sql.SQL(" where id = %s"), (plan_id,)).fetchone()
    if row is None:
        raise NotFound(f"plan {plan_id} does not exist; see lakehouse rollout status")
    return PlanRow(*row)


def lock(conn: psycopg.Connection, plan_id: uuid.UUID, *, wait: bool = True) -> PlanRow | None:
    """The plan's row, locked until the caller's transaction ends (None: another holds it and ``wait`` is off)."""
    row = conn.execute(
        _SELECT_PLANS + sql.SQL(" where id = %s for update" if wait else " where id = %s for update skip locked"),
        (plan_id,),
    ).fetchone()
    return PlanRow(*row) if row else None


def plans(conn: psycopg.Connection, states: tuple[str, ...] | None = None, limit: int = 50) -> list[PlanRow]:
    query = _SELECT_PLANS
    params: list[Any] = []
    if states is not None:
        query += sql.SQL(" where state = any(%s)")
        params.append(list(states))
    query += sql.SQL(" order by created_at desc limit %s")
    params.append(limit)
    return [PlanRow(*r) for r in conn.execute(query, params).fetchall()]


def update(conn: psycopg.Connection, plan_id: uuid.UUID, **fields: Any) -> None:
    allowed = {"state", "stage", "phase", "reason", "blocking", "ended_at"}
    assert set(fields) <= allowed, fields
    sets = ", ".join(f"{k} = %s" for k in fields)
    conn.execute(
        f"update lakehouse_rollout_plans set {sets}, updated_at = now() where id = %s", [*fields.values(), plan_id]
    )


def set_blocking(conn: psycopg.Connection, p: PlanRow, text: str | None) -> None:
    """What the plan waits for, written only when it changes (a tick that waits writes nothing)."""
    if p.blocking != text:
        conn.execute("update lakehouse_rollout_plans set blocking = %s where id = %s", (text, p.id))


def stage_row(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int) -> StageRow:
    row = conn.execute(
        "select plan_id, stage, started_at, flipped_at, passed_at, approved_at, approved_by, approval_note,"
        " inconclusive_since, cardinality(moved) from lakehouse_rollout_stages where plan_id = %s and stage = %s",
        (plan_id, stage),
    ).fetchone()
    if row is None:
        raise NotFound(
            f"rollout plan {plan_id} has no stage {stage} (was the plan deleted?); see lakehouse rollout status"
        )
    return StageRow(*row)


def stage_rows(conn: psycopg.Connection, plan_id: uuid.UUID) -> list[StageRow]:
    return [
        StageRow(*r)
        for r in conn.execute(
            "select plan_id, stage, started_at, flipped_at, passed_at, approved_at, approved_by, approval_note,"
            " inconclusive_since, cardinality(moved) from lakehouse_rollout_stages where plan_id = %s order by stage",
            (plan_id,),
        ).fetchall()
    ]


def update_stage(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int, **fields: Any) -> None:
    allowed = {
        "started_at",
        "flipped_at",
        "passed_at",
        "approved_at",
        "approved_by",
        "approval_note",
        "inconclusive_since",
    }
    assert set(fields) <= allowed, fields
    sets = ", ".join(f"{k} = %s" for k in fields)
    conn.execute(
        f"update lakehouse_rollout_stages set {sets} where plan_id = %s and stage = %s",
        [*fields.values(), plan_id, stage],
    )


# Every dataset the plan's flips moved, as a relation ``moved(id)`` for a query's join (never sent to Python).
MOVED_CTE = sql.SQL(
    "with moved as (select distinct unnest(s.moved) as id from lakehouse_rollout_steps s"
    " where s.plan_id = %(plan)s and s.kind = 'flip') "
)


def set_stage_moved(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int) -> int:
    """The stage's moved datasets: the union of its flips', kept in the stage's row; returns how many."""
    return fetch_value(
        conn.execute(
            "update lakehouse_rollout_stages set moved = (select coalesce(array_agg(distinct d), '{}') from"
            " lakehouse_rollout_steps s, unnest(s.moved) d where s.plan_id = %(plan)s and s.stage = %(stage)s"
            " and s.kind = 'flip') where plan_id = %(plan)s and stage = %(stage)s returning cardinality(moved)",
            {"plan": plan_id, "stage": stage},
        ),
        NotFound(f"rollout plan {plan_id} has no stage {stage} (was the plan deleted?)"),
    )


def moved_before(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int) -> list[uuid.UUID]:
    """Every dataset the stages before ``stage`` moved (what a complete stage retires), in id order."""
    rows = conn.execute(
        "select distinct d from lakehouse_rollout_stages, unnest(moved) d where plan_id = %s and stage < %s order by d",
        (plan_id, stage),
    ).fetchall()
    return [r[0] for r in rows]


def stage_sample(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int, n: int) -> list[uuid.UUID]:
    """Up to ``n`` of the stage's moved datasets, at random (all when fewer)."""
    rows = conn.execute(
        "select d from lakehouse_rollout_stages, unnest(moved) d where plan_id = %s and stage = %s"
        " order by random() limit %s",
        (plan_id, stage, n),
    ).fetchall()
    return [r[0] for r in rows]


def steps(
    conn: psycopg.Connection,
    plan_id: uuid.UUID,
    stage: int | None = None,
    kind: str | None = None,
    *,
    with_moved: bool = True,
) -> list[StepRow]:
    """``with_moved`` False: ``moved`` comes back empty (a global flip's holds every dataset id)."""
    columns = _STEP_COLUMNS if with_moved else _STEP_COLUMNS.replace("moved", "'{}'::uuid[]")
    query = f"select {columns} from lakehouse_rollout_steps where plan_id = %s"
    params: list[Any] = [plan_id]
    if stage is not None:
        query += " and stage = %s"
        params.append(stage)
    if kind is not None:
        query += " and kind = %s"
        params.append(kind)
    query += " order by requested_at, step_key"
    return [StepRow(*r) for r in conn.execute(query, params).fetchall()]


def add_step(
    conn: psycopg.Connection,
    plan_id: uuid.UUID,
    step_key: str,
    stage: int,
    kind: str,
    job: str,
    config: dict,
    moved: list[uuid.UUID],
    *,
    status: str = "requested",
    detail: str | None = None,
) -> None:
    """A step of the plan, written before its run is asked for. A step written earlier under the same key stays (the
    run key is the step's: a tick that died after writing it asks again), except a "skipped" one that now needs its
    run: it is replaced, so the step stands for what its run does."""
    conn.execute(
        "insert into lakehouse_rollout_steps (plan_id, step_key, stage, kind, job, config, moved, status, detail,"
        " finished_at) values (%s, %s, %s, %s, %s, %s, %s, %s, %s, case when %s <> 'requested' then now() end)"
        " on conflict (plan_id, step_key) do update set job = excluded.job, config = excluded.config,"
        " moved = excluded.moved, status = excluded.status, detail = excluded.detail, run_id = null,"
        " requested_at = now(), finished_at = excluded.finished_at"
        " where lakehouse_rollout_steps.detail like 'skipped%%' and excluded.status = 'requested'",
        (plan_id, step_key, stage, kind, job, Jsonb(config), moved, status, detail, status),
    )


def finish_step(
    conn: psycopg.Connection, plan_id: uuid.UUID, step_key: str, status: str, run_id: str | None, detail: str | None
) -> None:
    conn.execute(
        "update lakehouse_rollout_steps set status = %s, run_id = %s, detail = %s, finished_at = now()"
        " where plan_id = %s and step_key = %s and status = 'requested'",
        (status, run_id, detail, plan_id, step_key),
    )


def events(
    conn: psycopg.Connection, plan_id: uuid.UUID | None = None, *, after_id: int = 0, limit: int = 200
) -> list[dict]:
    """Plan events, oldest first (``after_id``: the cursor of an alert sender)."""
    query = (
        "select id, plan_id, at, stage, event, severity, reason, actor, detail from lakehouse_rollout_events"
        " where id > %s"
    )
    params: list[Any] = [after_id]
    if plan_id is not None:
        query += " and plan_id = %s"
        params.append(plan_id)
    query += " order by id limit %s"
    params.append(limit)
    keys = ("id", "plan_id", "at", "stage", "event", "severity", "reason", "actor", "detail")
    return [dict(zip(keys, r)) for r in conn.execute(query, params).fetchall()]


# The events an operator must hear of (the alerts sensor posts them): "aborting" is left out, its "aborted" follows.
ALERTABLE = (PAUSED_EVENT, APPROVAL_NEEDED, ABORTED_EVENT)


_EVENTS_BY_XID = ("lakehouse_rollout_events", "xid", "true", ("plan_id", "stage", "event", "reason"))


def alertable_events(
    conn: psycopg.Connection, after: recording.Position | None, limit: int = 200
) -> tuple[list[dict], recording.Position]:
    """(the alertable events written since ``after`` with what their plan moves, the position after them). Read by
    the id of the transaction that wrote them (migration 0031), as the recorder reads its streams: an event whose
    transaction commits after a later event was read is still read, once. ``after`` None: nothing is reported, the
    position starts at the events committed now (a sender that starts now does not replay the past)."""
    if after is None:
        horizon = fetch_value(
            conn.execute("select pg_snapshot_xmin(pg_current_snapshot())::text::bigint"), "the snapshot's xmin"
        )
        _, pos = recording.read_by_xid(conn, "rollout", _EVENTS_BY_XID, recording.Position(horizon), limit)
        return [], pos
    changes, pos = recording.read_by_xid(conn, "rollout", _EVENTS_BY_XID, after, limit)
    wanted = [c for c in changes if c.row["event"] in ALERTABLE]
    plans_of = {
        r[0]: r[1:]
        for r in conn.execute(
            "select id, kind, name, mode from lakehouse_rollout_plans where id = any(%s)",
            (list({c.row["plan_id"] for c in wanted}),),
        ).fetchall()
    }
    out = []
    for c in wanted:
        if c.row["plan_id"] not in plans_of:  # (the plan was deleted since: nothing to tell)
            continue
        kind, name, mode = plans_of[c.row["plan_id"]]
        out.append({"id": c.id, **c.row, "kind": kind, "name": name, "mode": mode})
    return out, pos


def flag_keys(conn: psycopg.Connection, plan_id: uuid.UUID) -> list[dict]:
    keys = ("kind", "name", "scope", "scope_id", "before_mode", "restored_at", "restore_detail")
    return [
        dict(zip(keys, r))
        for r in conn.execute(
            "select kind, name, scope, scope_id, before_mode, restored_at, restore_detail from lakehouse_rollout_flags"
            " where plan_id = %s order by recorded_at, scope, scope_id",
            (plan_id,),
        ).fetchall()
    ]


def mark_flag_restored(conn: psycopg.Connection, plan_id: uuid.UUID, k: dict, detail: str) -> None:
    """One flag the plan moved, put back (or not) by an abort: when, and what was done."""
    conn.execute(
        "update lakehouse_rollout_flags set restored_at = now(), restore_detail = %s"
        " where plan_id = %s and kind = %s and name = %s and scope = %s and scope_id is not distinct from %s",
        (detail, plan_id, k["kind"], k["name"], k["scope"], k["scope_id"]),
    )


# When a plan started, as an SQL expression over the parameter %(plan)s (plans/analysis.py: the MISMATCHes since).
PLAN_START = sql.SQL("(select created_at from lakehouse_rollout_plans where id = %(plan)s)")


# The datasets a plan covers so far, as an SQL predicate over ``d`` (a datasets row) with the parameters %(plan)s,
# %(upcoming_global)s and %(upcoming)s: the scopes of the stage about to start, or a flip step of the plan's.
IN_PLAN_SCOPE = sql.SQL("""(%(upcoming_global)s or d.workspace_id = any(%(upcoming)s::uuid[]) or d.id = any(%(upcoming)s::uuid[])
            or exists (select 1 from lakehouse_rollout_steps s
                        where s.plan_id = %(plan)s and s.kind = 'flip'
                          and (s.config->>'scope' = 'global'
                               or s.config->>'scope_id' in (d.workspace_id::text, d.id::text)
                               or d.id = any(s.moved))))""")


def delete_unstarted_steps(conn: psycopg.Connection, plan_id: uuid.UUID, stage: int, step_keys: list[str]) -> None:
    """A stage start undone: its steps only requested or skipped go (the controller, over max_datasets)."""
    conn.execute(
        "delete from lakehouse_rollout_steps where plan_id = %s and stage = %s and step_key = any(%s)"
        " and (status = 'requested' or detail like 'skipped%%')",
        (plan_id, stage, step_keys),
    )


def datasets_moved(conn: psycopg.Connection, plan_id: uuid.UUID) -> int:
    """How many distinct datasets the plan's succeeded flips moved."""
    return fetch_value(
        conn.execute(
            "select count(distinct d) from lakehouse_rollout_steps, unnest(moved) d where plan_id = %s and kind = 'flip'"
            " and status = 'succeeded'",
            (plan_id,),
        ),
        "the count of datasets the plan's flips moved",
    )


def tables_exist(conn: psycopg.Connection) -> bool:
    """Whether the rollout tables exist yet (migration 027): the controller sensor skips until they do."""
    return fetch_value(conn.execute("select to_regclass('lakehouse_rollout_plans')"), "the rollout tables") is not None


def plan_ids_in(conn: psycopg.Connection, states: tuple[str, ...]) -> list[uuid.UUID]:
    """The plans in one of ``states``, the oldest first."""
    return [
        r[0]
        for r in conn.execute(
            "select id from lakehouse_rollout_plans where state = any(%s) order by created_at", (list(states),)
        ).fetchall()
    ]


def db_now(conn: psycopg.Connection) -> dt.datetime:
    return fetch_value(conn.execute("select now()"), "the database clock (select now())")
