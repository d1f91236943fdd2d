"""The settings of operating the migration: flags, rollouts, shadow reads, parity, complete, the service, alerts,
the recorder."""

from __future__ import annotations

import dataclasses

from lakehouse_dagster.core.setting_vars import (
    ABOVE_ZERO,
    FRACTION,
    at_least,
    given,
    setting,
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
            "soak set` wins in every process; `lakehouse up` stores this value the first time it starts on "
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
            "rows of `dataset_rows` each batch of `lakehouse complete` deletes "
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
