"""A plan made concrete over the database as it is: every flag change in order, the datasets each moves, and the
gate that would refuse any of it. The dry-run (`lakehouse rollout plan`) prints it; `start` stores it and the
controller runs exactly those changes, so what the dry-run lists is what the run then does.

Each change is simulated over the flag's overrides as the earlier changes leave them (the same precedence as the
resolver: dataset > workspace > global > default), so a workspace stage after a datasets stage moves only the
workspace's other datasets. Nothing is written.

Refused before the plan starts, naming the gate:
  * writers: the flip gates that do not depend on the moment of the flip (F3 pipeline input, prerequisite #1 —
    readers on Postgres —, Postgres-locked readers, manifest datasets) and the runbook's writer order
    (sync.full, then sync.append, then sync.incremental / cdc.append at each scope);
  * the widening rule (with a project soak): a workspace stage needs a dataset-scope flip inside that workspace
    before it, a global stage a workspace-scope flip;
  * a stage moving more datasets than its ``max_datasets``; a datasets stage without enough candidates.
What the gates check again at the flip (caught up, a fresh ok verdict, readers soaked) is listed as a note. A
``complete`` stage changes no flag: it lists the datasets it would retire (those the stages above move) and, as a
note, each that complete would refuse as things stand for a reason no soak ends (a pipeline input, a declared
Postgres-locked reader): the stage would pause on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg

from lakehouse_dagster.core.errors import BadInput, FlipRefused
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.candidates import write_flip_candidates
from lakehouse_dagster.flags.gates import AtFlip, Effect, write_flip_blockers
from lakehouse_dagster.flags.overrides import DATASET, GLOBAL, WORKSPACE, Scope
from lakehouse_dagster.flags.reader_datasets import on_postgres
from lakehouse_dagster.flags.registry import COMMAND, READ, Flag, get_flag, rank
from lakehouse_dagster.flags.soak_setting import STORED, SoakSetting, current_soak
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.flags.widen import scope_mode_in, widen_blockers
from lakehouse_dagster.parity import verdicts as parity_verdicts
from lakehouse_dagster.plans.spec import COMPLETE, DATASETS, SHADOW, Plan, Stage, format_duration
from lakehouse_dagster.plans.spec import WORKSPACE as WORKSPACE_STAGE
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import lookup, pipeline_input_dataset_ids, scopes

_SHOWN = 20


@dataclasses.dataclass(frozen=True)
class Move:
    dataset_id: uuid.UUID
    name: str
    before: str
    after: str


@dataclasses.dataclass
class FlagChange:
    stage: int
    scope: str  # dataset | workspace | global
    scope_id: uuid.UUID | None
    mode: str
    before: str | None  # the override at this key before the change (None: none)
    moved: list[Move]
    skipped: list[str]  # datasets it moves that are not Iceberg-tabular (named, not checked)
    label: str = ""  # the dataset's or workspace's name

    @property
    def step_key(self) -> str:
        return f"stage{self.stage}:{self.scope}:{self.scope_id or 'all'}"

    @property
    def tabular(self) -> list[Move]:
        return self.moved

    def command(self, flag: Flag) -> str:
        where = "" if self.scope_id is None else f" --{self.scope} {self.scope_id}"
        return f"{COMMAND[flag.kind].removeprefix('lakehouse ')} set {flag.name} {self.mode}{where}"

    def as_dict(self) -> dict:
        return {
            "stage": self.stage,
            "step_key": self.step_key,
            "scope": self.scope,
            "scope_id": str(self.scope_id) if self.scope_id else None,
            "label": self.label,
            "mode": self.mode,
            "before": self.before,
            "moves": [
                {"dataset_id": str(m.dataset_id), "name": m.name, "before": m.before, "after": m.after}
                for m in self.moved
            ],
            "skipped": self.skipped,
        }


@dataclasses.dataclass
class StagePlan:
    index: int
    stage: Stage
    soak: int  # effective: max(the stage's, the project's)
    soak_text: str
    changes: list[FlagChange]
    notes: list[str]
    completes: list[Move] = dataclasses.field(default_factory=list)  # a complete stage: the datasets it retires

    def as_dict(self) -> dict:
        return {
            "stage": self.index,
            "what": self.stage.describe(),
            "soak_seconds": self.soak,
            "soak": self.soak_text,
            "approval": self.stage.approval,
            "window": self.stage.window.text if self.stage.window else None,
            "changes": [c.as_dict() for c in self.changes],
            "notes": self.notes,
            **(
                {"completes": [{"dataset_id": str(m.dataset_id), "name": m.name} for m in self.completes]}
                if self.stage.kind == COMPLETE
                else {}
            ),
        }


@dataclasses.dataclass
class Rendered:
    plan: Plan
    stages: list[StagePlan]
    problems: list[str]  # a gate or rule that refuses the plan: empty to start

    @property
    def changes(self) -> list[FlagChange]:
        return [c for s in self.stages for c in s.changes]

    def refusal(self) -> str:
        head = f"refused: the plan for {self.plan.flag_word} {self.plan.name} → {self.plan.mode} would break a gate"
        return "\n".join([head + "; nothing written:"] + [f"  {p}" for p in self.problems])

    def as_dict(self) -> dict:
        return {
            "plan": self.plan.as_dict(),
            "stages": [s.as_dict() for s in self.stages],
            "changes": len(self.changes),
            "problems": self.problems,
        }

    def lines(self) -> list[str]:
        flag = get_flag(self.plan.kind, self.plan.name)
        out = [
            f"rollout plan: {self.plan.flag_word} {self.plan.name} → {self.plan.mode}, {len(self.stages)} stage(s), "
            f"{len(self.changes)} flag change(s) in this order:"
        ]
        n = 0
        for s in self.stages:
            when = f"window {s.stage.window.text}" if s.stage.window else "any time"
            approval = "approval needed before it" if s.stage.approval else "no approval"
            if s.stage.kind == COMPLETE:
                out.append(f"stage {s.index + 1}: complete — {approval}; {when}")
                export = f", after writing them as Parquet under {s.stage.export_to}" if s.stage.export_to else ""
                out.append(
                    f"  retires the Postgres rows of the {len(s.completes)} dataset(s) the stages above move{export} "
                    "(lakehouse complete: each refused, and the stage paused, unless native past the "
                    "soak with reverse parity ok and no Postgres-locked consumer):"
                )
                out += [f"       {m.name} ({m.dataset_id})" for m in s.completes[:_SHOWN]]
                if len(s.completes) > _SHOWN:
                    out.append(f"       ... and {len(s.completes) - _SHOWN} more (--json lists all)")
                out += [f"  note: {note}" for note in s.notes]
                continue
            out.append(f"stage {s.index + 1}: {s.stage.describe()} — soak {s.soak_text}; {approval}; {when}")
            for c in s.changes:
                n += 1
                label = f" ({c.label})" if c.label else ""
                out.append(f"  {n}. {c.command(flag)}{label}: moves {len(c.moved)} dataset(s)")
                out += [f"       {m.name} ({m.dataset_id}): {m.before} → {m.after}" for m in c.moved[:_SHOWN]]
                if len(c.moved) > _SHOWN:
                    out.append(f"       ... and {len(c.moved) - _SHOWN} more (--json lists all)")
                out += [f"       skipped: {s_}" for s_ in c.skipped[:_SHOWN]]
            out += [f"  note: {note}" for note in s.notes]
        out += [f"REFUSED: {p}" for p in self.problems]
        return out


def effective_soak(stage: Stage, project: SoakSetting) -> tuple[int, str]:
    """The larger of the stage's soak and the project's (the stored soak every gate applies, flags/soak_setting.py):
    a plan never undercuts the gate's soak; the text says both."""
    soak = max(stage.soak, project.seconds)
    where = "stored" if project.source == STORED else project.source
    return soak, (
        f"{format_duration(soak)} (the larger of the plan's {format_duration(stage.soak)} and the project's "
        f"{format_duration(project.seconds)}, {where})"
    )


