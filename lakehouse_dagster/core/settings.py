"""Every environment variable the project reads, typed, in one place: each declared once, in its section.

A section is the settings of one capability (``settings.mirror``, ``settings.service``...); a capability reads its
own. Each field is declared with ``setting(variable, default, meaning, bound=...)`` (core/setting_vars.py):
``Settings.from_env`` reads them all, refusing a bad value in one line that names the variable, and
docs/configuration.md's tables are written from the same declarations (``python -m
lakehouse_dagster.core.settings_doc --write``; lakehouse_dagster_tests/test_settings_doc.py fails when they differ).
Long on purpose: one declaration per variable, with the meaning the docs show.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.setting_vars import (
    ABOVE_ZERO,
    FRACTION,
    SHARE,
    Var,
    at_least,
    declared,
    given,
    one_of,
    read_one,
    read_section,
    setting,
    zero_or_at_least,
)

# Compaction (tracking/row_changes.py) decides from the newest this-many snapshots: expiry keeps at least them.
SNAPSHOTS_KEEP_MIN = 16


def _home_default() -> Path:
    return (Path.cwd() / ".lakehouse").resolve()


def _warehouse_default() -> str:
    return (read_one(ProjectSettings, "home") / "warehouse").as_uri()


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid:{os.getuid()}"


def _catalog_properties(name: str, raw: str) -> dict[str, str]:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadInput(f'{name} is not a JSON object of strings; set it like {{"scope": "PRINCIPAL_ROLE:ALL"}}')
    return value


@dataclasses.dataclass(frozen=True)
class ProjectSettings:
    """Where the project keeps its local state, and who acts: the home and the actor audited."""

    home: Path = setting(
        "LAKEHOUSE_HOME",
        None,
        "embedded Postgres, local warehouse, `DAGSTER_HOME`, the demo's source files",
        kind="path",
        factory=_home_default,
        shown="`./.lakehouse`",
    )
    actor: str = setting(
        "LAKEHOUSE_ACTOR",
        None,
        "who a flag change is audited as",
        factory=_os_user,
        shown="OS user",
    )


@dataclasses.dataclass(frozen=True)
class PostgresSettings:
    """The project's Postgres: the app tables, the control tables and (by default) the Iceberg SQL catalog."""

    dsn: str | None = setting(
        "LAKEHOUSE_PG_DSN",
        None,
        (
            "Postgres with the app tables, control tables and the Iceberg SQL catalog; unset: the embedded server"
            " under `$LAKEHOUSE_HOME/pg` (started only by `lakehouse up` / `lakehouse pg start`; any other verb "
            "attaches to it running, or refuses in one line, exit 3)"
        ),
        shown="embedded server",
    )


