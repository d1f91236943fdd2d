"""The stream's share of the reverse mirror (mirror/stream.py, mirror/reverse.py): which native datasets of its shard
are due, the applies in flight, the backoff of the failed ones, and the events it yields for them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

import psycopg

from lakehouse_dagster.core.errors import Backpressure, LockTimeout, first_line, is_transient
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.mirror.batch import BUSY_LOCK_WAIT_S
from lakehouse_dagster.mirror.reverse import (
    NOOP,
    CommitCursor,
    ReverseResult,
    apply_reverse,
    due_datasets,
    native_commits,
)
from lakehouse_dagster.mirror.stream_lease import ShardLease
from lakehouse_dagster.mirror.stream_pacing import BUSY_RETRY_S, _Rest

_log = logging.getLogger("lakehouse_dagster.mirror.stream")  # the stream's one logger, as before the split


@dataclasses.dataclass(frozen=True)
class ReverseApplied:
    """A native commit (or several) of a dataset applied to dataset_rows by the reverse mirror (never a no-op)."""

    result: ReverseResult

    @property
    def dataset_id(self) -> uuid.UUID:
        return self.result.dataset_id


@dataclasses.dataclass(frozen=True)
class ReverseFailed:
    """A reverse apply that failed; tried again after ``retry_in`` seconds (LAKEHOUSE_RETRY_FAILED_AFTER_SECONDS,
    doubling per failure, at most an hour), not sooner. Nothing was half-applied (one transaction)."""

    dataset_id: uuid.UUID
    error: str  # one line, with the exception's type
    attempts: int
    retry_in: float


REVERSE_BACKOFF_MAX_S = 3600.0  # a reverse apply that keeps failing is tried again at most this far apart


class _Reverse:
    """The stream's share of the reverse mirror (mirror/reverse.py) for its shard: which native datasets are due
    for an apply, the applies in flight, and the backoff of the failed ones.

    Found two ways: each poll, the native commits since the cursor (``native_commits``: one index scan of the sync
    log by transaction id, nothing read when nothing was committed), checked by ``due_datasets`` for the shard's
    datasets among them (three small queries, only when a native commit of the shard landed); and at each sweep,
    ``due_datasets`` over every native dataset of the shard (what was committed while no stream ran, a reverse
    turned on, a failure past its backoff). Exactly once rests on ``apply_reverse`` itself: rows and position in
    one transaction, a dataset already at its snapshot a no-op; the stream only decides when to ask."""

    def __init__(self, dsn: str, catalog, settings: Settings, mine: Callable[[uuid.UUID], bool], xid: int):
        self.dsn, self.catalog, self.settings, self.mine = dsn, catalog, settings, mine
        self.cursor = CommitCursor(xid)
        self.due: dict[uuid.UUID, float] = {}  # dataset -> when its apply may start
        self.busy: dict[uuid.UUID, int] = {}  # busy or transient retries of its pending apply
        self.failures: dict[uuid.UUID, int] = {}  # failed applies in a row
        self.until: dict[uuid.UUID, float] = {}  # not asked again before (a failure's backoff, a table not there yet)
        self.flying: dict[concurrent.futures.Future, uuid.UUID] = {}
        # A dataset's applies take at most LAKEHOUSE_MIRROR_SYNC_SHARE of the time, as its forward syncs do: a
        # dataset committed natively without pause is applied in batches (one apply takes every commit since the
        # last), leaving the CPU to the live app (bench/bench_reverse_app_writes.py)
        self.rest = _Rest(settings.stream.sync_share)

    def _note(self, ds: uuid.UUID, now: float) -> None:
        if self.until.get(ds, 0.0) > now:
            return  # backing off: the sweep or a commit asks again only once it passed
        self.until.pop(ds, None)
        self.due.setdefault(ds, now)

    def sweep(self, conn: psycopg.Connection, now: float) -> None:
        for ds in due_datasets(conn, keep=self.mine):
            self._note(ds, now)

    def poll(self, conn: psycopg.Connection, now: float) -> bool:
        """The native commits since the cursor; True when the read was cut (the caller sweeps at once)."""
        found, self.cursor, cut = native_commits(conn, self.cursor)
        mine = [ds for ds in found if self.mine(ds)]
        if mine:
            for ds in due_datasets(conn, mine):
                self._note(ds, now)
        return cut

    def ready(self, now: float, busy: set[uuid.UUID]) -> list[uuid.UUID]:
        return sorted(
            (d for d, at in self.due.items() if self.rest.due_at(d, at) <= now and d not in busy),
            key=lambda d: self.due[d],
        )

    def nearest(self, busy: set[uuid.UUID]) -> float | None:
        return min((self.rest.due_at(d, at) for d, at in self.due.items() if d not in busy), default=None)

    def in_flight(self) -> set[uuid.UUID]:
        return set(self.flying.values())

    def start(self, executor: concurrent.futures.Executor, ds: uuid.UUID) -> None:
        del self.due[ds]
        fut = executor.submit(apply_reverse, self.dsn, self.catalog, self.settings, ds, lock_timeout_s=BUSY_LOCK_WAIT_S)
        self.flying[fut] = ds

    def outcome(
        self, fut: concurrent.futures.Future, now: float, lease: ShardLease, shard: int
    ) -> ReverseApplied | ReverseFailed | None:
        """What a finished apply means: its result (None for a no-op), a failure (backed off), or None when it is
        tried again soon (the dataset's lock held by a native write or a sync, a transient failure)."""
        ds = self.flying.pop(fut)
        try:
            r = fut.result()
        except (LockTimeout, Backpressure) as exc:
            n = self.busy[ds] = self.busy.get(ds, 0) + 1
            self.due[ds] = now + min(8.0, BUSY_RETRY_S * 2 ** (n - 1))
            _log.info("shard %s: reverse of dataset %s busy (%s); again in a moment", shard, ds, first_line(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - a reverse apply never stops the stream's forward mirror
            n = self.busy.get(ds, 0)
            if is_transient(exc) and n < 3:
                self.busy[ds] = n + 1
                self.due[ds] = now + BUSY_RETRY_S * 2**n
                return None
            self.busy.pop(ds, None)
            attempts = self.failures[ds] = self.failures.get(ds, 0) + 1
            wait = min(
                REVERSE_BACKOFF_MAX_S, max(1, self.settings.mirror.retry_failed_after_seconds) * 2.0 ** (attempts - 1)
            )
            self.until[ds] = now + wait
            lease.stats.failures += 1
            return ReverseFailed(ds, f"{type(exc).__name__}: {first_line(exc)}", attempts, wait)
        self.busy.pop(ds, None)
        self.failures.pop(ds, None)
        if r.how == NOOP:
            if r.snapshot_id is None:  # no table yet: the position is not written, so the sweep would ask each time
                self.until[ds] = now + max(1, self.settings.mirror.retry_failed_after_seconds)
            return None
        self.rest.synced(ds, r.seconds, now)
        lease.stats.last_commit_at = time.time()
        lease.stats.last_dataset_id = ds
        return ReverseApplied(r)
