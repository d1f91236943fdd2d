"""Every move of a dataset goes through ``transition``: the lifecycle lock, the state before, the verb's effects,
then the state after derived from what the verb changed and checked against the table of transitions
(lifecycle/states.py) — an illegal move raises ``LifecycleRefused`` inside the verb's transaction, so its effects
roll back with it and nothing is written. Legal moves are stored with a new version and a history row.

The facts a state is derived from (flags, the reverse setting, the complete mark, the sync log) belong to the layers
above; they hand their ``derive`` in (flags/lifecycle_facts.py). A transition opened inside another one on the same
connection joins it: the outer one checks every dataset both touched, once, at its end.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence

import psycopg

from lakehouse_dagster.lifecycle import store
from lakehouse_dagster.lifecycle.errors import LifecycleRefused
from lakehouse_dagster.lifecycle.lock import lock_dataset, lock_every_dataset
from lakehouse_dagster.lifecycle.states import MIRROR, OBSERVE, PG, Facts, allowed, illegal, next_steps
from lakehouse_dagster.tracking.datasets import lookup, scopes

Derive = Callable[[psycopg.Connection, list[uuid.UUID]], dict[uuid.UUID, Facts]]
_SHOWN = 20


@dataclasses.dataclass
class _Open:
    conn: psycopg.Connection
    verb: str
    actor: str
    what: str
    derive: Derive
    every: bool
    before: dict[uuid.UUID, Facts]


_active: contextvars.ContextVar[_Open | None] = contextvars.ContextVar("lakehouse_lifecycle_open", default=None)


def _all_ids(conn: psycopg.Connection) -> list[uuid.UUID]:
    return scopes.all_ids(conn)


def _before(conn: psycopg.Connection, ids: list[uuid.UUID], derive: Derive, actor: str) -> dict[uuid.UUID, Facts]:
    """The stored state of each dataset; one without a row gets its derived state recorded first (``observe``)."""
    found = {d: f for d, (f, _v) in store.stored(conn, ids).items()}
    stale = [d for d in ids if d not in found or found[d].state == PG]
    if stale:
        derived = derive(conn, stale)
        store.record_many(conn, [(d, None, f) for d, f in derived.items() if d not in found], verb=OBSERVE, actor=actor)
        # still pg in the store while the forward mirror's first snapshot landed: that move first, as the mirror's
        mirrored = [
            (d, found[d], f)
            for d, f in derived.items()
            if d in found and not found[d].same_place(f) and allowed(PG, f.state, MIRROR)
        ]
        store.record_many(conn, mirrored, verb=MIRROR, actor=actor)
        found.update({d: f for d, f in derived.items() if d not in found})
        found.update({d: f for d, _b, f in mirrored})
    return found


def allowed_for(before: Facts, after: Facts, verb: str) -> bool:
    """``before → after`` by ``verb``, allowing the forward mirror's first snapshot to have landed meanwhile (it
    moves pg on without a verb's lock)."""
    if allowed(before.state, after.state, verb):
        return True
    if before.state == PG and allowed(PG, after.state, MIRROR):
        return True  # the first snapshot landed meanwhile (pg → mirrored / read-flipped)
    return before.state == PG and any(
        allowed(PG, mid, MIRROR) and allowed(mid, after.state, verb) for mid in ("mirrored", "read-flipped")
    )


@contextlib.contextmanager
def transition(
    conn: psycopg.Connection,
    verb: str,
    *,
    dataset_ids: Sequence[uuid.UUID] | None | Callable[[psycopg.Connection], Sequence[uuid.UUID] | None],
    derive: Derive,
    actor: str,
    what: str,
    wide: bool = False,
) -> Iterator[None]:
    """Run the caller's block as ``verb`` over ``dataset_ids`` (None: every dataset; a callable: read under the
    lock, for a workspace whose datasets may change) under the lifecycle lock, in one transaction with the check
    and the record of each dataset's move. ``wide``: a workspace or global verb (every dataset's lock exclusive,
    whatever the count). ``what``: the verb as the operator typed it, for the refusal."""
    outer = _active.get()
    if outer is not None and outer.conn is conn:
        yield from _join(outer, _ids(conn, dataset_ids))
        return
    with conn.transaction():
        known = None if callable(dataset_ids) or dataset_ids is None else list(dict.fromkeys(dataset_ids))
        every = wide or known is None or len(known) != 1  # a callable's datasets are known only under the lock
        if every:
            lock_every_dataset(conn)
        else:
            assert known is not None
            lock_dataset(conn, known[0])
        ids = _ids(conn, dataset_ids)
        scope = _all_ids(conn) if ids is None else ids
        opened = _Open(conn, verb, actor, what, derive, every, _before(conn, scope, derive, actor))
        token = _active.set(opened)
        try:
            yield
        finally:
            _active.reset(token)
        _settle(opened, ids is None)


def _ids(conn: psycopg.Connection, dataset_ids) -> list[uuid.UUID] | None:
    found = dataset_ids(conn) if callable(dataset_ids) else dataset_ids
    return None if found is None else list(dict.fromkeys(found))


def _join(outer: _Open, ids: list[uuid.UUID] | None) -> Iterator[None]:
    conn = outer.conn
    if not outer.every:
        if ids is None or len(ids) != 1 or ids[0] not in outer.before:
            lock_every_dataset(conn)  # widens the outer's lock: taken after its own, never the other way round
            outer.every = True
    scope = _all_ids(conn) if ids is None else ids
    new = [d for d in scope if d not in outer.before]
    outer.before.update(_before(conn, new, outer.derive, outer.actor))
    yield


