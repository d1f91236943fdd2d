"""Alerts: what needs an operator, posted once to a Slack-compatible webhook (``LAKEHOUSE_ALERT_WEBHOOK_URL``).

Nine kinds of event, each found where it is durable:

* ``run_failed`` — a failed run of a lakehouse job (the Dagster instance; the sensor reads them and passes them in);
* ``mismatch`` and ``auto_rollback`` — a MISMATCH verdict and what auto-rollback did about it
  (``lakehouse_read_parity``, its ``detail->'auto_rollback'``);
* ``wedged`` — a sync stuck ``running`` or ``failed`` (``parity.canary.wedged_syncs``);
* ``freshness`` — a flipped dataset behind the mirror past ``LAKEHOUSE_LAGGING_AFTER_SECONDS`` (``status/lag.py``, the one
  definition of lag);
* ``native_unsafe`` — a dataset written iceberg-native that fails the write-flip gates (``routing/native_guard.py``);
* ``stream_down`` — a shard of the mirror stream with no live stream for longer than
  ``LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS`` while ``LAKEHOUSE_MIRROR_STREAM`` is on (``mirror/stream.py``
  ``shard_status``, what ``lakehouse status`` and the overview show);
* ``reverse_behind`` — a dataset written iceberg-native whose reverse mirror has lacked a native commit for longer than
  ``LAKEHOUSE_REVERSE_LAG_ALERT_SECONDS`` (``mirror/reverse_lag.py``, what the overview and ``/metrics`` show): its
  Postgres-locked consumers read an old copy, and a writer rollback would need a backfill;
* ``rollout`` — a rollout plan that paused, waits for an approval, or aborted (the plans' own event log; the sensor
  reads it and passes the events in, as it does the failed runs: plans sit above this layer).

Each event is recorded once in ``lakehouse_alerts`` under a key naming it (the parity row, the run, the sync, the
dataset, the shard), then posted from there: a restart neither posts it again nor loses it, a post that failed is
retried with exponential backoff and jitter (``next_attempt_at``) under the same idempotency key (``post_key``), and
only a post that fails more than ``LAKEHOUSE_ALERT_RETRY_SECONDS`` (a day) after the event was recorded, or more than
``MAX_PENDING`` events waiting, drops one, with a log line. A condition (wedged, freshness, native_unsafe,
stream_down, reverse_behind) is one event while it lasts; when it ends its row is marked resolved, and if it comes back that is a
new event. The cursor (the sensor's) only moves forward and past every page it reads (keyset positions on (time,
id)); behind it a look-back reads again what may have committed late, and the keys make a second sight of an event
harmless.

The webhook URL is a secret (its path is the credential): it is never logged, stored, put in a message or an
exception; a failed post names the receiver's host at most. One post waits ``LAKEHOUSE_ALERT_TIMEOUT_SECONDS`` at
most, a tick posts for ``TICK_BUDGET_SECONDS`` at most and stops at the first failure (the receiver is down: the rest
wait for the next tick), so a receiver that fails or hangs never stalls the sensor.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import hashlib
import json
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg
from psycopg import sql

from lakehouse_dagster.core.db import fetch_one, fetch_value
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.flipped import flipped_dataset_ids
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.mirror.reverse_lag import reverse_lags
from lakehouse_dagster.mirror.shards import shard_status
from lakehouse_dagster.parity.canary import wedged_syncs
from lakehouse_dagster.routing.native_guard import unsafe_native_datasets
from lakehouse_dagster.status import recording
from lakehouse_dagster.status.lag import behind_datasets, lagging_past

RUN_FAILED, MISMATCH, AUTO_ROLLBACK = "run_failed", "mismatch", "auto_rollback"
WEDGED, FRESHNESS, NATIVE_UNSAFE, ROLLOUT = "wedged", "freshness", "native_unsafe", "rollout"
STREAM_DOWN, REVERSE_BEHIND = "stream_down", "reverse_behind"
DROPPED = "dropped"  # alerts dropped unsent past MAX_PENDING: one event says how many
KINDS = (
    RUN_FAILED,
    MISMATCH,
    AUTO_ROLLBACK,
    WEDGED,
    FRESHNESS,
    NATIVE_UNSAFE,
    STREAM_DOWN,
    REVERSE_BEHIND,
    ROLLOUT,
    DROPPED,
)
CONDITIONS = (
    WEDGED,
    FRESHNESS,
    NATIVE_UNSAFE,
    STREAM_DOWN,
    REVERSE_BEHIND,
)  # states, not moments: one event per episode
TITLE = {
    RUN_FAILED: "Lakehouse run failed",
    MISMATCH: "Parity MISMATCH",
    AUTO_ROLLBACK: "Auto-rollback",
    WEDGED: "Wedged sync",
    FRESHNESS: "Freshness breach",
    NATIVE_UNSAFE: "Native-safety",
    STREAM_DOWN: "Mirror stream down",
    REVERSE_BEHIND: "Reverse mirror behind",
    ROLLOUT: "Rollout plan",
    DROPPED: "Alerts dropped",
}
PLURAL = {
    RUN_FAILED: "failed lakehouse runs",
    MISMATCH: "parity MISMATCHes",
    AUTO_ROLLBACK: "auto-rollbacks",
    WEDGED: "wedged syncs",
    FRESHNESS: "freshness breaches",
    NATIVE_UNSAFE: "native-safety findings",
    STREAM_DOWN: "mirror stream shards down",
    REVERSE_BEHIND: "reverse mirrors behind",
    ROLLOUT: "rollout plan events",
    DROPPED: "notices of dropped alerts",
}

# A MISMATCH row committed after a later one was read, or whose auto-rollback outcome is written after the row
# itself, is still seen: each tick reads back this far behind its cursor (the keys skip what is recorded).
PARITY_LOOKBACK = dt.timedelta(hours=1)
RUNS_LOOKBACK = dt.timedelta(minutes=10)
SCAN_LIMIT = 500  # MISMATCH rows read per tick (a storm is read over several ticks)
FOLD_AT = 3  # this many pending events of one kind or more go out as one message ...
FOLD_MAX = 20  # ... of at most this many
MAX_POSTS_PER_TICK = 20
BACKOFF_FIRST_SECONDS = 30.0  # a failed post's event waits this long (with jitter), doubling per failure ...
BACKOFF_MAX_SECONDS = 900.0  # ... up to this
MAX_PENDING = 10_000  # events waiting at most: past it the oldest are dropped, with one event that says so
IDEMPOTENCY_FIELD = "idempotency_key"  # in every body (and the header Idempotency-Key): fixed per message
RUNS_LOOKBACK_READ = 1000  # failed runs of the look-back read again per tick at most (the newest of them)
TICK_BUDGET_SECONDS = 20.0  # a sensor tick has 60 s (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS)
KEEP_DAYS = 30  # posted or dropped events older than this are deleted (an open condition is kept)
ENV = "LAKEHOUSE_ALERT_WEBHOOK_URL"


# ---------------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FailedRun:
    """A failed Dagster run, as the sensor read it from the instance."""

    run_id: str
    job_name: str
    updated_at: dt.datetime
    reason: str  # why: the first failed step's error (a refusal's reason), else the run's failure message
    dataset_ids: tuple[str, ...] = ()
    dataset_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PlanEvent:
    """A rollout plan's event that needs an operator (paused, approval needed, aborted), as the sensor read it from
    the plans' event log."""

    event_id: int
    plan_id: uuid.UUID
    plan: str  # what the plan moves, e.g. "reader export.stream → iceberg"
    event: str  # paused | approval-needed | aborted
    stage: int | None  # 0-based
    reason: str