def _datasets(conn: psycopg.Connection) -> tuple[dict[uuid.UUID, tuple], dict[uuid.UUID, int | None]]:
    rows = scopes.summaries(conn)
    return {r[0]: r[:4] for r in rows}, {r[0]: r[4] for r in rows}


def _moves(flag: Flag, before: dict, after: dict, datasets: dict, scope: str, scope_id) -> tuple[list, list, list]:
    """(tabular moves, the others named, every move as the gates' Effect: the gates judge manifest datasets too)."""
    moved, skipped, every = [], [], []
    for ds_id, (_, name, ws, kind) in datasets.items():
        if scope == DATASET and ds_id != scope_id or scope == WORKSPACE and ws != scope_id:
            continue
        b, a = resolve_for(flag, before, ds_id, ws), resolve_for(flag, after, ds_id, ws)
        if b == a:
            continue
        every.append(Effect(ds_id, name, b, a))
        if kind == "tabular":
            moved.append(Move(ds_id, name, b, a))
        else:
            skipped.append(f"{name} ({ds_id}): {kind} dataset, not Iceberg-tabular")
    moved.sort(key=lambda m: (m.name, str(m.dataset_id)))
    return moved, skipped, every


def reader_candidates(
    conn: psycopg.Connection,
    flag: Flag,
    stored: dict,
    datasets: dict,
    row_counts: dict,
    mode: str,
    within: uuid.UUID | None,
    ok_within: int,
) -> list[uuid.UUID]:
    """Tabular datasets below ``mode`` for the reader whose latest verdict is ok, at their current Postgres version,
    recorded within ``ok_within`` seconds: smallest first (a canary risks little), then by name."""
    ids = [
        i
        for i, (_, _, ws, kind) in datasets.items()
        if kind == "tabular"
        and (within is None or ws == within)
        and rank(flag.kind, resolve_for(flag, stored, i, ws)) < rank(flag.kind, mode)
    ]
    if not ids:
        return []
    latest = parity_verdicts.latest_verdicts(conn, ids)
    current: dict = lookup.rows_versions(conn, ids)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ok_within)
    ok = [
        i
        for i, v in latest.items()
        if v["verdict"] == parity_verdicts.OK and v["checked_at"] >= since and v["pg_version"] == current.get(i)
    ]
    return sorted(ok, key=lambda i: (row_counts.get(i) is None, row_counts.get(i) or 0, datasets[i][1], str(i)))


