"""The stream's shards as the supervisor and the operator see them: the heartbeat rows (lakehouse_mirror_streams),
the supervisor's decision per shard (the mirror_poller sensor gathers the runs from Dagster and acts on them), and
each shard's state in words (`lakehouse status`, the migration overview, the ``stream_down`` alert).

SQL and plain data only, apart from mirror/stream.py (the loop, with the sync machinery behind it), so a reader of
the shards' state (`lakehouse status`) does not import pyiceberg and pyarrow."""

from __future__ import annotations

import dataclasses

import psycopg

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.settings import StreamSettings

STALE_AFTER_S = 10.0  # a holder whose heartbeat is this old is dead or hung: its run is failed and replaced


@dataclasses.dataclass(frozen=True)
class StreamRun:
    """A mirror_stream run queued or running (from the Dagster instance)."""

    run_id: str
    shard: int
    shard_count: int


@dataclasses.dataclass(frozen=True)
class ShardView:
    """A shard as its heartbeat row says it is (lakehouse_mirror_streams)."""

    shard: int
    run_id: str | None
    heartbeat_age: float | None  # seconds since its holder's last heartbeat; None: never streamed
    deadline_in: float | None  # seconds to its holder's deadline
    ended: bool
    last_commit_age: float | None
    syncs: int
    failures: int
    backlog: int
    lag_seconds: float
    started_age: float | None = None  # seconds since its holder took the shard's lock


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    shard: int
    start: bool  # request a new stream run for it
    dead_run_id: str | None  # its holder's run, whose heartbeat went stale: to be marked failed
    covered: bool  # a live stream covers its datasets (else the poller's batch runs do)
    why: str


def shard_views(conn: psycopg.Connection, shard_count: int) -> dict[int, ShardView]:
    rows = conn.execute(
        """select shard, run_id, extract(epoch from now() - heartbeat_at)::float8,
                  extract(epoch from deadline_at - now())::float8, ended_at is not null,
                  extract(epoch from now() - last_commit_at)::float8, syncs, failures, backlog, lag_seconds,
                  extract(epoch from now() - started_at)::float8
             from lakehouse_mirror_streams where shard_count = %s order by shard""",
        (shard_count,),
    ).fetchall()
    return {r[0]: ShardView(*r) for r in rows}


def record_beat(conn: psycopg.Connection, beat: dict) -> None:
    """A stream run's heartbeat on its shard (mirror/stream.py): taken (``started``), alive, or ``ended``, with its
    figures; what ``shard_views`` reads."""
    conn.execute(
        """insert into lakehouse_mirror_streams as m
                     (shard_count, shard, run_id, started_at, heartbeat_at, deadline_at, ended_at, last_commit_at,
                      last_dataset_id, syncs, failures, backlog, lag_seconds)
                   values (%(count)s, %(shard)s, %(run)s, now(), now(), to_timestamp(%(deadline)s),
                           case when %(ended)s then now() end, to_timestamp(%(commit)s), %(last)s, %(syncs)s,
                           %(failures)s, %(backlog)s, %(lag)s)
                   on conflict (shard_count, shard) do update set
                     run_id = excluded.run_id,
                     started_at = case when %(started)s then now() else m.started_at end,
                     heartbeat_at = now(), deadline_at = excluded.deadline_at, ended_at = excluded.ended_at,
                     last_commit_at = case when %(started)s then coalesce(excluded.last_commit_at, m.last_commit_at)
                                           else excluded.last_commit_at end,
                     last_dataset_id = coalesce(excluded.last_dataset_id, m.last_dataset_id),
                     syncs = excluded.syncs, failures = excluded.failures, backlog = excluded.backlog,
                     lag_seconds = excluded.lag_seconds""",
        beat,
    )


def shards_held(conn: psycopg.Connection, shard_count: int, *, started_within_s: float) -> int:
    """How many of the ``shard_count`` shards a stream run holds now (not ended, a heartbeat within two beats) that
    took it within the last ``started_within_s`` seconds (`lakehouse up`'s ready line: this stack's streams, not a
    row a killed one left)."""
    return fetch_value(
        conn.execute(
            """select count(*) from lakehouse_mirror_streams
                where shard_count = %s and shard < %s and ended_at is null
                  and heartbeat_at > now() - interval '3 seconds'
                  and started_at > now() - make_interval(secs => %s)""",
            (shard_count, shard_count, started_within_s),
        ),
        "the shards held",
    )


def handover_lead_s(lifetime_s: float) -> float:
    """How long before a run's deadline its successor is requested: enough for a launch to start and load the code
    (it then waits on the shard's lock), at most a quarter of the lifetime."""
    return min(30.0, lifetime_s / 4)


