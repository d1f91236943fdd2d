"""The outbox, ``lakehouse_alerts``: every statement on the table (its owner): an event recorded once under its key,
then posted from there with retries, backoff, folding and shedding."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
import uuid
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_one, fetch_value
from lakehouse_dagster.status.alerts.kinds import (
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    CONDITIONS,
    DROPPED,
    FOLD_AT,
    FOLD_MAX,
    IDEMPOTENCY_FIELD,
    KEEP_DAYS,
    MAX_PENDING,
    MAX_POSTS_PER_TICK,
    PLURAL,
    TICK_BUDGET_SECONDS,
    Event,
    _duration,
    _line,
)
from lakehouse_dagster.status.alerts.webhook import PostFailed, _scrub, post_message
from lakehouse_dagster.tracking.datasets.fragments import LEFT_JOIN_DATASET_D_OF_P

# A MISMATCH row to read: its MISMATCH not recorded yet, or an auto-rollback outcome worth telling (something was
# rolled back, refused, left on, or failed: "already off" needs no one) not recorded yet. Every row returned gives
# an event that is recorded this tick, so a read never returns the same row twice and a full page is never read
# forever. {range}: the keyset page after the position, or the look-back behind it.
_MISMATCHES = (
    """
select * from (
  select p.id, p.dataset_id, d.name, p.source, p.run_id, p.pg_count, p.iceberg_count, p.pg_version, p.snapshot_id,
         p.mismatched_row_indexes, p.detail, p.checked_at,
         not exists (select 1 from lakehouse_alerts a where a.key = 'mismatch:' || p.id) as new_mismatch,
         (p.detail ? 'auto_rollback'
          and (coalesce(p.detail->'auto_rollback'->'error', 'null') not in ('null', 'false', '""', '0', '[]', '{{}}')
               or exists (select 1 from jsonb_array_elements(case jsonb_typeof(p.detail->'auto_rollback'->'actions')
                                                             when 'array' then p.detail->'auto_rollback'->'actions'
                                                             else '[]' end) a
                           where a->>'status' is distinct from 'already'))
          and not exists (select 1 from lakehouse_alerts a where a.key = 'auto_rollback:' || p.id)) as new_outcome
    from lakehouse_read_parity p
    """
    + LEFT_JOIN_DATASET_D_OF_P
    + """
   where p.verdict = 'MISMATCH' and {range}
) q
 where new_mismatch or new_outcome
 order by checked_at, id
 limit %(limit)s
