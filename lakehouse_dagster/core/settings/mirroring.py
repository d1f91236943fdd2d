"""The settings of moving rows: syncs, table maintenance, the mirror, its stream, the reverse mirror."""

from __future__ import annotations

import dataclasses

from lakehouse_dagster.core.setting_vars import (
    SHARE,
    at_least,
    setting,
    zero_or_at_least,
)

# Compaction (tracking/row_changes.py) decides from the newest this-many snapshots: expiry keeps at least them.
SNAPSHOTS_KEEP_MIN = 16


@dataclasses.dataclass(frozen=True)
class SyncSettings:
    """One sync of a dataset to Iceberg (mirror/sync.py, lake/writer.py): its files, admission and commit."""

    chunk_rows: int = setting(
        "LAKEHOUSE_INGEST_CHUNK_ROWS",
        250_000,
        "rows per Parquet file written by a sync",
        bound=at_least(1),
    )
    max_concurrent: int = setting(
        "LAKEHOUSE_MAX_CONCURRENT_INGEST",
        4,
        "G2 admission bound (syncs at once, across processes)",
        bound=at_least(1),
    )
    partial_max_fraction: float = setting(
        "LAKEHOUSE_PARTIAL_MAX_FRACTION",
        0.25,
        (
            "a sync after updates/deletes/inserts below the max rewrites only the Iceberg files holding the "
            "changed rows when those files hold at most this fraction of the table's rows; more, or `0`: a full "
            "rewrite"
        ),
    )
    snapshots_keep: int = setting(
        "LAKEHOUSE_SNAPSHOTS_KEEP",
        100,
        (
            "a mirror commit removes from the table metadata the snapshots past the newest N that are also older "
            "than the max age below (`0`: never; else at least 16, the snapshots compaction reads); native "
            "commits do the same, carrying the rollback's totals"
        ),
        bound=zero_or_at_least(SNAPSHOTS_KEEP_MIN, ", the snapshots compaction reads to decide", "never expire"),
    )
    snapshots_max_age_seconds: int = setting(
        "LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS",
        3600,
        ("a snapshot younger than this is never expired; also the orphan sweep's default grace (at least an hour)"),
    )


@dataclasses.dataclass(frozen=True)
class MaintenanceSettings:
    """Table maintenance between syncs (lake/maintenance.py; a stream run calls it)."""

    small_file_bytes: int = setting(
        "LAKEHOUSE_MAINTENANCE_SMALL_FILE_BYTES",
        8 * 1024 * 1024,
        (
            "table maintenance between syncs (`lake/maintenance.py`, called by the stream every "
            "`LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS`): a data file below this size is small"
        ),
        bound=at_least(1),
    )
    min_files: int = setting(
        "LAKEHOUSE_MAINTENANCE_MIN_FILES",
        16,
        (
            "compact a mirror table's small files (one overwrite commit, same rows and identity values) once it "
            "has at least this many"
        ),
        bound=at_least(2),
    )
    keep_snapshots: int = setting(
        "LAKEHOUSE_MAINTENANCE_KEEP_SNAPSHOTS",
        SNAPSHOTS_KEEP_MIN,
        (
            "maintenance expiry always keeps the newest N snapshots (at least 16, the snapshots a sync's "
            "compaction reads)"
        ),
        bound=at_least(SNAPSHOTS_KEEP_MIN),
    )
    snapshot_age_seconds: int = setting(
        "LAKEHOUSE_MAINTENANCE_SNAPSHOT_AGE_SECONDS",
        60,
        (
            "maintenance expiry removes snapshots older than this (beyond the newest N and the pinned ones); the "
            "commit-time expiry above stays as it is"
        ),
    )
    pin_seconds: int = setting(
        "LAKEHOUSE_MAINTENANCE_PIN_SECONDS",
        60,
        (
            "a snapshot a reader was handed (a succeeded sync's, still the latest within this window) is never "
            "expired by maintenance"
        ),
        bound=at_least(1),
    )