@dataclasses.dataclass(frozen=True)
class CatalogSettings:
    """The Iceberg catalog and its warehouse (lake/catalog.py); a REST catalog's secrets come from the environment only."""

    type: str = setting(
        "LAKEHOUSE_CATALOG_TYPE",
        "sql",
        "`sql` (pyiceberg SqlCatalog on `LAKEHOUSE_PG_DSN`) or `rest`",
        kind="lower",
        bound=one_of("sql", "rest"),
    )
    uri: str | None = setting(
        "LAKEHOUSE_CATALOG_URI",
        None,
        (
            "the REST catalog URL (required with `rest`; also what `lakehouse catalog migrate` moves tables to or"
            " from) ([REST catalog](rest-catalog.md))"
        ),
    )
    credential: str | None = setting(
        "LAKEHOUSE_CATALOG_CREDENTIAL",
        None,
        (
            "a REST catalog's OAuth2 client credential `id:secret` (SeaweedFS: its S3 access key and secret); a "
            "secret: read from the environment only, never a resource field, never logged or written to a table"
        ),
        secret=True,
    )
    token: str | None = setting(
        "LAKEHOUSE_CATALOG_TOKEN",
        None,
        "a REST catalog's bearer token instead of a credential (a secret, as above)",
        secret=True,
    )
    properties: dict[str, str] = setting(
        "LAKEHOUSE_CATALOG_PROPERTIES",
        None,
        (
            'more RestCatalog properties, a JSON object of strings, e.g. `{"scope": "PRINCIPAL_ROLE:ALL"}` '
            '(Polaris) or `{"header.X-Iceberg-Access-Delegation": "vended-credentials"}`; they win over the '
            "project's own. Not for secrets"
        ),
        parse=_catalog_properties,
        factory=dict,
        shown="—",
    )
    warehouse: str = setting(
        "LAKEHOUSE_WAREHOUSE",
        None,
        (
            "where table files go; `s3://bucket/prefix` with the standard AWS variables (credentials from the "
            "SDK's default chain; `AWS_REGION`/`AWS_DEFAULT_REGION` the region, else `us-east-1` with "
            "`LAKEHOUSE_S3_ENDPOINT`) and, for a store that is not AWS, `LAKEHOUSE_S3_ENDPOINT` ([object store "
            "faults](design/faults.md#object-store-faults))"
        ),
        factory=_warehouse_default,
        shown="`file://$LAKEHOUSE_HOME/warehouse`",
    )
    namespace: str = setting(
        "LAKEHOUSE_NAMESPACE",
        "lakehouse",
        "Iceberg namespace; tables are `<namespace>.ds_<uuid hex>`",
    )


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """An S3-compatible object store: the warehouse's and the s3:// file sources' (lake/storage.py)."""

    endpoint: str | None = setting(
        "LAKEHOUSE_S3_ENDPOINT",
        None,
        (
            "endpoint of an S3-compatible store (MinIO, moto) for `s3://` file sources and an `s3://` warehouse "
            "(the catalog's FileIO, `s3.endpoint`); the standard AWS variables give the credentials and region"
        ),
    )
    region: str | None = setting(
        "AWS_REGION",
        None,
        (
            "the region of an `s3://` warehouse (the catalog's FileIO, `s3.region`; given, pyiceberg does not ask"
            " AWS for the bucket's); unset: the SDK's, or `us-east-1` with `LAKEHOUSE_S3_ENDPOINT`"
        ),
        also=("AWS_DEFAULT_REGION",),
    )
    connect_timeout_seconds: float = setting(
        "LAKEHOUSE_S3_CONNECT_TIMEOUT_SECONDS",
        5.0,
        (
            "an `s3://` warehouse: a connect to the store that takes longer fails and is retried (pyiceberg's "
            "`s3.connect-timeout`)"
        ),
        bound=ABOVE_ZERO,
    )
    request_timeout_seconds: float = setting(
        "LAKEHOUSE_S3_REQUEST_TIMEOUT_SECONDS",
        10.0,
        (
            "an `s3://` warehouse: a request during which nothing arrives for this long fails and is retried "
            "(`s3.request-timeout`, curl's low-speed limit: a store that trickles a byte now and then is not cut)."
            " Each request is tried 9 times at most (8 retries, 6.4 s of backoff in all), so a silent "
            "store fails a sync after about 9 × this + 6.4 s, exit 75"
        ),
        bound=ABOVE_ZERO,
    )


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


@dataclasses.dataclass(frozen=True)
class FlagSettings:
    """How the flags reach every process (flags/resolver.py)."""

    ttl_seconds: float = setting(
        "LAKEHOUSE_FLAG_TTL_SECONDS",
        10.0,
        "flag cache TTL: a flip or rollback is seen everywhere within it",
    )
    listen: bool = setting(
        "LAKEHOUSE_FLAG_LISTEN",
        True,
        ("flag changes reach every process through Postgres `LISTEN/NOTIFY` within a second; `false`: the TTL only"),
    )


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """Flips widening, rolling back and the rollout plans (flags/widen.py, runbooks/auto_rollback.py, plans/)."""

    soak_seconds: int = setting(
        "LAKEHOUSE_SOAK_SECONDS",
        3600,
        (
            "the soak's default only: how long a flip must hold (no MISMATCH, failed sync or fallback) before it "
            "may widen, and readers must have served Iceberg before a write flip. A soak stored with `lakehouse "
            "flags soak set` wins in every process; `lakehouse up` stores this value the first time it starts on "
            "a database ([widening](flags.md#widening-dataset-workspace-global-in-the-runbooks-order)); `0`: no "
            "waiting, the dataset → workspace → global order still holds"
        ),
    )
    # Set in this process: `lakehouse up` stores it as the soak; a soak stored in the database wins otherwise.
    soak_seconds_given: bool = given("LAKEHOUSE_SOAK_SECONDS")
    auto_rollback: bool = setting(
        "LAKEHOUSE_AUTO_ROLLBACK",
        True,
        (
            "a canary MISMATCH turns the readers serving the dataset from Iceberg off (a first native sync's "
            "MISMATCH: its writer back to pg), at dataset scope, audited; `false`: report only"
        ),
    )
    tick_seconds: int = setting(
        "LAKEHOUSE_ROLLOUT_TICK_SECONDS",
        15,
        (
            "how often the `rollout_controller` sensor advances the rollout plans ([rollout plans](rollouts.md));"
            " read when the code location loads"
        ),
        bound=at_least(1),
    )


