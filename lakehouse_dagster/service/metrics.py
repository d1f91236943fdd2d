"""``GET /metrics``: what the runbooks monitor, in Prometheus' text format, with low-cardinality labels only
(readers, writers, reasons, outcomes, paths, endpoints — never a dataset id).

Counted as the service works: read decisions by reader and reason, fallbacks, ingest requests by writer and
outcome (``ok``, ``503``, ``refused``, ``error``), rows ingested by path, rows served by source, HTTP requests.
Read from Postgres at scrape time: datasets behind the mirror and the largest lag (status/lag.py, the one
definition), datasets by their latest canary verdict (parity/canary.py's newest-verdict order, one index probe per
dataset: the cost of a scrape follows the datasets, never the verdicts' history), native datasets by their reverse
mirror's state and its largest lag (mirror/reverse_lag.py, the overview's definition). Process memory: prometheus-client's
process collector (``process_resident_memory_bytes``). When Postgres cannot be read, the scraped gauges are left
out and ``lakehouse_status_up`` says 0 — never a 0 that looks like "nothing behind".

Shadow reads (routing/shadow.py, issue 43): the comparisons of the last ``SHADOW_WINDOW_SECONDS`` by reader and
verdict, and per reader the consistency of that window (matches ÷ matches, mismatches and Iceberg-side errors; left
out when none was counted). Labelled by reader and verdict only — both closed sets from the registry and the shadow
module — never by dataset: a dataset label would add a series per dataset and reader that lives as long as the
scrape history (10,000 datasets × 3 compute readers). The per-dataset proof a flip needs is ``lakehouse flags list``
and the overview's "held on Postgres" list. The window, read through ``(reader, at)``, bounds a scrape's cost by the
last hour's comparisons, not by their whole history.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from lakehouse_dagster.api import shadow
from lakehouse_dagster.api.flags import READ, READERS, WRITERS, native_dataset_ids, outcomes_in_window, rank
from lakehouse_dagster.api.lifecycle import STATES, state_counts
from lakehouse_dagster.api.parity import counts_by_latest_verdict
from lakehouse_dagster.api.reverse import reverse_lags
from lakehouse_dagster.api.sources import WRITERS as SOURCE_WRITERS
from lakehouse_dagster.api.status import behind_datasets
from lakehouse_dagster.service.db import ServiceDb

log = logging.getLogger("lakehouse_dagster.service")

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
OUTCOMES = ("ok", "503", "refused", "error")
VERDICTS = ("ok", "lagging", "no-snapshot", "MISMATCH", "native", "error")

SHADOW_WINDOW_SECONDS = 3600
SHADOW_VERDICTS = (
    shadow.MATCH,
    shadow.MISMATCH,
    shadow.ERROR,
    shadow.LAGGING,
    shadow.NO_SNAPSHOT,
    shadow.NOT_COMPARABLE,
    shadow.DROPPED,
)
SHADOW_COUNTED = (shadow.MATCH, shadow.MISMATCH, shadow.ERROR)  # what a consistency rate counts (flags/proof.py)
SHADOW_READERS = tuple(r.name for r in READERS.values() if rank(READ, r.ceiling) >= rank(READ, "shadow"))


class ServiceMetrics:
    """One registry per app (tests start several apps in one process)."""

    def __init__(self, db: ServiceDb | None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.read_decisions = Counter(
            "lakehouse_read_decisions",
            "Reads served through POST /lakehouse/read, by reader and the router's final reason",
            ["reader", "reason"],
            registry=r,
        )
        self.read_fallbacks = Counter(
            "lakehouse_read_fallbacks", "Iceberg reads that failed and were served by Postgres", ["reader"], registry=r
        )
        self.rows_served = Counter("lakehouse_read_rows", "Rows streamed to readers, by source", ["source"], registry=r)
        self.reads_in_flight = Gauge(
            "lakehouse_reads_in_flight",
            "Read streams open now (each holds a snapshot; a pg one a connection)",
            registry=r,
        )
        self.streams_cut = Counter(
            "lakehouse_read_streams_cut",
            "Read streams ended before their last row: the client went away or stalled, or the read failed",
            ["why"],
            registry=r,
        )
        self.ingest_requests = Counter(
            "lakehouse_ingest_requests",
            "POST /lakehouse/ingest by writer and outcome (ok, 503 = G2 backpressure, refused = 4xx, error)",
            ["writer", "outcome"],
            registry=r,
        )
        self.rows_ingested = Counter(
            "lakehouse_rows_ingested", "Rows written by ingests, by path (pg, native)", ["path"], registry=r
        )
        self.http_requests = Counter(
            "lakehouse_http_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r
        )
        self.http_seconds = Histogram(
            "lakehouse_http_request_seconds",
            "Time from a request's arrival to its last byte, by endpoint",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        for writer in SOURCE_WRITERS:  # present from the start, so a rate sees the first 503 too
            for outcome in OUTCOMES:
                self.ingest_requests.labels(writer, outcome)
        ProcessCollector(registry=r)
        if db is not None:
            r.register(_StatusCollector(db))

    def ingest(self, writer: str, outcome: str) -> None:
        """Count one ingest request; a name outside the registry is counted as ``unknown`` (labels stay few)."""
        self.ingest_requests.labels(writer if writer in WRITERS else "unknown", outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StatusCollector:
    """Scrape-time gauges read from Postgres (five short queries)."""

    def __init__(self, db: ServiceDb):
        self.db = db

    def describe(self) -> Iterable[Metric]:
        return []  # not described up front: describing would query Postgres at registration

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily(
            "lakehouse_status_up", "1 when the scrape could read the migration's state from Postgres"
        )
        try:
            with self.db.connection() as conn:
                behind = behind_datasets(conn)
                verdicts = counts_by_latest_verdict(conn)
                rlags, reverse_off = reverse_lags(conn, native_dataset_ids(conn))
                lifecycle = state_counts(conn)
                compared = outcomes_in_window(conn, list(SHADOW_READERS), SHADOW_WINDOW_SECONDS)
        except psycopg.Error as exc:
            log.warning("metrics: cannot read the migration's state from Postgres (%s)", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        count = GaugeMetricFamily(
            "lakehouse_datasets_behind_mirror",
            "Tabular datasets whose Postgres rows moved past their latest succeeded sync (native ones excluded)",
        )
        count.add_metric([], len(behind))
        yield count
        never = GaugeMetricFamily(
            "lakehouse_datasets_never_synced", "Datasets behind the mirror that were never synced"
        )
        never.add_metric([], sum(1 for b in behind if b.never_synced))
        yield never
        lags = [b.lag_seconds for b in behind if b.lag_seconds is not None]
        lag = GaugeMetricFamily(
            "lakehouse_mirror_lag_max_seconds",
            "The largest lag among datasets behind the mirror: seconds since its latest succeeded sync (0: none behind)",
        )
        lag.add_metric([], max(lags) if lags else 0.0)
        yield lag
        by_verdict = GaugeMetricFamily(
            "lakehouse_canary_latest_verdicts", "Datasets by their newest canary verdict", labels=["verdict"]
        )
        counts = {**dict.fromkeys(VERDICTS, 0), **verdicts}
        for verdict, n in counts.items():
            by_verdict.add_metric([verdict], n)
        yield by_verdict
        reverse = GaugeMetricFamily(
            "lakehouse_reverse_mirror_datasets",
            "Datasets written iceberg-native by their reverse mirror: caught_up, behind (native commits not yet "
            "applied to dataset_rows), off",
            labels=["state"],
        )
        behind_reverse = [r for r in rlags.values() if not r.caught_up]
        reverse.add_metric(["caught_up"], len(rlags) - len(behind_reverse))
        reverse.add_metric(["behind"], len(behind_reverse))
        reverse.add_metric(["off"], reverse_off)
        yield reverse
        reverse_lag = GaugeMetricFamily(
            "lakehouse_reverse_mirror_lag_max_seconds",
            "The largest reverse lag: seconds since the oldest native commit dataset_rows lacks (0: none behind)",
        )
        reverse_lag.add_metric([], max((r.lag_seconds or 0.0 for r in behind_reverse), default=0.0))
        yield reverse_lag
        by_state = GaugeMetricFamily(
            "lakehouse_datasets_by_lifecycle",
            "Datasets by their stored lifecycle state (pg, mirrored, read-flipped, native, completing, complete, "
            "restoring); a dataset no verb or reader has looked at yet is not counted",
            labels=["state"],
        )
        for state in STATES:
            by_state.add_metric([state], lifecycle.get(state, 0))
        yield by_state
        yield from shadow_metrics(compared)


def shadow_metrics(compared: list[tuple[str, str, int]]) -> Iterable[Metric]:
    """The shadow comparisons of the window by reader and verdict (every pair present, zeros included) and each
    reader's consistency over them (absent when nothing was counted: never a rate that looks measured)."""
    counts = {(r, v): 0 for r in SHADOW_READERS for v in SHADOW_VERDICTS}
    for reader, verdict, n in compared:
        if (reader, verdict) in counts:
            counts[(reader, verdict)] = n
    window = f"the last {SHADOW_WINDOW_SECONDS // 60} minutes"
    by_verdict = GaugeMetricFamily(
        "lakehouse_shadow_comparisons",
        f"Shadow reads compared with Iceberg in {window}, by reader and verdict (match, mismatch, error count toward "
        "consistency; lagging, no-snapshot, not-comparable, dropped do not)",
        labels=["reader", "verdict"],
    )
    for (reader, verdict), n in counts.items():
        by_verdict.add_metric([reader, verdict], n)
    yield by_verdict
    rate = GaugeMetricFamily(
        "lakehouse_shadow_consistency_ratio",
        f"Per reader, matches ÷ (matches + mismatches + errors) of its shadow reads in {window} over every dataset "
        "(1: every comparison equal); the per-dataset proof a flip needs is `lakehouse flags list`",
        labels=["reader"],
    )
    for reader in SHADOW_READERS:
        counted = sum(counts[(reader, v)] for v in SHADOW_COUNTED)
        if counted:
            rate.add_metric([reader], counts[(reader, shadow.MATCH)] / counted)
    yield rate
