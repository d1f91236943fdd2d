"""Auto-rollback: a canary that finds a caught-up dataset MISMATCH takes it off Iceberg at once for every
reader serving it from there (runbook Fase 1: "MISMATCH → STOP, roll back"); a writer whose first native
sync mismatches goes back to pg (Fase 4 step 3). Both at dataset scope, one override per flag.

Every canary path (the CLI, the schedule, the parity check, the flip preflight, the first native sync)
records its verdict through ``record_and_roll_back`` (or runs ``run_canary_and_roll_back``), which calls
``after_record`` for a MISMATCH: one hook, applied by the caller. The comparison (parity/canary.py) only returns
and records verdicts; it never changes a flag.

Each change is the operator's own gated ``set_flag`` (same audit row, same gate lock), noted
``auto-rollback: MISMATCH (<canary source>, <run id>)`` — the run id is the Dagster run's, or
``parity <id>`` (the verdict's row) for a canary outside Dagster. The flags are read and the changes made
in one transaction under the gate lock, so an operator's concurrent change is either seen or waits, and a
second canary on the same MISMATCH finds the readers already off and writes nothing.

When the gate refuses (a reader of a dataset written iceberg-native may not go below iceberg: Postgres is
stale for it), the MISMATCH is not the reader's: the outcome says REFUSED, loudly, and claims nothing.
``LAKEHOUSE_AUTO_ROLLBACK=false``: nothing is written; the outcome names what still serves Iceberg and the
command to roll it back by hand.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

import psycopg

from lakehouse_dagster.core.errors import FlipRefused, LakehouseError
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import NATIVE, lock_gates, set_flag
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_words
from lakehouse_dagster.flags.registry import COMMAND, FLIPPABLE_WRITERS, READ, READERS, WRITE, rank
from lakehouse_dagster.flags.resolver import DATASET_OVERRIDE, FlagResolver, invalidate_local
from lakehouse_dagster.mirror.native_run import ways_forward
from lakehouse_dagster.parity import canary
from lakehouse_dagster.parity.verdicts import add_to_detail
from lakehouse_dagster.routing.read_router import ICEBERG, decide, freshness
from lakehouse_dagster.runbooks import reverse_parity
from lakehouse_dagster.runbooks.first_native_canary import SOURCE as FIRST_NATIVE_SYNC

log = logging.getLogger("lakehouse_dagster.parity")

NOTE = "auto-rollback: MISMATCH ({source}, {run})"
ROLLED_BACK, ALREADY, REFUSED, DISABLED = "rolled-back", "already", "refused", "disabled"
_READ_OFF, _WRITE_BACK = "off", "pg"


@dataclasses.dataclass
class Action:
    """One reader (or writer) of the dataset and what auto-rollback did with it."""

    kind: str  # read | write
    flag: str
    before: str  # its effective mode when decided
    after: str  # off (reader) | pg (writer)
    status: str  # rolled-back | already | refused | disabled
    audit_id: int | None = None
    detail: str = ""

    def command(self, dataset_id: uuid.UUID) -> str:
        return f"{COMMAND[self.kind]} set {self.flag} {self.after} --dataset {dataset_id}"


@dataclasses.dataclass
class Outcome:
    dataset_id: uuid.UUID
    dataset: str
    source: str
    note: str
    enabled: bool
    actions: list[Action] = dataclasses.field(default_factory=list)
    next_steps: str = ""  # a writer rollback: what the operator must do about the Iceberg-only rows
    error: str | None = None  # the rollback itself failed: nothing is claimed

    def with_status(self, status: str) -> list[Action]:
        return [a for a in self.actions if a.status == status]

    @property
    def rolled_back(self) -> list[Action]:
        return self.with_status(ROLLED_BACK)

    @property
    def loud(self) -> bool:
        """Something still serves the mismatching data: a refusal, a failure, or auto-rollback off."""
        return bool(self.error or self.with_status(REFUSED) or self.with_status(DISABLED))

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "dataset": self.dataset,
            "source": self.source,
            "note": self.note,
            "enabled": self.enabled,
            "error": self.error,
            "next_steps": self.next_steps or None,
            "rolled_back": [dataclasses.asdict(a) for a in self.rolled_back],
            "actions": [dataclasses.asdict(a) for a in self.actions],
            "lines": self.lines(),
        }

    def lines(self) -> list[str]:
        """For people: one line per flag, what was done (or not) and why."""
        who = f"{self.dataset} ({self.dataset_id})"
        out = []
        for a in self.actions:
            what = "reader" if a.kind == READ else "writer"
            if a.status == ROLLED_BACK:
                out.append(
                    f"auto-rollback: {what} {a.flag} {a.before} → {a.after} for {who} at dataset scope "
                    f"(audit #{a.audit_id})"
                )
            elif a.status == ALREADY:
                out.append(
                    f"auto-rollback: {what} {a.flag} already {a.before} at dataset scope for {who}; nothing written"
                )
            elif a.status == REFUSED:
                out.append(f"AUTO-ROLLBACK REFUSED: {what} {a.flag} stays {a.before} for {who}: {a.detail}")
            else:
                out.append(
                    f"AUTO-ROLLBACK OFF (LAKEHOUSE_AUTO_ROLLBACK=false): {what} {a.flag} still {a.before} "
                    f"for {who}; roll back by hand: {a.command(self.dataset_id)}"
                )
        if self.error:
            out.append(
                f"AUTO-ROLLBACK FAILED for {who}: {self.error}; nothing is claimed rolled back — check "
                f"lakehouse flags list --dataset {self.dataset_id}"
            )
        elif not self.actions:
            out.append(
                f"auto-rollback: nothing to roll back for {who} "
                + (
                    "(its writer is not iceberg_native)"
                    if self.source == FIRST_NATIVE_SYNC
                    else "(no reader serves it from Iceberg)"
                )
            )
        if self.next_steps:
            out.append(f"  next: {self.next_steps}")
        return out


def lines_of(v) -> list[str]:
    """What auto-rollback did for a recorded verdict, for people (empty: it did not run)."""
    return list((v.detail.get("auto_rollback") or {}).get("lines", []))


def after_record(
    conn: psycopg.Connection,
    v,
    *,
    source: str,
    run_id: str | None,
    parity_id: int,
    settings: Settings,
) -> Outcome | None:
    """Roll back what serves a MISMATCH verdict just recorded as row ``parity_id``; the outcome goes to
    ``v.detail["auto_rollback"]`` and to that row. ``conn``: autocommit (or the caller's transaction)."""
    if v.verdict != "MISMATCH":
        return None
    out = Outcome(
        v.dataset_id,
        v.dataset,
        source,
        NOTE.format(source=source, run=run_id or f"parity {parity_id}"),
        settings.rollout.auto_rollback,
    )
    actor = f"{settings.project.actor} (auto-rollback)"
    try:
        if source == FIRST_NATIVE_SYNC and v.detail.get("writer"):
            _writer(conn, out, str(v.detail["writer"]), actor)
        else:
            _readers(conn, out, actor)
    except Exception as exc:  # report it with the verdict, never as a rollback that happened
        out.actions = [a for a in out.actions if a.status != ROLLED_BACK]  # its transaction rolled back
        out.error = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(exc, LakehouseError):
            out.error = f"{type(exc).__name__}: {out.error}"
    for line in out.lines():
        (log.error if out.loud else log.warning)("%s", line)
    v.detail["auto_rollback"] = out.as_dict()
    add_to_detail(conn, parity_id, "auto_rollback", v.detail["auto_rollback"])
    return out


def _readers(conn: psycopg.Connection, out: Outcome, actor: str) -> None:
    """Every reader the read router would serve from Iceberg for the dataset → off at dataset scope."""
    ds = out.dataset_id
    with conn.transaction():
        if out.enabled:
            lock_gates(conn, ds)  # decide on flags no one else is changing (released at commit)
        flags = FlagResolver(conn, ttl_seconds=60)  # a new resolver: its first fill reads the flags now
        fresh = freshness(conn, ds, exact=True)
        native = any(flags.resolve(WRITE, w.name, ds).mode == NATIVE for w in FLIPPABLE_WRITERS)
        for reader in READERS:  # the router decides who serves Iceberg (a reader whose ceiling is off never does)
            res = flags.resolve(READ, reader, ds)
            # a reader left below iceberg is served Iceberg only because the dataset is written natively (the
            # router never serves Postgres then): it was never flipped, there is nothing to roll back
            if rank(READ, res.mode) < rank(READ, "iceberg") or decide(reader, ds, res, fresh, native).source != ICEBERG:
                if res.reason == DATASET_OVERRIDE and res.mode == _READ_OFF != res.ceiling:  # rolled back before
                    out.actions.append(Action(READ, reader, res.mode, _READ_OFF, ALREADY))
                continue
            action = Action(READ, reader, res.mode, _READ_OFF, DISABLED)
            out.actions.append(action)
            if out.enabled:
                _set(conn, action, ds, out.note, actor, native)
    invalidate_local()  # committed now: this process sees it at once


def _writer(conn: psycopg.Connection, out: Outcome, writer: str, actor: str) -> None:
    """The writer whose first native sync mismatched → pg at dataset scope; the rows it wrote are Iceberg-only."""
    ds = out.dataset_id
    with conn.transaction():
        if out.enabled:
            lock_gates(conn, ds)
        flags = FlagResolver(conn, ttl_seconds=60)
        res = flags.resolve(WRITE, writer, ds)
        if res.mode != NATIVE:
            if res.reason == DATASET_OVERRIDE and res.mode == _WRITE_BACK:
                out.actions.append(Action(WRITE, writer, res.mode, _WRITE_BACK, ALREADY))
            return
        action = Action(WRITE, writer, res.mode, _WRITE_BACK, DISABLED)
        out.actions.append(action)
        if out.enabled:
            _set(conn, action, ds, out.note, actor, True)
        others = [
            w.name for w in FLIPPABLE_WRITERS if w.name != writer and flags.resolve(WRITE, w.name, ds).mode == NATIVE
        ]
    invalidate_local()
    if action.status != ROLLED_BACK:
        return
    steps = [f"the rows {writer} wrote natively exist only in Iceberg: {ways_forward(ds)}"]
    if others:
        steps.append(f"still iceberg_native for it: {', '.join(others)}")
    state = lifecycle_words(conn, [ds]).get(ds)  # after the rollback's transition: what the dataset is now
    out.next_steps = (f"now {state}; " if state else "") + "; ".join(steps)


def _set(conn: psycopg.Connection, action: Action, ds: uuid.UUID, note: str, actor: str, native: bool) -> None:
    try:
        change = set_flag(conn, action.kind, action.flag, action.after, dataset=ds, note=note, actor=actor)
    except FlipRefused as exc:  # nothing written (its savepoint rolled back); say why, loudly
        action.status = REFUSED
        gate = " ".join(str(exc).split())
        action.detail = (
            f"the MISMATCH is not a reader problem — the dataset is written iceberg-native, so "
            f"Postgres is not authoritative for it; investigate the writer (gate: {gate})"
            if native and action.kind == READ
            else f"the flip gate refuses it: {gate}"
        )
        return
    action.status, action.audit_id = ROLLED_BACK, change.audit.id if change.audit else None


def record_and_roll_back(
    conn: psycopg.Connection, v, *, source: str = "canary", run_id: str | None = None, settings: Settings | None = None
) -> int:
    """Record a verdict (parity.canary.record), then roll back what serves it when it is a MISMATCH. Every
    runbook, job and command that records a verdict goes through here; returns the verdict's row id."""
    parity_id = canary.record(conn, v, source=source, run_id=run_id)
    after_record(conn, v, source=source, run_id=run_id, parity_id=parity_id, settings=settings or Settings.from_env())
    return parity_id


def run_canary_and_roll_back(conn: psycopg.Connection, dsn: str, catalog, settings: Settings, **kwargs):
    """parity.canary.run_canary, each MISMATCH rolled back as soon as it is recorded (before the next dataset).
    A native dataset with the reverse mirror on is compared both ways (runbooks/reverse_parity.py): Iceberg is the
    truth there, so its MISMATCH repairs the copy by a full reverse re-sync and rolls nothing back."""
    source, run_id = kwargs.get("source", "canary"), kwargs.get("run_id")
    lag_before: dict = kwargs.pop("reverse_lag_before", None) or {}  # reverse_parity.catch_up's, to record
    both_ways = reverse_parity.both_ways_dataset_ids(conn)

    def compare(dsn, catalog, settings, ds_id, *, smoke: bool):
        if ds_id not in both_ways:
            return None
        v = reverse_parity.reverse_parity(dsn, catalog, settings, ds_id, smoke=smoke)
        if v is not None and ds_id in lag_before:
            v.detail["reverse"]["lag_before_s"] = lag_before[ds_id]
        return v

    def roll_back(v, parity_id: int) -> None:
        if reverse_parity.is_reverse_verdict(v):
            if v.verdict == canary.MISMATCH:
                reverse_parity.repair_copy(conn, dsn, catalog, settings, v, parity_id)
            return
        after_record(conn, v, source=source, run_id=run_id, parity_id=parity_id, settings=settings)

    return canary.run_canary(conn, dsn, catalog, settings, on_recorded=roll_back, evaluate_with=compare, **kwargs)
