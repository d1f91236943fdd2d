"""A stream's shard (mirror/stream.py): which shard a dataset is in, and the lease a stream holds on its shard for its
whole life (the shard's advisory lock and its heartbeat row, beaten from a thread that notices a lost lock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import uuid
from collections.abc import Callable

import psycopg

from lakehouse_dagster.core import locks
from lakehouse_dagster.core.db import close_quietly, fetch_value
from lakehouse_dagster.core.errors import BadInput, first_line
from lakehouse_dagster.core.guards import guard_connection
from lakehouse_dagster.mirror import shards

_NS_SHARD = locks.STREAM_SHARD  # advisory lock class of a stream shard: (namespace, shard_count << 16 | shard)


HEARTBEAT_EVERY_S = 1.0


def shard_of(dataset_id: uuid.UUID, shard_count: int) -> int:
    """The shard of a dataset: a stable hash of its id's bytes (the same in every process and release), mod
    ``shard_count``. Hashed, not the id's leading bytes: time-ordered ids (v1, v7) would otherwise bunch up."""
    if shard_count <= 1:
        return 0
    return int.from_bytes(hashlib.blake2b(dataset_id.bytes, digest_size=8).digest(), "big") % shard_count


def check_shard(shard: int, shard_count: int) -> None:
    if shard_count < 1 or shard_count > 1024:
        raise BadInput(f"shard count {shard_count} is out of range; use 1 to 1024 (LAKEHOUSE_MIRROR_SHARDS)")
    if not 0 <= shard < shard_count:
        raise BadInput(f"shard {shard} is out of range for {shard_count} shards; use 0 to {shard_count - 1}")


def _lock_key(shard: int, shard_count: int) -> int:
    return (shard_count << 16) | shard


@dataclasses.dataclass
class _Stats:
    syncs: int = 0
    failures: int = 0
    last_commit_at: float | None = None
    last_dataset_id: uuid.UUID | None = None
    backlog: int = 0
    lag_seconds: float = 0.0


class ShardLease:
    """The shard's lock and heartbeat row, on a connection of their own (TCP keepalives, no idle timeout). After
    ``acquire`` a thread beats the heartbeat every ``HEARTBEAT_EVERY_S`` and notices a lost lock (``lost``);
    ``close`` marks the row ended and releases the lock (closing the connection releases it too)."""

    def __init__(self, dsn: str, shard: int, shard_count: int, run_id: str, deadline: float):
        check_shard(shard, shard_count)
        self.dsn, self.shard, self.shard_count, self.run_id, self.deadline = dsn, shard, shard_count, run_id, deadline
        self.stats = _Stats()
        self.lost: str | None = None  # why the lease was lost (its session died, its lock gone)
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False

    def acquire(self, *, until: float, clock: Callable[[], float] = time.time, poll_s: float = 0.1) -> bool:
        """Wait for the shard's lock until ``until`` (the predecessor finishing its last commit); False if it never
        came. Polls with pg_try_advisory_lock so an interruption (a run termination) is never stuck in the server."""
        self._conn = guard_connection(self.dsn)
        key = _lock_key(self.shard, self.shard_count)
        while True:
            if fetch_value(
                self._conn.execute("select pg_try_advisory_lock(%s, %s)", (_NS_SHARD, key)), "the lock's answer"
            ):
                break
            if clock() >= until:
                return False
            time.sleep(poll_s)
        self._held = True
        self._beat(started=True)
        self._thread = threading.Thread(target=self._beating, name=f"stream-shard-{self.shard}-heartbeat", daemon=True)
        self._thread.start()
        return True

    def _beat(self, *, started: bool = False, ended: bool = False) -> None:
        assert self._conn is not None
        s = self.stats
        shards.record_beat(
            self._conn,
            {
                "count": self.shard_count,
                "shard": self.shard,
                "run": self.run_id,
                "deadline": self.deadline,
                "ended": ended,
                "started": started,
                "commit": s.last_commit_at,
                "last": s.last_dataset_id,
                "syncs": s.syncs,
                "failures": s.failures,
                "backlog": s.backlog,
                "lag": s.lag_seconds,
            },
        )

    def _still_held(self) -> bool:
        assert self._conn is not None
        return fetch_value(
            self._conn.execute(
                "select exists(select 1 from pg_locks where locktype = 'advisory' and pid = pg_backend_pid() and granted"
                " and objsubid = 2 and classid = %s::bigint::oid and objid = %s::bigint::oid)",
                (_NS_SHARD, _lock_key(self.shard, self.shard_count)),
            ),
            "the shard lock's state",
        )

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            try:
                if not self._still_held():
                    self.lost = "the shard's lock is no longer held by its session"
                    return
                self._beat()
            except psycopg.Error as exc:
                self.lost = f"the session holding the shard's lock died ({type(exc).__name__}: {first_line(exc)})"
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        conn = self._conn
        if conn is None:
            return
        try:
            if self._held and self.lost is None:
                self._beat(ended=True)
                conn.execute("select pg_advisory_unlock(%s, %s)", (_NS_SHARD, _lock_key(self.shard, self.shard_count)))
        except psycopg.Error:
            pass  # the session is gone: so is its lock
        finally:
            self._conn = None
            close_quietly(conn)

    def __enter__(self) -> ShardLease:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
