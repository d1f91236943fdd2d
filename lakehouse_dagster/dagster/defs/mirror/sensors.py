"""The mirror poller: requests a mirror of every dataset whose Postgres rows moved, and again of every dataset
still behind with no run in flight (backoff, cap and per-dataset run keys in mirror/poller.py). The datasets of
one tick go to a few mirror_batch_job runs (LAKEHOUSE_MIRROR_BATCH_SIZE each), or to one mirror_job run each
when that is 0.

With LAKEHOUSE_MIRROR_STREAM on, the tick first supervises the stream (mirror/shards.py ``plan_shards``): it keeps one
mirror_stream run queued or running per shard (run key ``stream-<shard>of<count>-<generation>``, the generation
kept in the sensor's cursor), requests a run's successor shortly before its deadline (the successor waits on the
shard's lock), and marks failed a run whose heartbeat went stale (a SIGKILLed or hung process) before replacing it.
The datasets of a shard a live stream covers are left out of the tick's batch requests; those of a shard with no
heartbeat for LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS (or all of them, streaming off) go to batch runs as before.

The reverse mirror (mirror/reverse.py) likewise: a live stream applies the native commits of its shard itself; for
the native datasets no live stream covers, each tick asks ``due_datasets`` (Postgres only) and requests a
reverse_mirror_job run per due dataset, run key ``reverse:<dataset>:<snapshot>`` (the snapshot of its latest
commit in the sync log), so each snapshot is applied by one run; nothing is asked while a live stream covers every
shard.

Each dataset version the tick sees for the first time is also recorded as a runless materialization of its
postgres/dataset_rows partition, its rows_version as data version (the app wrote those rows, outside Dagster): the UI
shows the dataset's iceberg/dataset_table partition as stale ("Unsynced") from that moment until a mirror of it
lands, with no run needed. Not an observation: Dagster 1.13 reads observations for staleness only on observable
(source) assets (``CachingInstanceQueryer._get_latest_materialization_or_observation_record``), and this asset is
materializable. Stored by the tick itself in one batch write (dagster/private_apis.py), not returned as
``SensorResult(asset_events=...)``: the daemon stores those one at a time before it submits the tick's runs, ~40×
slower for 100 datasets on Postgres storage, and the mirror's runs would wait for it."""

import hashlib
import json
import time
import uuid

import dagster as dg

from lakehouse_dagster.api.capture import CaptureError, catch_up_without_waiting
from lakehouse_dagster.api.mirror import (
    Cursor,
    Pending,
    Retry,
    ShardPlan,
    StreamRun,
    plan_shards,
    plan_tick,
    shard_of,
    shard_views,
)
from lakehouse_dagster.api.reverse import due_datasets, latest_snapshots
from lakehouse_dagster.core.batches import split_near_equal
from lakehouse_dagster.core.settings import MirrorSettings, StreamSettings
from lakehouse_dagster.dagster.defs.mirror.assets import mirror_job
from lakehouse_dagster.dagster.defs.mirror.mirror_batch import (
    DATA_VERSION_TAG,
    DATASETS_TAG,
    MirrorBatchConfig,
    mirror_batch_job,
)
from lakehouse_dagster.dagster.defs.mirror.reverse_job import (
    IN_FLIGHT_STATUSES,
    reverse_mirror_job,
    reverse_retries,
    reverse_run_request,
)
from lakehouse_dagster.dagster.defs.mirror.stream_job import GENERATION_TAG, SHARD_TAG, mirror_stream
from lakehouse_dagster.dagster.defs.resources import LakehouseResource
from lakehouse_dagster.dagster.defs.shared.keys import PG_ROWS
from lakehouse_dagster.dagster.defs.shared.outage import skip_while_postgres_is_down
from lakehouse_dagster.dagster.defs.shared.partitions import DATASETS, datasets_partitions
from lakehouse_dagster.dagster.defs.shared.tags import DATASET, DATASET_NAME, datasets_tags, text
from lakehouse_dagster.dagster.private_apis import dagster_report_runless_materializations

STREAM_PRIORITY = 10  # the run queue starts higher first (default 0): a stream run before the batch and ingest runs
_now = time.time  # the reverse retries' clock (a test moves it past a backoff)
DATASET_NAMES_TAG = "lakehouse/dataset_names"  # a batch run: its datasets' names (display; filter by one-dataset runs)

