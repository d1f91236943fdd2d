"""Flip gates: the operator's set/clear (CLI and Dagster jobs) refuses a change that would strand consumers.

``overrides.set_override`` validates names, modes and scopes; this module adds what the Fase 4
runbook makes mandatory before a dataset starts being written iceberg-native, and what must not
happen afterwards. A change is judged by its effect: for every dataset whose effective mode the
change moves (a dataset, a workspace, or every dataset for a global change; narrower overrides win,
so a dataset pinned by its own override is not moved), before vs after.

A dataset moving to iceberg_native for a writer must be
  * tabular (manifest datasets are file-backed, not Iceberg-tabular);
  * not a pipeline INPUT (F3: the pipeline source CTE reads dataset_rows, which goes stale) — unless its
    reverse mirror is on (flags/reverse_setting.py, the default), which keeps dataset_rows for it;
  * identity-ready: its latest mirror sync succeeded with identity columns (the runbook's query);
  * caught up: Iceberg covers the current Postgres version (rows not yet mirrored would never be,
    since the mirror skips native datasets);
  * read from Iceberg already (prerequisite #1): every reader that Iceberg can serve resolves to
    iceberg or iceberg_only for it, and has for LAKEHOUSE_SOAK_SECONDS — since its effective mode for
    the dataset reached iceberg (the audit of its dataset/workspace/global overrides, replayed) and since
    the latest MISMATCH or fallback of that reader on it ("read-flip → soak → write-flip");
  * read by no declared reader that holds it on dataset_rows (reader_datasets.py ``on_postgres``: a reader locked
    to Postgres — sdk.files.list, mediaset.item —, or a compute reader — objects.sync, dashboards.aggregate,
    pipeline.expectations — whose mode for it is still below iceberg) — unless its reverse mirror is on, as for
    a pipeline input (``postgres_consumer_blockers``);
  * parity-checked: its latest recorded verdict is ok, at its current Postgres version.
A reader of a native dataset must not move below iceberg: Postgres no longer receives its rows.
A compute reader (registry ``proof``) moving a dataset to iceberg or iceberg_only needs proven shadow consistency
for it (flags/proof.py: LAKEHOUSE_SHADOW_PROOF_READS comparisons in a row, all equal, since its last schema change).

A widen (workspace/global) must also follow the widening rules: soak and the writers' order (widen.py).

The check and the write run in one transaction under one advisory lock shared by every gated
change, so two operators cannot each pass a check the other's change invalidates.

Kept whole on purpose: every gate a flag change passes, under the one lock they share.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import FlipRefused
from lakehouse_dagster.flags.completed import holding
from lakehouse_dagster.flags.incidents import FALLBACK, MISMATCH, latest_incidents
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_words
from lakehouse_dagster.flags.overrides import DATASET, Change, Scope, clear_override, set_override
from lakehouse_dagster.flags.proof import needed_reads, proofs
from lakehouse_dagster.flags.reader_datasets import on_postgres
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, READ, SERVABLE_READERS, WRITE, Flag, rank
from lakehouse_dagster.flags.reverse_setting import DEFAULT_ON, ReverseSetting, reverse_settings
from lakehouse_dagster.flags.soak import audit_history, effective_since, soak
from lakehouse_dagster.flags.soak_setting import current_soak
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.flags.widen import place, widen_blockers
from lakehouse_dagster.lifecycle.lock import lock_dataset, lock_every_dataset
from lakehouse_dagster.parity.verdicts import latest_with_rows_version
from lakehouse_dagster.tracking import barrier, capture, sync_log
from lakehouse_dagster.tracking import datasets as app_tables
from lakehouse_dagster.tracking.datasets import pipeline_input_dataset_ids, scopes
from lakehouse_dagster.tracking.datasets import rows as dataset_rows

NATIVE = "iceberg_native"
_GATE_LOCK = "lakehouse_flag_gates"
_SHOWN = 20  # blocked datasets listed in a refusal (the count says how many more)


@dataclasses.dataclass(frozen=True)
class Effect:
    dataset_id: uuid.UUID
    name: str
    before: str
    after: str


class AtFlip(str):
    """A reason true only at the moment of a dataset's flip (Postgres still authoritative: mirrored, caught
    up, parity ok at its version). Once Iceberg holds a native snapshot, Postgres is frozen by design and
    these no longer apply; the other reasons (what reads the dataset, what it is) hold for as long as it
    is native (routing/native_guard.py)."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class Blocked:
    dataset_id: uuid.UUID
    name: str
    reasons: tuple[str, ...]