@dataclasses.dataclass(frozen=True)
class ShadowSettings:
    """Read mode shadow (routing/shadow.py) and the proof a compute reader's flip needs (flags/proof.py)."""

    sample: float = setting(
        "LAKEHOUSE_SHADOW_SAMPLE",
        0.1,
        (
            "read mode `shadow`: the fraction of reads (0 to 1) also read from Iceberg and compared, off the "
            "request path ([shadow reads](rollouts.md#shadow-reads))"
        ),
        bound=FRACTION,
    )
    workers: int = setting(
        "LAKEHOUSE_SHADOW_WORKERS",
        2,
        "threads per process that run the shadow reads' Iceberg side and comparison",
        bound=at_least(1),
    )
    queue: int = setting(
        "LAKEHOUSE_SHADOW_QUEUE",
        64,
        (
            "shadow reads waiting for a worker, per process; when full a sampled read is dropped and counted, "
            "never waited for"
        ),
        bound=at_least(1),
    )
    proof_reads: int = setting(
        "LAKEHOUSE_SHADOW_PROOF_READS",
        300,
        (
            "a compute reader (`objects.sync`, `dashboards.aggregate`, `pipeline.expectations`) is flipped to "
            "Iceberg for a dataset only after this many shadow comparisons of it in a row compared equal since "
            "the dataset's last change of schema ([flags](flags.md#compute-readers-proven-before-a-flip)); one "
            "value for every process on a database: once stored (`lakehouse_settings`, audited in "
            "`lakehouse_settings_audit`) every process shows and applies the stored value; a flip's gate in a "
            "process where this variable is set to another value stores that value first, with its actor, so a "
            "lower bar set in one shell becomes everyone's, visibly, never a private exception; with nothing "
            "stored, this variable or 300"
        ),
        bound=at_least(1),
    )
    # Set in this process: a flip's gate stores it first, so a bar set in one shell becomes everyone's, visibly.
    proof_reads_given: bool = given("LAKEHOUSE_SHADOW_PROOF_READS")


@dataclasses.dataclass(frozen=True)
class ParitySettings:
    """Parity digests and the scheduled canary (parity/, runbooks/canary_rounds.py)."""

    # Off by default: measured at 1.48x the mirror's time (bench_mirror.py --digest-ab).
    digest_on_write: bool = setting(
        "LAKEHOUSE_DIGEST_ON_WRITE",
        False,
        (
            "digest each Iceberg data file as it is written (else the first canary/parity check that meets it "
            "does, once per file)"
        ),
    )
    canary_batch_size: int = setting(
        "LAKEHOUSE_CANARY_BATCH_SIZE",
        1000,
        "datasets per `parity_canary_batch_job` run of the canary schedule",
        bound=at_least(1),
    )
    canary_max_per_tick: int = setting(
        "LAKEHOUSE_CANARY_MAX_PER_TICK",
        10_000,
        (
            "flipped datasets one tick of the canary schedule asks for at most (oldest verdict first; the rest in"
            " later ticks)"
        ),
        bound=at_least(1),
    )
    canary_max_runs: int = setting(
        "LAKEHOUSE_CANARY_MAX_RUNS",
        10,
        (
            "canary batch runs queued or running at once at most: a tick asks only for the runs left free, never "
            "for a dataset already in one ([the canary schedule](operator-guide.md#the-canary-schedule))"
        ),
        bound=at_least(1),
    )