"""
)
_AFTER = "(p.checked_at, p.id) > (%(at)s, %(id)s)"
_BEHIND = "p.checked_at > %(at)s - %(lookback)s and (p.checked_at, p.id) <= (%(at)s, %(id)s)"


def unalerted_mismatches(conn: psycopg.Connection, args: dict) -> tuple[list, list]:
    """The MISMATCH rows (``_MISMATCHES``) after the position in ``args``, and those in the look-back behind it, whose
    events are not recorded yet: the scan filters on this table inside its one limited statement, so it lives here
    with the table (``events.parity_events`` turns the rows into events)."""
    ahead = conn.execute(_MISMATCHES.format(range=_AFTER), args).fetchall()
    behind = conn.execute(_MISMATCHES.format(range=_BEHIND), args).fetchall()
    return ahead, behind


def unrecorded(conn: psycopg.Connection, keys: Sequence[str]) -> set[str]:
    """Which of the event keys are not in lakehouse_alerts yet (a look-back's second sight of an event is skipped
    before anything is done about it)."""
    if not keys:
        return set()
    rows = conn.execute(
        "select k from unnest(%s::text[]) k where not exists (select 1 from lakehouse_alerts a where a.key = k)",
        (list(keys),),
    ).fetchall()
    return {r[0] for r in rows}


def record(conn: psycopg.Connection, events: Sequence[Event], present: dict[str, set[str]]) -> list[Event]:
    """Record the events not recorded yet (returned), and mark resolved the open conditions of each kind in
    ``present`` whose key is no longer there (a kind left out could not be read this tick: left as it is)."""
    events = list({e.key: e for e in events}.values())
    with conn.transaction():
        new = set()
        if events:
            rows = conn.execute(
                """insert into lakehouse_alerts (key, kind, dataset_id, message)
                   select * from unnest(%s::text[], %s::text[], %s::uuid[], %s::text[])
                   on conflict (key) where resolved_at is null do nothing
                   returning key""",
                (
                    [e.key for e in events],
                    [e.kind for e in events],
                    [e.dataset_id for e in events],
                    [e.message for e in events],
                ),
            ).fetchall()
            new = {r[0] for r in rows}
        for kind, keys in present.items():
            conn.execute(
                "update lakehouse_alerts set resolved_at = now()"
                " where kind = %s and resolved_at is null and not (key = any(%s))",
                (kind, sorted(keys)),
            )
        conn.execute(
            """delete from lakehouse_alerts
                where coalesce(posted_at, dropped_at) < now() - make_interval(days => %s)
                  and (resolved_at is not null or kind <> all(%s))""",
            (KEEP_DAYS, list(CONDITIONS)),
        )
    return [e for e in events if e.key in new]


@dataclasses.dataclass
class Delivery:
    posted: int = 0  # events
    messages: int = 0
    failure: str | None = None  # the post that failed this tick (host and why)
    dropped: list[str] = dataclasses.field(default_factory=list)  # log lines
    pending: int = 0
    out_of_time: bool = False
    retry_seconds: float = 0.0
    next_attempt_at: dt.datetime | None = None  # the earliest pending event's next try, when none is due now


def backoff(failures: int, rng: random.Random | None = None) -> dt.timedelta:
    """How long an event waits after its ``failures``-th failed post: 30 s doubling per failure, at most 15 min, with
    jitter (a random 50-100% of it), so events and senders that failed together do not retry in step."""
    base = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** max(0, failures - 1))
    return dt.timedelta(seconds=base * (rng or random).uniform(0.5, 1.0))


# Composed into the queries below through psycopg.sql (named {pending} and {due} there), never by formatting.
_PENDING = sql.SQL("posted_at is null and dropped_at is null")


def _shed(conn: psycopg.Connection, max_pending: int) -> list[str]:
    """Past ``max_pending`` events waiting, the oldest are dropped (one line, and one event that says so, posted
    like any other): the bound on what an endless outage can pile up."""
    over = fetch_value(
        conn.execute(
            sql.SQL("select count(*) - %s from lakehouse_alerts where {pending}").format(pending=_PENDING),
            (max_pending,),
        ),
        "the count of waiting alerts",
    )
    if over <= 0:
        return []
    with conn.transaction():
        gone = conn.execute(
            sql.SQL(
                """update lakehouse_alerts set dropped_at = now(), last_error = 'dropped unsent: too many alerts waited'
                 where id in (select id from lakehouse_alerts where {pending} order by id limit %s)
                returning created_at"""
            ).format(pending=_PENDING),
            (over + 1,),  # (one more: room for the event that tells of the drop)
        ).fetchall()
        oldest = min(r[0] for r in gone)
        what = (
            f"{len(gone)} alert(s) recorded since {oldest:%Y-%m-%d %H:%M:%S} UTC were dropped unsent: more than "
            f"{max_pending} waited (the webhook has failed for a long time); the oldest went first"
        )
        act = (
            "their texts: select created_at, message from lakehouse_alerts where last_error = 'dropped unsent: too "
            "many alerts waited' order by id; check the receiver (LAKEHOUSE_ALERT_WEBHOOK_URL)"
        )
        e = Event(f"{DROPPED}:{uuid.uuid4()}", DROPPED, None, what, act)
        conn.execute(
            "insert into lakehouse_alerts (key, kind, message) values (%s, %s, %s)", (e.key, e.kind, e.message)
        )
    return [f"{what} ({act})"]


def deliver(
    conn: psycopg.Connection,
    url: str,
    *,
    timeout: float,
    retry_seconds: float,
    now: dt.datetime | None = None,
    post: Callable[[str, dict, float], None] = post_message,
    budget_seconds: float = TICK_BUDGET_SECONDS,
    max_posts: int = MAX_POSTS_PER_TICK,
    max_pending: int = MAX_PENDING,
    rng: random.Random | None = None,
) -> Delivery:
    """Post the events that are due (``now``: the tick's clock), oldest first: alone, or several of one kind as one
    message (``FOLD_AT``). A message's idempotency key (``idempotency_key`` in the body, header ``Idempotency-Key``)
    is stored with its events before the first attempt, and every retry sends the same events under the same key:
    a receiver that got a post which then timed out here sees the key again and can drop the repeat. A failed post
    waits ``backoff`` before its next try; the first failure ends the tick's posting (the receiver is down); a
    success makes every waiting event due at once (it is back). An event is dropped, with a log line, only when a
    post of it fails more than ``retry_seconds`` after it was recorded, or past ``max_pending`` waiting.
    Long on purpose: the key stored before the post, the post and the backoff or drop after it are one transaction's
    story per message."""
    now = now or dt.datetime.now(dt.UTC)
    out = Delivery(retry_seconds=retry_seconds)
    out.dropped += _shed(conn, max_pending)
    deadline = time.monotonic() + budget_seconds
    due = sql.SQL("{pending} and (next_attempt_at is null or next_attempt_at <= %(now)s)").format(pending=_PENDING)
    for _ in range(max_posts):
        remaining = deadline - time.monotonic()
        if remaining < min(timeout, 1.0):
            out.out_of_time = True
            break
        with conn.transaction():  # the message's events and key, fixed before the first attempt (and kept)
            head = conn.execute(
                sql.SQL("select kind, post_key from lakehouse_alerts where {due} order by id limit 1").format(due=due),
                {"now": now},
            ).fetchone()
            if head is None:
                break
            key = head[1]
            if key is None:
                group = conn.execute(
                    sql.SQL(
                        "select id from lakehouse_alerts where {due} and kind = %(kind)s and post_key is null"
                        " order by id limit %(n)s for update skip locked"
                    ).format(due=due),
                    {"now": now, "kind": head[0], "n": FOLD_MAX},
                ).fetchall()
                ids = [r[0] for r in group] if len(group) >= FOLD_AT else [r[0] for r in group[:1]]
                key = f"lakehouse-alert-{uuid.uuid4()}"
                conn.execute("update lakehouse_alerts set post_key = %s where id = any(%s)", (key, ids))
        with conn.transaction():
            batch = conn.execute(
                sql.SQL(
                    "select id, message, created_at, attempts from lakehouse_alerts where post_key = %s and {pending}"
                    " order by id for update skip locked"
                ).format(pending=_PENDING),
                (key,),
            ).fetchall()
            if not batch:  # another sender holds them
                break
            ids = [r[0] for r in batch]
            text = batch[0][1] if len(batch) == 1 else _folded(head[0], [r[1] for r in batch])
            try:
                post(url, {"text": text, IDEMPOTENCY_FIELD: key}, min(timeout, remaining))
            except PostFailed as exc:
                out.failure = _scrub(str(exc), url)
                wait = backoff(max(r[3] for r in batch) + 1, rng)  # (one message: its events fail together)
                gone = conn.execute(
                    """update lakehouse_alerts set attempts = attempts + 1, last_error = %(error)s,
                              next_attempt_at = %(next)s,
                              dropped_at = case when %(now)s - created_at > %(keep)s then now() end
                        where id = any(%(ids)s) returning dropped_at is not null, message, attempts""",
                    {
                        "error": out.failure,
                        "now": now,
                        "next": now + wait,
                        "keep": dt.timedelta(seconds=retry_seconds),
                        "ids": ids,
                    },
                ).fetchall()
                out.dropped += [
                    f"alert dropped after {n} failed post(s) over more than {_duration(retry_seconds)} "
                    f"(last: {out.failure}): {_line(m, 300)}"
                    for dropped, m, n in gone
                    if dropped
                ]
                break
            conn.execute(
                "update lakehouse_alerts set attempts = attempts + 1, posted_at = now(), last_error = null"
                " where id = any(%s)",
                (ids,),
            )
            conn.execute(
                sql.SQL(
                    "update lakehouse_alerts set next_attempt_at = null where {pending} and next_attempt_at > %s"
                ).format(pending=_PENDING),
                (now,),
            )
            out.posted += len(ids)
            out.messages += 1
    out.pending, out.next_attempt_at = fetch_one(
        conn.execute(
            sql.SQL(
                "select count(*), min(next_attempt_at) filter (where next_attempt_at > %s) from lakehouse_alerts"
                " where {pending}"
            ).format(pending=_PENDING),
            (now,),
        ),
        "the count of waiting alerts",
    )
    return out


def _folded(kind: str, messages: list[str]) -> str:
    return f"{len(messages)} {PLURAL[kind]}:\n" + "\n".join(f"• {m}" for m in messages)