def _datasets_in(conn: psycopg.Connection, scope: Scope) -> list[tuple]:
    return scopes.in_scope(conn, scope.scope, scope.scope_id)


def effects(conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str | None) -> tuple[list[Effect], dict]:
    """What setting ``mode`` (None: clearing) at ``scope`` does to each dataset's effective mode."""
    stored = stored_overrides(conn, flag.kind, [flag.name])[flag.name]
    after_stored = dict(stored)
    key = (scope.scope, scope.scope_id)
    if mode is None:
        after_stored.pop(key, None)
    else:
        after_stored[key] = mode
    rows = _datasets_in(conn, scope)
    out = []
    for ds_id, name, ws_id, _kind in rows:
        before, after = resolve_for(flag, stored, ds_id, ws_id), resolve_for(flag, after_stored, ds_id, ws_id)
        if before != after:
            out.append(Effect(ds_id, name, before, after))
    return out, {r[0]: r for r in rows}


def configured_soak(conn: psycopg.Connection, soak_seconds: int | None) -> int:
    """The soak to apply: the caller's (tests, benches), else the stored one, else LAKEHOUSE_SOAK_SECONDS
    (flags/soak_setting.py: what the CLI and every Dagster process read the same way)."""
    return current_soak(conn).seconds if soak_seconds is None else soak_seconds


def _db_now(conn: psycopg.Connection):
    return fetch_value(conn.execute("select now()"), "the database clock (select now())")


def write_flip_blockers(
    conn: psycopg.Connection, moved: list[Effect], datasets: dict, *, soak_seconds: int | None = None, now=None
) -> list[Blocked]:
    """Why each dataset about to be written iceberg-native is not ready (empty: all ready).
    Long on purpose: one pass over the moved datasets applying every gate of the write flip in the runbook's order, each gate's reason beside its query."""
    ids = [e.dataset_id for e in moved]
    if not ids:
        return []
    soak_seconds = configured_soak(conn, soak_seconds)
    now = now or _db_now(conn)
    consumers = postgres_consumer_blockers(conn, moved, datasets)
    with barrier.read_tracking_consistently(conn, ids):  # after-commit: rows_version covers every committed write
        syncs = sync_log.latest_mirror_syncs(conn, ids)
        verdicts = latest_with_rows_version(conn, ids)
    servable = list(SERVABLE_READERS)
    reader_overrides = stored_overrides(conn, READ, [r.name for r in servable])
    reader_soaks = _reader_soaks(conn, moved, datasets, servable, reader_overrides, soak_seconds, now)
    blocked = []
    for e in moved:
        _, name, ws_id, kind = datasets[e.dataset_id]
        reasons = []
        if kind != "tabular":  # the one reason: the writers' other prerequisites do not apply to it (never advice)
            blocked.append(
                Blocked(
                    e.dataset_id,
                    name,
                    (
                        f"a {kind} dataset is file-backed, not Iceberg-tabular: write flips do not apply to it "
                        "(dataset.manifest writes it, locked to pg)",
                    ),
                )
            )
            continue
        reasons += consumers.get(e.dataset_id, [])  # pipeline input, locked readers: unless the reverse is on
        sync = syncs.get(e.dataset_id)
        if sync is None:
            reasons.append(AtFlip(f"never mirrored: sync it first (lakehouse sync --dataset {e.dataset_id})"))
        else:
            status, has_identity, source_version, rows_version = sync
            if status != "succeeded" or not has_identity:
                reasons.append(
                    AtFlip(
                        f"not identity-ready: its latest mirror sync is {status}"
                        f"{'' if has_identity else ' without identity columns'}"
                    )
                )
            elif source_version is None or source_version < rows_version:
                reasons.append(
                    AtFlip(
                        f"Iceberg is behind Postgres (covers version {source_version}, Postgres is "
                        f"at {rows_version}): let the mirror catch up, or rows not yet mirrored are lost"
                    )
                )
        on_pg = [
            f"{r.name} ({m})"
            for r in servable
            if rank(READ, m := resolve_for(r, reader_overrides[r.name], e.dataset_id, ws_id)) < rank(READ, "iceberg")
        ]
        if on_pg:
            reasons.append(
                "readers still on Postgres for it: " + ", ".join(on_pg) + " — read-flip them first (prerequisite #1)"
            )
        elif reader_soaks.get(e.dataset_id):
            # a moment-of-flip reason: once a dataset is written natively, a reader re-raised later must not
            # block its writes for a whole soak (the guard before each native write drops AtFlip reasons)
            reasons.append(
                AtFlip(
                    "readers not yet soaked on Iceberg (prerequisite #1: read-flip → soak → write-flip): "
                    + "; ".join(reader_soaks[e.dataset_id])
                )
            )
        verdict = verdicts.get(e.dataset_id)
        if verdict is None:
            reasons.append(AtFlip(f"no parity verdict recorded: run lakehouse canary --smoke --dataset {e.dataset_id}"))
        elif verdict[0] not in ("ok", "native"):
            reasons.append(
                AtFlip(
                    f"latest parity verdict is {verdict[0]} ({verdict[1]:%Y-%m-%d %H:%M:%S} UTC): "
                    "run the canary until it says ok"
                )
            )
        elif verdict[0] == "ok" and (verdict[2] is None or verdict[2] < verdict[3]):
            reasons.append(
                AtFlip(
                    f"parity was last checked at Postgres version {verdict[2]}, it is now at "
                    f"{verdict[3]}: run lakehouse canary --smoke --dataset {e.dataset_id} again"
                )
            )
        if reasons:
            blocked.append(Blocked(e.dataset_id, name, tuple(reasons)))
    return blocked


