"""Which datasets are written natively to Iceberg: the mirror poller skips them.

One query for any number of datasets, uncached (the poller must see a flip at once): the same
precedence as the resolver (dataset > workspace > global > registry default), over the writers
whose ceiling allows iceberg_native. Writers locked to PG clamp to pg, so they never count.
"""

from __future__ import annotations

import uuid
from typing import Iterable

import psycopg
from psycopg import sql

from .registry import FLIPPABLE_WRITERS

_QUERY = sql.SQL(
    """
with w(name, dflt) as (values {writers}),
     d as (select id, workspace_id from datasets {where}),
     o as (select name, scope, scope_id, mode from lakehouse_flag_overrides where kind = 'write')
select distinct d.id
  from d cross join w
  left join o od on od.name = w.name and od.scope = 'dataset' and od.scope_id = d.id
  left join o ow on ow.name = w.name and ow.scope = 'workspace' and ow.scope_id = d.workspace_id
  left join o og on og.name = w.name and og.scope = 'global'
 where coalesce(od.mode, ow.mode, og.mode, w.dflt) = 'iceberg_native'
"""
)


def native_dataset_ids(
    conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID] | None = None
) -> set[uuid.UUID]:
    """Datasets (all, or among ``dataset_ids``) where any flip-able writer resolves to iceberg_native."""
    if not FLIPPABLE_WRITERS:
        return set()
    writers = sql.SQL(", ").join(sql.SQL("(%s, %s)") for _ in FLIPPABLE_WRITERS)
    params: list = [v for w in FLIPPABLE_WRITERS for v in (w.name, w.default)]
    if dataset_ids is None:
        where = sql.SQL("")
    else:
        ids = list(dataset_ids)
        if not ids:
            return set()
        where = sql.SQL("where id = any(%s::uuid[])")
        params.append(ids)
    query = _QUERY.format(writers=writers, where=where)
    return {r[0] for r in conn.execute(query, params).fetchall()}
