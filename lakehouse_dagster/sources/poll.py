"""What the source_poller sensor asks for: datasets whose source has something new, a page per tick.

Every dataset with a source (files / postgres / cdc; legacy or unknown types count as none) is visited
in id order from a cursor that wraps around, so a tick costs at most ``limit`` requests and ``budget_s``
seconds however many datasets have sources, and every dataset is visited again within a few ticks.
``pending_source_changes`` (sources/writers.py) is cheap — it lists files or asks one max() — and
names what is new (the token goes into the run key, so the same news is never requested twice and
new news always is). The writer is the source's default (files: sync.append, postgres with a cursor:
sync.incremental, without: sync.full, cdc: cdc.append); its flag is resolved here only to tag the
request — run_writer resolves it again when it runs, so a flip in between is honoured.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.registry import WRITE
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.sources import get_source
from lakehouse_dagster.sources.spec import TYPES
from lakehouse_dagster.sources.writers import pending_source_changes

_NIL = uuid.UUID(int=0)


@dataclasses.dataclass(frozen=True)
class PendingIngest:
    dataset_id: uuid.UUID
    writer: str
    token: str  # what is new (pending_source_changes)
    mode: str  # the writer's flag now: pg | iceberg_native
    reason: str  # why (Resolution.describe())

    @property
    def run_key(self) -> str:
        return f"ingest:{self.dataset_id}:{self.writer}:{self.token}"


def _page(conn, after: uuid.UUID, size: int) -> list[uuid.UUID]:
    return [
        r[0]
        for r in conn.execute(
            "select id from datasets where kind = 'tabular' and source->>'type' = any(%s) and id > %s order by id limit %s",
            (list(TYPES), after, size),
        ).fetchall()
    ]


def pending_ingests(
    dsn: str,
    settings: Settings,
    cursor: str | None,
    *,
    limit: int,
    budget_s: float = 20.0,
) -> tuple[list[PendingIngest], str | None, int]:
    """(requests, next cursor, datasets visited). ``cursor``: the last dataset id visited (None: from the start)."""
    started = time.monotonic()
    size = max(4 * limit, 100)
    found: list[PendingIngest] = []
    with connect(dsn) as conn:
        ids = _page(conn, uuid.UUID(cursor) if cursor else _NIL, size)
        if not ids and cursor:  # past the end: wrap around
            ids = _page(conn, _NIL, size)
        resolver = FlagResolver(conn, ttl_seconds=0)
        visited = 0
        for ds_id in ids:
            if len(found) >= limit or time.monotonic() - started > budget_s:
                break
            visited += 1
            spec = get_source(conn, ds_id)
            token = pending_source_changes(dsn, settings, ds_id) if spec is not None else None
            if token is None:
                continue
            res = resolver.resolve(WRITE, spec.default_writer, ds_id)
            found.append(PendingIngest(ds_id, spec.default_writer, token, res.mode, res.describe()))
    # Stopped early or a full page: continue after the last visited next tick; else start over.
    more = visited < len(ids) or len(ids) == size
    return found, (str(ids[visited - 1]) if more and visited else None), visited
