"""Which of a dataset's snapshots is newer, so that nothing records an older one over a newer one on a page (issue 42,
item 9): the table's own order, never the order in which events happen to be written.

The order is the sync log's: every commit the project makes to a dataset's table (a mirror sync, a native write, a
compaction) is made under the dataset lock (G3) and recorded as an ``iceberg_sync_log`` row whose ``finished_at`` is
set, under that lock, right after the commit; so ``(finished_at, id)`` of a snapshot's newest succeeded row orders the
table's commits as its Iceberg sequence numbers do, and it is the order ``lakehouse_latest_succeeded_sync`` (what
the pages call "the table now") uses. One query, no table load: cheap enough for every event a run or the recorder
writes. A snapshot the log does not know (another engine's commit: issue 42 item 7) has no place in the order and
is never called newer or older. Plain Python over a connection; the Dagster glue asks it before it records."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import psycopg

from lakehouse_dagster.tracking import sync_log

# The table now: the snapshot of each dataset's latest succeeded sync (the one definition).
_CURRENT = """
select k.ds, (select s.snapshot_id from lakehouse_latest_succeeded_sync(k.ds) s) from unnest(%s::uuid[]) as k(ds)
"""


def sync_order(conn: psycopg.Connection, pairs: Iterable[tuple[uuid.UUID, int]]) -> dict[tuple[uuid.UUID, int], tuple]:
    """The order key of each (dataset, snapshot) the sync log knows (greater: committed later), in one query."""
    asked = list(dict.fromkeys((d, int(s)) for d, s in pairs if s is not None))
    if not asked:
        return {}
    rows = sync_log.succeeded_order(conn, [d for d, _ in asked], [s for _, s in asked])
    # nulls last in a descending order: a row without finished_at sorts below every finished one
    return {(r[0], r[1]): (r[2] is not None, r[2].timestamp() if r[2] is not None else 0.0, r[3]) for r in rows}


def current_snapshots(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, int | None]:
    """The table now of each dataset (its latest succeeded sync's snapshot), in one query."""
    ids = list(dict.fromkeys(dataset_ids))
    if not ids:
        return {}
    return {r[0]: r[1] for r in conn.execute(_CURRENT, (ids,)).fetchall()}


def newer_than(order: dict[tuple[uuid.UUID, int], tuple], dataset_id: uuid.UUID, a: int | None, b: int | None) -> bool:
    """Whether snapshot ``a`` of the dataset was committed after snapshot ``b`` (False when either is unknown)."""
    if a is None or b is None or int(a) == int(b):
        return False
    ka, kb = order.get((dataset_id, int(a))), order.get((dataset_id, int(b)))
    return ka is not None and kb is not None and ka > kb


def superseded_by(conn: psycopg.Connection, dataset_id: uuid.UUID, snapshot_id: int | None) -> int | None:
    """The snapshot that makes ``snapshot_id`` old news for the dataset's pages: the table now, when it was committed
    after ``snapshot_id``; None when ``snapshot_id`` is the table now (or the order cannot tell). Two short queries:
    what every run asks before it records a commit of its own as the table now."""
    if snapshot_id is None:
        return None
    now = current_snapshots(conn, [dataset_id]).get(dataset_id)
    if now is None or int(now) == int(snapshot_id):
        return None
    order = sync_order(conn, [(dataset_id, snapshot_id), (dataset_id, now)])
    return int(now) if newer_than(order, dataset_id, now, snapshot_id) else None
