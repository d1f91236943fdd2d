"""What the source_poller sensor asks for: datasets whose source has something new, a page per tick.

Every dataset with a source (files / postgres / cdc; legacy or unknown types count as none) is visited
in id order from a cursor that wraps around, so a tick costs at most ``limit`` requests and ``budget_s``
seconds however many datasets have sources, and every dataset is visited again within a few ticks.
``pending_source_changes`` (sources/writers.py) is cheap — it lists files, asks one max(), or compares a
cursor-less table's change counters (a cursor-less query or view: a digest of its rows; ``polling_cost``) — and
names what is new (the token goes into the run key, so the same news is never requested twice and
new news always is). The writer is the source's default (files: sync.append, postgres with a cursor:
sync.incremental, without: sync.full, cdc: cdc.append); its flag is resolved here only to tag the
request — run_writer resolves it again when it runs, so a flip in between is honoured. A source whose writer is on
pg while the dataset is native (Iceberg its truth) is not asked for: the write would be refused; `lakehouse status`
and the refusal of a hand-run ingest say why.
"""

from __future__ import annotations

import dataclasses
import time
import uuid

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.lifecycle_facts import lifecycle_of
from lakehouse_dagster.flags.registry import WRITE
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lifecycle import ICEBERG
from lakehouse_dagster.sources import get_source
from lakehouse_dagster.sources.pgsource import STATS, fingerprint_method
from lakehouse_dagster.sources.spec import TYPES, SourceSpec
from lakehouse_dagster.sources.writers import pending_source_changes
from lakehouse_dagster.tracking.datasets.scopes import ids_with_source_page

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
    return ids_with_source_page(conn, TYPES, after, size)


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
        states = lifecycle_of(conn, ids)
        visited = 0
        for ds_id in ids:
            if len(found) >= limit or time.monotonic() - started > budget_s:
                break
            visited += 1
            spec = get_source(conn, ds_id)
            token = pending_source_changes(dsn, settings, ds_id) if spec is not None else None
            if spec is None or token is None:
                continue
            res = resolver.resolve(WRITE, spec.default_writer, ds_id)
            facts = states.get(ds_id)
            if res.mode == "pg" and facts is not None and facts.authority == ICEBERG:
                continue  # a pg writer beside a native one: its write would be refused (lifecycle/authority.py)
            found.append(PendingIngest(ds_id, spec.default_writer, token, res.mode, res.describe()))
    # Stopped early or a full page: continue after the last visited next tick; else start over.
    more = visited < len(ids) or len(ids) == size
    return found, (str(ids[visited - 1]) if more and visited else None), visited


def polling_cost(spec: SourceSpec, dsn: str) -> str:
    """What watching this source costs the source_poller on each visit (every 30 s at most), for `sources set`."""
    if spec.type == "files":
        where = "an S3 listing" if (spec.uri or "").startswith("s3://") else "a directory listing"
        return f"polling: {where} of {spec.uri} per visit (new or changed files are ingested once; no rows read)"
    if spec.order_column:
        col = spec.order_column
        return (
            f"polling: one max({col}) per visit past the stored mark (index {col} to keep it cheap); rows that arrive "
            f"at or below the mark, and updates or deletes, are not seen"
        )
    with connect(spec.dsn(dsn)) as conn:
        method = fingerprint_method(spec, conn)
    if method == STATS:
        return (
            "polling: the table's row-change counters (pg_stat_all_tables n_tup_ins/upd/del) and file node per visit: "
            "one catalog query, no rows read; any change (insert, update, delete, truncate) re-runs sync.full, which "
            "reads the whole table; a change shows within ~10 s of its commit (60 s at most)"
        )
    return (
        f"polling: {'the query' if spec.query else 'the view'} is run and every row digested (count + sum of row "
        "hashes) per visit, O(rows) on the source every 30 s; give --cursor-column to poll with one max() instead"
    )
