"""The states a dataset goes through, who is authoritative in each, and the table of transitions: the one
definition every verb is checked against (lifecycle/transition.py) and docs/lifecycle.md is tested against.

A state is (name, reverse): the reverse mirror's setting matters only where Iceberg is the truth. A transition is
allowed when the pair (before → after) is in ``TRANSITIONS`` for the verb asking and the state after is ``legal``.
"""

from __future__ import annotations

import dataclasses
import uuid

PG, MIRRORED, READ_FLIPPED, NATIVE = "pg", "mirrored", "read-flipped", "native"
COMPLETING, COMPLETE, RESTORING = "completing", "complete", "restoring"
STATES = (PG, MIRRORED, READ_FLIPPED, NATIVE, COMPLETING, COMPLETE, RESTORING)

# Who holds the truth: where a write must land, what a reader may trust
POSTGRES, ICEBERG = "postgres", "iceberg"
AUTHORITY = {
    PG: POSTGRES,
    MIRRORED: POSTGRES,
    READ_FLIPPED: POSTGRES,
    NATIVE: ICEBERG,
    COMPLETING: ICEBERG,
    COMPLETE: ICEBERG,
    RESTORING: ICEBERG,
}

# The verbs that move a dataset (every caller says which it is)
MIRROR = "mirror"  # the forward mirror's first snapshot of the dataset
READER_FLAG = "reader-flag"  # flags set/clear/flip at any scope, a reader's auto-rollback, a plan's stage or abort
WRITER_FLAG = "writer-flag"  # write-flags set/clear/flip at any scope, a writer rollback, auto-rollback, plans
REVERSE = "reverse"  # lakehouse reverse on/off/clear at any scope
COMPLETE_VERB = "complete"  # lakehouse complete: start, then finish
RESTORE = "restore"  # lakehouse backfill of a completed dataset: start, then finish
OBSERVE = "observe"  # the first time a dataset's state is recorded (no move)
VERBS = (MIRROR, READER_FLAG, WRITER_FLAG, REVERSE, COMPLETE_VERB, RESTORE, OBSERVE)


@dataclasses.dataclass(frozen=True)
class Transition:
    before: str
    after: str
    verbs: tuple[str, ...]
    precondition: str  # what the verb checks before it (its gates), in a sentence
    effect: str  # what happens to each store


TRANSITIONS: tuple[Transition, ...] = (
    Transition(PG, MIRRORED, (MIRROR,), "the dataset changed", "the forward mirror writes its first snapshot"),
    Transition(
        PG,
        READ_FLIPPED,
        (MIRROR,),
        "a reader already resolves to iceberg for it",
        "the first snapshot; the freshness gate starts serving Iceberg",
    ),
    Transition(
        MIRRORED,
        READ_FLIPPED,
        (READER_FLAG,),
        "canary ok, the soak of the narrower flip (Fase 1)",
        "a reader serves Iceberg; Postgres stays the truth",
    ),
    Transition(READ_FLIPPED, MIRRORED, (READER_FLAG,), "none (Postgres is the truth)", "readers serve Postgres again"),
    Transition(
        READ_FLIPPED,
        NATIVE,
        (WRITER_FLAG,),
        "Fase 4's gates: readers on Iceberg, identity, caught up, parity ok, G1–G4",
        "the writer lands in Iceberg; the forward mirror stops; the reverse mirror (if on) copies back",
    ),
    Transition(
        MIRRORED,
        NATIVE,
        (WRITER_FLAG,),
        "Fase 4's gates (no Iceberg-servable reader left on Postgres)",
        "as read-flipped → native",
    ),
    Transition(PG, NATIVE, (WRITER_FLAG,), "Fase 4's gates (a dataset new under a native scope)", "as above"),
    Transition(
        NATIVE,
        READ_FLIPPED,
        (WRITER_FLAG,),
        "the rollback's gates: the reverse caught up, or a backfill first",
        "writes land in Postgres again; the forward mirror resumes",
    ),
    Transition(NATIVE, MIRRORED, (WRITER_FLAG,), "as native → read-flipped", "as native → read-flipped"),
    Transition(NATIVE, PG, (WRITER_FLAG,), "as native → read-flipped", "as native → read-flipped"),
    Transition(NATIVE, NATIVE, (REVERSE,), "none", "the reverse mirror starts (a full re-sync) or stops"),
    Transition(
        NATIVE,
        COMPLETING,
        (COMPLETE_VERB,),
        "native for the soak, reverse parity ok at the current snapshot, no Postgres-locked consumer",
        "the reverse off; dataset_rows deleted in batches",
    ),
    Transition(COMPLETING, COMPLETE, (COMPLETE_VERB,), "no row left", "Iceberg alone holds the rows"),
    Transition(
        COMPLETE,
        RESTORING,
        (RESTORE,),
        "none",
        "the reverse on; dataset_rows re-synced in full from the current snapshot",
    ),
    Transition(COMPLETING, RESTORING, (RESTORE,), "none", "as complete → restoring (the batches stop)"),
    Transition(RESTORING, NATIVE, (RESTORE,), "the re-sync landed", "Postgres holds every row again (reverse on)"),
)
_ALLOWED = {(t.before, t.after): t.verbs for t in TRANSITIONS}


