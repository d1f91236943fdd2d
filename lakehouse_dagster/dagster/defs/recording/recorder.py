"""lakehouse_recorder: every change of a dataset's table, Postgres rows or flags recorded on the Dagster instance,
whoever made it (the CLI, a run, the service, another process), from the durable facts it leaves in Postgres
(status/recording.py). Runless materializations and observations (``SensorResult.asset_events``: the daemon
reports them, then stores the cursor), so a partition page always shows the table as it is now.

* A dataset whose table changed: one materialization of its ``iceberg/dataset_table`` partition describing the
  table as its latest succeeded sync left it (read at tick time: a late tick never shows an older snapshot; a
  state read before a run recorded a newer commit is read again, ``in_order``: pages never go back in time), with
  the metadata a run records — unless the partition's latest materialization already shows that snapshot (the run
  that wrote it recorded it itself). A sweep that removed orphan files is recorded even then, with what it removed.
* A backfill: a materialization of ``postgres/dataset_rows`` (Postgres got the rows only Iceberg held).
* A flag change (set, clear, flip, rollback, auto-rollback): an observation on the dataset's partition (dataset
  scope) or on ``lakehouse/migration_overview`` (workspace and global scope), with the reader or writer, the mode,
  the scope, the actor and the note. A workspace or global change is also fanned out: one observation per dataset
  of the scope showing its modes now (a page of at most ``recorder_max_events`` datasets a tick).
* A verdict (a canary from the CLI, a job, a rollout stage, a check) or a read fallback (any process, or an app
  through POST /lakehouse/fallback): an observation of the dataset's state now, unless another event of the
  tick already shows it.
* A native dataset's reverse mirror behind longer than ``LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS``: an observation of its
  ``postgres/dataset_rows`` partition when that starts and when it ends (status/reverse_page.py), so the page's
  newest event is never an old apply shown as if the copy were current.
* Partitions of datasets that no longer exist are removed (every PRUNE_EVERY_SECONDS), partitions of datasets it
  records are added.
"""

import dataclasses
import time
import uuid

import dagster as dg
import psycopg

from lakehouse_dagster.api.reverse import ReversePageChange, reverse_page_changes
from lakehouse_dagster.api.status import (
    Change,
    Cursor,
    PartitionState,
    Plan,
    deleted_dataset_keys,
    newer_than,
    partition_states,
    plan_recording,
    sync_order,
)
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.dagster.defs.mirror.sensors import IN_FLIGHT
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import ICEBERG_TABLE, MIGRATION_OVERVIEW, PG_ROWS
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.partition_metadata import (
    latest_metadata,
    migration_state,
    names,
    postgres_standard,
    written_by,
)
from lakehouse_dagster.dagster.defs.shared.partition_metadata import latest_sync_metadata as table_now
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS, datasets_partitions
from lakehouse_dagster.dagster.defs.shared.provenance import iceberg_holds_truth, table_provenance
from lakehouse_dagster.dagster.defs.shared.tags import scope_value, text

PRUNE_EVERY_SECONDS = 300.0  # a full comparison of the partitions with the datasets (O(partitions)): not every tick
DATA_VERSION_TAG = "dagster/data_version"
RECORDED_BY = "lakehouse_recorder (no run: recorded from Postgres)"
# How long, and for how many partitions at most, the recorder checks that what it showed is not overwritten by an
# older snapshot's event written after it (a run's write racing ours: milliseconds, so a few ticks are plenty).
RECHECK_SECONDS = 30.0
RECHECK_MAX = 1000


def runs_in_flight(instance: dg.DagsterInstance, run_ids: set[str]) -> set[str]:
    """Which of ``run_ids`` are queued or running, in one query."""
    if not run_ids:
        return set()
    records = instance.get_run_records(dg.RunsFilter(run_ids=sorted(run_ids), statuses=IN_FLIGHT))
    return {r.dagster_run.run_id for r in records}


