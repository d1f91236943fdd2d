"""Which datasets are flipped: any reader or writer whose effective mode is above its registry default.

One query, uncached (the schedule must see a flip at once), with the resolver's precedence
(dataset > workspace > global > registry default) and its clamp (a stored mode above the ceiling
counts as the ceiling, so a hand-written row cannot make a PG-locked writer look flipped).
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

_QUERY = """
with f(kind, name, dflt_rank, ceiling_rank) as (values {flags}),
     m(kind, mode, rnk) as (values {modes}),
     o as (select kind, name, scope, scope_id, mode from lakehouse_flag_overrides),
     d as (
       select id, workspace_id from datasets
        where kind = 'tabular'
          and (exists (select 1 from o where scope = 'global')
               or id in (select scope_id from o where scope = 'dataset')
               or workspace_id in (select scope_id from o where scope = 'workspace')))
select distinct d.id
  from d cross join f
  left join o od on od.kind = f.kind and od.name = f.name and od.scope = 'dataset' and od.scope_id = d.id
  left join o ow on ow.kind = f.kind and ow.name = f.name and ow.scope = 'workspace' and ow.scope_id = d.workspace_id
  left join o og on og.kind = f.kind and og.name = f.name and og.scope = 'global'
  join m on m.kind = f.kind and m.mode = coalesce(od.mode, ow.mode, og.mode)
 where least(m.rnk, f.ceiling_rank) > f.dflt_rank
"""


def flipped_dataset_ids(conn: psycopg.Connection) -> set[uuid.UUID]:
    """Tabular datasets with at least one read or write flag resolving above its registry default."""
    if conn.execute("select to_regclass('lakehouse_flag_overrides')").fetchone()[0] is None:
        return set()
    from ..flags.registry import MODES, REGISTRY, rank  # the flags area's registry (one place)

    flags = [(k, f.name, rank(k, f.default), rank(k, f.ceiling)) for k, fs in REGISTRY.items() for f in fs.values()]
    modes = [(k, m, rank(k, m)) for k, ms in MODES.items() for m in ms]
    query = sql.SQL(_QUERY).format(
        flags=sql.SQL(", ").join(sql.SQL("(%s, %s, %s, %s)") for _ in flags),
        modes=sql.SQL(", ").join(sql.SQL("(%s, %s, %s)") for _ in modes),
    )
    params = [v for row in flags for v in row] + [v for row in modes for v in row]
    return {r[0] for r in conn.execute(query, params).fetchall()}