@dataclasses.dataclass(frozen=True)
class CompleteSettings:
    """Completing a native dataset (runbooks/complete/): deleting its Postgres rows in batches."""

    batch_rows: int = setting(
        "LAKEHOUSE_COMPLETE_BATCH_ROWS",
        10_000,
        (
            "rows of `dataset_rows` each batch of `lakehouse write-flags complete` deletes "
            "([Complete](complete.md)): each batch is its own short transaction over a `row_index` range of the "
            "primary key, with a lock timeout, never a table lock"
        ),
        bound=at_least(1),
    )


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    """The HTTP service, `lakehouse serve` (service/)."""

    token: str | None = setting(
        "LAKEHOUSE_API_TOKEN",
        None,
        (
            "the bearer token of `lakehouse serve` (the runbooks' `ML_RUNNER_TOKEN`): every endpoint but "
            "`/healthz` asks for it; required off loopback, at least 16 characters; never printed or logged. "
            "`lakehouse up` uses it when set, else keeps one in `$LAKEHOUSE_HOME/api-token` ([the "
            "service](service.md))"
        ),
        secret=True,
    )
    max_body_bytes: int = setting(
        "LAKEHOUSE_API_MAX_BODY_BYTES",
        65_536,
        "a request body past this is refused (413) before it is parsed",
        bound=at_least(256),
    )
    timeout_seconds: float = setting(
        "LAKEHOUSE_API_TIMEOUT_SECONDS",
        300.0,
        (
            "the longest a service request waits without progress: its body (408), a read's start, a reader that "
            "reads nothing (cut, its read freed), an ingest's answer (504; the ingest goes on and ends whole)"
        ),
        bound=ABOVE_ZERO,
    )
    batch_rows: int = setting(
        "LAKEHOUSE_API_BATCH_ROWS",
        65_536,
        "rows per record batch a read streams: the service's memory per read",
        bound=at_least(1),
    )
    pg_dead_after_seconds: int = setting(
        "LAKEHOUSE_API_PG_DEAD_AFTER_SECONDS",
        30,
        (
            "the service's Postgres sessions (reads, control requests, the flag resolver, an ingest's writers): a"
            " peer gone silent — a partitioned network, a failover that leaves the old address unanswered — is "
            "found dead after about this long instead of TCP's ~15 minutes. libpq `keepalives_idle` a third of "
            "it, then 3 probes (`keepalives_interval`, `keepalives_count`), and `tcp_user_timeout` the whole of "
            "it"
        ),
        bound=at_least(3),
    )
    read_statement_seconds: float = setting(
        "LAKEHOUSE_API_READ_STATEMENT_SECONDS",
        120.0,
        (
            "the `statement_timeout` of the service's read sessions: one statement of a read (its plan queries, "
            "each fetch of a batch) that runs longer is cut by the server and the stream ends cut"
        ),
        bound=ABOVE_ZERO,
    )
    control_statement_seconds: float = setting(
        "LAKEHOUSE_API_CONTROL_STATEMENT_SECONDS",
        45.0,
        (
            "the `statement_timeout` of the sessions of `/lakehouse/route`, `/lakehouse/flags`, `/readyz`, "
            "`/metrics` and the flag resolver (kept above the barrier's 30 s wait). Ingests have none: G3's wait "
            "is bounded by its own 30-minute lock timeout"
        ),
        bound=ABOVE_ZERO,
    )


@dataclasses.dataclass(frozen=True)
class AlertSettings:
    """Alerts (status/alerts/): the webhook the lakehouse_alerts sensor posts to."""

    webhook_url: str | None = setting(
        "LAKEHOUSE_ALERT_WEBHOOK_URL",
        None,
        (
            "Slack-compatible webhook the `lakehouse_alerts` sensor posts to; unset: nothing is posted (the tick "
            "says so). A secret: never logged or shown ([Alerts](alerts.md))"
        ),
        secret=True,
    )
    timeout_seconds: float = setting(
        "LAKEHOUSE_ALERT_TIMEOUT_SECONDS",
        5.0,
        ("one alert post's whole exchange at most; a receiver that fails or hangs is retried with backoff"),
        bound=ABOVE_ZERO,
    )
    retry_seconds: int = setting(
        "LAKEHOUSE_ALERT_RETRY_SECONDS",
        86_400,
        (
            "how long an alert whose post failed is retried, with backoff and jitter, before it is dropped with a"
            " log line (at least 3600: an hour of outage loses nothing; [Alerts](alerts.md)) (it replaces the "
            "attempt count of earlier releases, which is no longer read)"
        ),
        bound=at_least(3600),
    )