REVERSE_ON = "lakehouse reverse on --dataset {id}"


def postgres_consumer_blockers(
    conn: psycopg.Connection, moved: list[Effect], datasets: dict
) -> dict[uuid.UUID, list[str]]:
    """{dataset: why what reads it from dataset_rows blocks its native writes}: a pipeline input (F3: the pipeline
    source CTE reads dataset_rows) or a declared Postgres-locked reader (reader_datasets.py). None of it blocks a
    dataset whose reverse mirror is on (flags/reverse_setting.py, the default): it applies each native commit back
    to dataset_rows, so those consumers keep their rows (docs/design/reverse-mirror.md). Where the reverse mirror
    cannot run (``capture.reverse_blocked``: capture mode after-commit before PostgreSQL 14) it counts as off.
    Three queries, whatever the number of datasets."""
    inputs = pipeline_input_dataset_ids(conn)
    locked = on_postgres(conn, {e.dataset_id: datasets[e.dataset_id][2] for e in moved})
    consumed = [e.dataset_id for e in moved if e.dataset_id in inputs or locked.get(e.dataset_id)]
    if not consumed:
        return {}
    settings = reverse_settings(conn, consumed)
    cannot_run = capture.reverse_blocked(conn)
    out: dict[uuid.UUID, list[str]] = {}
    for ds_id in consumed:
        s = settings.get(ds_id) or ReverseSetting(ds_id, DEFAULT_ON, "default")
        if s.enabled and not cannot_run:
            continue
        turn_on = REVERSE_ON.format(id=ds_id)
        off = (
            f"{s.describe()}: turn it on with `{turn_on}`"
            if not s.enabled
            else f"{s.describe()}, but it cannot run: {cannot_run}"
        )
        reasons = out.setdefault(ds_id, [])
        if ds_id in inputs:
            reasons.append(
                f"BLOCKED (pipeline input; reverse mirror off): a pipeline reads it from {dataset_rows.TABLE} (F3), which "
                f"stays fresh for a native dataset only through the reverse mirror; {off}"
            )
        if locked.get(ds_id):
            reasons.append(
                f"read from {dataset_rows.TABLE} by "
                + ", ".join(d.describe() for d in locked[ds_id])
                + ", locked to Postgres: Postgres would go stale for it without the "
                f"reverse mirror; {off} (or flip a compute reader once proven, or remove the declaration, lakehouse "
                "lakehouse pg-readers remove, once it no longer reads this dataset)"
            )
    return out