def plan_shards(views: dict[int, ShardView], runs: list[StreamRun], stream: StreamSettings) -> list[ShardPlan]:
    """Per shard of LAKEHOUSE_MIRROR_SHARDS: whether to start a run (none queued or running; or only the holder,
    whose deadline is near: its successor), whether its holder is dead (heartbeat older than STALE_AFTER_S while
    its run is still in flight), and whether a live stream covers it (a heartbeat within
    LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS)."""
    count = stream.shards
    lead = handover_lead_s(stream.lifetime_seconds)
    out = []
    for shard in range(count):
        view = views.get(shard)
        flying = [r.run_id for r in runs if r.shard == shard and r.shard_count == count]
        holder = view.run_id if view is not None and not view.ended and view.run_id in flying else None
        dead = None
        if holder is not None and view is not None and (view.heartbeat_age or 0.0) > STALE_AFTER_S:
            dead, holder = holder, None
            flying = [r for r in flying if r != dead]
        covered = view is not None and view.heartbeat_age is not None and view.heartbeat_age <= stream.down_seconds
        covered = covered and dead is None
        if not flying:
            why = "its holder's heartbeat is stale" if dead else "no stream run is queued or running"
            out.append(ShardPlan(shard, True, dead, covered, why))
        elif flying == [holder] and view is not None and view.deadline_in is not None and view.deadline_in <= lead:
            out.append(ShardPlan(shard, True, dead, covered, f"its run ends in {max(0.0, view.deadline_in):.0f}s"))
        else:
            out.append(ShardPlan(shard, False, dead, covered, "streaming"))
    return out


def shard_status(conn: psycopg.Connection, stream: StreamSettings) -> dict:
    """Each shard as an operator reads it (`lakehouse status`, the migration overview, the ``stream_down`` alert):
    its run, alive or not, its lag, its last commit, and for how long it has had no live stream (``down_s``; None
    while alive). One query.

    A shard is alive while its holder has not ended and beat its heartbeat within LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS.
    Not alive, it has had no live stream since its last heartbeat (a run that ended beats once as it lets go), or, if
    it never streamed, since the oldest of its sibling shards' runs took their shard: streaming is on at least that
    long (None when no shard of this count ever streamed: how long it has been on is not recorded anywhere)."""
    count = stream.shards
    views = shard_views(conn, count)
    starts = [v.started_age for v in views.values() if v.started_age is not None]
    since_on = max(starts) if starts else None
    shards = []
    for shard in range(count):
        v = views.get(shard)
        alive = v is not None and not v.ended and (v.heartbeat_age or 0.0) <= stream.down_seconds
        down = None if alive else (v.heartbeat_age if v is not None and v.heartbeat_age is not None else since_on)
        shards.append(
            {
                "shard": shard,
                "run_id": v.run_id if v else None,
                "alive": alive,
                "ended": bool(v and v.ended),
                "down_s": None if down is None else round(down, 1),
                "heartbeat_age_s": round(v.heartbeat_age, 1) if v and v.heartbeat_age is not None else None,
                "lag_s": round(v.lag_seconds, 1) if v else None,
                "backlog": v.backlog if v else None,
                "last_commit_age_s": round(v.last_commit_age, 1) if v and v.last_commit_age is not None else None,
                "syncs": v.syncs if v else 0,
                "failures": v.failures if v else 0,
            }
        )
    return {
        "on": stream.enabled,
        "shard_count": count,
        "down_after_s": stream.down_seconds,
        "shards": shards,
    }


STREAM_OFF = "mirror stream: off (LAKEHOUSE_MIRROR_STREAM); batch runs mirror every change"


def handing_over(s: dict, down_after_s: float) -> bool:
    """Its run let go at its deadline within the bound: a successor waiting on the lock takes it in a moment."""
    return not s["alive"] and s["ended"] and s["down_s"] is not None and s["down_s"] <= down_after_s


def shard_state(s: dict, down_after_s: float) -> str:
    """A shard's state in a few words: ``alive``, ``handing over``, or ``DOWN for 45 s (...)`` with why."""
    if s["alive"]:
        age = s.get("heartbeat_age_s")
        if age is not None and age > STALE_AFTER_S:  # still covering its datasets, but the poller is replacing it
            return (
                f"alive, heartbeat late ({age:.0f} s: the poller replaces a run silent for over {STALE_AFTER_S:.0f} s)"
            )
        return "alive"
    if handing_over(s, down_after_s):
        return f"handing over (its run let go {s['down_s']:.0f} s ago)"
    down = "DOWN" if s["down_s"] is None else f"DOWN for {s['down_s']:.0f} s"
    if s["run_id"] is None:
        return f"{down} (never streamed)"
    return f"{down} ({'its run ended and no successor took the shard' if s['ended'] else 'its run stopped beating'})"


def down_count(status: dict) -> int:
    """Shards with no live stream, a handover in progress not counted."""
    return sum(not s["alive"] and not handing_over(s, status["down_after_s"]) for s in status["shards"])


def _age(seconds: float | None, none: str = "none yet") -> str:
    return none if seconds is None else f"{seconds:.1f} s ago"


def shard_lines(status: dict) -> list[str]:
    """The shards for a terminal (`lakehouse status`): one line each, or one line when streaming is off."""
    if not status["on"]:
        return [STREAM_OFF]
    shards, bound = status["shards"], status["down_after_s"]
    lines = [
        f"mirror stream: {len(shards)} shard(s), {sum(s['alive'] for s in shards)} alive, {down_count(status)} DOWN "
        f"(DOWN: no heartbeat for {bound} s; batch runs cover its datasets meanwhile)"
    ]
    for s in shards:
        head = f"  shard {s['shard']} of {len(shards)}: {shard_state(s, bound)}"
        if s["run_id"] is None:
            lines.append(head)
            continue
        lines.append(
            f"{head}, run {s['run_id']}, heartbeat {_age(s['heartbeat_age_s'])}, lag {s['lag_s']:.1f} s "
            f"({s['backlog']} waiting), last commit {_age(s['last_commit_age_s'])}, {s['syncs']} syncs, "
            f"{s['failures']} failed"
        )
    return lines