def writer_candidates(
    conn: psycopg.Connection, flag: Flag, datasets: dict, row_counts: dict, within: uuid.UUID | None
) -> list[uuid.UUID]:
    """The runbook's SAFE candidates (step 2b) that pass every flip gate now, smallest first."""
    ready = [
        c.dataset_id
        for c in write_flip_candidates(conn, flag.name)
        if c.ready and (within is None or datasets[c.dataset_id][2] == within)
    ]
    return sorted(ready, key=lambda i: (row_counts.get(i) is None, row_counts.get(i) or 0, datasets[i][1], str(i)))


def render(conn: psycopg.Connection, plan: Plan, settings: Settings) -> Rendered:  # noqa: C901
    """Long on purpose: the stages in order over one simulated set of overrides, each stage's changes, moves and
    refusals beside each other, so the dry-run and the controller read the same story."""
    flag = get_flag(plan.kind, plan.name)
    project = current_soak(conn, settings)
    settings = settings.replace(
        rollout={"soak_seconds": project.seconds}
    )  # every soak below is the one the gates apply
    datasets, row_counts = _datasets(conn)
    workspaces: dict = app_tables.workspace_names(conn)
    stored = dict(stored_overrides(conn, flag.kind, [flag.name])[flag.name])
    problems: list[str] = []
    stages: list[StagePlan] = []
    for i, stage in enumerate(plan.stages):
        where = f"stages[{i}]"
        if stage.kind == COMPLETE:
            stages.append(_complete_stage(conn, i, stage, stages, datasets, problems))
            continue
        soak, soak_text = effective_soak(stage, project)
        notes: list[str] = []
        keys: list[tuple[str, uuid.UUID | None, str]] = []  # (scope, id, label)
        mode = "shadow" if stage.kind == SHADOW else plan.mode
        if stage.kind == SHADOW:
            current = stored.get((GLOBAL, None))
            if current is not None and rank(READ, current) > rank(READ, "shadow"):
                problems.append(
                    f"{where}.shadow: {flag.name} is {current} globally already; a shadow stage would lower it"
                )
            keys.append((GLOBAL, None, ""))
        elif stage.kind == DATASETS:
            within = stage.within or next(
                (s.workspaces[0] for s in plan.stages[i + 1 :] if s.kind == WORKSPACE_STAGE and s.workspaces), None
            )
            if within is not None and within not in workspaces:
                problems.append(f"{where}.within: workspace {within} does not exist; check the id (lakehouse datasets)")
            if plan.kind == READ:
                found = reader_candidates(conn, flag, stored, datasets, row_counts, plan.mode, within, stage.ok_within)
                how = (
                    f"datasets with an ok verdict at their current version in the last "
                    f"{format_duration(stage.ok_within)}; canary more (lakehouse canary --smoke --limit 50)"
                )
            else:
                found = writer_candidates(conn, flag, datasets, row_counts, within)
                how = "SAFE candidates that pass every flip gate now (lakehouse candidates)"
            in_ws = f" in workspace {within}" if within else ""
            if stage.count is not None and len(found) < stage.count:
                problems.append(
                    f"{where}.datasets: {stage.count} wanted, {len(found)} candidate(s){in_ws}: {how}, or lower N"
                )
            keys += [(DATASET, d, datasets[d][1]) for d in found[: stage.count]]
        elif stage.kind == WORKSPACE_STAGE:
            for w in stage.workspaces:
                if w not in workspaces:
                    problems.append(
                        f"{where}.workspace: workspace {w} does not exist; check the id (lakehouse datasets)"
                    )
                keys.append((WORKSPACE, w, workspaces.get(w, "")))
        else:
            keys.append((GLOBAL, None, ""))
        changes = []
        for scope, scope_id, label in keys:
            before = dict(stored)
            after = {**stored, (scope, scope_id): mode}
            moved, skipped, every = _moves(flag, before, after, datasets, scope, scope_id)
            change = FlagChange(i, scope, scope_id, mode, stored.get((scope, scope_id)), moved, skipped, label)
            own = scope_mode_in(flag, stored, Scope(scope, scope_id)) if scope != DATASET else mode
            if not moved and rank(flag.kind, own) >= rank(flag.kind, mode):
                notes.append(
                    f"{change.command(flag)} moves no Iceberg-tabular dataset (each already resolves to {mode}): "
                    "skipped, nothing to flip"
                )
                continue
            if not moved:  # as `flags flip` does: the scope's own mode rises (datasets created there later get it)
                notes.append(
                    f"{change.command(flag)} moves no existing dataset (each already resolves to {mode}); it raises "
                    f"the {scope} scope's own mode from {own}, which datasets created there later get"
                )
            problems += _gate_problems(conn, flag, change, every, datasets, stored, where, notes)
            stored[(scope, scope_id)] = mode
            changes.append(change)
        moved_count = sum(len(c.moved) for c in changes)
        if stage.max_datasets is not None and stage.kind != SHADOW and moved_count > stage.max_datasets:
            problems.append(
                f"{where}: moves {moved_count} datasets, above its max_datasets {stage.max_datasets}; "
                "add a narrower stage first or raise max_datasets"
            )
        if settings.rollout.soak_seconds > stage.soak:
            notes.append(
                f"soak raised to the project's {format_duration(settings.rollout.soak_seconds)}: a plan never undercuts the gate"
            )
        stages.append(StagePlan(i, stage, soak, soak_text, changes, notes))
    return Rendered(plan, stages, problems)


