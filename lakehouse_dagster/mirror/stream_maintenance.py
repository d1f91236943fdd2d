"""Background table maintenance in a stream run (docs/design/mirror.md "The stream"): bounded table growth under a
steady trickle of commits, without a job of its own.

The stream loop (mirror/stream.py) tells ``StreamMaintenance`` of every sync it landed and, in an idle moment (no
sync due, none in flight), asks it to start one round: the dataset the stream synced whose round is due longest,
at most one round at a time, and a dataset at most once per ``LAKEHOUSE_MIRROR_STREAM_MAINTENANCE_SECONDS`` (0:
never). A round runs on a thread of its own (the loop keeps finding and syncing changes meanwhile; it only does not
sync the dataset being maintained until the round ends) and is ``compact_small_files`` then ``expire_snapshots``
(lake/maintenance.py), with the ``LAKEHOUSE_MAINTENANCE_*`` limits, both under the dataset's lock (G3, the lock
every sync takes) held once for the round on the round's own session. So it never races a sync of this stream or of
another process: a dataset whose lock is held elsewhere is skipped and tried again a second later. Snapshots a
reader may have pinned (``reader_pins``) are never expired. A failed round is logged in one line and tried again
after the interval; it never fails the stream.

A dataset stays due while it may have something to maintain: it was synced since its last round, or within
max(snapshot age, pin window) before it (its snapshots were too young, or pinned, to expire then). A dataset whose
trickle stopped gets one round after that and is then left alone.

No Dagster here: the mirror_stream job logs what each round did (``Maintained.line``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import close_quietly, connect
from lakehouse_dagster.core.errors import LockTimeout, first_line
from lakehouse_dagster.core.failpoints import failpoint
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake.maintenance import Compaction, Expiry, compact_small_files, expire_snapshots
from lakehouse_dagster.mirror.sync import SyncResult

_log = logging.getLogger(__name__)

LOCK_WAIT_S = 0.2  # a round waits this long for the dataset's lock, then skips it (another sync holds it)
BUSY_AGAIN_S = 1.0  # a dataset skipped as busy is tried again after this


@dataclasses.dataclass(frozen=True)
class Maintained:
    """What one maintenance round of a dataset did (yielded by the stream when it ended)."""

    dataset_id: uuid.UUID
    seconds: float
    compaction: Compaction | None = None
    expiry: Expiry | None = None
    error: str | None = None  # why it failed, in one line (tried again after the interval; the stream goes on)
    busy: bool = False  # the dataset's lock was held elsewhere: nothing done, tried again soon

    @property
    def compacted_files(self) -> int:
        c = self.compaction
        return c.compacted_files if c is not None and c.skipped is None else 0

    @property
    def expired_snapshots(self) -> int:
        return len(self.expiry.expired) if self.expiry is not None else 0

    @property
    def did_something(self) -> bool:
        return self.compacted_files > 0 or self.expired_snapshots > 0

    def line(self) -> str | None:
        """One line for the run's log: what the round did, its failure, or None when it did nothing."""
        if self.error is not None:
            return f"maintenance of {self.dataset_id} failed: {self.error}; tried again later, the stream goes on"
        if not self.did_something:
            return None
        parts = []
        c, e = self.compaction, self.expiry
        if c is not None and self.compacted_files:
            parts.append(f"{c.compacted_files} small data files compacted ({c.files_before} → {c.files_after} live)")
        if e is not None and self.expired_snapshots:
            pinned = f", {len(e.pinned)} pinned by readers kept" if e.pinned else ""
            parts.append(
                f"{len(e.expired)} snapshots expired ({e.snapshots_before} → {e.snapshots_after} live{pinned})"
            )
        return f"maintenance of {self.dataset_id}: {'; '.join(parts)} in {self.seconds:.2f}s"


@dataclasses.dataclass
class _State:
    last_commit: float  # when the stream last landed a commit of the dataset
    next_at: float  # its next round is due then
    last_round: float | None = None  # when its last round started (None: none yet)


