"""The event finders: each kind of event found where it is durable (see the package's docstring)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence

import psycopg

from lakehouse_dagster.core.settings import MirrorSettings, ReverseSettings, StreamSettings
from lakehouse_dagster.flags.flipped import flipped_dataset_ids
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.mirror.reverse_lag import reverse_lags
from lakehouse_dagster.mirror.shards import shard_status
from lakehouse_dagster.parity.canary import wedged_syncs
from lakehouse_dagster.routing.native_guard import unsafe_native_datasets
from lakehouse_dagster.status.alerts.cursor import Position
from lakehouse_dagster.status.alerts.kinds import (
    AUTO_ROLLBACK,
    FRESHNESS,
    MISMATCH,
    NATIVE_UNSAFE,
    PARITY_LOOKBACK,
    REVERSE_BEHIND,
    ROLLOUT,
    RUN_FAILED,
    SCAN_LIMIT,
    STREAM_DOWN,
    WEDGED,
    Event,
    FailedRun,
    PlanEvent,
    _duration,
    _line,
)
from lakehouse_dagster.status.alerts.outbox import unalerted_mismatches
from lakehouse_dagster.status.lag import behind_datasets, lagging_past
from lakehouse_dagster.tracking.datasets import lookup


def _who(name: str | None, dataset_id: object) -> str:
    return f"{name or '(deleted dataset)'} ({dataset_id})"


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


def parity_events(conn: psycopg.Connection, after: Position) -> tuple[list[Event], Position]:
    """The MISMATCH verdicts after ``after`` (a keyset position on (checked_at, id)) not yet alerted, and the
    auto-rollback outcomes once written, with the position after them; plus, once more, those in the look-back
    behind it (a row committed after a later one was read, an outcome written after its row) not yet recorded.
    The position moves past every full page: a storm of rows is read over several ticks, never the same page."""
    args = {"at": after.at, "id": after.id, "limit": SCAN_LIMIT, "lookback": PARITY_LOOKBACK}
    ahead, behind = unalerted_mismatches(conn, args)
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
            f"lakehouse backfill --dataset {ds}"
        )
    return (
        f"what each reader serves now: lakehouse flags list --dataset {ds}; the audit: lakehouse flags history "
        f"--dataset {ds}; once the MISMATCH is understood and fixed, flip again the runbook's way: "
        f"lakehouse flags flip <reader> --dataset {ds}"
    )


def _names(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    if not ids:
        return {}
    return lookup.names_of(conn, ids)


def wedged_events(conn: psycopg.Connection, mirror: MirrorSettings) -> list[Event]:
    """One event per wedged sync (its sync id): latest sync ``running`` or ``failed`` for longer than
    LAKEHOUSE_WEDGED_AFTER_SECONDS."""
    wedged = wedged_syncs(conn, mirror.wedged_after_seconds)
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


def freshness_events(conn: psycopg.Connection, mirror: MirrorSettings) -> list[Event]:
    """One event per flipped dataset behind the mirror for longer than LAKEHOUSE_LAGGING_AFTER_SECONDS (status/lag.py:
    ``behind_datasets`` and ``lagging_past``; flipped: flags/flipped.py)."""
    late = lagging_past(behind_datasets(conn), mirror.lagging_after_seconds)
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
                f"old (threshold {_duration(mirror.lagging_after_seconds)}): Postgres is at version {b.rows_version}, "
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


def stream_events(conn: psycopg.Connection, stream: StreamSettings) -> list[Event]:
    """One event per shard of the mirror stream with no live stream for longer than
    LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS while LAKEHOUSE_MIRROR_STREAM is on (mirror/shards.py ``shard_status``: its
    run stopped beating, ended with no successor, or it never streamed while a sibling shard has streamed that long).
    Keyed by the shard (and the shard count): one event per outage whatever runs come and fail during it; the shard
    alive again (or streaming turned off) resolves it."""
    if not stream.enabled:
        return []
    status = shard_status(conn, stream)
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


def reverse_events(conn: psycopg.Connection, reverse: ReverseSettings) -> list[Event]:
    """One event per native dataset with the reverse mirror on that has lacked a native commit for longer than
    LAKEHOUSE_REVERSE_LAG_ALERT_SECONDS (mirror/reverse_lag.py: the overview's and /metrics' definition). Keyed by
    the dataset: one event while it stays behind; caught up (or the reverse turned off) resolves it."""
    lags, _off = reverse_lags(conn, native_dataset_ids(conn))
    bound = reverse.lag_alert_seconds
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
            "lakehouse backfill",
            act=f"catch it up now: lakehouse reverse sync --dataset {r.dataset_id}; if it fails, its "
            "error says why (the reverse_mirror_job runs and the mirror_stream run log it too); "
            f"lakehouse reverse status --dataset {r.dataset_id} shows where it stands",
        )
        for r in sorted(late, key=lambda r: -(r.lag_seconds or 0))
    ]
