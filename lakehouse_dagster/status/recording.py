"""What changed since the recorder's cursor: the durable facts every writer leaves in Postgres, whoever it is (the
CLI, a Dagster run, the HTTP service, a rollout plan, another process), read in the order their transactions
ended, so the Dagster instance can show each change (the lakehouse_recorder sensor, dagster/defs/recording/).

Six append-style streams, each with its own position:

* ``syncs``     iceberg_sync_log rows that succeeded (a mirror sync, a native write, a compaction): the table changed;
* ``flags``     lakehouse_flag_audit (every set and clear, auto-rollbacks included);
* ``backfills`` lakehouse_pg_reconciled rows of a backfill: Postgres got the rows only Iceberg held;
* ``sweeps``    lakehouse_orphan_sweeps: a sweep removed a table's orphan files;
* ``verdicts``  lakehouse_read_parity: a canary, check or first native sync recorded a verdict (migration 030);
* ``fallbacks`` lakehouse_read_fallbacks: a reader fell back to Postgres (any process, or an app through the
  service's POST /lakehouse/fallback);
* ``lifecycle`` lakehouse_lifecycle_history: a dataset moved in its lifecycle (lifecycle/, migration 036) — a
  complete retired its Postgres rows, a restore brought them back, a flip or a rollback moved it.

A flag change at workspace or global scope changes the modes of every dataset of that scope: it is fanned out
(``Fanout``), a page of at most ``limit`` datasets a tick, one event per dataset whatever the number of changes
behind it. A change that arrives while a pass of its scope is under way restarts that pass where it stands and
wraps around, so every dataset is shown after the newest change and none waits behind a stream of changes.

Each row carries the id of the transaction that wrote it (migration 028). A bigserial id is drawn before commit,
so "id > last" skips a row that commits late; the position is a transaction id X instead, with the mirror poller's
invariant (mirror/poller.py): every row written by a transaction below X has been read. After a complete read the
next X is the read's snapshot xmin; a row at or above xmin is already committed (we read it) but a transaction
below it may still commit, so X cannot pass it yet: such rows are reported at once and remembered in the position
(``seen``, by id and transaction id) so that the next reads, which see them again, do not report them twice.

Rows from before migration 028 carry no transaction id and are never read. So that a partition page shows its
table as it is from the start, the recorder's first ticks also page once through every dataset with a succeeded
sync (``seed_page``, ``limit`` datasets a tick): the caller records those its instance does not show yet.

A sync written by a Dagster run materializes the partition itself (mirror_job, mirror_batch_job, ingest_job), or
not (the write_flip job's first native sync): the dataset waits while that run is in flight, then the caller
records it unless the partition's latest materialization already shows the table's current snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable

import psycopg
from psycopg import sql

SYNCS, FLAGS, BACKFILLS, SWEEPS, VERDICTS, FALLBACKS, LIFECYCLE = (
    "syncs",
    "flags",
    "backfills",
    "sweeps",
    "verdicts",
    "fallbacks",
    "lifecycle",
)

# stream -> (table, transaction id column, which rows, columns read)
_STREAMS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    SYNCS: ("iceberg_sync_log", "changed_xid", "status = 'succeeded'", ("dataset_id", "sync_id", "run_id")),
    FLAGS: (
        "lakehouse_flag_audit",
        "xid",
        "true",
        ("at", "action", "kind", "name", "scope", "scope_id", "before_mode", "after_mode", "note", "actor"),
    ),
    BACKFILLS: (
        "lakehouse_pg_reconciled",
        "xid",
        "how = 'backfill'",
        ("dataset_id", "snapshot_id", "rows_copied", "rows_removed", "rows_moved", "actor", "at"),
    ),
    SWEEPS: (
        "lakehouse_orphan_sweeps",
        "xid",
        "true",
        ("dataset_id", "files_removed", "bytes_removed", "grace_seconds", "actor", "at"),
    ),
    VERDICTS: ("lakehouse_read_parity", "xid", "true", ("dataset_id", "verdict", "source", "checked_at")),
    FALLBACKS: ("lakehouse_read_fallbacks", "xid", "true", ("dataset_id", "reader", "at")),
    LIFECYCLE: (
        "lakehouse_lifecycle_history",
        "xid",
        "before_state is not null",  # a first sight records no move
        ("dataset_id", "version", "before_state", "after_state", "after_reverse", "verb", "actor", "at"),
    ),
}
STREAMS = tuple(_STREAMS)

SEEN_MAX = 2000  # rows above the horizon remembered per stream; past it they wait until they are final
WAITING_MAX = 1000  # datasets waiting for their runs; past it they are recorded at once (a duplicate, never a gap)
WAIT_MAX_SECONDS = 900.0  # a run still "in flight" this long after its sync (a dead worker): recorded anyway


@dataclasses.dataclass(frozen=True)
class Position:
    """Where one stream stands: every row of a transaction below ``xid`` is read; ``after_id`` pages within
    ``xid`` when a read was cut at the per-tick cap; ``seen`` = (row id, transaction id) reported already."""

    xid: int = 0
    after_id: int | None = None
    seen: frozenset[tuple[int, int]] = frozenset()

    def as_json(self) -> dict:
        return {"xid": self.xid, "after_id": self.after_id, "seen": sorted([list(e) for e in self.seen])}

    @classmethod
    def from_json(cls, data: dict) -> Position:
        after = data.get("after_id")
        return cls(
            int(data.get("xid", 0)),
            int(after) if after is not None else None,
            frozenset(map(tuple, data.get("seen", []))),
        )


@dataclasses.dataclass(frozen=True)
class Waiting:
    runs: tuple[str, ...]  # Dagster runs in flight that wrote the dataset's table
    since: float  # epoch seconds: when the dataset started waiting


GLOBAL = "global"  # the fan-out pass of a global change; a workspace's pass is keyed by the workspace's id

# What is left of a fan-out pass: dataset id intervals (after, upto], in order; None is open-ended.
Interval = tuple[uuid.UUID | None, uuid.UUID | None]
EVERY: tuple[Interval, ...] = ((None, None),)


def restarted(left: tuple[Interval, ...] | None) -> tuple[Interval, ...]:
    """A pass after a new change of its scope: every dataset again, starting where the pass stands (the datasets
    it had not reached yet come first, then it wraps around to those it had shown before the change)."""
    at = left[0][0] if left else None
    return EVERY if at is None else ((at, None), (None, at))


@dataclasses.dataclass(frozen=True)
class Cursor:
    positions: dict[str, Position] = dataclasses.field(default_factory=dict)
    waiting: dict[uuid.UUID, Waiting] = dataclasses.field(default_factory=dict)
    pruned_at: float = 0.0  # epoch seconds of the last removal of deleted datasets' partitions (the caller's)
    seeded: bool = False  # the first pass over every synced dataset is done
    seed_after: uuid.UUID | None = None  # where that pass stands
    # Fan-out passes under way: GLOBAL or a workspace id -> what is left of it (at most one pass per scope).
    fanout: dict[str, tuple[Interval, ...]] = dataclasses.field(default_factory=dict)
    # Reverse mirrors whose partition page says they are behind (status/reverse_page.py): dataset -> the snapshot the
    # copy held then.
    reverse_behind: dict[uuid.UUID, int | None] = dataclasses.field(default_factory=dict)
    # Table partitions this recorder showed a snapshot on lately: dataset -> (that snapshot, until when, epoch s); the
    # next ticks check that no older snapshot's event, written after it, is the partition's newest (issue 42).
    shown: dict[uuid.UUID, tuple[int, float]] = dataclasses.field(default_factory=dict)

    def position(self, stream: str) -> Position:
        return self.positions.get(stream, Position())

    def dumps(self) -> str:
        return json.dumps(
            {
                "positions": {s: p.as_json() for s, p in self.positions.items()},
                "waiting": {str(d): {"runs": list(w.runs), "since": w.since} for d, w in self.waiting.items()},
                "pruned_at": self.pruned_at,
                "seeded": self.seeded,
                "seed_after": str(self.seed_after) if self.seed_after else None,
                "fanout": {k: [[_text(a), _text(b)] for a, b in left] for k, left in self.fanout.items() if left},
                "reverse_behind": {str(d): snap for d, snap in self.reverse_behind.items()},
                "shown": {str(d): [snap, until] for d, (snap, until) in self.shown.items()},
            },
            sort_keys=True,
        )

    @classmethod
    def loads(cls, raw: str | None) -> Cursor:
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(
            {s: Position.from_json(p) for s, p in data.get("positions", {}).items() if s in _STREAMS},
            {uuid.UUID(d): Waiting(tuple(w["runs"]), float(w["since"])) for d, w in data.get("waiting", {}).items()},
            float(data.get("pruned_at", 0.0)),
            bool(data.get("seeded", False)),
            uuid.UUID(data["seed_after"]) if data.get("seed_after") else None,
            {
                k: tuple((_uuid_or_none(a), _uuid_or_none(b)) for a, b in left)
                for k, left in data.get("fanout", {}).items()
                if left
            },
            {uuid.UUID(d): snap for d, snap in data.get("reverse_behind", {}).items()},
            {uuid.UUID(d): (int(v[0]), float(v[1])) for d, v in data.get("shown", {}).items()},
        )


def _text(v: uuid.UUID | None) -> str | None:
    return str(v) if v is not None else None


def _uuid_or_none(v: str | None) -> uuid.UUID | None:
    return uuid.UUID(v) if v else None


@dataclasses.dataclass(frozen=True)
class Change:
    stream: str
    id: int
    xid: int
    row: dict  # the stream's columns


def read_stream(conn: psycopg.Connection, stream: str, pos: Position, limit: int) -> tuple[list[Change], Position]:
    """The rows of ``stream`` written since ``pos`` (at most ``limit`` read; those already reported left out), and
    the next position (never behind ``pos``)."""
    return read_by_xid(conn, stream, _STREAMS[stream], pos, limit)


def read_by_xid(
    conn: psycopg.Connection, stream: str, spec: tuple[str, str, str, tuple[str, ...]], pos: Position, limit: int
) -> tuple[list[Change], Position]:
    """``read_stream`` over any append-only table whose rows carry their transaction's id: ``spec`` = (table, its
    xid8 column, which rows (SQL, a constant of the caller's), the columns read). The alerts sensor reads the
    rollout plans' events this way too."""
    table, xid_col, where, cols = spec
    # One statement: the horizon (the snapshot's xmin) comes from the snapshot the rows were read in, also when
    # none are. Taken in a second statement, it would come from a newer snapshot, and a transaction committing in
    # between would fall below it unread, for good.
    query = sql.SQL(
        "select h.xmin, r.* from (select pg_snapshot_xmin(pg_current_snapshot())::text::bigint as xmin) h"
        " left join lateral (select id, {x}::text::bigint as row_xid, {cols} from {t}"
        " where {x} >= %(xid)s::text::xid8"
        " and (%(after)s::bigint is null or ({x}, id) > (%(xid)s::text::xid8, %(after)s::bigint))"
        " and {where} order by {x}, id limit %(limit)s) r on true order by r.row_xid, r.id"
    ).format(
        x=sql.Identifier(xid_col),
        cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
        t=sql.Identifier(table),
        where=sql.SQL(where),
    )
    fetched = conn.execute(query, {"xid": str(pos.xid), "after": pos.after_id, "limit": limit + 1}).fetchall()
    xmin = fetched[0][0]
    fetched = [(r[1], r[2], *r[3:]) for r in fetched if r[1] is not None]
    truncated = len(fetched) > limit
    rows = fetched[:limit]
    final = [r for r in rows if r[1] < xmin]  # no transaction below them can still commit: their order is final
    nxt: tuple[int, int | None]
    if not truncated:
        nxt = (max(pos.xid, xmin), None)
    elif final:
        nxt = (final[-1][1], final[-1][0])
    else:  # a full page above the horizon: stay until the transactions below it end
        nxt = (pos.xid, pos.after_id)

    def read_again(entry: tuple[int, int]) -> bool:  # (id, xid): would a read from ``nxt`` return it?
        row_id, xid = entry
        return xid >= nxt[0] if nxt[1] is None else (xid, row_id) > nxt

    seen = {e for e in pos.seen if read_again(e)}
    changes = []
    for r in rows:
        entry = (r[0], r[1])
        if entry in pos.seen:
            continue
        if read_again(entry):
            if len(seen) >= SEEN_MAX:
                continue  # not reported: read again (and reported) once it is final
            seen.add(entry)
        changes.append(Change(stream, r[0], r[1], dict(zip(cols, r[2:]))))
    return changes, Position(nxt[0], nxt[1], frozenset(seen))


@dataclasses.dataclass(frozen=True)
class Plan:
    """One tick of the recorder: what to record, and the cursor after it."""

    tables: dict[uuid.UUID, list[Change]]  # datasets whose table changed and no run in flight wrote it (+ syncs)
    seeded: list[uuid.UUID]  # datasets of the first pass: recorded only if the instance does not show them yet
    sweeps: list[Change]
    backfills: list[Change]
    flags: list[Change]
    waiting: dict[uuid.UUID, Waiting]  # datasets left waiting for a run in flight
    cursor: Cursor
    # Datasets whose modes, verdict or fallbacks changed without an event of their own: the caller shows their
    # state once each (unless another event of the tick already does), saying why.
    refresh: dict[uuid.UUID, list[str]] = dataclasses.field(default_factory=dict)
    # Lifecycle moves that changed what Postgres holds (complete, restore): an event on the postgres/dataset_rows page
    lifecycle: list[Change] = dataclasses.field(default_factory=list)

    @property
    def dataset_ids(self) -> set[uuid.UUID]:
        """Every dataset this tick records something about (their state is read once)."""
        ids = set(self.tables) | set(self.seeded) | set(self.refresh)
        ids |= {c.row["dataset_id"] for c in [*self.sweeps, *self.backfills, *self.lifecycle]}
        ids |= {c.row["scope_id"] for c in self.flags if c.row["scope"] == "dataset" and c.row["scope_id"]}
        return ids


def plan_recording(
    conn: psycopg.Connection,
    cursor: Cursor,
    *,
    limit: int,
    in_flight: Callable[[set[str]], set[str]],
    now: float | None = None,
) -> Plan:
    """Read every stream since ``cursor`` (at most ``limit`` rows each) and decide which datasets' tables to record
    now. ``in_flight`` answers, in one call, which of the given Dagster run ids are queued or running."""
    now = time.time() if now is None else now
    read: dict[str, list[Change]] = {}
    positions = {}
    for stream in STREAMS:
        read[stream], positions[stream] = read_stream(conn, stream, cursor.position(stream), limit)
    touched: dict[uuid.UUID, list[Change]] = {}
    for c in read[SYNCS]:
        touched.setdefault(c.row["dataset_id"], []).append(c)
    runs = {ds: set(w.runs) for ds, w in cursor.waiting.items()}
    for ds, changes in touched.items():
        runs.setdefault(ds, set()).update(c.row["run_id"] for c in changes if c.row["run_id"])
    busy = in_flight(set().union(*runs.values())) if runs else set()
    seeded, seed_after, done = (
        ([], cursor.seed_after, True) if cursor.seeded else seed_page(conn, cursor.seed_after, limit)
    )
    tables: dict[uuid.UUID, list[Change]] = {}
    waiting: dict[uuid.UUID, Waiting] = {}
    for ds in [*cursor.waiting, *(d for d in touched if d not in cursor.waiting)]:
        still = runs.get(ds, set()) & busy
        since = cursor.waiting[ds].since if ds in cursor.waiting else now
        if still and now - since < WAIT_MAX_SECONDS and len(waiting) < WAITING_MAX:
            waiting[ds] = Waiting(tuple(sorted(still)), since)
        else:
            tables[ds] = touched.get(ds, [])
    refresh: dict[uuid.UUID, list[str]] = {}
    for c in read[VERDICTS]:
        at = c.row["checked_at"].isoformat(timespec="seconds")
        refresh.setdefault(c.row["dataset_id"], []).append(f"verdict {c.row['verdict']} ({c.row['source']}, {at})")
    for c in read[FALLBACKS]:
        at = c.row["at"].isoformat(timespec="seconds")
        refresh.setdefault(c.row["dataset_id"], []).append(f"read fallback of {c.row['reader']} ({at})")
    moved_rows: list[Change] = []
    for c in read[LIFECYCLE]:
        r = c.row
        if r["verb"] == "mirror":
            continue  # the first snapshot: its table event shows it (the move is recorded whenever a reader looks)
        refresh.setdefault(r["dataset_id"], []).append(
            f"lifecycle {r['before_state']} → {r['after_state']} ({r['verb']} by {r['actor']})"
        )
        if r["verb"] in ("complete", "restore"):
            moved_rows.append(c)
    passes, why = fanout_changes(cursor.fanout, read[FLAGS])
    fanned, passes = fanout_page(conn, passes, limit)
    for ds, ws, key in fanned:
        lines = refresh.setdefault(ds, [])
        lines.append(why.get(key) or _pass_why(key))
        if key == GLOBAL and str(ws) in why:  # its workspace's change of this tick, whose pass the global one ended
            lines.append(why[str(ws)])
    return Plan(
        tables,
        [d for d in seeded if d not in tables and d not in waiting],
        read[SWEEPS],
        read[BACKFILLS],
        read[FLAGS],
        waiting,
        Cursor(positions, waiting, cursor.pruned_at, done, None if done else seed_after, passes),
        refresh,
        moved_rows,
    )


def _scope_key(c: Change) -> str | None:
    """The fan-out pass a flag change needs: GLOBAL, a workspace's id, or None (a dataset's own change)."""
    if c.row["scope"] == "global":
        return GLOBAL
    if c.row["scope"] == "workspace" and c.row["scope_id"]:
        return str(c.row["scope_id"])
    return None


def _pass_why(key: str) -> str:
    return f"a flag change at {'global scope' if key == GLOBAL else f'workspace {key}'}"


def fanout_changes(
    passes: dict[str, tuple[Interval, ...]], flags: list[Change]
) -> tuple[dict[str, tuple[Interval, ...]], dict[str, str]]:
    """The passes after this tick's workspace and global flag changes (coalesced: one pass per scope; a global one
    covers every dataset, so it ends the workspace passes), and a line per scope saying which changes it shows."""
    out = dict(passes)
    why: dict[str, list[str]] = {}
    for c in flags:
        key = _scope_key(c)
        if key is None:
            continue
        r = c.row
        word = "reader" if r["kind"] == "read" else "writer"
        why.setdefault(key, []).append(f"{r['action']} {word} {r['name']} {r['after_mode'] or 'cleared'}")
        if key == GLOBAL:
            out = {GLOBAL: restarted(out.get(GLOBAL))}
        else:
            out[key] = restarted(out.get(key))
    lines = {}
    for key, changes in why.items():
        shown = ", ".join(dict.fromkeys(changes[:5])) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
        lines[key] = f"{_pass_why(key)}: {shown}"
    return out, lines


def fanout_page(
    conn: psycopg.Connection, passes: dict[str, tuple[Interval, ...]], limit: int
) -> tuple[list[tuple[uuid.UUID, uuid.UUID | None, str]], dict[str, tuple[Interval, ...]]]:
    """The next ``limit`` tabular datasets of the passes under way (global first), each with its workspace and its
    pass, and what is left of the passes: one query per interval read, at most ``limit`` datasets whatever the
    number of changes."""
    got: list[tuple[uuid.UUID, uuid.UUID | None, str]] = []
    left = dict(passes)
    for key in sorted(left, key=lambda k: (k != GLOBAL, k)):
        intervals = list(left[key])
        while intervals and len(got) < limit:
            after, upto = intervals[0]
            budget = limit - len(got)
            ids = [
                (r[0], r[1])
                for r in conn.execute(
                    "select id, workspace_id from datasets where kind = 'tabular'"
                    " and (%(ws)s::uuid is null or workspace_id = %(ws)s::uuid)"
                    " and (%(after)s::uuid is null or id > %(after)s::uuid)"
                    " and (%(upto)s::uuid is null or id <= %(upto)s::uuid)"
                    " order by id limit %(n)s",
                    {"ws": None if key == GLOBAL else key, "after": after, "upto": upto, "n": budget + 1},
                ).fetchall()
            ]
            got += [(d, ws, key) for d, ws in ids[:budget]]
            if len(ids) > budget:  # more in this interval: the next tick goes on after the last one read
                intervals[0] = (ids[budget - 1][0], upto)
                break
            intervals.pop(0)
        if intervals:
            left[key] = tuple(intervals)
        else:
            del left[key]
        if len(got) >= limit:
            break
    return got, left


def seed_page(
    conn: psycopg.Connection, after: uuid.UUID | None, limit: int
) -> tuple[list[uuid.UUID], uuid.UUID | None, bool]:
    """The first pass: the next ``limit`` tabular datasets with a succeeded sync (by id), where the pass stands,
    and whether it is done."""
    ids = [
        r[0]
        for r in conn.execute(
            "select id from datasets where kind = 'tabular' and mirrored_version is not null"
            " and (%s::uuid is null or id > %s::uuid) order by id limit %s",
            (after, after, limit + 1),
        ).fetchall()
    ]
    done = len(ids) <= limit
    ids = ids[:limit]
    return ids, (ids[-1] if ids else after), done


def deleted_dataset_keys(conn: psycopg.Connection, keys: list[str]) -> list[str]:
    """The partition keys (dataset ids) whose dataset no longer exists, in one query. A key that is not a uuid
    was never a dataset partition of ours: it is left alone."""
    ids = []
    for k in keys:
        try:
            ids.append(uuid.UUID(k))
        except ValueError:
            continue
    if not ids:
        return []
    gone = conn.execute(
        "select k from unnest(%s::uuid[]) k where not exists (select 1 from datasets d where d.id = k)", (ids,)
    ).fetchall()
    return sorted(str(r[0]) for r in gone)