@dataclasses.dataclass(frozen=True)
class Event:
    key: str  # <kind>:<what it is about>; unique among open events
    kind: str
    dataset_id: uuid.UUID | None
    what: str  # what happened, naming the dataset
    act: str  # the command or job to act on it

    @property
    def message(self) -> str:
        return f"{TITLE[self.kind]}: {self.what}\n→ {self.act}"


def _who(name: str | None, dataset_id: object) -> str:
    return f"{name or '(deleted dataset)'} ({dataset_id})"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _line(text: object, limit: int = 300) -> str:
    one = " ".join(str(text or "").split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


# What to do about a failed run of each job (the run's log has the step's reason).
_RUN_ACTS = {
    "mirror_batch_job": "the mirror poller retries the failed datasets by itself; to mirror one now: "
    "lakehouse sync --dataset {ds}",
    "mirror_job": "the mirror poller retries it; to mirror it now: lakehouse sync --dataset {ds}",
    "parity_canary_batch_job": "each failed dataset's check result says why; re-check one: "
    "lakehouse canary --smoke --dataset {ds}",
    "parity_canary_job": "its check results say why; re-check it: lakehouse canary --smoke --dataset {ds}",
    "ingest_job": "the step's reason says what to fix; re-run it: lakehouse ingest --dataset {ds} --writer <writer>",
    "native_safety_report": "fix each dataset's reasons, or roll its writer back: "
    "lakehouse write-flags set <writer> pg --dataset <uuid>",
}


def failed_run_event(run: FailedRun) -> Event:
    # (a batch run's names tag is cut to 255 characters: its ids say how many datasets it had)
    shown, total = run.dataset_names[:5], max(len(run.dataset_names), len(run.dataset_ids))
    names = ", ".join(shown) + (f" and {total - len(shown)} more" if shown and total > len(shown) else "")
    about = f" for {names}" if names else (f" for {total} dataset(s)" if total > 1 else "")
    ds = run.dataset_ids[0] if len(run.dataset_ids) == 1 else "<uuid>"
    hint = _RUN_ACTS.get(run.job_name, "fix what the failed step says, then launch the job again")
    return Event(
        key=f"{RUN_FAILED}:{run.run_id}",
        kind=RUN_FAILED,
        dataset_id=_uuid(run.dataset_ids[0]) if len(run.dataset_ids) == 1 else None,
        what=f"job {run.job_name} run {run.run_id[:8]}{about}: {_line(run.reason) or 'no reason recorded'}",
        act=f"Dagster UI, Runs → {run.run_id}; {hint.format(ds=ds)}",
    )


_PLAN_ACT = {
    "paused": "look: lakehouse rollout status {id}; then lakehouse rollout resume {id}, or abort {id} (jobs "
    "rollout_resume / rollout_abort)",
    "approval-needed": 'lakehouse rollout approve {id} --note "…" (job rollout_approve), or abort {id}',
    "aborted": "every flag the plan set is back to its value before the plan (lakehouse rollout status {id} lists "
    "each); investigate the reason, then start a new plan",
}


def plan_event(e: PlanEvent) -> Event:
    stage = f" at stage {e.stage + 1}" if e.stage is not None else ""
    act = _PLAN_ACT.get(e.event, "lakehouse rollout status {id}").format(id=e.plan_id)
    return Event(
        f"{ROLLOUT}:{e.event_id}",
        ROLLOUT,
        None,
        f"rollout {e.plan_id} ({e.plan}) {e.event}{stage}: {_line(e.reason)}",
        act,
    )


def _uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


# A MISMATCH row to read: its MISMATCH not recorded yet, or an auto-rollback outcome worth telling (something was
# rolled back, refused, left on, or failed: "already off" needs no one) not recorded yet. Every row returned gives
# an event that is recorded this tick, so a read never returns the same row twice and a full page is never read
# forever. {range}: the keyset page after the position, or the look-back behind it.
_MISMATCHES = """
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
    left join datasets d on d.id = p.dataset_id
   where p.verdict = 'MISMATCH' and {range}
) q
 where new_mismatch or new_outcome
 order by checked_at, id
 limit %(limit)s
"""
_AFTER = "(p.checked_at, p.id) > (%(at)s, %(id)s)"
_BEHIND = "p.checked_at > %(at)s - %(lookback)s and (p.checked_at, p.id) <= (%(at)s, %(id)s)"


def parity_events(conn: psycopg.Connection, after: Position) -> tuple[list[Event], Position]:
    """The MISMATCH verdicts after ``after`` (a keyset position on (checked_at, id)) not yet alerted, and the
    auto-rollback outcomes once written, with the position after them; plus, once more, those in the look-back
    behind it (a row committed after a later one was read, an outcome written after its row) not yet recorded.
    The position moves past every full page: a storm of rows is read over several ticks, never the same page."""
    args = {"at": after.at, "id": after.id, "limit": SCAN_LIMIT, "lookback": PARITY_LOOKBACK}
    ahead = conn.execute(_MISMATCHES.format(range=_AFTER), args).fetchall()
    behind = conn.execute(_MISMATCHES.format(range=_BEHIND), args).fetchall()
    out: list[Event] = []
    for pid, ds, name, source, run_id, pg_n, ice_n, pg_v, snap, idx, detail, _at, new, told in [*behind, *ahead]:
        who, detail = _who(name, ds), detail or {}
        by = f"found by {_FOUND_BY.get(source, source)}" + (f", run {run_id[:8]}" if run_id else "")
        if new:
            diff = f"; first differing __row_index: {', '.join(map(str, idx[:10]))}" if idx else ""
            out.append(
                Event(
                    key=f"{MISMATCH}:{pid}",
                    kind=MISMATCH,
                    dataset_id=ds,
                    what=f"{who} is caught up (Postgres version {pg_v}) and differs from Iceberg snapshot {snap}: "
                    f"{pg_n} rows in Postgres, {ice_n} in Iceberg{diff} ({by})",
                    act=f"STOP: do not flip or widen it; investigate. Re-check: lakehouse canary --smoke --dataset {ds}; "
                    f"what serves it: lakehouse flags list --dataset {ds}",
                )
            )
        outcome = detail.get("auto_rollback")
        if told and outcome:
            lines = [_line(x, 400) for x in outcome.get("lines", [])[:10]]
            out.append(
                Event(
                    key=f"{AUTO_ROLLBACK}:{pid}",
                    kind=AUTO_ROLLBACK,
                    dataset_id=ds,
                    what=f"after the MISMATCH on {who} ({by}): " + "; ".join(lines),
                    act=_rollback_act(outcome, ds),
                )
            )
    return out, (Position(ahead[-1][11], ahead[-1][0]) if ahead else after)


# Who recorded the verdict (lakehouse_read_parity.source), for people.
_FOUND_BY = {
    "canary": "lakehouse canary",
    "check": "the parity check",
    "schedule": "the canary schedule",
    "rollout": "a flip's preflight canary",
    "first-native-sync": "the first native sync's canary",
}


def _rollback_act(outcome: dict, ds: object) -> str:
    """A writer rolled back (first native sync): its rows exist only in Iceberg; readers: flip again once fixed."""
    if any(a.get("kind") == "write" for a in outcome.get("actions", [])):
        return (
            f"what each writer resolves to now: lakehouse write-flags list --dataset {ds}; the audit: "
            f"lakehouse write-flags history --dataset {ds}; the rows written natively exist only in Iceberg: "
            f"lakehouse write-flags backfill --dataset {ds}"
        )
    return (
        f"what each reader serves now: lakehouse flags list --dataset {ds}; the audit: lakehouse flags history "
        f"--dataset {ds}; once the MISMATCH is understood and fixed, flip again the runbook's way: "
        f"lakehouse flags flip <reader> --dataset {ds}"
    )


def _names(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    if not ids:
        return {}
    return dict(conn.execute("select id, name from datasets where id = any(%s)", (list(ids),)).fetchall())


def wedged_events(conn: psycopg.Connection, settings: Settings) -> list[Event]:
    """One event per wedged sync (its sync id): latest sync ``running`` or ``failed`` for longer than
    LAKEHOUSE_WEDGED_AFTER_SECONDS."""
    wedged = wedged_syncs(conn, settings.wedged_after_seconds)
    names = _names(conn, [w["dataset_id"] for w in wedged])
    out = []
    for w in wedged:
        ds, who = w["dataset_id"], _who(names.get(w["dataset_id"]), w["dataset_id"])
        age = _duration(w["stuck_seconds"])
        state = (
            f"has been running for {age}"
            if w["status"] == "running"
            else f"{w['status']} (it started {age} ago) and no sync has succeeded since"
        )
        error = f": {_line(w['error'])}" if w.get("error") else ""
        out.append(
            Event(
                key=f"{WEDGED}:{w['sync_id']}",
                kind=WEDGED,
                dataset_id=ds,
                what=f"{who}: its latest sync ({w['sync_id']}) {state}{error}",
                act=f"investigate the error above before relying on the dataset, then mirror it: "
                f"lakehouse sync --dataset {ds} (lakehouse canary --dataset {ds} reports it as wedged until then)",
            )
        )
    return out


def freshness_events(conn: psycopg.Connection, settings: Settings) -> list[Event]:
    """One event per flipped dataset behind the mirror for longer than LAKEHOUSE_LAGGING_AFTER_SECONDS (status/lag.py:
    ``behind_datasets`` and ``lagging_past``; flipped: flags/flipped.py)."""
    late = lagging_past(behind_datasets(conn), settings.lagging_after_seconds)
    if not late:
        return []
    flipped = flipped_dataset_ids(conn)
    out = []
    for b in late:
        if b.dataset_id not in flipped:
            continue
        out.append(
            Event(
                key=f"{FRESHNESS}:{b.dataset_id}",
                kind=FRESHNESS,
                dataset_id=b.dataset_id,
                what=f"{_who(b.name, b.dataset_id)} is flipped to Iceberg and its Iceberg view is {_duration(b.lag_seconds)} "
                f"old (threshold {_duration(settings.lagging_after_seconds)}): Postgres is at version {b.rows_version}, "
                f"the mirror at {b.mirrored_version}",
                act=f"look at the mirror_poller sensor and the dataset's mirror_batch_job runs; mirror it now: "
                f"lakehouse sync --dataset {b.dataset_id}",
            )
        )
    return out


def native_events(conn: psycopg.Connection) -> list[Event]:
    """One event per dataset written iceberg-native that fails the write-flip gates, and again if its reasons
    change (the native_safety sensor's report run lists the same)."""
    _, blocked = unsafe_native_datasets(conn)
    out = []
    for b in blocked:
        reasons = "; ".join(b.reasons)
        digest = hashlib.sha256(reasons.encode()).hexdigest()[:12]
        out.append(
            Event(
                key=f"{NATIVE_UNSAFE}:{b.dataset_id}:{digest}",
                kind=NATIVE_UNSAFE,
                dataset_id=b.dataset_id,
                what=f"{_who(b.name, b.dataset_id)} is written iceberg-native but fails the write-flip gates, so its "
                f"native writes are refused: {_line(reasons, 600)}",
                act=f"fix what the reasons say, or roll its writer back: lakehouse write-flags set <writer> pg "
                f"--dataset {b.dataset_id} (lakehouse write-flags list --dataset {b.dataset_id} shows which writer "
                f"is iceberg_native); the job native_safety_report lists every such dataset",
            )
        )
    return out


def stream_events(conn: psycopg.Connection, settings: Settings) -> list[Event]:
    """One event per shard of the mirror stream with no live stream for longer than
    LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS while LAKEHOUSE_MIRROR_STREAM is on (mirror/shards.py ``shard_status``: its
    run stopped beating, ended with no successor, or it never streamed while a sibling shard has streamed that long).
    Keyed by the shard (and the shard count): one event per outage whatever runs come and fail during it; the shard
    alive again (or streaming turned off) resolves it."""
    if not settings.mirror_stream:
        return []
    status = shard_status(conn, settings)
    count, bound = status["shard_count"], status["down_after_s"]
    out = []
    for s in status["shards"]:
        if s["alive"] or s["down_s"] is None or s["down_s"] <= bound:
            continue
        shard, run = s["shard"], s["run_id"]
        if run is None:
            why = "it has never streamed (no mirror_stream run has taken it)"
            look = f"the mirror_stream runs tagged lakehouse/stream_shard={shard}/{count} (queued, failed or none)"
        elif s["ended"]:
            why = f"its run {run} let go of it and no successor took it"
            look = f"Runs → {run} and the mirror_stream runs tagged lakehouse/stream_shard={shard}/{count} after it"
        else:
            why = f"its run {run} stopped beating its heartbeat (its process died or hung)"
            look = f"Runs → {run} (its log says where it stopped)"
        out.append(
            Event(
                key=f"{STREAM_DOWN}:{shard}/{count}",
                kind=STREAM_DOWN,
                dataset_id=None,
                what=f"shard {shard} of {count} has had no live stream for {_duration(s['down_s'])} (bound "
                f"{_duration(bound)}): {why}; batch runs (mirror_batch_job) cover its datasets meanwhile",
                act=f"Dagster UI, {look}; the mirror_poller sensor starts a replacement by itself (its ticks say "
                f"what it requested); each shard as it is now: lakehouse status",
            )
        )
    return out


def reverse_events(conn: psycopg.Connection, settings: Settings) -> list[Event]:
    """One event per native dataset with the reverse mirror on that has lacked a native commit for longer than
    LAKEHOUSE_REVERSE_LAG_ALERT_SECONDS (mirror/reverse_lag.py: the overview's and /metrics' definition). Keyed by
    the dataset: one event while it stays behind; caught up (or the reverse turned off) resolves it."""
    lags, _off = reverse_lags(conn, native_dataset_ids(conn))
    bound = settings.reverse_lag_alert_seconds
    late = [r for r in lags.values() if r.lag_seconds is not None and r.lag_seconds > bound]
    names = _names(conn, [r.dataset_id for r in late])
    return [
        Event(
            key=f"{REVERSE_BEHIND}:{r.dataset_id}",
            kind=REVERSE_BEHIND,
            dataset_id=r.dataset_id,
            what=f"{_who(names.get(r.dataset_id), r.dataset_id)} is written iceberg-native and its reverse mirror has "
            f"lacked {r.pending} native commit(s) for {_duration(r.lag_seconds)} (bound {_duration(bound)}): "
            "dataset_rows is that old for its Postgres-locked consumers, and a writer rollback now would need "
            "lakehouse write-flags backfill",
            act=f"catch it up now: lakehouse write-flags reverse sync --dataset {r.dataset_id}; if it fails, its "
            "error says why (the reverse_mirror_job runs and the mirror_stream run log it too); "
            f"lakehouse write-flags reverse status --dataset {r.dataset_id} shows where it stands",
        )
        for r in sorted(late, key=lambda r: -(r.lag_seconds or 0))
    ]


# ---------------------------------------------------------------------------------------------------
# The cursor
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """A keyset position in an order by (time, id): everything at or before it was read."""

    at: dt.datetime
    id: int = 0

    def as_json(self) -> list:
        return [self.at.isoformat(), self.id]

    @classmethod
    def from_json(cls, raw: object) -> Position | None:
        if isinstance(raw, list) and len(raw) == 2:
            return cls(dt.datetime.fromisoformat(raw[0]), int(raw[1]))
        if isinstance(raw, str):  # a cursor from before the keyset positions: a time only
            return cls(dt.datetime.fromisoformat(raw))
        return None


@dataclasses.dataclass(frozen=True)
class Cursor:
    """How far the sensor has read: MISMATCH verdicts up to ``parity`` (checked_at, row id), failed runs up to
    ``runs`` (update time, run storage id), rollout plan events up to ``rollout`` (by transaction id, as the recorder
    reads: status/recording.py). Each tick reads on after the first two and again a look-back behind them; an empty
    position starts at the tick's time (rollout: at the events committed then)."""

    parity: Position | None = None
    runs: Position | None = None
    rollout: recording.Position | None = None

    @classmethod
    def loads(cls, raw: str | None) -> Cursor:
        if not raw:
            return cls()
        data = json.loads(raw)
        rollout = data.get("rollout")
        return cls(
            Position.from_json(data.get("parity") or data.get("parity_at")),
            Position.from_json(data.get("runs") or data.get("runs_at")),
            recording.Position.from_json(rollout) if isinstance(rollout, dict) else None,
        )

    def dumps(self) -> str:
        return json.dumps(
            {
                "parity": self.parity.as_json() if self.parity else None,
                "runs": self.runs.as_json() if self.runs else None,
                "rollout": self.rollout.as_json() if self.rollout else None,
            }
        )

    def runs_after(self, now: dt.datetime) -> Position:
        """Read the failed runs after this (and the look-back behind it)."""
        return self.runs or Position(now)

    def parity_after(self, now: dt.datetime) -> Position:
        return self.parity or Position(now)

    def moved(
        self,
        parity: Position | None = None,
        runs: Position | None = None,
        rollout: recording.Position | None = None,
    ) -> Cursor:
        """Forward only: a position behind the current one is ignored (rollout: the reader never moves back)."""
        return Cursor(_later(self.parity, parity), _later(self.runs, runs), rollout or self.rollout)


def _later(a: Position | None, b: Position | None) -> Position | None:
    return b if a is None else a if b is None else max(a, b)


T = TypeVar("T")
_TICK = dt.timedelta(microseconds=1)


def keyset_page(
    read: Callable[[dt.datetime, int], Sequence[T]],
    key: Callable[[T], Position],
    after: Position,
    page: int,
) -> tuple[list[T], bool]:
    """The items after ``after`` in (time, id) order, about ``page`` of them, and whether more may follow, from a
    source that filters only "time > t" and orders only by time, ties in any order (Dagster's run storage:
    ``read(t, limit)``). A full page ends before its last time (that time may hold more items than the page
    showed) unless the whole page is one time; then the page grows (16x at most). So the position after the page
    always moves past it, and no item is skipped."""
    limit = page
    while True:
        got = list(read(after.at - _TICK, limit))
        new = sorted((r for r in got if key(r) > after), key=key)
        if len(got) < limit:
            return new, False
        last_at = max(key(r).at for r in got)
        whole = [r for r in new if key(r).at < last_at]
        if whole:
            return whole, True
        if limit >= 16 * page:  # more than 16 pages of items in one microsecond: take this page as it is
            return new, True
        limit *= 2


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


# ---------------------------------------------------------------------------------------------------
# Recording and posting
# ---------------------------------------------------------------------------------------------------


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


class PostFailed(Exception):
    """A post that did not get a 2xx answer in time: the receiver's host and why (never the URL)."""


def webhook_problem(url: str | None) -> str | None:
    """Why the URL cannot be posted to (None: it can). Never repeats the URL: it is a secret."""
    if not url:
        return f'{ENV} is not set: no alert is posted (set it to a Slack incoming-webhook URL, or any receiver of a JSON body {{"text": ...}})'
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{ENV} is set but is not an http(s) URL with a host (its value is not shown: it is a secret); no alert is posted"
    return None


def post_message(url: str, payload: dict, timeout: float) -> None:
    """POST ``payload`` as JSON; raises PostFailed unless a 2xx answer came within ``timeout`` seconds (the whole
    exchange, not each socket read: the request runs in a thread that is abandoned when late)."""
    host = urllib.parse.urlsplit(url).hostname or "?"
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", **_idempotency_header(payload)},
        method="POST",
    )
    outcome: dict = {}

    def send() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # (http(s) only: webhook_problem)
                response.read(65536)
                outcome["status"] = response.status
        except urllib.error.HTTPError as exc:
            outcome["error"] = f"HTTP {exc.code}"
            exc.close()
        except urllib.error.URLError as exc:
            outcome["error"] = _reason(exc.reason, timeout)
        except OSError as exc:  # includes socket.timeout / TimeoutError while reading the answer
            outcome["error"] = _reason(exc, timeout)

    thread = threading.Thread(target=send, name="lakehouse-alert-post", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    if thread.is_alive():
        raise PostFailed(f"{host}: no answer within {timeout:g} s")
    if "error" in outcome:
        raise PostFailed(f"{host}: {_scrub(outcome['error'], url)}")
    if not 200 <= outcome.get("status", 0) < 300:
        raise PostFailed(f"{host}: HTTP {outcome.get('status')}")


def _idempotency_header(payload: dict) -> dict[str, str]:
    key = payload.get(IDEMPOTENCY_FIELD)
    return {"Idempotency-Key": str(key)} if key else {}


def _reason(exc: object, timeout: float) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return _line(exc, 200)


def _scrub(text: str, url: str) -> str:
    """Belt and braces: no part of the URL past its host survives in a text we keep."""
    parts = urllib.parse.urlsplit(url)
    for secret in (url, parts.path, parts.query):
        if secret and len(secret) > 1:
            text = text.replace(secret, "<webhook>")
    return text


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


# ---------------------------------------------------------------------------------------------------
# One tick
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Tick:
    cursor: Cursor
    new: dict[str, int] = dataclasses.field(default_factory=dict)  # events recorded this tick, per kind
    delivery: Delivery | None = None
    unreadable: list[str] = dataclasses.field(default_factory=list)  # a source that could not be read, and why
    disabled: str | None = None  # why nothing was done (no URL)

    @property
    def log_lines(self) -> list[str]:
        lines = [f"could not read {u}" for u in self.unreadable]
        return lines + (self.delivery.dropped if self.delivery else [])

    def summary(self) -> str:
        """The tick's one line (the sensor's skip reason): never the URL."""
        if self.disabled:
            return self.disabled
        d = self.delivery or Delivery()
        new = sum(self.new.values())
        parts = [
            f"{new} new event(s)" + (f" ({', '.join(f'{k} {n}' for k, n in self.new.items() if n)})" if new else ""),
            f"posted {d.posted} event(s) in {d.messages} message(s)",
        ]
        later = f" (next try {d.next_attempt_at:%H:%M:%S} UTC)" if d.next_attempt_at else ""
        if d.failure:
            parts.append(f"a post failed ({d.failure}): {d.pending} event(s) pending, retried with backoff{later}")
        elif d.pending:
            parts.append(
                f"{d.pending} event(s) pending for a later tick" + (" (time budget)" if d.out_of_time else later)
            )
        if d.dropped:
            parts.append(f"{len(d.dropped)} event(s) dropped (see the log)")
        if self.unreadable:
            parts.append(f"could not read: {'; '.join(self.unreadable)}")
        return "; ".join(parts)


def run_tick(
    conn: psycopg.Connection,
    settings: Settings,
    cursor: Cursor,
    failed_runs: Sequence[FailedRun],
    *,
    now: dt.datetime,
    runs_read_to: Position | None = None,
    plan_events: Sequence[PlanEvent] = (),
    plan_events_read_to: recording.Position | None = None,
    post: Callable[[str, dict, float], None] = post_message,
) -> Tick:
    """Find the events since ``cursor`` (``failed_runs``: the failed runs the sensor read from the instance after
    ``cursor.runs_after(now)`` and in its look-back, not recorded yet, up to the position ``runs_read_to``;
    ``plan_events``: the rollout plan events read after ``cursor.rollout``, up to ``plan_events_read_to``), record the
    new ones, post what is due. Nothing at all when the webhook is unset or unusable (the cursor still moves, so
    turning alerts on later does not replay the past)."""
    problem = webhook_problem(settings.alert_webhook_url)
    if problem:
        return Tick(cursor=cursor.moved(Position(now), Position(now), plan_events_read_to), disabled=problem)
    assert settings.alert_webhook_url is not None
    events: list[Event] = [failed_run_event(r) for r in failed_runs] + [plan_event(e) for e in plan_events]
    present: dict[str, set[str]] = {}
    tick = Tick(cursor=cursor.moved(runs=runs_read_to or cursor.runs_after(now), rollout=plan_events_read_to))
    try:
        found, reached = parity_events(conn, cursor.parity_after(now))
        events += found
        tick.cursor = tick.cursor.moved(parity=reached)
    except psycopg.Error as exc:
        tick.unreadable.append(f"parity verdicts: {_line(exc, 200)}")
    for kind, find in (
        (WEDGED, lambda: wedged_events(conn, settings)),
        (FRESHNESS, lambda: freshness_events(conn, settings)),
        (NATIVE_UNSAFE, lambda: native_events(conn)),
        (STREAM_DOWN, lambda: stream_events(conn, settings)),
        (REVERSE_BEHIND, lambda: reverse_events(conn, settings)),
    ):
        try:
            found = find()
        except psycopg.Error as exc:  # that source is unreadable: its open conditions stay as they are
            tick.unreadable.append(f"{kind}: {_line(exc, 200)}")
            continue
        events += found
        present[kind] = {e.key for e in found}
    fresh = record(conn, events, present)
    tick.new = dict(collections.Counter(e.kind for e in fresh))
    tick.delivery = deliver(
        conn,
        settings.alert_webhook_url,
        timeout=settings.alert_timeout_seconds,
        retry_seconds=settings.alert_retry_seconds,
        now=now,
        post=post,
    )
    return tick