def _complete_stage(
    conn: psycopg.Connection, i: int, stage: Stage, before: list[StagePlan], datasets: dict, problems: list[str]
) -> StagePlan:
    """What a complete stage would retire (every dataset the stages above move) and who would stop it."""
    seen: dict[uuid.UUID, Move] = {}
    for s in before:
        for c in s.changes:
            for m in c.moved:
                seen.setdefault(m.dataset_id, m)
    completes = sorted(seen.values(), key=lambda m: (m.name, str(m.dataset_id)))
    notes: list[str] = []
    ids = [m.dataset_id for m in completes]
    if stage.max_datasets is not None and len(ids) > stage.max_datasets:
        problems.append(
            f"stages[{i}]: would complete {len(ids)} datasets, above its max_datasets {stage.max_datasets}; "
            "raise it, or complete fewer by narrowing the stages above"
        )
    inputs = pipeline_input_dataset_ids(conn) & set(ids)
    locked = on_postgres(conn, {d: datasets[d][2] for d in ids})
    held = [
        f"{datasets[d][1]} ({d}): "
        + "; ".join(
            (["a pipeline input (BLOCKED: the pipeline source reads dataset_rows)"] if d in inputs else [])
            + ([f"read by {', '.join(r.describe() for r in locked[d])}, locked to Postgres"] if locked.get(d) else [])
        )
        for d in ids
        if d in inputs or locked.get(d)
    ]
    if held:
        notes.append(
            f"complete would refuse {len(held)} of them as things stand, for a reason no soak ends (the stage would "
            "pause on them): "
            + "; ".join(held[:_SHOWN])
            + (f"; and {len(held) - _SHOWN} more" if len(held) > _SHOWN else "")
        )
    return StagePlan(i, stage, 0, "none (complete's own soak condition applies)", [], notes, completes)