def check_postgres_consumers(conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str) -> None:
    """``postgres_consumer_blockers`` alone for a write flip, so its preflight refuses before it canaries (the
    gated set checks them again with every other gate)."""
    moved, datasets = effects(conn, flag, scope, mode)
    judged = [e for e in moved if e.after == NATIVE and datasets[e.dataset_id][3] == "tabular"]
    found = postgres_consumer_blockers(conn, judged, datasets)
    if found:
        blocked = [Blocked(e.dataset_id, e.name, tuple(found[e.dataset_id])) for e in judged if e.dataset_id in found]
        states = lifecycle_words(conn, [b.dataset_id for b in blocked[:_SHOWN]])
        raise _refusal(flag, mode, scope, blocked, (), scope_names(conn, datasets), states)


def _reader_soaks(
    conn, moved: list[Effect], datasets: dict, servable: list[Flag], stored: dict, soak_seconds: int, now
) -> dict[uuid.UUID, list[str]]:
    """{dataset: why its Iceberg-served readers have not soaked}: each reader's effective mode must have been
    iceberg or above for ``soak_seconds`` (from the audit), with no MISMATCH on the dataset and no fallback of
    that reader since."""
    if soak_seconds <= 0:
        return {}
    history = audit_history(conn, READ, [r.name for r in servable])
    earliest = None
    since: dict[tuple[uuid.UUID, str], Any] = {}
    for e in moved:
        ws_id = datasets[e.dataset_id][2]
        for r in servable:
            if rank(READ, resolve_for(r, stored[r.name], e.dataset_id, ws_id)) < rank(READ, "iceberg"):
                continue  # named as "still on Postgres" instead
            since[(e.dataset_id, r.name)] = t = effective_since(history[r.name], r, e.dataset_id, ws_id, "iceberg")
            if t is not None and (earliest is None or t < earliest):
                earliest = t
    found = latest_incidents(conn, [e.dataset_id for e in moved], earliest) if earliest else {}
    out: dict[uuid.UUID, list[str]] = {}
    for (ds_id, reader), t in since.items():
        if t is None:
            out.setdefault(ds_id, []).append(
                f"{reader}: no audit says when it reached iceberg (written outside "
                "the CLI?): set it again with lakehouse flags set to start its soak"
            )
            continue
        relevant = [
            i for i in found.get(ds_id, []) if i.what == MISMATCH or (i.what == FALLBACK and i.reader == reader)
        ]
        s = soak(f"{reader} on Iceberg", t, relevant, soak_seconds, {ds_id: datasets[ds_id][1]})
        if not s.soaked(now):
            out.setdefault(ds_id, []).append(s.describe(now))
    return out


def read_rollback_blockers(conn: psycopg.Connection, moved: list[Effect], datasets: dict) -> list[Blocked]:
    """Datasets written iceberg-native whose reader would go back to Postgres (stale there)."""
    down = [e for e in moved if rank(READ, e.after) < rank(READ, "iceberg") <= rank(READ, e.before)]
    if not down:
        return []
    writer_overrides = stored_overrides(conn, WRITE, [w.name for w in FLIPPABLE_WRITERS])
    blocked = []
    for e in down:
        ws_id = datasets[e.dataset_id][2]
        native = [
            w.name for w in FLIPPABLE_WRITERS if resolve_for(w, writer_overrides[w.name], e.dataset_id, ws_id) == NATIVE
        ]
        if native:
            blocked.append(
                Blocked(
                    e.dataset_id,
                    e.name,
                    (
                        f"written iceberg-native by {', '.join(native)}: Postgres no longer receives its rows, so a "
                        f"reader on Postgres ({e.after}) would serve rows the writer may not have put there; roll "
                        "the writer back first (write-flags set <writer> pg: its report says whether Postgres "
                        "holds every row or needs lakehouse backfill), then the readers",
                    ),
                )
            )
    return blocked


