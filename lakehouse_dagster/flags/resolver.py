"""Resolution of a flag for a dataset: precedence, clamp, and an in-process TTL cache.

Precedence: dataset override > workspace override (the dataset's workspace, from `datasets`) >
global override > registry default; then a stored mode above the ceiling is clamped to it. Coded once,
in precedence.py: the load runs its SQL, ``resolve_from`` its in-memory twin (for the flip gates).

Cache: one query per (dataset, TTL) fills every reader and writer of that dataset. An entry
expires ``ttl`` seconds after the moment its query *started*, so a value is never older than
the TTL: a flip or rollback made by any process is seen everywhere within the TTL. A set/clear
made through overrides.py in this process drops every cache in the process at once (and bumps a
generation, so a fill racing with the flip cannot store the value from before it). A change made
anywhere else drops the caches within a second too: Postgres NOTIFYs it and a listener thread per
process passes it on (flags/listen.py); the TTL stays the fallback while that thread is not listening.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
import weakref
from collections.abc import Callable

import psycopg

from lakehouse_dagster.core.errors import BadInput
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import FlagSettings, Settings
from lakehouse_dagster.flags.listen import subscribe
from lakehouse_dagster.flags.precedence import DEFAULT, effective_sql, pick
from lakehouse_dagster.flags.registry import READ, REGISTRY, WRITE, Flag, check_kind, clamp, get_flag
from lakehouse_dagster.tracking.datasets import scopes

# The reasons a resolution gives, most specific first.
DATASET_OVERRIDE = "dataset override"
WORKSPACE_OVERRIDE = "workspace override"
GLOBAL_OVERRIDE = "global override"
REGISTRY_DEFAULT = "registry default"
CLAMPED = "clamped to ceiling"

_REASON_BY_SCOPE = {
    "dataset": DATASET_OVERRIDE,
    "workspace": WORKSPACE_OVERRIDE,
    "global": GLOBAL_OVERRIDE,
    DEFAULT: REGISTRY_DEFAULT,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Resolution:
    """A flag's effective mode and why. Immutable and shared: equal resolutions are one object."""

    kind: str
    name: str
    mode: str  # the effective mode, never above the ceiling
    reason: str  # one of the five reasons above
    source: str  # where the stored value came from (equals reason unless clamped)
    stored_mode: str  # the value found before the clamp
    ceiling: str
    consistency: str | None

    def describe(self) -> str:
        if self.reason == CLAMPED:
            return f"{self.mode} ({CLAMPED}: {self.source} says {self.stored_mode})"
        return f"{self.mode} ({self.reason})"


_interned: dict[tuple, Resolution] = {}


def resolve_from(flag: Flag, stored: dict[str, str]) -> Resolution:
    """Precedence + clamp over overrides held in memory for one flag ({scope: mode}): precedence.pick."""
    scope, mode = pick(stored, flag.default)
    return _resolution(flag, scope, mode, clamp(flag, mode)[0])


def _resolution(flag: Flag, scope: str, mode: str, effective: str) -> Resolution:
    """The interned Resolution of a flag whose override at ``scope`` (or the default) says ``mode``."""
    source = _REASON_BY_SCOPE[scope]
    key = (
        flag.kind,
        flag.name,
        effective,
        CLAMPED if effective != mode else source,
        source,
        mode,
        flag.ceiling,
        flag.consistency,
    )
    res = _interned.get(key)
    if res is None:  # a handful per flag: (stored mode x source), so the cache holds pointers, not copies
        res = _interned.setdefault(key, Resolution(*key))
    return res


# Every live resolver in this process, so a local set/clear can drop their caches at once.
_resolvers: weakref.WeakSet[FlagResolver] = weakref.WeakSet()
_generation = [0]
_generation_lock = threading.Lock()


def invalidate_local() -> None:
    """Called after a set/clear commits: this process sees the change immediately."""
    _invalidate(list(_resolvers))


def _invalidate(resolvers: list) -> None:
    """Drop these resolvers' caches; the generation bump keeps a fill racing with the change from storing."""
    with _generation_lock:
        _generation[0] += 1
        for r in resolvers:
            r._cache.clear()


# The one dataset resolved (even one that does not exist: it gets the global overrides and defaults).
_ONE_DATASET = scopes.ONE_ID_AND_WORKSPACE
_NO_DATASET = "select null::uuid, null::uuid"
_COLUMNS = "e.kind, e.name, e.source, e.stored_mode, e.mode"
_ALL_FLAGS = [f for flags in REGISTRY.values() for f in flags.values()]


def _listen_default() -> bool:

    try:
        return Settings.from_env().flags.listen
    except BadInput:  # another variable is bad: whoever reads it says so; listening is harmless
        return True


