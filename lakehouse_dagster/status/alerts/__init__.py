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

The package: ``kinds`` (the kinds, tunables and event records), ``events`` (the finders), ``cursor`` (the keyset
cursor), ``outbox`` (``lakehouse_alerts``, its owner: record, deliver, shed), ``webhook`` (the HTTP post), ``tick``
(one sensor tick). Callers import from here.
"""

from __future__ import annotations

from lakehouse_dagster.status.alerts.cursor import Cursor, Position, keyset_page
from lakehouse_dagster.status.alerts.events import (
    failed_run_event,
    freshness_events,
    native_events,
    parity_events,
    plan_event,
    reverse_events,
    stream_events,
    wedged_events,
)
from lakehouse_dagster.status.alerts.kinds import (
    AUTO_ROLLBACK,
    BACKOFF_FIRST_SECONDS,
    BACKOFF_MAX_SECONDS,
    CONDITIONS,
    DROPPED,
    ENV,
    FOLD_AT,
    FOLD_MAX,
    FRESHNESS,
    IDEMPOTENCY_FIELD,
    KEEP_DAYS,
    KINDS,
    MAX_PENDING,
    MAX_POSTS_PER_TICK,
    MISMATCH,
    NATIVE_UNSAFE,
    PARITY_LOOKBACK,
    PLURAL,
    REVERSE_BEHIND,
    ROLLOUT,
    RUN_FAILED,
    RUNS_LOOKBACK,
    RUNS_LOOKBACK_READ,
    SCAN_LIMIT,
    STREAM_DOWN,
    TICK_BUDGET_SECONDS,
    TITLE,
    WEDGED,
    Event,
    FailedRun,
    PlanEvent,
)
from lakehouse_dagster.status.alerts.outbox import Delivery, backoff, deliver, record, unrecorded
from lakehouse_dagster.status.alerts.tick import Tick, run_tick
from lakehouse_dagster.status.alerts.webhook import PostFailed, post_message, webhook_problem

__all__ = [
    "RUN_FAILED",
    "MISMATCH",
    "AUTO_ROLLBACK",
    "WEDGED",
    "FRESHNESS",
    "NATIVE_UNSAFE",
    "ROLLOUT",
    "STREAM_DOWN",
    "REVERSE_BEHIND",
    "DROPPED",
    "KINDS",
    "CONDITIONS",
    "TITLE",
    "PLURAL",
    "PARITY_LOOKBACK",
    "RUNS_LOOKBACK",
    "SCAN_LIMIT",
    "FOLD_AT",
    "FOLD_MAX",
    "MAX_POSTS_PER_TICK",
    "BACKOFF_FIRST_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "MAX_PENDING",
    "IDEMPOTENCY_FIELD",
    "RUNS_LOOKBACK_READ",
    "TICK_BUDGET_SECONDS",
    "KEEP_DAYS",
    "ENV",
    "FailedRun",
    "PlanEvent",
    "Event",
    "failed_run_event",
    "plan_event",
    "parity_events",
    "wedged_events",
    "freshness_events",
    "native_events",
    "stream_events",
    "reverse_events",
    "Position",
    "Cursor",
    "keyset_page",
    "unrecorded",
    "record",
    "PostFailed",
    "webhook_problem",
    "post_message",
    "Delivery",
    "backoff",
    "deliver",
    "Tick",
    "run_tick",
]