def proof_blockers(
    conn: psycopg.Connection, flag: Flag, moved: list[Effect], datasets: dict, needed: int | None = None
) -> list[Blocked]:
    """A compute reader (registry ``proof``) moving a dataset from Postgres to Iceberg: refused for every dataset its
    shadow reads have not proven (flags/proof.py). ``needed`` None: LAKEHOUSE_SHADOW_PROOF_READS."""
    if not flag.proof:
        return []
    up = [e for e in moved if rank(READ, e.before) < rank(READ, "iceberg") <= rank(READ, e.after)]
    if not up:
        return []
    needed = needed_reads(conn=conn) if needed is None else needed  # the one value of every process (flags/proof.py)
    found = proofs(conn, [flag.name], [e.dataset_id for e in up])
    blocked = []
    for e in up:
        p = found[(flag.name, e.dataset_id)]
        if not p.proven(needed):
            blocked.append(
                Blocked(
                    e.dataset_id,
                    e.name,
                    (
                        f"{flag.name} is not proven on it: shadow reads {p.describe(needed)} since its last change "
                        f"of schema, {needed} in a row needed (lakehouse shadow-proof show); keep it in shadow "
                        f"(lakehouse flags set {flag.name} shadow --dataset {e.dataset_id}) while it reads",
                    ),
                )
            )
    return blocked


def check_proof(conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str) -> None:
    """``proof_blockers`` alone for a read flip, so its preflight refuses before it canaries (the gated set checks
    it again with every other gate)."""
    if not flag.proof:
        return
    moved, datasets = effects(conn, flag, scope, mode)
    blocked = proof_blockers(conn, flag, moved, datasets)
    if blocked:
        raise _refusal(flag, mode, scope, blocked, (), scope_names(conn, datasets))


def _refusal(
    flag: Flag,
    mode: str | None,
    scope: Scope,
    blocked: list[Blocked],
    rules: Sequence[str] = (),
    names=None,
    states: dict | None = None,
) -> FlipRefused:
    verb = f"set {flag.name} {mode}" if mode is not None else f"clear {flag.name}"
    where = place(scope.scope, scope.scope_id, names or {})
    if rules:
        lines = [f"refused: {verb} ({where}) widens before the runbook's widening rules allow; nothing written:"]
        lines += [f"  {r}" for r in rules]
        if blocked:
            lines.append(f"  and it would move {len(blocked)} dataset(s) that are not ready:")
    else:
        lines = [f"refused: {verb} ({where}) would move {len(blocked)} dataset(s) that are not ready; nothing written:"]
    states = states or {}
    for b in blocked[:_SHOWN]:
        state = f", {states[b.dataset_id]}" if b.dataset_id in states else ""
        lines.append(f"  {b.name} ({b.dataset_id}){state}: " + "; ".join(b.reasons))
    if len(blocked) > _SHOWN:
        lines.append(f"  ... and {len(blocked) - _SHOWN} more")
    if scope.scope != DATASET and blocked:
        lines.append(
            f"  (a dataset-scoped override keeps one dataset where it is, e.g. "
            f"{'write-flags' if flag.kind == WRITE else 'flags'} set {flag.name} "
            f"{'pg' if flag.kind == WRITE else 'iceberg'} --dataset <id>)"
        )
    return FlipRefused("\n".join(lines))


def check_change(
    conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str | None, *, soak_seconds: int | None = None
) -> list[Effect]:
    """Raise FlipRefused when the change would strand consumers or widen too early; returns its effects
    otherwise. ``soak_seconds`` None: LAKEHOUSE_SOAK_SECONDS."""

    soak_seconds = configured_soak(conn, soak_seconds)
    now = _db_now(conn)
    moved, datasets = effects(conn, flag, scope, mode)
    if flag.kind == WRITE:
        refuse_completed_rollback(conn, flag, mode, scope, moved)
        # a workspace or global write flip leaves manifest datasets out (not applicable); one named alone is refused
        judged = [
            e for e in moved if e.after == NATIVE and (scope.scope == DATASET or datasets[e.dataset_id][3] == "tabular")
        ]
        blocked = write_flip_blockers(conn, judged, datasets, soak_seconds=soak_seconds, now=now)
    else:
        blocked = read_rollback_blockers(conn, moved, datasets) + proof_blockers(conn, flag, moved, datasets)
    names = scope_names(conn, datasets)
    rules = widen_blockers(conn, flag, scope, mode, moved, datasets, soak_seconds=soak_seconds, now=now, names=names)
    if blocked or rules:
        states = lifecycle_words(conn, [b.dataset_id for b in blocked[:_SHOWN]])
        raise _refusal(flag, mode, scope, blocked, rules, names, states)
    return moved