def _gate_problems(
    conn,
    flag: Flag,
    change: FlagChange,
    every: list[Effect],
    datasets: dict,
    stored: dict,
    where: str,
    notes: list,
) -> list[str]:
    """Why the gates would refuse this change when its turn comes (empty: they would not, as far as can be
    known now); reasons true only at the moment of a flip become notes."""
    problems = []
    scope = Scope(change.scope, change.scope_id)
    what = f"{where} ({change.command(flag)})"
    if change.mode == "shadow":
        return []
    if flag.kind != READ:
        blocked = write_flip_blockers(conn, [e for e in every if e.after == "iceberg_native"], datasets, soak_seconds=0)
        hard = [(b, [r for r in b.reasons if not isinstance(r, AtFlip)]) for b in blocked]
        hard = [(b, rs) for b, rs in hard if rs]
        if hard:
            lines = [f"  {b.name} ({b.dataset_id}): {'; '.join(rs)}" for b, rs in hard[:_SHOWN]]
            more = [f"  ... and {len(hard) - _SHOWN} more"] if len(hard) > _SHOWN else []
            problems.append(
                f"{what}: the flip gates refuse {len(hard)} dataset(s) it moves:\n" + "\n".join(lines + more)
            )
        at_flip = sum(1 for b in blocked if any(isinstance(r, AtFlip) for r in b.reasons))
        if at_flip:
            notes.append(
                f"{change.command(flag)}: {at_flip} dataset(s) not yet caught up / parity-checked / soaked: "
                "the flip's own preflight and gates check them again when the stage starts"
            )
        order = [
            r
            for r in widen_blockers(
                conn, flag, scope, change.mode, every, datasets, soak_seconds=0, now=dt.datetime.now(dt.UTC)
            )
            if r.startswith("writer order")
        ]
        problems += [f"{what}: {r}" for r in order]
    if change.scope in (WORKSPACE, GLOBAL):  # the order holds whatever the soak (flags/widen.py)
        one_down = DATASET if change.scope == WORKSPACE else WORKSPACE
        narrower = [
            k
            for k, m in stored.items()
            if k[0] == one_down
            and rank(flag.kind, m) >= rank(flag.kind, change.mode)
            and (change.scope == GLOBAL or datasets.get(k[1], (None, None, None))[2] == change.scope_id)
        ]
        if not narrower:
            problems.append(
                f"{what}: order (dataset → workspace → global): no {one_down}-scope flip to {change.mode} inside {scope} before it; "
                f"add a {'datasets stage within that workspace' if one_down == DATASET else 'workspace stage'} first"
            )
    return problems


def check_startable(rendered: Rendered) -> None:
    """Refuse a plan a gate would stop (FlipRefused, exit 6) or one that moves nothing (BadInput)."""
    if rendered.problems:
        raise FlipRefused(rendered.refusal())
    if not rendered.changes:
        raise BadInput(
            f"nothing to roll out: every dataset already resolves {rendered.plan.name} to {rendered.plan.mode}; "
            "nothing written"
        )
