"""The reverse mirror's effective setting per dataset (dataset > workspace > global > on), apart from the verb that
changes it (reverse_setting.py: checks, lifecycle transition, audit) so that the lifecycle's facts
(lifecycle_facts.py) can read it below the overrides. Every statement on lakehouse_reverse_settings is here (its
owner: lakehouse_dagster_tests/test_table_owners.py)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable

import psycopg

from lakehouse_dagster.tracking.datasets import fragments

DEFAULT_ON = True

_EFFECTIVE = (
    """
select d.id,
       coalesce(o_d.enabled, o_w.enabled, o_g.enabled, %(default)s) as enabled,
       case when o_d.enabled is not null then 'dataset' when o_w.enabled is not null then 'workspace'
            when o_g.enabled is not null then 'global' else 'default' end as source
  """
    + fragments.FROM_DATASETS
    + """
  left join lakehouse_reverse_settings o_d on o_d.scope = 'dataset' and o_d.scope_id = d.id
  left join lakehouse_reverse_settings o_w on o_w.scope = 'workspace' and o_w.scope_id = d.workspace_id
  left join lakehouse_reverse_settings o_g on o_g.scope = 'global'
 where d.id = any(%(ids)s::uuid[])
"""
)


@dataclasses.dataclass(frozen=True)
class ReverseSetting:
    dataset_id: uuid.UUID
    enabled: bool
    source: str  # dataset | workspace | global | default

    def describe(self) -> str:
        return f"reverse {'on' if self.enabled else 'off'} ({'the default' if self.source == 'default' else self.source + ' setting'})"


def reverse_settings(conn: psycopg.Connection, dataset_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, ReverseSetting]:
    """The effective setting of each dataset (one query, uncached: a change applies at the next apply)."""
    ids = list(dataset_ids)
    if not ids:
        return {}
    rows = conn.execute(_EFFECTIVE, {"ids": ids, "default": DEFAULT_ON}).fetchall()
    return {r[0]: ReverseSetting(r[0], bool(r[1]), r[2]) for r in rows}


_LOCK = "lakehouse_reverse_settings"  # one writer at a time: the audit's before is exact (core/locks.py NAMED)


def lock_and_read_setting(conn: psycopg.Connection, scope: str, scope_id: uuid.UUID | None) -> bool | None:
    """The setting stored at one scope (None: none), read under the lock every change takes first."""
    conn.execute("select pg_advisory_xact_lock(hashtextextended(%s, 0))", (_LOCK,))
    row = conn.execute(
        "select enabled from lakehouse_reverse_settings where scope = %s and scope_id is not distinct from %s",
        (scope, scope_id),
    ).fetchone()
    return None if row is None else bool(row[0])


def store_setting(
    conn: psycopg.Connection, scope: str, scope_id: uuid.UUID | None, enabled: bool, note: str | None, actor: str
) -> None:
    conn.execute(
        "insert into lakehouse_reverse_settings (scope, scope_id, enabled, note, set_by) values (%s, %s, %s, %s, %s)"
        " on conflict (scope, coalesce(scope_id, '00000000-0000-0000-0000-000000000000'::uuid))"
        " do update set enabled = excluded.enabled, note = excluded.note, set_by = excluded.set_by, set_at = now()",
        (scope, scope_id, enabled, note, actor),
    )


def delete_setting(conn: psycopg.Connection, scope: str, scope_id: uuid.UUID | None) -> None:
    conn.execute(
        "delete from lakehouse_reverse_settings where scope = %s and scope_id is not distinct from %s",
        (scope, scope_id),
    )


def reverse_enabled(conn: psycopg.Connection, dataset_id: uuid.UUID) -> ReverseSetting:
    return reverse_settings(conn, [dataset_id]).get(dataset_id) or ReverseSetting(dataset_id, DEFAULT_ON, "default")