def table_event(
    state: PartitionState, sweeps: list[Change], instance: dg.DagsterInstance | None = None
) -> dg.AssetMaterialization:
    """The partition's table as it is now (its latest succeeded sync), with what a sweep removed; with ``instance``,
    its data provenance (shared/provenance.py: "Unsynced" only when Iceberg is behind)."""
    t = state.table
    assert t is not None
    metadata: dict = {
        **names(state),
        **table_now(state),
        "recorded_by": text(RECORDED_BY),
        **migration_state(state),
    }
    description = f"{written_by(state)}: snapshot {t.snapshot_id}, {t.rows} rows"
    if sweeps:
        files = sum(c.row["files_removed"] for c in sweeps)
        metadata["orphan_files_removed"] = dg.MetadataValue.int(files)
        metadata["orphan_bytes_removed"] = dg.MetadataValue.int(sum(c.row["bytes_removed"] for c in sweeps))
        metadata["swept_by"] = text(", ".join(sorted({c.row["actor"] for c in sweeps})))
        description += f"; an orphan sweep removed {files} file(s) no snapshot references"
    return dg.AssetMaterialization(
        asset_key=ICEBERG_TABLE,
        partition=str(state.dataset_id),
        description=description,
        metadata=metadata,
        tags={
            DATA_VERSION_TAG: str(t.source_version),
            **table_provenance(
                instance, str(state.dataset_id), t.source_version, iceberg_truth=iceberg_holds_truth(state)
            ),
        }
        if t.source_version is not None
        else None,
    )


def backfill_event(conn: psycopg.Connection, state: PartitionState, c: Change) -> dg.AssetMaterialization:
    """Postgres got the rows only Iceberg held: the dataset's rows in dataset_rows as they are now."""
    r = c.row
    return dg.AssetMaterialization(
        asset_key=PG_ROWS,
        partition=str(state.dataset_id),
        description=(
            f"backfill by {r['actor']}: {r['rows_copied']} row(s) copied from snapshot {r['snapshot_id']}, "
            f"{r['rows_removed']} stale row(s) removed, {r['rows_moved']} moved"
        ),
        metadata={
            **names(state),
            "kind": state.kind,
            "rows_version": text(state.rows_version),
            "backfilled_from_snapshot_id": text(r["snapshot_id"]),
            "rows_copied": dg.MetadataValue.int(r["rows_copied"]),
            "rows_removed": dg.MetadataValue.int(r["rows_removed"]),
            "rows_moved": dg.MetadataValue.int(r["rows_moved"]),
            "actor": text(r["actor"]),
            "at": text(r["at"].isoformat(timespec="seconds")),
            "recorded_by": text(RECORDED_BY),
            **postgres_standard(conn, state),
        },
        tags={DATA_VERSION_TAG: str(state.rows_version)},
    )


def rows_moved_event(conn: psycopg.Connection, state: PartitionState, c: Change) -> dg.AssetMaterialization:
    """A lifecycle move that changed what Postgres holds (complete retired the rows, a restore brought them back):
    the dataset's rows in dataset_rows as they are now, with the move (issue 42: the page kept `row_count 2005` after
    complete, and a restore never appeared)."""
    r = c.row
    what = {
        ("native", "completing"): "complete started: its Postgres rows are being retired",
        ("completing", "complete"): "complete: Postgres holds none of its rows, Iceberg alone does",
        ("complete", "restoring"): "restore started: the rows come back from Iceberg",
        ("completing", "restoring"): "restore started: the rows come back from Iceberg",
        ("restoring", "native"): "restored: Postgres holds every row of the current snapshot again",
    }.get((r["before_state"], r["after_state"]), f"lifecycle {r['before_state']} → {r['after_state']}")
    return dg.AssetMaterialization(
        asset_key=PG_ROWS,
        partition=str(state.dataset_id),
        description=f"{what} ({r['verb']} by {r['actor']})",
        metadata={
            **names(state),
            "kind": state.kind,
            "rows_version": text(state.rows_version),
            "lifecycle_move": text(f"{r['before_state']} → {r['after_state']}"),
            "lifecycle_version": dg.MetadataValue.int(int(r["version"])),
            "actor": text(r["actor"]),
            "at": text(r["at"].isoformat(timespec="seconds")),
            "recorded_by": text(RECORDED_BY),
            **migration_state(state),
            **postgres_standard(conn, state),
        },
        tags={DATA_VERSION_TAG: str(state.rows_version)},
    )