class StreamMaintenance:
    """The rounds of one stream run (module docstring). Used from the loop's thread only; each round runs on one
    worker thread with its own Postgres session, opened at the first round and again after a failed one."""

    def __init__(self, dsn: str, catalog: Catalog, settings: Settings, *, clock: Callable[[], float] = time.time):
        self.dsn, self.catalog, self.settings, self.clock = dsn, catalog, settings, clock
        self.every = float(settings.stream.maintenance_seconds)
        self.window = float(max(settings.maintenance.snapshot_age_seconds, settings.maintenance.pin_seconds))
        self._state: dict[uuid.UUID, _State] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._running: tuple[uuid.UUID, float, concurrent.futures.Future] | None = None
        self._conn: psycopg.Connection | None = None

    @property
    def on(self) -> bool:
        return self.every > 0

    @property
    def busy_with(self) -> uuid.UUID | None:
        """The dataset a round is maintaining now (the loop does not sync it until the round ends)."""
        return self._running[0] if self._running is not None else None

    def synced(self, result: SyncResult) -> None:
        """The stream landed ``result``: its dataset is due a round (the first one ``every`` seconds from now)."""
        if not self.on or result.mode == "noop" or result.snapshot_id is None:
            return
        now = self.clock()
        got = self._state.get(result.dataset_id)
        if got is None:
            self._state[result.dataset_id] = _State(last_commit=now, next_at=now + self.every)
        else:
            got.last_commit = now

    def _wants(self, st: _State) -> bool:
        return st.last_round is None or st.last_commit > st.last_round - self.window

    def start(self, exclude: set[uuid.UUID] | frozenset[uuid.UUID] = frozenset()) -> uuid.UUID | None:
        """In an idle moment: start the round of the dataset due longest, unless a round runs or none is due (or
        every due one is in ``exclude``: a change of it waits for its sync). Returns the dataset started."""
        if not self.on or self._running is not None:
            return None
        now = self.clock()
        for ds in [d for d, st in self._state.items() if not self._wants(st)]:
            del self._state[ds]  # nothing left to maintain: a new sync brings it back
        due = [(st.next_at, ds) for ds, st in self._state.items() if st.next_at <= now and ds not in exclude]
        if not due:
            return None
        _, ds = min(due)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stream-maintenance")
        self._running = (ds, now, self._executor.submit(self._round, ds))
        return ds

    def finished(self, *, wait: bool = False) -> Maintained | None:
        """The round that ended since the last call (``wait``: wait for the one running), else None."""
        if self._running is None:
            return None
        ds, started, fut = self._running
        if not wait and not fut.done():
            return None
        self._running = None
        done: Maintained = fut.result()  # _round never raises
        st = self._state.get(ds)
        if st is not None:
            if done.busy:
                st.next_at = self.clock() + BUSY_AGAIN_S
            else:
                st.last_round, st.next_at = started, started + self.every
        return done

    def close(self) -> Maintained | None:
        """Wait for the round running (one commit or two: bounded), end the worker and the session; the last
        round's outcome, if one was still running."""
        last = self.finished(wait=True)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._drop_session()
        return last

    def _drop_session(self) -> None:
        if self._conn is not None:
            close_quietly(self._conn)
            self._conn = None

    def _round(self, ds: uuid.UUID) -> Maintained:
        t = time.perf_counter()
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = connect(self.dsn)
            conn = self._conn
            # Held once for the round (both calls take it again on this session: advisory locks nest per session).
            with dataset_lock(conn, ds, timeout_s=LOCK_WAIT_S):
                failpoint("stream-maintenance")
                compaction = compact_small_files(conn, self.catalog, self.settings, ds)
                expiry = expire_snapshots(conn, self.catalog, self.settings, ds)
        except LockTimeout:
            return Maintained(ds, time.perf_counter() - t, busy=True)
        except Exception as exc:  # noqa: BLE001 - a failed round is logged and tried again; it never ends the stream
            self._drop_session()  # whatever state the session is in, the next round starts on a fresh one
            error = f"{type(exc).__name__}: {first_line(exc)}"
            _log.warning("stream maintenance of dataset %s failed (%s); tried again in %.0fs", ds, error, self.every)
            return Maintained(ds, time.perf_counter() - t, error=error)
        return Maintained(ds, time.perf_counter() - t, compaction, expiry)