def refuse_completed_rollback(
    conn: psycopg.Connection, flag: Flag, mode: str | None, scope: Scope, moved: list[Effect]
) -> None:
    """A writer leaving iceberg_native for a completed dataset (runbooks/complete/: its Postgres rows are deleted)
    is refused before anything else is judged: the pg path would write into an emptied ``dataset_rows`` and every
    reader going back to Postgres would read nothing. The way back is a backfill from Iceberg first."""
    leaving = [e for e in moved if e.before == NATIVE and e.after != NATIVE]
    if not leaving:
        return
    found = holding(conn, [e.dataset_id for e in leaving])
    if not found:
        return
    verb = f"set {flag.name} {mode}" if mode is not None else f"clear {flag.name}"
    lines = [f"refused: {verb} ({scope}) would move completed dataset(s) off iceberg_native; nothing written:"]
    lines += [f"  {found[d].why_not_postgres()}" for d in sorted(found, key=str)[:_SHOWN]]
    if len(found) > _SHOWN:
        lines.append(f"  ... and {len(found) - _SHOWN} more")
    if scope.scope != DATASET:
        lines.append(
            f"  (or keep them native with a dataset-scoped override: write-flags set {flag.name} {NATIVE} --dataset <id>)"
        )
    if len(found) == 1 and scope.scope == DATASET:
        (only,) = found.values()
        raise FlipRefused(f"refused: {verb}: {only.why_not_postgres()}; nothing written")
    raise FlipRefused("\n".join(lines))


def scope_names(conn: psycopg.Connection, datasets: dict) -> dict:
    """Dataset names (from ``effects``' rows) and every workspace's name, by id: refusals name what they mean."""
    names = {i: r[1] for i, r in datasets.items()}
    names.update(app_tables.workspace_names(conn))
    return names


def lock_gates(conn: psycopg.Connection, dataset_id: uuid.UUID | None = None) -> None:
    """Take the lock every gated change holds until its transaction ends (re-entrant in one session), so a
    caller deciding a change from the flags it reads (auto-rollback) decides on what no one else is changing.
    The lifecycle's lock comes first — of ``dataset_id``, else of every dataset — as every verb takes it (one lock
    order, no deadlock with a verb in flight)."""
    if dataset_id is not None:
        lock_dataset(conn, dataset_id)
    else:
        lock_every_dataset(conn)
    _lock_gate(conn)


def _lock_gate(conn: psycopg.Connection) -> None:
    conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (_GATE_LOCK,))


def check_widen(
    conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str, *, soak_seconds: int | None = None
) -> None:
    """The widening rules alone (soak, writers' order), so a flip's preflight refuses before it canaries."""

    moved, datasets = effects(conn, flag, scope, mode)
    names = scope_names(conn, datasets)
    soak_seconds = configured_soak(conn, soak_seconds)
    rules = widen_blockers(
        conn, flag, scope, mode, moved, datasets, soak_seconds=soak_seconds, now=_db_now(conn), names=names
    )
    if rules:
        raise _refusal(flag, mode, scope, [], rules, names)


def _guard_with(soak_seconds: int | None):
    def guard(conn: psycopg.Connection, flag: Flag, scope: Scope, mode: str | None) -> None:
        _lock_gate(conn)  # inside the change's lifecycle transition (flags/overrides.py), which holds its lock
        check_change(conn, flag, scope, mode, soak_seconds=soak_seconds)

    return guard


def set_flag(
    conn: psycopg.Connection, kind: str, name: str, mode: str, *, soak_seconds: int | None = None, **kw
) -> Change:
    """``set_override`` behind the flip gates: what the CLI and the Dagster jobs call
    (``soak_seconds`` None: LAKEHOUSE_SOAK_SECONDS)."""
    return set_override(conn, kind, name, mode, guard=_guard_with(soak_seconds), **kw)


def clear_flag(conn: psycopg.Connection, kind: str, name: str, *, soak_seconds: int | None = None, **kw) -> Change:
    return clear_override(conn, kind, name, guard=_guard_with(soak_seconds), **kw)