def flag_event(c: Change, state: PartitionState | None) -> dg.AssetObservation:
    """One set or clear: on the dataset's partition (dataset scope, a tabular dataset that exists), else on the
    overview."""
    r = c.row
    word = "reader" if r["kind"] == "read" else "writer"
    scope = scope_value(r["scope_id"]) if r["scope"] == "dataset" else scope_value(None, r["scope_id"])
    after = r["after_mode"] or "cleared (back to the next scope or the registry default)"
    metadata: dict = {  # flag_*: apart from the table's own keys (mode, writer), which an observation shows too
        "flag_changed": text(f"{word} {r['name']}"),
        "flag_action": text(r["action"]),
        "flag_mode": text(after),
        "flag_mode_before": text(r["before_mode"] or "(no override)"),
        "scope": text(scope),
        "actor": text(r["actor"]),
        "note": text(r["note"] or ""),
        "audit_id": text(c.id),
        "at": text(r["at"].isoformat(timespec="seconds")),
        "recorded_by": text(RECORDED_BY),
    }
    description = (
        f"{r['action']} {word} {r['name']}: {r['before_mode'] or '(no override)'} → {r['after_mode'] or 'cleared'}"
        f" at {scope} by {r['actor']}" + (f" ({r['note']})" if r["note"] else "")
    )
    if state is not None and state.kind == "tabular":
        # The partition page shows its latest event's metadata: the observation says what the table is now too.
        return dg.AssetObservation(
            asset_key=ICEBERG_TABLE,
            partition=str(state.dataset_id),
            description=description,
            metadata={**names(state), **metadata, **migration_state(state), **table_now(state)},
        )
    if r["scope"] == "dataset":
        metadata["dataset_id"] = text(r["scope_id"])
        if state is None:
            description += " (the dataset no longer exists)"
        else:
            metadata["dataset_name"] = text(state.name)
            description += f" ({state.name} is a {state.kind} dataset: it has no table partition)"
    return dg.AssetObservation(asset_key=MIGRATION_OVERVIEW, description=description, metadata=metadata)


def in_order(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    states: dict[uuid.UUID, PartitionState],
    ids: list[uuid.UUID],
    settings: Settings | None = None,
) -> dict[str, str]:
    """The snapshot the latest materialization of each of ``ids``' table partitions shows, after reading again the
    state of each dataset whose page already shows a snapshot committed after the one its state (read earlier this
    tick) names: a run landed and recorded a newer commit meanwhile. ``states`` is updated in place, so no event of
    the tick shows an older snapshot as the table now (status/page_order.py: the table's commit order)."""
    latest = latest_metadata(instance, ICEBERG_TABLE, {str(d) for d in ids})
    differ = [
        (d, int(latest[str(d)]), int(t.snapshot_id))
        for d in ids
        if (t := states[d].table) is not None
        and t.snapshot_id is not None
        and latest.get(str(d), "").lstrip("-").isdigit()
        and latest[str(d)] != str(t.snapshot_id)
    ]
    order = sync_order(conn, [(d, s) for d, a, b in differ for s in (a, b)])
    behind = [d for d, shown, read in differ if newer_than(order, d, shown, read)]
    if behind:
        states.update(partition_states(conn, settings or Settings.from_env(), behind))
    return latest