# A run in one of these may still sync its dataset: the sweep does not ask again meanwhile.
IN_FLIGHT = list(IN_FLIGHT_STATUSES)


def mirror_runs_in_flight(instance: dg.DagsterInstance, dataset_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Datasets among ``dataset_ids`` with a mirror run queued or running: a mirror_job run of their partition,
    or a mirror_batch_job run listing them (tag lakehouse/datasets). Two queries; batch runs in flight are few."""
    if not dataset_ids:
        return set()
    want = {str(d) for d in dataset_ids}
    records = instance.get_run_records(
        dg.RunsFilter(job_name=mirror_job.name, statuses=IN_FLIGHT, tags={"dagster/partition": sorted(want)})
    )
    busy = {r.dagster_run.tags["dagster/partition"] for r in records}
    for r in instance.get_run_records(dg.RunsFilter(job_name=mirror_batch_job.name, statuses=IN_FLIGHT)):
        busy |= want.intersection(r.dagster_run.tags.get(DATASETS_TAG, "").split(","))
    return {uuid.UUID(d) for d in busy & want}


def mirror_tags(items: list[Pending], named: dict | None = None) -> dict[str, str]:
    """The run tags of a mirror request (one place: the batch and the per-dataset path). A run of one dataset
    carries its id and name (dagster/defs/shared/tags.py, filterable in the runs list); a batch lists its ids and names."""
    named = named or {}
    tags = {DATASETS_TAG: ",".join(str(p.dataset_id) for p in items)}
    if len(items) > 1:
        names = [named.get(p.dataset_id, {}).get(DATASET_NAME, str(p.dataset_id)) for p in items]
        tags[DATASET_NAMES_TAG] = ",".join(names)[:255]
    if len(items) == 1:
        tags.update(named.get(items[0].dataset_id, {}))
        tags["lakehouse/source_version"] = str(items[0].rows_version)
        if isinstance(items[0], Retry):
            tags["lakehouse/attempt"] = str(items[0].attempt)
    return tags


def batch_run_key(items: list[Pending]) -> str:
    """A lone dataset keeps its own key (mirror:<ds>:<version>[:attempt:<n>]); a batch's key is a digest of its
    datasets' keys, so it too changes with every version and attempt (a run key deduplicates forever)."""
    if len(items) == 1:
        return items[0].run_key
    digest = hashlib.sha256("\n".join(sorted(p.run_key for p in items)).encode()).hexdigest()[:24]
    return f"mirror-batch:{len(items)}:{digest}"


def datasets_per_tick(mirror: MirrorSettings) -> int:
    """At most LAKEHOUSE_SENSOR_MAX_REQUESTS runs per tick, each of at most LAKEHOUSE_MIRROR_BATCH_SIZE datasets."""
    return mirror.sensor_max_requests * max(1, mirror.batch_size)


def requested_datasets(run_requests: list[dg.RunRequest]) -> list[str]:
    """The dataset ids a tick's run requests mirror (batch runs' config, or mirror_job partitions)."""
    out: list[str] = []
    for r in run_requests:
        out += [r.partition_key] if r.partition_key else r.run_config["ops"]["mirror_datasets"]["config"]["datasets"]
    return out


def mirror_run_requests(items: list[Pending], batch_size: int, named: dict | None = None) -> list[dg.RunRequest]:
    if batch_size <= 0:  # one mirror_job run per dataset partition (the path before batches)
        return [
            dg.RunRequest(
                job_name=mirror_job.name,
                run_key=p.run_key,
                partition_key=str(p.dataset_id),
                tags=mirror_tags([p], named),
            )
            for p in items
        ]
    return [
        dg.RunRequest(
            job_name=mirror_batch_job.name,
            run_key=batch_run_key(b),
            tags=mirror_tags(b, named),
            run_config=dg.RunConfig(
                ops={"mirror_datasets": MirrorBatchConfig(datasets=[str(p.dataset_id) for p in b])}
            ),
        )
        for b in split_near_equal(items, batch_size)
    ]


def changed_materializations(items: list[Pending], named: dict | None = None) -> list[dg.AssetMaterialization]:
    """A runless materialization of postgres/dataset_rows per dataset version seen for the first time (a retry's
    version was recorded when first asked for), its data version the rows_version: Dagster then shows the dataset's
    Iceberg partition as stale until the mirror's materialization of that version lands."""
    named = named or {}
    out = []
    for p in items:
        if isinstance(p, Retry):
            continue
        tags = named.get(p.dataset_id, {})
        out.append(
            dg.AssetMaterialization(
                asset_key=PG_ROWS,
                partition=str(p.dataset_id),
                tags={DATA_VERSION_TAG: str(p.rows_version)},
                description="Postgres rows changed (seen by the mirror poller; written by the app, not by a run)",
                metadata={
                    "dataset_name": text(tags.get(DATASET_NAME, "(unknown dataset)")),
                    "dataset_id": text(tags.get(DATASET, p.dataset_id)),
                    "rows_version": text(p.rows_version),
                },
            )
        )
    return out


def stream_runs_in_flight(instance: dg.DagsterInstance) -> list[tuple[StreamRun, dg.DagsterRun]]:
    """The mirror_stream runs queued or running, with their shard (tag lakehouse/stream_shard): one query."""
    out = []
    for r in instance.get_run_records(dg.RunsFilter(job_name=mirror_stream.name, statuses=IN_FLIGHT)):
        shard, _, count = r.dagster_run.tags.get(SHARD_TAG, "").partition("/")
        if shard.isdigit() and count.isdigit():
            out.append((StreamRun(r.dagster_run.run_id, int(shard), int(count)), r.dagster_run))
    return out


def stream_run_request(shard: int, count: int, generation: int, lifetime_s: int) -> dg.RunRequest:
    return dg.RunRequest(
        job_name=mirror_stream.name,
        run_key=f"stream-{shard}of{count}-{generation}",  # a run key deduplicates forever: one per generation
        run_config=dg.RunConfig(ops={"stream_shard_op": {"config": {"shard": shard, "shards": count}}}),
        tags={
            SHARD_TAG: f"{shard}/{count}",
            GENERATION_TAG: str(generation),
            # Dagster's run monitoring ends a run stuck far past its lifetime (it lets go of its shard at its deadline)
            "dagster/max_runtime": str(lifetime_s + 600),
            # First out of the run queue: until a shard's stream runs, its changes wait for batch runs (seconds each)
            "dagster/priority": str(STREAM_PRIORITY),
        },
    )


def supervise_streams(
    context, conn, stream: StreamSettings, generation: int
) -> tuple[list[ShardPlan], list[dg.RunRequest], int]:
    """The tick's stream decisions: (per-shard plans, the stream runs to request, the next generation). A holder
    whose heartbeat went stale is marked failed here (its process is gone or hung; Dagster's run monitoring may
    not see it under every launcher), so its replacement is not held back by it."""
    flying = stream_runs_in_flight(context.instance)
    plans = plan_shards(shard_views(conn, stream.shards), [r for r, _ in flying], stream)
    by_id = {r.run_id: run for r, run in flying}
    requests = []
    for p in plans:
        if p.dead_run_id is not None and p.dead_run_id in by_id:
            context.instance.report_run_failed(
                by_id[p.dead_run_id],
                f"stream shard {p.shard}: no heartbeat for over 10 s (the run's process died or hung); "
                "the mirror poller replaces it",
            )
            context.log.warning(f"stream shard {p.shard}: run {p.dead_run_id} has no heartbeat; replacing it")
        if p.start:
            requests.append(stream_run_request(p.shard, stream.shards, generation, stream.lifetime_seconds))
            generation += 1
    return plans, requests, generation


def _generation(raw: str | None) -> int:
    """The next stream run generation, kept in the sensor's cursor beside the xid cursor; a cursor without one (a
    first tick, a reset) starts from the clock, so a key is never one an earlier generation used."""
    try:
        return int(json.loads(raw or "{}").get("stream_generation") or 0) or int(time.time())
    except (ValueError, AttributeError):
        return int(time.time())


def _cursor(cursor: Cursor, generation: int) -> str:
    return json.dumps({**json.loads(cursor.dumps()), "stream_generation": generation})


@dg.sensor(
    jobs=[mirror_batch_job, mirror_job, mirror_stream, reverse_mirror_job],
    # The daemon evaluates sensors at most every 5 s (MIN_INTERVAL_LOOP_TIME): ask for every loop. Not 5: the
    # interval is measured from the previous tick's start, which lags its loop's start, so with 5 every other
    # loop found 4.9x s elapsed and skipped (ticks 10 s apart, measured in job_ticks).
    minimum_interval_seconds=1,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="PG → Iceberg mirror poller (ENABLE_ICEBERG_SYNC); skips manifest and iceberg-native datasets.",
)
@skip_while_postgres_is_down
def mirror_poller(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource):
    settings = lakehouse.settings()
    if not settings.mirror.enabled:
        return dg.SkipReason("ENABLE_ICEBERG_SYNC is off")
    generation = _generation(context.cursor)
    stream_requests: list[dg.RunRequest] = []
    keep = None
    every_shard_streamed = False  # then the streams apply every native commit: the tick asks nothing of the reverse
    with lakehouse.connect() as conn:
        if settings.stream.enabled:
            plans, stream_requests, generation = supervise_streams(context, conn, settings.stream, generation)
            covered = {p.shard for p in plans if p.covered}
            every_shard_streamed = len(covered) == settings.stream.shards
            if covered:
                count = settings.stream.shards

                def keep(ds: uuid.UUID) -> bool:  # what no live stream covers: for the batch runs
                    return shard_of(ds, count) not in covered

        try:  # capture mode after-commit: the consumer writes the change tracking this tick reads
            catch_up_without_waiting(conn)
        except CaptureError as exc:  # the tracking lags; said plainly, the tick goes on
            context.log.warning(f"change tracking from the WAL not caught up: {exc}")
        tick = plan_tick(
            conn,
            Cursor.loads(context.cursor),
            limit=datasets_per_tick(settings.mirror),
            retry_after_seconds=settings.mirror.retry_failed_after_seconds,
            retry_max=settings.mirror.retry_failed_max,
            in_flight=lambda ids: mirror_runs_in_flight(context.instance, ids),
            keep=keep,
        )
        reverse_due = (
            [] if every_shard_streamed else due_datasets(conn, keep=keep)[: settings.mirror.sensor_max_requests]
        )
        snapshots = latest_snapshots(conn, reverse_due)
        named = datasets_tags(conn, [p.dataset_id for p in tick.requests] + reverse_due)
    dagster_report_runless_materializations(context.instance, changed_materializations(tick.requests, named))
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    new_keys = sorted(({str(p.dataset_id) for p in tick.requests} | {str(d) for d in reverse_due}) - known)
    requests = mirror_run_requests(tick.requests, settings.mirror.batch_size, named)
    asks = reverse_retries(
        context.instance,
        reverse_due,
        snapshots,
        after_seconds=settings.mirror.retry_failed_after_seconds,
        max_retries=settings.mirror.retry_failed_max,
        now=_now(),
    )
    requests += [reverse_run_request(a.dataset_id, a.snapshot_id, named, a.attempt) for a in asks if a.attempt]
    held = [a for a in asks if not a.attempt]
    retries = sum(isinstance(p, Retry) for p in tick.requests)
    # A tick that asks for nothing is kept in the tick's log (DEBUG), not on the console: an idle stack is quiet
    (context.log.info if requests else context.log.debug)(
        f"scanned {tick.scanned} changed datasets, {tick.behind} behind Postgres; requesting"
        f" {len(tick.requests) - retries} syncs and {retries} retries in {len(requests)} runs"
        f" ({tick.in_flight} behind with a run in flight)"
    )
    if stream_requests:
        context.log.info(f"requesting {len(stream_requests)} stream runs")
    if reverse_due:
        context.log.info(
            f"requesting {len(asks) - len(held)} reverse mirror runs (native datasets no live stream covers)"
            + (
                f"; {len(held)} not asked now: " + "; ".join(f"{a.dataset_id}: {a.why}" for a in held[:5])
                if held
                else ""
            )
        )
    return dg.SensorResult(
        run_requests=stream_requests + requests,
        dynamic_partitions_requests=[datasets_partitions.build_add_request(new_keys)] if new_keys else [],
        cursor=_cursor(tick.cursor, generation),
    )