@dataclasses.dataclass(frozen=True)
class MirrorSettings:
    """The mirror's poller and batch runs (dagster/defs/mirror/), and when a mirrored dataset counts as stuck or late."""

    enabled: bool = setting(
        "ENABLE_ICEBERG_SYNC",
        True,
        "the mirror poller requests syncs only when on",
    )
    sensor_max_requests: int = setting(
        "LAKEHOUSE_SENSOR_MAX_REQUESTS",
        25,
        (
            "mirror runs requested per sensor tick at most (each of up to `LAKEHOUSE_MIRROR_BATCH_SIZE` "
            "datasets), and as many retries; also the source poller's visits per tick"
        ),
        bound=at_least(1),
    )
    batch_size: int = setting(
        "LAKEHOUSE_MIRROR_BATCH_SIZE",
        25,
        "datasets per `mirror_batch_job` run; `0`: one `mirror_job` run per dataset (the old path)",
    )
    retry_failed_after_seconds: int = setting(
        "LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS",
        300,
        (
            "the poller asks again for a dataset still behind Postgres, with no mirror run in flight, this long "
            "after the last request of its version, doubling per attempt (`0`: never)"
        ),
    )
    retry_failed_max: int = setting(
        "LAKEHOUSE_RETRY_FAILED_MAX",
        5,
        (
            "further requests per version after the first, after which the poller leaves the dataset to the "
            "operator (until it changes)"
        ),
    )
    wedged_after_seconds: int = setting(
        "LAKEHOUSE_WEDGED_AFTER_SECONDS",
        3600,
        "a sync `running`/`failed` longer than this is `wedged`",
        bound=at_least(1),
    )
    lagging_after_seconds: int = setting(
        "LAKEHOUSE_LAGGING_AFTER_SECONDS",
        3600,
        (
            "a dataset behind the mirror whose latest succeeded sync finished longer ago is `lagging` ([the "
            "overview](overview.md)); a flipped one's `snapshot_freshness` check then fails without a run, and "
            "the `lakehouse_alerts` sensor posts a freshness breach"
        ),
        bound=at_least(1),
    )
    freshness_seconds: int = setting(
        "LAKEHOUSE_MIRROR_FRESHNESS_SECONDS",
        86400,
        (
            "the freshness policy of `iceberg/dataset_table`: fails when no partition was materialized for this "
            "long, warns at a quarter of it (Dagster evaluates it per asset, not per partition); `0`: no policy"
        ),
        bound=zero_or_at_least(60, " (Dagster's freshness windows are at least a minute)", "no policy"),
    )


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    """The mirror as a stream (mirror/stream.py): long-lived mirror_stream runs, one per shard of the datasets."""

    # On by default (issue 30): freshness no longer depends on how fast the run launcher starts a run.
    enabled: bool = setting(
        "LAKEHOUSE_MIRROR_STREAM",
        True,
        (
            "the mirror as a stream ([The stream](design/mirror.md#the-stream-mirror_stream-runs)): the "
            "`mirror_poller` keeps a `mirror_stream` run alive per shard, which mirrors each changed dataset of "
            "its shard within about a second (each shard holds one of `dagster.yaml`'s run slots, two during a "
            "handover); `false`: batch runs only (a run per change, as before issue 30)"
        ),
    )
    shards: int = setting(
        "LAKEHOUSE_MIRROR_SHARDS",
        1,
        (
            "shards of the datasets (a stable hash of the dataset id), one stream run each (1 to 1024). Each "
            "takes one of `dagster.yaml`'s `max_concurrent_runs` (two during a handover): keep it above twice "
            "this"
        ),
        bound=at_least(1),
    )
    lifetime_seconds: int = setting(
        "LAKEHOUSE_MIRROR_STREAM_LIFETIME_SECONDS",
        900,
        (
            "how long a stream run lives; its successor is started up to 30 s (at most a quarter of this) before "
            "and takes the shard over when it ends"
        ),
        bound=at_least(10),
    )
    commit_window_ms: int = setting(
        "LAKEHOUSE_MIRROR_COMMIT_WINDOW_MS",
        200,
        "changes of one dataset seen within this window of its first go into one commit",
    )
    poll_ms: int = setting(
        "LAKEHOUSE_MIRROR_POLL_MS",
        100,
        "how often a stream run looks for changed datasets (one indexed query on the xid cursor)",
        bound=at_least(10),
    )
    workers: int = setting(
        "LAKEHOUSE_MIRROR_STREAM_WORKERS",
        3,
        "syncs a stream run makes at once (threads, one dataset each; G2 and G3 still hold)",
        bound=at_least(1),
    )
    maintenance_seconds: int = setting(
        "LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS",
        10,
        (
            "a stream run's background table maintenance ([The "
            'stream](design/mirror.md#the-stream-mirror_stream-runs), "Table maintenance"): in an idle moment, '
            "one dataset it synced, at most once per this many seconds per dataset, gets `compact_small_files` "
            "then `expire_snapshots` with the maintenance limits above (`LAKEHOUSE_MAINTENANCE_SMALL_FILE_BYTES` "
            "to `LAKEHOUSE_MAINTENANCE_PIN_SECONDS`), under the dataset's lock (G3); `0`: off (a sync's own "
            "compaction and commit-time expiry only)"
        ),
    )
    sync_share: float = setting(
        "LAKEHOUSE_MIRROR_SYNC_SHARE",
        0.25,
        (
            "the most of the time one dataset's syncs take in a stream run: after a sync of T seconds its next "
            "sync waits T × (1/share − 1) (a 0.1 s append sync: 0.3 s; a 1 s rewrite of a dataset written without"
            " pause: 3 s), so a dataset the app writes all the time is mirrored at about a batch run's pace and "
            "its syncs leave the CPU to the app "
            "([benchmarks](benchmarks.md#freshness-through-the-stream-issue-30)); a native dataset's reverse "
            "applies are paced the same way (after an apply of T seconds the next waits T × (1/share − 1), one "
            "apply then taking every native commit since the last; "
            "[benchmarks](benchmarks.md#the-reverse-mirror-and-complete-issue-31)); `1`: back to back"
        ),
        bound=SHARE,
    )
    down_seconds: int = setting(
        "LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS",
        30,
        (
            "a shard whose stream has not beaten its heartbeat for this long is down: its changed datasets go to "
            "batch runs until a stream is back. A holder silent for 10 s is marked failed and replaced. Down past"
            " it, the alerts sensor posts `stream_down` ([Alerts](alerts.md))"
        ),
        bound=at_least(5),
    )