def recorded_events(
    instance: dg.DagsterInstance,
    conn: psycopg.Connection,
    plan: Plan,
    states: dict[uuid.UUID, PartitionState],
    settings: Settings | None = None,
) -> list:
    """The tick's events in the order of what happened: tables, then Postgres rows, then flags. None shows a snapshot
    older than the one the partition's page already shows (``in_order``)."""
    sweeps: dict[uuid.UUID, list[Change]] = {}
    for c in plan.sweeps:
        sweeps.setdefault(c.row["dataset_id"], []).append(c)
    flagged = [c.row["scope_id"] for c in plan.flags if c.row["scope"] == "dataset"]
    on_table = [d for d in [*plan.tables, *plan.seeded, *sweeps, *flagged, *plan.refresh] if d in states]
    latest = in_order(instance, conn, states, list(dict.fromkeys(on_table)), settings)
    shown = {d: s for d, s in states.items() if not s.throwaway}
    changed = [d for d in [*plan.tables, *plan.seeded, *sweeps] if d in shown and shown[d].table is not None]
    changed = list(dict.fromkeys(changed))
    events: list = [
        table_event(shown[d], sweeps.get(d, []), instance)
        for d in changed
        if d in sweeps or ((t := shown[d].table) is not None and latest.get(str(d)) != str(t.snapshot_id))
    ]
    events += [
        backfill_event(conn, shown[c.row["dataset_id"]], c) for c in plan.backfills if c.row["dataset_id"] in shown
    ]
    last_moves = {c.row["dataset_id"]: c for c in plan.lifecycle}  # the rows as they are now: one event a dataset
    events += [rows_moved_event(conn, shown[d], c) for d, c in last_moves.items() if d in shown]
    for c in plan.flags:
        ds = c.row["scope_id"] if c.row["scope"] == "dataset" else None
        if ds in states and states[ds].throwaway:
            continue  # the ingest bench's own flags on its throwaway datasets
        events.append(flag_event(c, shown.get(ds) if ds else None))
    # A verdict, a fallback or a wider scope's flag change: the partition's state once, unless an event above
    # already shows it (every event on a partition carries the state as it is now).
    on_page = {e.partition for e in events if e.asset_key == ICEBERG_TABLE and e.partition}
    events += [
        state_event(shown[d], why)
        for d, why in plan.refresh.items()
        if str(d) not in on_page and d in shown and shown[d].kind == "tabular"
    ]
    return events


def state_event(state: PartitionState, why: list[str]) -> dg.AssetObservation:
    """The partition as it is now — modes, verdict, latest fallback, table — after changes that left no event of
    their own on it: a verdict, a read fallback, a flag change at workspace or global scope."""
    shown = list(dict.fromkeys(why))
    because = "; ".join(shown[:5]) + (f"; and {len(shown) - 5} more" if len(shown) > 5 else "")
    return dg.AssetObservation(
        asset_key=ICEBERG_TABLE,
        partition=str(state.dataset_id),
        description=f"{state.name}: {because}",
        metadata={
            **names(state),
            "changed": text(because),
            "recorded_by": text(RECORDED_BY),
            **migration_state(state),
            **table_now(state),
        },
    )


def reverse_page_event(state: PartitionState, c: ReversePageChange) -> dg.AssetObservation:
    """The dataset's Postgres rows behind Iceberg (or no longer), on its postgres/dataset_rows partition."""
    metadata: dict = {**names(state), "reverse_behind": c.behind, "recorded_by": text(RECORDED_BY)}
    lag = c.lag
    if lag is not None:
        metadata["reverse_applied_snapshot_id"] = text(lag.applied_snapshot)
        metadata["reverse_applied_at"] = text(lag.applied_at.isoformat(timespec="seconds") if lag.applied_at else None)
        metadata["reverse_pending_commits"] = lag.pending
        if not lag.caught_up:  # a time, not a lag in seconds: the page keeps showing it while the episode lasts
            metadata["reverse_behind_since"] = text(lag.since.isoformat(timespec="seconds") if lag.since else None)
            metadata["iceberg_snapshot_id"] = text(lag.latest_snapshot)
    return dg.AssetObservation(
        asset_key=PG_ROWS, partition=str(state.dataset_id), description=c.description(), metadata=metadata
    )


def overwritten(
    instance: dg.DagsterInstance, conn: psycopg.Connection, shown: dict[uuid.UUID, tuple[int, float]], now: float
) -> list[uuid.UUID]:
    """Datasets whose table partition this recorder showed snapshot S on lately, and whose newest materialization
    now names a snapshot committed before S: a run's event written after ours, its check having raced the commit we
    recorded (a check and its write are not one transaction). Two queries on the instance, one on Postgres."""
    live = {d: snap for d, (snap, until) in shown.items() if until >= now}
    if not live:
        return []
    latest = latest_metadata(instance, ICEBERG_TABLE, {str(d) for d in live})
    pairs = [
        (d, int(latest[str(d)]), snap)
        for d, snap in live.items()
        if latest.get(str(d), "").lstrip("-").isdigit() and latest[str(d)] != str(snap)
    ]
    order = sync_order(conn, [(d, s) for d, a, b in pairs for s in (a, b)])
    return [d for d, on_page, snap in pairs if newer_than(order, d, snap, on_page)]