def allowed(before: str, after: str, verb: str) -> bool:
    return verb in _ALLOWED.get((before, after), ())


@dataclasses.dataclass(frozen=True)
class Facts:
    """A dataset's lifecycle as stored (or as derived from the facts the verbs change)."""

    state: str
    reverse: bool | None  # None where Postgres is the truth: the reverse mirror has nothing to do
    native_writers: tuple[str, ...] = ()

    @property
    def authority(self) -> str:
        return AUTHORITY[self.state]

    def same_place(self, other: Facts) -> bool:
        return (self.state, self.reverse) == (other.state, other.reverse)

    def describe(self) -> str:
        if self.reverse is None:
            return self.state
        return f"{self.state} (reverse {'on' if self.reverse else 'off'})"


def illegal(f: Facts) -> str | None:
    """Why the state ``f`` cannot exist (None: it can)."""
    if f.state not in STATES:
        return f"unknown state {f.state!r}"
    if AUTHORITY[f.state] == POSTGRES:
        return None if f.reverse is None else "a Postgres-authoritative state has no reverse setting"
    if f.state in (COMPLETING, COMPLETE) and f.reverse:
        return "Postgres holds none (or not all) of its rows: the reverse mirror stays off until a restore"
    if f.state == RESTORING and not f.reverse:
        return "a restore re-syncs dataset_rows through the reverse mirror: it stays on until the restore ends"
    if f.state != NATIVE and not f.native_writers:
        return "its rows live in Iceberg only: no writer may leave iceberg_native before a restore"
    return None


def next_steps(state: str, dataset_id: uuid.UUID) -> str:
    """The legal ways on from ``state``, as commands (every refusal ends with them)."""
    d = f"--dataset {dataset_id}"
    return {
        PG: f"mirror it first (lakehouse sync {d})",
        MIRRORED: f"flip its readers (lakehouse flags flip <reader> {d}), then its writers",
        READ_FLIPPED: f"flip a writer (lakehouse write-flags flip <writer> {d}) or its readers back (flags set <reader> off)",
        NATIVE: f"complete it (lakehouse complete {d}) or roll its writers back "
        f"(lakehouse write-flags set <writer> pg {d})",
        COMPLETING: f"let it finish (lakehouse complete {d} resumes it) or restore it (lakehouse backfill {d})",
        COMPLETE: f"restore it from Iceberg first (lakehouse backfill {d})",
        RESTORING: f"finish the restore (lakehouse backfill {d})",
    }[state]


def markdown_table() -> str:
    """``TRANSITIONS`` as the table docs/lifecycle.md shows (test_lifecycle.py checks the page holds it verbatim)."""
    lines = [
        "| from | to | verbs | precondition (the verb's gates) | effect |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in TRANSITIONS:
        verbs = ", ".join(f"`{v}`" for v in t.verbs)
        lines.append(f"| `{t.before}` | `{t.after}` | {verbs} | {t.precondition} | {t.effect} |")
    return "\n".join(lines)