@dataclasses.dataclass(frozen=True)
class ReverseSettings:
    """The reverse mirror of a native dataset (mirror/reverse.py): Iceberg back into dataset_rows."""

    resync_share: float = setting(
        "LAKEHOUSE_REVERSE_RESYNC_SHARE",
        1.0,
        (
            "the most of the time a [reverse mirror](design/reverse-mirror.md)'s full re-sync (a native "
            "overwrite, a compaction, a repair) may spend COPYing: after each slice of 8,192 rows sent in T "
            "seconds it pauses T × (1/share − 1), inside its transaction, so the live app's statements beside it "
            "meet its WAL and CPU in short bursts; the re-sync then takes about 1/share as long and holds its "
            "snapshot as long; the staging path, taken for values the client cannot build as Postgres does, is "
            "not paced ([benchmarks](benchmarks.md#the-reverse-mirror-and-complete-issue-31)); `1`: unpaced"
        ),
        bound=SHARE,
    )
    lag_alert_seconds: int = setting(
        "LAKEHOUSE_REVERSE_LAG_ALERT_SECONDS",
        300,
        (
            "a native dataset whose [reverse mirror](design/reverse-mirror.md) has lacked a native commit for "
            "longer than this: the alerts sensor posts `reverse_behind` ([Alerts](alerts.md))"
        ),
        bound=at_least(1),
    )
    lag_page_seconds: int = setting(
        "LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS",
        30,
        (
            "a native dataset whose [reverse mirror](design/reverse-mirror.md) has lacked a native commit for "
            "longer than this: the recorder says so on its `postgres/dataset_rows` partition page, once, and "
            "again when it is caught up"
        ),
        bound=at_least(1),
    )