def still_shown(
    shown: dict[uuid.UUID, tuple[int, float]], events: list, now: float
) -> dict[uuid.UUID, tuple[int, float]]:
    """The cursor's ``shown`` after this tick: the entries not expired, and the snapshot each of this tick's events on
    a table partition shows, checked for RECHECK_SECONDS (at most RECHECK_MAX partitions, the newest kept)."""
    out = {d: v for d, v in shown.items() if v[1] >= now}
    for e in events:
        value = e.metadata.get("snapshot_id") if e.asset_key == ICEBERG_TABLE and e.partition else None
        snap = getattr(value, "value", value)
        if snap is not None and str(snap).lstrip("-").isdigit():
            out.pop(uuid.UUID(e.partition), None)
            out[uuid.UUID(e.partition)] = (int(str(snap)), now + RECHECK_SECONDS)
    return dict(list(out.items())[-RECHECK_MAX:])


@dg.sensor(
    minimum_interval_seconds=1,  # every daemon loop (5 s), like the mirror poller: the page follows the change
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Records every change of a dataset (syncs from the CLI or any process, native writes, backfills, "
    "orphan sweeps, flag changes) on its partition, and removes the partitions of deleted datasets.",
)
@skip_while_postgres_is_down
def lakehouse_recorder(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    cursor = Cursor.loads(context.cursor)
    now = time.time()
    prune = now - cursor.pruned_at >= PRUNE_EVERY_SECONDS
    with lakehouse.connect() as conn:
        plan = plan_recording(
            conn,
            cursor,
            limit=settings.recorder.max_events,
            in_flight=lambda ids: runs_in_flight(context.instance, ids),
            now=now,
        )
        reverse, reverse_behind = reverse_page_changes(conn, cursor.reverse_behind, settings.reverse.lag_page_seconds)
        again = overwritten(context.instance, conn, cursor.shown, now)
        if again:  # recorded again from the table now (its state read below)
            plan = dataclasses.replace(plan, tables={**{d: [] for d in again}, **plan.tables})
        states = partition_states(conn, settings, plan.dataset_ids | {c.dataset_id for c in reverse})
        events = recorded_events(context.instance, conn, plan, states, settings)
        events += [reverse_page_event(states[c.dataset_id], c) for c in reverse if c.dataset_id in states]
        keys = {e.partition for e in events if e.partition}
        known = set(context.instance.get_dynamic_partitions(DATASETS)) if keys or prune else set()
        gone = deleted_dataset_keys(conn, sorted(known)) if prune else []
    requests: list = []
    new_keys = sorted(keys - known)
    if new_keys:
        requests.append(datasets_partitions.build_add_request(new_keys))
    if gone:
        requests.append(datasets_partitions.build_delete_request(gone))
    tables = sum(1 for e in events if isinstance(e, dg.AssetMaterialization) and e.asset_key == ICEBERG_TABLE)
    states_shown = sum(1 for e in events if isinstance(e, dg.AssetObservation) and "changed" in e.metadata)
    fanning = ", ".join(sorted(plan.cursor.fanout)) or "none"
    # a line on the console for what changed in Iceberg, the flags, the partitions; the dataset states it shows again
    # after each sync (verdicts, fallbacks) and an idle tick go to the tick's log only (DEBUG)
    anything = tables or plan.backfills or plan.flags or gone or reverse
    (context.log.info if anything else context.log.debug)(
        f"recorded {tables} table change(s), {len(plan.backfills)} backfill(s), {len(plan.flags)} flag change(s),"
        f" {states_shown} dataset state(s) (verdicts, fallbacks, wider scopes; fan-out still under way: {fanning});"
        f" {len(plan.waiting)} dataset(s) wait for their run to end; {len(gone)} deleted dataset partition(s) removed;"
        f" {len(reverse_behind)} reverse mirror(s) shown behind"
    )
    nxt = dataclasses.replace(
        plan.cursor,
        pruned_at=now if prune else cursor.pruned_at,
        reverse_behind=reverse_behind,
        shown=still_shown(cursor.shown, events, now),
    )
    return dg.SensorResult(asset_events=events, dynamic_partitions_requests=requests, cursor=nxt.dumps())
