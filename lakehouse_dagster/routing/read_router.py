"""The read router: which engine serves a reader for a dataset, and the runner that serves it.

- ``off`` / ``shadow`` serve Postgres. In ``shadow`` a sample of reads is also read from Iceberg and compared off
  the request path by the caller of the router (routing/shadow.py; ``exercise.read_through_router``).
- ``iceberg`` / ``iceberg_only`` serve Iceberg only when the freshness gate passes:
  EVENTUAL — a succeeded sync with a snapshot exists; STRICT — the latest succeeded sync's
  source_version covers datasets.rows_version (both read in one statement). Otherwise Postgres.
  The gate applies to iceberg_only too: with nothing in Iceberg there is nothing to serve.
- An Iceberg error under ``iceberg`` falls back to Postgres and logs
  ``[read-router] <reader> ds=<id> iceberg read failed → PG fallback: <error>``;
  under ``iceberg_only`` it is raised (no fallback). Nor is there a fallback for a dataset written
  iceberg-native (any flippable writer resolves to iceberg_native for it): Postgres no longer receives
  its rows, so serving them would be a silent split-brain; the error is raised instead.
- Postgres never serves a dataset written iceberg-native, whatever the reader's mode: Iceberg is the
  truth for it, so "lagging" means nothing (a ``row.edit`` or a schema change moves the Postgres version of
  a frozen copy). Where the rules above would pick Postgres (``off``/``shadow`` set by hand — the gates
  forbid it —, no snapshot, lagging) it serves the latest snapshot, reason ``iceberg@native``; with no
  snapshot at all, or for a reader Iceberg cannot serve (ceiling ``off``), the read is refused with the
  reason (``ReadRefused``), never served stale.
- Except where the reverse mirror keeps Postgres: a Postgres-held reader of a native dataset — locked (ceiling
  ``off``), or a compute reader (registry ``proof``) whose mode for it is below iceberg: not flipped, not proven —
  whose reverse resolves on (and can run: capture mode triggers) reads ``dataset_rows``, reason ``pg@reverse`` —
  the gates let such a dataset go native for exactly that reason. A compute reader not flipped, with no reverse
  copy to read, is served the latest snapshot (``iceberg@native``): Iceberg is the truth and it can serve it. EVENTUAL: the copy as of the reverse's last
  applied snapshot; STRICT: only when the reverse is caught up (mirror/reverse_lag.py), otherwise refused
  (``refused@reverse-behind``) with the command that catches it up.

Every decision is logged with its reason (``reason=iceberg@eventual``, ``reason=pg@no-snapshot``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from lakehouse_dagster.core.db import fetch_one
from lakehouse_dagster.core.errors import NotFound, ReadRefused
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.flags.incidents import record_fallback
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, READ, READERS, STRICT, WRITE, rank, reads_postgres
from lakehouse_dagster.flags.resolver import FlagResolver, Resolution
from lakehouse_dagster.mirror.reverse_lag import ReverseLag, reverse_lags
from lakehouse_dagster.tracking import barrier, capture
from lakehouse_dagster.tracking.datasets import fragments

log = logging.getLogger("lakehouse_dagster.read_router")

T = TypeVar("T")

PG, ICEBERG, REFUSED = "pg", "iceberg", "refused"
NATIVE_STALE = "written iceberg-native: Postgres is stale for it"


@dataclasses.dataclass(frozen=True)
class Freshness:
    rows_version: int  # datasets.rows_version: the current Postgres version of the rows
    snapshot_id: int | None  # latest succeeded sync's snapshot
    source_version: int | None  # the PG version that snapshot covers

    @property
    def has_snapshot(self) -> bool:
        return self.snapshot_id is not None

    @property
    def caught_up(self) -> bool:
        return self.has_snapshot and self.source_version is not None and self.source_version >= self.rows_version


_FRESHNESS = fragments.freshness_query(barrier.MODE_IS_AFTER_COMMIT)


def freshness(conn: psycopg.Connection, dataset_id: uuid.UUID, *, exact: bool = False) -> Freshness:
    """``exact``: in capture mode after-commit, read behind the barrier (a STRICT read, a rollback's decision), so
    that rows_version covers every write committed before the call; one query otherwise."""
    row = conn.execute(_FRESHNESS, (dataset_id,)).fetchone()
    if row is None:
        raise NotFound(f"dataset {dataset_id} does not exist (check the id)")
    if exact and row[3]:
        with barrier.read_tracking_consistently(conn, [dataset_id]):
            row = fetch_one(
                conn.execute(_FRESHNESS, (dataset_id,)), NotFound(f"dataset {dataset_id} was deleted while it was read")
            )
    return Freshness(*row[:3])


@dataclasses.dataclass(frozen=True)
class ReadDecision:
    reader: str
    dataset_id: uuid.UUID
    flag: Resolution
    source: str  # "pg" | "iceberg" | "refused"
    reason: str  # e.g. iceberg@eventual, iceberg@native, pg@no-snapshot, pg@lagging, pg@off, pg@shadow, pg@fallback,
    # pg@reverse, refused@native-no-snapshot, refused@native-not-servable, refused@reverse-behind
    snapshot_id: int | None  # the snapshot an Iceberg read is pinned to
    freshness: Freshness | None = None
    native: bool = False  # the dataset is written iceberg-native: Postgres is stale for it
    reverse_snapshot: int | None = None  # pg@reverse: the snapshot dataset_rows holds (the reverse mirror applied)

    @property
    def mode(self) -> str:
        return self.flag.mode

    @property
    def fallback_allowed(self) -> bool:
        return self.flag.mode == "iceberg" and not self.native

    @property
    def no_fallback_because(self) -> str:
        return "written iceberg-native, Postgres is stale" if self.native else "iceberg_only"

    def log_line(self) -> str:
        snap = f" snapshot={self.snapshot_id}" if self.source == ICEBERG else ""
        why = f" ({NATIVE_STALE})" if self.reason.endswith("@native") or self.source == REFUSED else ""
        if self.reason == "pg@reverse":
            why = " (written iceberg-native: dataset_rows is the reverse mirror's copy)"
        return (
            f"[read-router] {self.reader} ds={self.dataset_id} mode={self.flag.describe()} "
            f"→ {self.source} reason={self.reason}{snap}{why}"
        )

    def refusal(self) -> str:
        """The one-line reason a refused read gives (what is wrong and what to do)."""
        if self.reason == "refused@native-not-servable":
            ceiling = READERS[self.reader].ceiling_reason if self.reader in READERS else None
            why = (
                f"reader {self.reader} cannot be served by Iceberg (maxMode={self.flag.ceiling}"
                f"{': ' + ceiling if ceiling else ''})"
            )
            todo = (
                f"turn its reverse mirror on (lakehouse reverse on --dataset {self.dataset_id}) so that "
                f"Postgres keeps its rows, or roll the writer back (lakehouse write-flags set <writer> pg --dataset "
                f"{self.dataset_id}; its report says whether a backfill is needed)"
            )
        elif self.reason == "refused@reverse-behind":
            why = f"{self.reader} is STRICT and the reverse mirror has not applied its latest snapshot to Postgres yet"
            todo = f"retry, or catch it up now: lakehouse reverse sync --dataset {self.dataset_id}"
        else:
            why = "Iceberg has no snapshot of it yet"
            todo = f"run its writer first (lakehouse ingest --dataset {self.dataset_id})"
        return f"refused: {self.reader} ds={self.dataset_id} is {NATIVE_STALE}, and {why}; nothing was read — {todo}"

    def as_dict(self) -> dict:
        return {
            "reader": self.reader,
            "dataset_id": str(self.dataset_id),
            "mode": self.flag.mode,
            "mode_reason": self.flag.reason,
            "source": self.source,
            "reason": self.reason,
            "snapshot_id": self.snapshot_id,
        }


def decide(
    reader: str,
    dataset_id: uuid.UUID,
    flag: Resolution,
    fresh: Freshness | None,
    native: bool = False,
    reverse: ReverseLag | None = None,
) -> ReadDecision:
    """Pure: the mode and the freshness facts give the source and its reason. ``reverse``: the dataset's reverse
    lag when its reverse mirror is on and can run (None: off, or not asked)."""
    d = _decide(reader, dataset_id, flag, fresh, native)
    if not native or d.source == ICEBERG:
        return d
    # Written iceberg-native: never a stale Postgres. The latest snapshot is the truth, whatever the mode says.
    if held_on_postgres(reader, flag):
        if reverse is not None and (flag.consistency != STRICT or reverse.caught_up):
            return dataclasses.replace(d, source=PG, reason="pg@reverse", reverse_snapshot=reverse.applied_snapshot)
        if reverse is not None:
            return dataclasses.replace(d, source=REFUSED, reason="refused@reverse-behind")
        if rank(READ, flag.ceiling) < rank(READ, "iceberg"):
            return dataclasses.replace(d, source=REFUSED, reason="refused@native-not-servable")
    if fresh is None or not fresh.has_snapshot:
        return dataclasses.replace(d, source=REFUSED, reason="refused@native-no-snapshot")
    return dataclasses.replace(d, source=ICEBERG, reason="iceberg@native", snapshot_id=fresh.snapshot_id)


def held_on_postgres(reader: str, flag: Resolution) -> bool:
    """A reader that reads the reverse mirror's copy of a native dataset: one Iceberg cannot serve (ceiling below
    iceberg), or a compute reader not flipped for it (its mode below iceberg: not proven yet)."""
    if rank(READ, flag.ceiling) < rank(READ, "iceberg"):
        return True
    registered = READERS.get(reader)
    return registered is not None and registered.proof and reads_postgres(flag.mode)


def _decide(
    reader: str, dataset_id: uuid.UUID, flag: Resolution, fresh: Freshness | None, native: bool
) -> ReadDecision:
    if flag.mode in ("off", "shadow"):
        return ReadDecision(reader, dataset_id, flag, PG, f"pg@{flag.mode}", None, fresh, native)
    assert fresh is not None
    if not fresh.has_snapshot:
        return ReadDecision(reader, dataset_id, flag, PG, "pg@no-snapshot", None, fresh, native)
    if flag.consistency == STRICT:
        if not fresh.caught_up:
            return ReadDecision(reader, dataset_id, flag, PG, "pg@lagging", None, fresh, native)
        return ReadDecision(reader, dataset_id, flag, ICEBERG, "iceberg@strict", fresh.snapshot_id, fresh, native)
    return ReadDecision(reader, dataset_id, flag, ICEBERG, "iceberg@eventual", fresh.snapshot_id, fresh, native)


@dataclasses.dataclass
class ReadResult:
    decision: ReadDecision  # after a fallback: source pg, reason pg@fallback
    value: Any  # what the runner returned (an Arrow table for the read endpoint)
    fallback_error: str | None = None


class ReadSource:
    """A routing decision, ready to run a Postgres executor or an Iceberg executor."""

    def __init__(
        self,
        decision: ReadDecision,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        on_fallback: Callable[[str, uuid.UUID, str], None] | None = None,
    ):
        self.decision = decision
        self._log = logger or log
        self._on_fallback = on_fallback  # records the fallback (flags/incidents.py): it restarts a soak

    def run(
        self,
        *,
        postgres: Callable[[ReadDecision], T],
        iceberg: Callable[[ReadDecision], T],
    ) -> ReadResult:
        d = self.decision
        if d.source == REFUSED:
            raise ReadRefused(d.refusal())
        if d.source == PG:
            return ReadResult(d, postgres(d))
        try:
            return ReadResult(d, iceberg(d))
        except Exception as exc:
            error = _one_line(exc)
            if not d.fallback_allowed:
                self._log.error(
                    f"[read-router] {d.reader} ds={d.dataset_id} iceberg read failed "
                    f"({d.no_fallback_because}, no fallback): {error}"
                )
                raise
            self._log.warning(f"[read-router] {d.reader} ds={d.dataset_id} iceberg read failed → PG fallback: {error}")
            if self._on_fallback is not None:
                self._on_fallback(d.reader, d.dataset_id, error)
            fallback = dataclasses.replace(d, source=PG, reason="pg@fallback", snapshot_id=None)
            return ReadResult(fallback, postgres(fallback), error)


def resolve_read_source(
    conn: psycopg.Connection,
    flags: FlagResolver,
    reader: str,
    dataset_id: uuid.UUID | str,
    *,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> ReadSource:
    """Resolve the reader's mode (cached, clamped), apply the freshness gate, log the decision."""
    dataset_id = parse_uuid(dataset_id, "dataset id")
    flag = flags.resolve(READ, reader, dataset_id)
    # also refuses a dataset that does not exist, whatever the mode; a STRICT read waits for after-commit's tracking
    fresh = freshness(conn, dataset_id, exact=flag.consistency == STRICT)
    # (the resolver holds every flag of the dataset from one query: the writers cost nothing more)
    native = any(flags.resolve(WRITE, w.name, dataset_id).mode == "iceberg_native" for w in FLIPPABLE_WRITERS)
    reverse = _reverse_copy(conn, dataset_id) if native and held_on_postgres(reader, flag) else None
    decision = decide(reader, dataset_id, flag, fresh, native, reverse)
    (logger or log).info(decision.log_line())
    return ReadSource(decision, logger, on_fallback=functools.partial(record_fallback, conn))


def _reverse_copy(conn: psycopg.Connection, dataset_id: uuid.UUID) -> ReverseLag | None:
    """The reverse lag of a native dataset whose reverse mirror keeps dataset_rows (on, and able to run in this
    capture mode): only a Postgres-locked reader of a native dataset asks (three short queries)."""
    if capture.reverse_blocked(conn):
        return None  # after-commit before PostgreSQL 14: the reverse mirror refuses to run, so Postgres is stale
    lags, _off = reverse_lags(conn, {dataset_id})
    return lags.get(dataset_id)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
