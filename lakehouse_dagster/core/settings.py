"""Every environment variable the project reads, typed, in one place."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
from pathlib import Path

from lakehouse_dagster.core.errors import BadInput


def _int(name: str, default: int, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"{name}={raw!r} is not an integer; set it to a whole number (default {default})") from None
    if value < minimum:
        raise BadInput(f"{name}={value} is below the minimum {minimum}")
    return value


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise BadInput(f"{name}={raw!r} is not a number (default {default})") from None


def _above_zero(name: str, value: float) -> float:
    if not value > 0:
        raise BadInput(f"{name}={value} must be above 0")
    return value


def _share(name: str, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise BadInput(f"{name}={value} is not a share of the time; set it above 0 and at most 1 (back to back)")
    return value


def _fraction(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise BadInput(f"{name}={value} is not a fraction; set it from 0 (never) to 1 (every read)")
    return value


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise BadInput(f"{name}={raw!r} is not a boolean; use true or false")


@dataclasses.dataclass(frozen=True)
class Settings:
    # Postgres holding the app tables, the lakehouse control tables and (by default) the Iceberg catalog.
    pg_dsn: str | None
    # Where the embedded Postgres, the local warehouse and DAGSTER_HOME live when nothing else is configured.
    home: Path
    catalog_type: str  # "sql" (pyiceberg SqlCatalog on pg_dsn) or "rest"
    catalog_uri: str | None
    warehouse: str
    namespace: str
    ingest_chunk_rows: int
    max_concurrent_ingest: int
    flag_ttl_seconds: float
    actor: str
    enable_iceberg_sync: bool
    wedged_after_seconds: int
    sensor_max_requests: int
    # The poller re-requests a dataset still behind Postgres, with no mirror run in flight, this many
    # seconds after the last request of its version, doubling per attempt, at most retry_failed_max
    # times per version (0 seconds: never), whatever stopped the last attempt.
    retry_failed_after_seconds: int = 300
    retry_failed_max: int = 5
    # Endpoint of an S3-compatible store (MinIO, moto...) for s3:// file sources and an s3:// warehouse; None: AWS.
    s3_endpoint: str | None = None
    # The region for s3:// (AWS_REGION, else AWS_DEFAULT_REGION): given, pyiceberg does not ask AWS for the bucket's.
    s3_region: str | None = None
    # The object store's client timers (pyarrow's S3FileSystem, through the catalog's FileIO): a connect, and a
    # request during which nothing arrives for this long, fail and are retried (lake/storage.py S3_MAX_RETRIES).
    # The SDK's own are 1 s and 3 s; a byte now and then keeps a request alive however slow (curl's low-speed limit).
    s3_connect_timeout_seconds: float = 5.0
    s3_request_timeout_seconds: float = 10.0
    # Retries of one failed S3 request (lake/storage.py S3_MAX_RETRIES says why 8). Fewer only where waiting out the
    # backoff is not the point: the suite's tests of a store failing everything (docs/configuration.md).
    s3_max_retries: int = 8
    # A canary that finds a caught-up dataset MISMATCH turns off the readers serving it from Iceberg (and a
    # first native sync that mismatches turns its writer back to pg), at dataset scope (runbooks/auto_rollback.py).
    auto_rollback: bool = True
    # A flip widens (dataset → workspace → global) only after the narrower flip held this long without an
    # incident, and a writer flips a dataset only after its readers served Iceberg this long (flags/widen.py).
    # Only the default: a soak stored in the database (`lakehouse flags soak set`, flags/soak_setting.py) wins in every
    # process; 0 drops the waiting, never the dataset → workspace → global order.
    soak_seconds: int = 3600
    soak_seconds_given: bool = False  # LAKEHOUSE_SOAK_SECONDS is set in this process' environment
    # Digest each Iceberg data file as it is written (parity/maintained.py). Off by default: measured at
    # 1.48x the mirror's time (bench_mirror.py --digest-ab); the first canary or parity check that meets a
    # file digests it instead (once per file, only the new files after an append).
    digest_on_write: bool = False
    # Datasets per mirror run (mirror_batch_job, one process); 0: one mirror_job run per dataset (the old path).
    mirror_batch_size: int = 25
    # Flag changes reach every process through Postgres NOTIFY (the TTL stays the fallback); false: TTL only.
    flag_listen: bool = True
    # A sync after updates/deletes/inserts below the max rewrites only the Iceberg data files holding the
    # changed rows when they hold at most this fraction of the table's rows; more, or 0: a full rewrite.
    partial_max_fraction: float = 0.25
    # A mirror or native commit removes from the table metadata the snapshots past the newest snapshots_keep that are also
    # older than snapshots_max_age_seconds (lake/writer.py expirable_snapshots); snapshots_keep 0: never.
    snapshots_keep: int = 100
    snapshots_max_age_seconds: int = 3600
    # Table maintenance between syncs (lake/maintenance.py; the stream calls it): data files below this size are
    # small, compacted once there are at least maintenance_min_files of them; snapshots older than the age are
    # expired, keeping the newest maintenance_keep_snapshots and every snapshot a reader was handed within the
    # pin window.
    maintenance_small_file_bytes: int = 8 * 1024 * 1024
    maintenance_min_files: int = 16
    maintenance_keep_snapshots: int = 16
    maintenance_snapshot_age_seconds: int = 60
    maintenance_pin_seconds: int = 60
    # A dataset behind the mirror whose latest succeeded sync finished longer ago than this is lagging (status/lag.py):
    # listed by the migration overview, and a flipped one's snapshot_freshness check fails without a run.
    lagging_after_seconds: int = 3600
    # The freshness policy of iceberg/dataset_table: red when no partition was materialized for this long (Dagster
    # evaluates it per asset, not per partition); 0: no policy.
    mirror_freshness_seconds: int = 86400
    # The HTTP service (`lakehouse serve`, service/): the bearer token every endpoint but /healthz asks for (the
    # runbooks' ML_RUNNER_TOKEN; None: no auth, refused off loopback); never in a repr, a log or a message.
    api_token: str | None = dataclasses.field(default=None, repr=False)
    api_max_body_bytes: int = 65_536  # a request body past this is refused (413) before it is parsed
    # The longest a request waits without progress: its body, a read's first batch, a stalled client, an
    # ingest's answer (past it 504; the ingest itself is never cut, it finishes whole on its own).
    api_timeout_seconds: float = 300.0
    api_batch_rows: int = 65_536  # rows per streamed record batch: a read's memory is bounded by it
    # The service's Postgres sessions (service/db.py): a peer gone silent (a partitioned network) is found dead
    # after about this long by TCP keepalives and tcp_user_timeout, instead of TCP's own ~15 minutes; and the
    # longest one statement of a read (a fetch of one batch) or of a control request (route, flags, readyz,
    # metrics; above the barrier's 30 s wait) may run. Ingests keep no statement timeout (G3 waits up to 30 min).
    api_pg_dead_after_seconds: int = 30
    api_read_statement_seconds: float = 120.0
    api_control_statement_seconds: float = 45.0
    # Read mode shadow (routing/shadow.py): the fraction of reads also read from Iceberg and compared, off the
    # request path, by this many worker threads per process taking a queue this long (full: dropped and counted).
    shadow_sample: float = 0.1
    shadow_workers: int = 2
    shadow_queue: int = 64
    # A compute reader's flip for a dataset (flags/proof.py) needs this many shadow comparisons of it in a row, all
    # equal, since the dataset's last change of schema: 0 failures in 300 bounds the failure rate under 1 % (95 %).
    shadow_proof_reads: int = 300
    shadow_proof_reads_given: bool = False  # LAKEHOUSE_SHADOW_PROOF_READS is set in this process' environment
    # How often the rollout_controller sensor advances the rollout plans (dagster/defs/plans/).
    rollout_tick_seconds: int = 15
    # The lakehouse_recorder sensor reads at most this many rows of each kind of change per tick (sync log, flag
    # audit, backfills, orphan sweeps); more wait for the next tick (status/recording.py).
    recorder_max_events: int = 50
    # The scheduled canary (runbooks/canary_rounds.py): datasets per parity_canary_batch_job run, datasets a tick
    # asks for at most, and canary runs queued or running at once at most (a tick asks only for the runs left free).
    canary_batch_size: int = 1000
    canary_max_per_tick: int = 10_000
    canary_max_runs: int = 10
    # Alerts (status/alerts/). The webhook URL is a secret (its path is the credential): never in a repr, a log,
    # metadata or an exception. Unset: the lakehouse_alerts sensor posts nothing and says so.
    alert_webhook_url: str | None = dataclasses.field(default=None, repr=False)
    alert_timeout_seconds: float = 5.0
    alert_retry_seconds: int = 86_400  # a failed alert is retried (with backoff) this long, then dropped
    # The mirror as a stream (mirror/stream.py, docs/design/mirror.md "The stream"): long-lived mirror_stream runs, one
    # per shard of the datasets (a stable hash of the dataset id), sync each changed dataset within about a second;
    # off: the mirror_poller's batch runs do it all, as before. A stream run lives mirror_stream_lifetime_seconds,
    # then hands its shard over to a successor the poller started shortly before. On by default (issue 30): with it,
    # freshness no longer depends on how fast the run launcher starts a run (a pod start on Kubernetes).
    mirror_stream: bool = True
    mirror_shards: int = 1
    mirror_stream_lifetime_seconds: int = 900
    # Changes of one dataset seen within this window of its first are mirrored in one commit.
    mirror_commit_window_ms: int = 200
    # How often a stream run looks for changed datasets (one indexed query on the xid cursor).
    mirror_poll_ms: int = 100
    # A shard whose stream run has not beaten its heartbeat for this long is down: the poller replaces the run and,
    # meanwhile, sends the shard's changed datasets to batch runs.
    mirror_stream_down_seconds: int = 30
    # A native dataset whose reverse mirror has lacked a native commit for longer than this is alerted
    # (reverse_behind, status/alerts/).
    reverse_lag_alert_seconds: int = 300
    # A native dataset's postgres/dataset_rows partition page says its reverse mirror is behind once it has lacked a
    # native commit for longer than this (status/reverse_page.py, the recorder), and again when that ends.
    reverse_lag_page_seconds: int = 30
    # Syncs a stream run makes at once (threads; each its own dataset, G3 and G2 still hold): a burst of changed
    # datasets is mirrored this many at a time.
    mirror_stream_workers: int = 3
    # Background table maintenance in a stream run (mirror/stream_maintenance.py): in an idle moment, one dataset the
    # run synced, at most once per this many seconds per dataset, gets compact_small_files then expire_snapshots with
    # the maintenance_* limits above, under its lock (G3); 0: none (a sync's own compaction and expiry only).
    mirror_stream_maintenance_seconds: int = 10
    # The most of the time one dataset's syncs may take in a stream run: after a sync of T seconds, that dataset's next
    # sync waits T × (1/share − 1). A small append (T ≈ 0.1 s) is mirrored again within a fraction of a second; a
    # dataset written without pause whose every sync rewrites much (T ≈ 1 s) is synced every few seconds, as a batch
    # run would, instead of back to back, so the mirror does not take the live app's CPU. 1: back to back.
    mirror_sync_share: float = 0.25
    # The most of the time a reverse full re-sync's COPY may take while it runs (mirror/reverse.py, copy_back.paced):
    # after each slice of rows sent in T seconds the COPY pauses T × (1/share − 1), inside its transaction. A full
    # re-sync (a native overwrite, a compaction, a repair) writes every row of the dataset, and the live app's
    # statements meet its WAL; paced, the slowest of them meet a short burst, and the re-sync takes about 1/share as
    # long (docs/benchmarks.md, "Pacing the re-sync"). 1: unpaced, as fast as it goes.
    reverse_resync_share: float = 1.0
    # `lakehouse write-flags complete` (runbooks/complete/): rows of dataset_rows each batch deletes, each batch its
    # own short transaction (a row_index range of the primary key, no table lock).
    complete_batch_rows: int = 10_000
    # A REST catalog's secrets, from the environment only (never a resource field, never in run config, never
    # printed: repr=False): the OAuth2 client credential ``id:secret`` (LAKEHOUSE_CATALOG_CREDENTIAL) or a bearer
    # token (LAKEHOUSE_CATALOG_TOKEN). lake/catalog.py hands them to pyiceberg's RestCatalog.
    catalog_credential: str | None = dataclasses.field(default=None, repr=False)
    catalog_token: str | None = dataclasses.field(default=None, repr=False)
    # More RestCatalog properties (LAKEHOUSE_CATALOG_PROPERTIES, a JSON object of strings): a scope, an
    # ``oauth2-server-uri`` elsewhere, ``header.X-Iceberg-Access-Delegation``... (docs/rest-catalog.md). Not secrets.
    catalog_properties: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_env(cls) -> Settings:
        """Long on purpose: one keyword per variable, every variable the project reads read in this one place."""
        home = Path(os.environ.get("LAKEHOUSE_HOME") or Path.cwd() / ".lakehouse").expanduser().resolve()
        catalog_type = (os.environ.get("LAKEHOUSE_CATALOG_TYPE") or "sql").lower()
        if catalog_type not in ("sql", "rest"):
            raise BadInput(f"LAKEHOUSE_CATALOG_TYPE={catalog_type!r} is not supported; use sql or rest")
        if catalog_type == "rest" and not os.environ.get("LAKEHOUSE_CATALOG_URI"):
            raise BadInput("LAKEHOUSE_CATALOG_TYPE=rest needs LAKEHOUSE_CATALOG_URI (the REST catalog's URL)")
        warehouse = os.environ.get("LAKEHOUSE_WAREHOUSE") or (home / "warehouse").as_uri()
        actor = os.environ.get("LAKEHOUSE_ACTOR") or _os_user()
        return cls(
            pg_dsn=os.environ.get("LAKEHOUSE_PG_DSN") or None,
            home=home,
            catalog_type=catalog_type,
            catalog_uri=os.environ.get("LAKEHOUSE_CATALOG_URI") or None,
            warehouse=warehouse,
            namespace=os.environ.get("LAKEHOUSE_NAMESPACE") or "lakehouse",
            ingest_chunk_rows=_int("LAKEHOUSE_INGEST_CHUNK_ROWS", 250_000, minimum=1),
            max_concurrent_ingest=_int("LAKEHOUSE_MAX_CONCURRENT_INGEST", 4, minimum=1),
            flag_ttl_seconds=_float("LAKEHOUSE_FLAG_TTL_SECONDS", 10.0),
            actor=actor,
            enable_iceberg_sync=_bool("ENABLE_ICEBERG_SYNC", True),
            wedged_after_seconds=_int("LAKEHOUSE_WEDGED_AFTER_SECONDS", 3600, minimum=1),
            sensor_max_requests=_int("LAKEHOUSE_SENSOR_MAX_REQUESTS", 25, minimum=1),
            retry_failed_after_seconds=_int("LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS", 300),
            retry_failed_max=_int("LAKEHOUSE_RETRY_FAILED_MAX", 5),
            s3_endpoint=os.environ.get("LAKEHOUSE_S3_ENDPOINT") or None,
            s3_region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None,
            s3_connect_timeout_seconds=_above_zero(
                "LAKEHOUSE_S3_CONNECT_TIMEOUT_SECONDS", _float("LAKEHOUSE_S3_CONNECT_TIMEOUT_SECONDS", 5.0)
            ),
            s3_request_timeout_seconds=_above_zero(
                "LAKEHOUSE_S3_REQUEST_TIMEOUT_SECONDS", _float("LAKEHOUSE_S3_REQUEST_TIMEOUT_SECONDS", 10.0)
            ),
            s3_max_retries=_int("LAKEHOUSE_S3_MAX_RETRIES", 8),
            auto_rollback=_bool("LAKEHOUSE_AUTO_ROLLBACK", True),
            soak_seconds=_int("LAKEHOUSE_SOAK_SECONDS", 3600),
            soak_seconds_given=bool(os.environ.get("LAKEHOUSE_SOAK_SECONDS")),
            digest_on_write=_bool("LAKEHOUSE_DIGEST_ON_WRITE", False),
            mirror_batch_size=_int("LAKEHOUSE_MIRROR_BATCH_SIZE", 25),
            flag_listen=_bool("LAKEHOUSE_FLAG_LISTEN", True),
            partial_max_fraction=_float("LAKEHOUSE_PARTIAL_MAX_FRACTION", 0.25),
            snapshots_keep=_snapshots_keep(),
            snapshots_max_age_seconds=_int("LAKEHOUSE_SNAPSHOTS_MAX_AGE_SECONDS", 3600),
            maintenance_small_file_bytes=_int("LAKEHOUSE_MAINTENANCE_SMALL_FILE_BYTES", 8 * 1024 * 1024, minimum=1),
            maintenance_min_files=_int("LAKEHOUSE_MAINTENANCE_MIN_FILES", 16, minimum=2),
            maintenance_keep_snapshots=_int(
                "LAKEHOUSE_MAINTENANCE_KEEP_SNAPSHOTS", SNAPSHOTS_KEEP_MIN, minimum=SNAPSHOTS_KEEP_MIN
            ),
            maintenance_snapshot_age_seconds=_int("LAKEHOUSE_MAINTENANCE_SNAPSHOT_AGE_SECONDS", 60),
            maintenance_pin_seconds=_int("LAKEHOUSE_MAINTENANCE_PIN_SECONDS", 60, minimum=1),
            lagging_after_seconds=_int("LAKEHOUSE_LAGGING_AFTER_SECONDS", 3600, minimum=1),
            mirror_freshness_seconds=mirror_freshness_seconds(),
            api_token=os.environ.get("LAKEHOUSE_API_TOKEN") or None,
            api_max_body_bytes=_int("LAKEHOUSE_API_MAX_BODY_BYTES", 65_536, minimum=256),
            api_timeout_seconds=_above_zero(
                "LAKEHOUSE_API_TIMEOUT_SECONDS", _float("LAKEHOUSE_API_TIMEOUT_SECONDS", 300.0)
            ),
            api_batch_rows=_int("LAKEHOUSE_API_BATCH_ROWS", 65_536, minimum=1),
            api_pg_dead_after_seconds=_int("LAKEHOUSE_API_PG_DEAD_AFTER_SECONDS", 30, minimum=3),
            api_read_statement_seconds=_above_zero(
                "LAKEHOUSE_API_READ_STATEMENT_SECONDS", _float("LAKEHOUSE_API_READ_STATEMENT_SECONDS", 120.0)
            ),
            api_control_statement_seconds=_above_zero(
                "LAKEHOUSE_API_CONTROL_STATEMENT_SECONDS", _float("LAKEHOUSE_API_CONTROL_STATEMENT_SECONDS", 45.0)
            ),
            shadow_sample=_fraction("LAKEHOUSE_SHADOW_SAMPLE", _float("LAKEHOUSE_SHADOW_SAMPLE", 0.1)),
            shadow_workers=_int("LAKEHOUSE_SHADOW_WORKERS", 2, minimum=1),
            shadow_queue=_int("LAKEHOUSE_SHADOW_QUEUE", 64, minimum=1),
            shadow_proof_reads=_int("LAKEHOUSE_SHADOW_PROOF_READS", 300, minimum=1),
            shadow_proof_reads_given=bool(os.environ.get("LAKEHOUSE_SHADOW_PROOF_READS")),
            rollout_tick_seconds=_int("LAKEHOUSE_ROLLOUT_TICK_SECONDS", 15, minimum=1),
            recorder_max_events=_int("LAKEHOUSE_RECORDER_MAX_EVENTS", 50, minimum=1),
            canary_batch_size=_int("LAKEHOUSE_CANARY_BATCH_SIZE", 1000, minimum=1),
            canary_max_per_tick=_int("LAKEHOUSE_CANARY_MAX_PER_TICK", 10_000, minimum=1),
            canary_max_runs=_int("LAKEHOUSE_CANARY_MAX_RUNS", 10, minimum=1),
            alert_webhook_url=os.environ.get("LAKEHOUSE_ALERT_WEBHOOK_URL") or None,
            alert_timeout_seconds=_above_zero(
                "LAKEHOUSE_ALERT_TIMEOUT_SECONDS", _float("LAKEHOUSE_ALERT_TIMEOUT_SECONDS", 5.0)
            ),
            alert_retry_seconds=_int("LAKEHOUSE_ALERT_RETRY_SECONDS", 86_400, minimum=3600),
            mirror_stream=_bool("LAKEHOUSE_MIRROR_STREAM", True),
            mirror_shards=_int("LAKEHOUSE_MIRROR_SHARDS", 1, minimum=1),
            mirror_stream_lifetime_seconds=_int("LAKEHOUSE_MIRROR_STREAM_LIFETIME_SECONDS", 900, minimum=10),
            mirror_commit_window_ms=_int("LAKEHOUSE_MIRROR_COMMIT_WINDOW_MS", 200),
            mirror_poll_ms=_int("LAKEHOUSE_MIRROR_POLL_MS", 100, minimum=10),
            mirror_stream_down_seconds=_int("LAKEHOUSE_MIRROR_STREAM_DOWN_SECONDS", 30, minimum=5),
            reverse_lag_alert_seconds=_int("LAKEHOUSE_REVERSE_LAG_ALERT_SECONDS", 300, minimum=1),
            reverse_lag_page_seconds=_int("LAKEHOUSE_REVERSE_LAG_PAGE_SECONDS", 30, minimum=1),
            mirror_stream_workers=_int("LAKEHOUSE_MIRROR_STREAM_WORKERS", 3, minimum=1),
            mirror_stream_maintenance_seconds=_int("LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS", 10),
            mirror_sync_share=_share("LAKEHOUSE_MIRROR_SYNC_SHARE", _float("LAKEHOUSE_MIRROR_SYNC_SHARE", 0.25)),
            reverse_resync_share=_share(
                "LAKEHOUSE_REVERSE_RESYNC_SHARE", _float("LAKEHOUSE_REVERSE_RESYNC_SHARE", 1.0)
            ),
            complete_batch_rows=_int("LAKEHOUSE_COMPLETE_BATCH_ROWS", 10_000, minimum=1),
            catalog_credential=os.environ.get("LAKEHOUSE_CATALOG_CREDENTIAL") or None,
            catalog_token=os.environ.get("LAKEHOUSE_CATALOG_TOKEN") or None,
            catalog_properties=_catalog_properties(),
        )

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)


# Compaction (tracking/row_changes.py) decides from the newest this-many snapshots: expiry keeps at least them.
SNAPSHOTS_KEEP_MIN = 16


def _catalog_properties() -> dict[str, str]:
    raw = os.environ.get("LAKEHOUSE_CATALOG_PROPERTIES") or ""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadInput(
            'LAKEHOUSE_CATALOG_PROPERTIES is not a JSON object of strings; set it like {"scope": "PRINCIPAL_ROLE:ALL"}'
        )
    return value


def _snapshots_keep() -> int:
    keep = _int("LAKEHOUSE_SNAPSHOTS_KEEP", 100)
    if 0 < keep < SNAPSHOTS_KEEP_MIN:
        raise BadInput(
            f"LAKEHOUSE_SNAPSHOTS_KEEP={keep} is below {SNAPSHOTS_KEEP_MIN}, the snapshots compaction reads "
            f"to decide; set it to 0 (never expire) or {SNAPSHOTS_KEEP_MIN} or more"
        )
    return keep


def mirror_freshness_seconds() -> int:
    """LAKEHOUSE_MIRROR_FRESHNESS_SECONDS alone: the Iceberg asset's freshness policy is built when the code location
    loads, and a bad value elsewhere must not stop it from loading."""
    seconds = _int("LAKEHOUSE_MIRROR_FRESHNESS_SECONDS", 86400)
    if 0 < seconds < 60:
        raise BadInput(
            f"LAKEHOUSE_MIRROR_FRESHNESS_SECONDS={seconds} is below 60 (Dagster's freshness windows are at least a "
            "minute); set 0 (no policy) or 60 or more"
        )
    return seconds


def _os_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in some containers
        return f"uid:{os.getuid()}"
