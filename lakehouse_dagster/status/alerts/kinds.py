"""The alerts' vocabulary: the kinds of event, their titles, the tunables, and the event records."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

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