@dataclasses.dataclass(frozen=True)
class RecorderSettings:
    """The lakehouse_recorder sensor (status/recording.py): every change recorded as Dagster events."""

    max_events: int = setting(
        "LAKEHOUSE_RECORDER_MAX_EVENTS",
        50,
        (
            "the `lakehouse_recorder` sensor reads at most this many rows of each kind of change per tick (syncs,"
            " flag changes, backfills, orphan sweeps; and datasets of its first pass); the rest wait for the next"
            " tick. The daemon reports each event after the tick (~60 ms a materialization here), in the loop "
            "that also runs the mirror poller: keep it small ([Every change recorded](design/recording.md))"
        ),
        bound=at_least(1),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting, by section (``settings.mirror.batch_size``); built once per process by ``from_env``."""

    project: ProjectSettings
    postgres: PostgresSettings
    catalog: CatalogSettings
    s3: S3Settings
    sync: SyncSettings
    maintenance: MaintenanceSettings
    mirror: MirrorSettings
    stream: StreamSettings
    reverse: ReverseSettings
    flags: FlagSettings
    rollout: RolloutSettings
    shadow: ShadowSettings
    parity: ParitySettings
    complete: CompleteSettings
    service: ServiceSettings
    alerts: AlertSettings
    recorder: RecorderSettings

    @classmethod
    def from_env(cls) -> Settings:
        """Every section read from the environment, each variable in its declaration."""
        settings = cls(**{name: read_section(section) for name, section in sections().items()})
        if settings.catalog.type == "rest" and not settings.catalog.uri:
            raise BadInput("LAKEHOUSE_CATALOG_TYPE=rest needs LAKEHOUSE_CATALOG_URI (the REST catalog's URL)")
        return settings

    def replace(self, **changes: Any) -> Settings:
        """A copy with some sections changed: each a section, or a mapping of the fields to change in it
        (``settings.replace(sync={"chunk_rows": 3})``)."""
        known = sections()
        for name in changes:
            if name not in known:
                raise TypeError(f"Settings has no section {name!r}{_moved(name)}")
        return dataclasses.replace(
            self,
            **{
                name: dataclasses.replace(getattr(self, name), **value) if isinstance(value, Mapping) else value
                for name, value in changes.items()
            },
        )

    def with_vars(self, values: Mapping[str, Any]) -> Settings:
        """A copy with the settings of these variables (``{"LAKEHOUSE_MIRROR_BATCH_SIZE": 5}``) set, as given."""
        index = variables()
        changes: dict[str, dict[str, Any]] = {}
        for env, value in values.items():
            section, field = index[env]
            changes.setdefault(section, {})[field] = value
        return self.replace(**changes)

    if not typing.TYPE_CHECKING:

        def __getattr__(self, name: str):
            """A flat name of before the sections (``settings.mirror_batch_size``) says where it went."""
            raise AttributeError(f"Settings has no attribute {name!r}{_moved(name)}")


def sections() -> dict[str, type]:
    """Section attribute -> its class, in the order the docs show them."""
    return {name: hint for name, hint in typing.get_type_hints(Settings).items()}


def variables() -> dict[str, tuple[str, str]]:
    """Every declared variable -> (section, field)."""
    return {var.env: (name, field) for name, cls in sections().items() for field, var in declared(cls)}


def declarations() -> list[tuple[str, str, Var]]:
    """(section, field, declaration) of every variable, in the docs' order."""
    return [(name, field, var) for name, cls in sections().items() for field, var in declared(cls)]


def _moved(name: str) -> str:
    """Where a flat name of before the sections went (named after its variable): a hint for old code."""
    env = "ENABLE_ICEBERG_SYNC" if name == "enable_iceberg_sync" else f"LAKEHOUSE_{name.upper()}"
    where = variables().get(env) or variables().get(f"LAKEHOUSE_{name.upper().removesuffix('_GIVEN')}")
    if name == "s3_region":
        where = ("s3", "region")
    if where is None:
        return ""
    suffix = "_given" if name.endswith("_given") else ""
    return f": the settings are by section, read settings.{where[0]}.{where[1]}{suffix}"


def mirror_freshness_seconds() -> int:
    """LAKEHOUSE_MIRROR_FRESHNESS_SECONDS alone: the Iceberg asset's freshness policy is built when the code location
    loads, and a bad value elsewhere must not stop it from loading."""
    value: int = read_one(MirrorSettings, "freshness_seconds")
    return value
