"""Flag precedence, coded once: dataset override > workspace override (the dataset's workspace, from
``datasets``) > global override > registry default; then a stored mode above the ceiling is clamped to it.

``effective_sql`` is the one definition every reader of flags from Postgres goes through: the resolver's
load (flags/resolver.py), which datasets are native (flags/native.py), which are flipped
(flags/flipped.py). ``pick`` is the same walk over ``SCOPES`` for overrides held in memory — the flip
gates judge a change before writing it, over the overrides as they would be (resolver.resolve_from).
test_after_flip checks on a table of tricky cases that all of them agree.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from psycopg import sql

from lakehouse_dagster.flags import overrides_store
from lakehouse_dagster.flags.registry import MODES, Flag, rank

SCOPES = ("dataset", "workspace", "global")  # most specific first
DEFAULT = "default"  # the source when no override applies: the registry default

# Which column of a dataset row an override of each scope is matched against (global: none).
_SCOPE_KEY = {"dataset": "id", "workspace": "workspace_id", "global": None}


def pick(stored: dict[str, str], default: str) -> tuple[str, str]:
    """(source, stored mode) from the overrides found for one flag and dataset ({scope: mode})."""
    for scope in SCOPES:
        if stored.get(scope) is not None:
            return scope, stored[scope]
    return DEFAULT, default


_QUERY = (
    """
with f(kind, name, dflt, dflt_rank, ceiling, ceiling_rank) as (values {flags}),
     m(kind, mode, rnk) as (values {modes}),
     d(id, workspace_id) as ({datasets}),
     o as ("""
    + overrides_store.OF_FLAGS_IN_F
    + """),
     s as (
       select d.id, f.kind, f.name, f.dflt_rank, f.ceiling, f.ceiling_rank,
              coalesce({stored}, f.dflt) as stored_mode,
              case {source} else {default} end as source
         from d cross join f
         {joins})
select s.id as dataset_id, s.kind, s.name,
       case when m.rnk > s.ceiling_rank then s.ceiling else s.stored_mode end as mode,
       s.source, s.stored_mode, least(m.rnk, s.ceiling_rank) as mode_rank, s.dflt_rank as default_rank
  from s join m on m.kind = s.kind and m.mode = s.stored_mode
"""
)


def effective_sql(
    flags: Sequence[Flag], datasets: str, datasets_params: Sequence = (), *, select: str = "*", where: str = "true"
) -> tuple[str, list]:
    """(query, params): ``select <select> from (<effective modes>) e where <where>``, where the effective
    modes are one row per (dataset, flag) for every dataset ``datasets`` selects (a constant query yielding
    ``id, workspace_id``, with ``datasets_params`` for its placeholders; a null id resolves with global
    overrides only) and every flag in ``flags``.

    Columns of ``e``: dataset_id, kind, name, mode (clamped), source (a scope or 'default'), stored_mode
    (before the clamp), mode_rank, default_rank. The registry goes in as literals and the text is rendered
    once per process, so a caller's query text is constant: psycopg prepares it after a few executions.
    """
    return _rendered(tuple(flags), datasets, select, where), list(datasets_params)


@functools.lru_cache(maxsize=64)
def _rendered(flags: tuple[Flag, ...], datasets: str, select: str, where: str) -> str:
    alias = {scope: sql.Identifier(f"o_{scope}") for scope in SCOPES}
    joins = []
    for scope in SCOPES:
        key = _SCOPE_KEY[scope]
        match = (
            sql.SQL("{a}.scope_id = d.{k}").format(a=alias[scope], k=sql.Identifier(key)) if key else sql.SQL("true")
        )
        joins.append(
            sql.SQL("left join o {a} on {a}.kind = f.kind and {a}.name = f.name and {a}.scope = {s} and {m}").format(
                a=alias[scope], s=sql.Literal(scope), m=match
            )
        )

    def values(rows):
        return sql.SQL(", ").join(sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Literal, r))) for r in rows)

    query = sql.SQL("select {select} from ({effective}) e where {where}").format(
        select=sql.SQL(select),
        where=sql.SQL(where),
        effective=sql.SQL(_QUERY).format(
            flags=values(
                [
                    (f.kind, f.name, f.default, rank(f.kind, f.default), f.ceiling, rank(f.kind, f.ceiling))
                    for f in flags
                ]
            ),
            modes=values([(k, m, rank(k, m)) for k, modes in MODES.items() for m in modes]),
            datasets=sql.SQL(datasets),
            stored=sql.SQL(", ").join(sql.SQL("{}.mode").format(alias[s]) for s in SCOPES),
            source=sql.SQL(" ").join(
                sql.SQL("when {a}.mode is not null then {s}").format(a=alias[s], s=sql.Literal(s)) for s in SCOPES
            ),
            default=sql.Literal(DEFAULT),
            joins=sql.SQL("\n         ").join(joins),
        ),
    )
    return query.as_string(None)