def _settle(opened: _Open, every_dataset: bool) -> None:
    conn = opened.conn
    ids = list(opened.before)
    if every_dataset:  # a dataset created meanwhile is judged too
        ids += [d for d in _all_ids(conn) if d not in opened.before]
        opened.before.update(_before(conn, [d for d in ids if d not in opened.before], opened.derive, opened.actor))
    after = opened.derive(conn, ids)
    refusals: list[tuple[uuid.UUID, Facts, Facts, str]] = []
    moves: list[tuple[uuid.UUID, Facts | None, Facts]] = []
    writers: list[tuple[uuid.UUID, tuple[str, ...]]] = []
    for d in ids:
        b, a = opened.before.get(d), after.get(d)
        if b is None or a is None:
            continue  # deleted meanwhile
        if b.same_place(a) and not illegal(a):
            if b.native_writers != a.native_writers:
                writers.append((d, a.native_writers))
            continue
        why = illegal(a) or (
            None
            if allowed_for(b, a, opened.verb)
            else f"{opened.verb} never moves a dataset from {b.state} to {a.state}"
        )
        if why:
            refusals.append((d, b, a, why))
        else:
            moves.append((d, b, a))
    if refusals:
        raise _refusal(conn, opened, refusals)
    store.record_many(conn, moves, verb=opened.verb, actor=opened.actor)
    store.set_writers(conn, writers)


def _refusal(conn: psycopg.Connection, opened: _Open, refusals: list) -> LifecycleRefused:
    ids = [r[0] for r in refusals]
    names: dict[uuid.UUID, str] = lookup.names_of(conn, ids)

    def line(d, b: Facts, a: Facts, why: str) -> str:
        return (
            f"dataset {names.get(d, '?')} ({d}) is {b.describe()}; this would leave it {a.describe()}: {why}; "
            f"the way on: {next_steps(b.state, d)}"
        )

    if len(refusals) == 1:
        return LifecycleRefused(f"refused: {opened.what}: {line(*refusals[0])}; nothing written")
    lines = [
        f"refused: {opened.what} would move {len(refusals)} dataset(s) where their lifecycle does not go; nothing written:"
    ]
    lines += [f"  {line(*r)}" for r in refusals[:_SHOWN]]
    if len(refusals) > _SHOWN:
        lines.append(f"  ... and {len(refusals) - _SHOWN} more")
    return LifecycleRefused("\n".join(lines))


def current(conn: psycopg.Connection, dataset_ids: Sequence[uuid.UUID], derive: Derive, actor: str) -> dict:
    """The state of each dataset as stored; a dataset without a row, or still ``pg`` in the store while its first
    snapshot has landed, is brought up to date first (recorded as ``observe`` / ``mirror``). For readers above the
    layers that own the facts (status, the CLI, the write paths): they pass ``derive``.

    A ``pg`` row whose dataset has no succeeded sync is answered as stored, read with that fact in one statement
    (issue 45: every pg-path write of such a dataset re-derived it). Re-deriving could only record the mirror's
    first snapshot (``pg → mirrored / read-flipped``, both need a succeeded sync); whatever else the facts say of
    it (a writer flag or a complete mark set behind the lifecycle's back) is no ``mirror`` move, and the stored
    ``pg`` was kept and returned for it before as well (test_lifecycle.py)."""
    ids = list(dict.fromkeys(dataset_ids))
    if not ids:
        return {}
    rows = store.stored_and_synced(conn, ids)
    found = {d: f for d, (f, _synced) in rows.items()}
    stale = [d for d in ids if d not in found or (found[d].state == PG and rows[d][1])]
    if stale:
        derived = derive(conn, stale)
        try:
            with conn.transaction():
                # a reader never waits on a verb: one moving these datasets holds their rows until it commits (and
                # records them itself), so past a short wait the answer comes from the facts, nothing stored
                before = conn.execute("select current_setting('lock_timeout')").fetchone()
                conn.execute("select set_config('lock_timeout', '200ms', true)")
                again = {d: f for d, (f, _v) in store.stored(conn, stale).items()}
                first = {d: f for d, f in derived.items() if d not in again}
                store.observe_many(conn, first, actor=actor)
                mirrored = [
                    (d, again[d], f)
                    for d, f in derived.items()
                    if d in again
                    and again[d].state == PG
                    and not again[d].same_place(f)
                    and allowed(PG, f.state, MIRROR)
                ]
                store.record_many(conn, mirrored, verb=MIRROR, actor=actor)
                conn.execute("select set_config('lock_timeout', %s, true)", (before[0] if before else "0",))
            found.update(first)
            found.update({d: f for d, _b, f in mirrored})
            found.update({d: f for d, f in again.items() if d not in found})
        except psycopg.errors.LockNotAvailable:
            found.update({d: f for d, f in derived.items() if d not in found or found[d].state == PG})
    return {d: found[d] for d in ids if d in found}


def stored_states(conn: psycopg.Connection, dataset_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Facts]:
    """The stored state alone, for readers below the facts' owners (the canary): no row → not in the result."""
    return {d: f for d, (f, _v) in store.stored(conn, list(dataset_ids)).items()}


def versions(conn: psycopg.Connection, dataset_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
    return {d: v for d, (_f, v) in store.stored(conn, list(dataset_ids)).items()}