class FlagResolver:
    """Resolves flags against one Postgres connection, caching each dataset's flags for ``ttl_seconds``.

    ``conn`` should be autocommit (store.db.connect), so each fill sees the latest committed overrides.
    Thread-safe: psycopg serialises use of the connection; cache values are immutable and replaced whole.
    Memory is bounded: past ``max_datasets`` cached datasets, expired entries are dropped, then all.
    """

    def __init__(
        self,
        conn: psycopg.Connection,
        ttl_seconds: float = 10.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_datasets: int = 100_000,
        listen: bool | None = None,
    ) -> None:
        self.conn = conn
        self.ttl = max(0.0, float(ttl_seconds))
        self._clock = clock
        self._max = max_datasets
        # dataset id (None = global) -> (expires at, {(kind, name): Resolution})
        self._cache: dict[uuid.UUID | None, tuple[float, dict[tuple[str, str], Resolution]]] = {}
        _resolvers.add(self)
        # NOTIFY-driven invalidation (None: LAKEHOUSE_FLAG_LISTEN, default on); nothing to drop without a cache.
        if self.ttl > 0 and (_listen_default() if listen is None else listen):
            subscribe(conn, self, _invalidate)

    @classmethod
    def from_settings(cls, conn: psycopg.Connection, flags: FlagSettings) -> FlagResolver:
        return cls(conn, flags.ttl_seconds, listen=flags.listen)

    def resolve(self, kind: str, name: str, dataset_id: uuid.UUID | str | None = None) -> Resolution:
        """The effective mode of one reader/writer for a dataset (or globally when dataset_id is None)."""
        ds_id = parse_uuid(dataset_id, "dataset id") if isinstance(dataset_id, str) else dataset_id
        entry = self._cache.get(ds_id)
        if entry is not None and entry[0] > self._clock():
            res = entry[1].get((kind, name))
            if res is not None:
                return res
        get_flag(kind, name)  # an unknown name is refused (BadInput naming the known ones) before any query
        return self._fill(ds_id)[(kind, name)]

    def read_mode(self, reader: str, dataset_id: uuid.UUID | str | None = None) -> Resolution:
        return self.resolve(READ, reader, dataset_id)

    def write_mode(self, writer: str, dataset_id: uuid.UUID | str | None = None) -> Resolution:
        return self.resolve(WRITE, writer, dataset_id)

    def resolve_all(self, dataset_id: uuid.UUID | str | None = None, kind: str | None = None) -> list[Resolution]:
        """Every reader and writer (or one kind) for a dataset, in registry order."""
        kinds = (check_kind(kind),) if kind else (READ, WRITE)
        return [self.resolve(k, name, dataset_id) for k in kinds for name in REGISTRY[k]]

    def clear(self) -> None:
        self._cache.clear()

    def _load(self, dataset_id: uuid.UUID | None) -> dict[tuple[str, str], Resolution]:
        if dataset_id is None:
            query, params = effective_sql(_ALL_FLAGS, _NO_DATASET, select=_COLUMNS)
        else:
            query, params = effective_sql(_ALL_FLAGS, _ONE_DATASET, (dataset_id, dataset_id), select=_COLUMNS)
        rows = self.conn.execute(query, params).fetchall()
        return {
            (kind, name): _resolution(REGISTRY[kind][name], source, stored, mode)
            for kind, name, source, stored, mode in rows
        }

    def _fill(self, dataset_id: uuid.UUID | None) -> dict[tuple[str, str], Resolution]:
        generation = _generation[0]
        started = self._clock()
        resolved = self._load(dataset_id)
        if self.ttl <= 0:
            return resolved
        with _generation_lock:
            # A local set/clear committed while we read: answer with what we read, but do not keep it.
            if _generation[0] == generation:
                if len(self._cache) >= self._max:
                    self._evict()
                self._cache[dataset_id] = (started + self.ttl, resolved)
        return resolved

    def _evict(self) -> None:
        now = self._clock()
        for key in [k for k, (expires, _) in self._cache.items() if expires <= now]:
            self._cache.pop(key, None)
        if len(self._cache) >= self._max:
            self._cache.clear()


_MANY_DATASETS = scopes.IDS_AND_WORKSPACES_OF


def resolve_datasets(conn: psycopg.Connection, dataset_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[Resolution]]:
    """Every reader and writer (registry order) of many datasets, in one query and uncached: what a status view
    of many datasets reads (FlagResolver asks once per dataset). Datasets that do not exist are left out."""
    if not dataset_ids:
        return {}
    query, params = effective_sql(_ALL_FLAGS, _MANY_DATASETS, [list(dataset_ids)], select="e.dataset_id, " + _COLUMNS)
    found: dict[uuid.UUID, dict[tuple[str, str], Resolution]] = {}
    for ds, kind, name, source, stored, mode in conn.execute(query, params).fetchall():
        found.setdefault(ds, {})[(kind, name)] = _resolution(REGISTRY[kind][name], source, stored, mode)
    return {ds: [by[(k, n)] for k in (READ, WRITE) for n in REGISTRY[k]] for ds, by in found.items()}
