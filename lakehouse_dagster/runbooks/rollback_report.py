"""What a writer rollback (`write-flags set <writer> pg`, `clear`) leaves behind, per dataset it moves.

The effects are computed before the change (gates.effects: which datasets the change moves off
iceberg_native); the Iceberg-only counts after it, from the table metadata (iceberg_only.py).
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import NATIVE, Effect, effects
from lakehouse_dagster.flags.overrides import parse_scope
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.mirror.native_run import IcebergOnly, iceberg_only, ways_forward


@dataclasses.dataclass(frozen=True)
class RolledBack:
    dataset_id: uuid.UUID
    name: str
    iceberg_only: IcebergOnly | None

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "name": self.name,
            "iceberg_only_rows": self.iceberg_only.rows if self.iceberg_only else 0,
            "iceberg_only_snapshots": self.iceberg_only.snapshots if self.iceberg_only else 0,
            "detail": self.iceberg_only.as_dict() if self.iceberg_only else None,
        }


def leaving_native(
    conn: psycopg.Connection, writer: str, mode: str | None, *, dataset=None, workspace=None
) -> list[Effect]:
    """Datasets a write-flag set (mode) or clear (None) moves off iceberg_native; call before the change."""
    flag = get_flag(WRITE, writer)
    moved, _ = effects(conn, flag, parse_scope(dataset, workspace), mode)
    return [e for e in moved if e.before == NATIVE and e.after != NATIVE]


def rolled_back(
    conn: psycopg.Connection, catalog: Catalog, settings: Settings, moved: list[Effect]
) -> list[RolledBack]:
    return [RolledBack(e.dataset_id, e.name, iceberg_only(conn, catalog, settings, e.dataset_id)) for e in moved]


def rollback_lines(writer: str, rolled: list[RolledBack]) -> list[str]:
    """One line per dataset moved back to pg: what only Iceberg holds and the two ways forward."""
    lines = []
    for r in rolled:
        if r.iceberg_only is None:
            lines.append(f"  {r.name} ({r.dataset_id}): back on pg; Iceberg holds nothing Postgres lacks")
        else:
            lines.append(
                f"  {r.name} ({r.dataset_id}): {r.iceberg_only.describe()}; the mirror refuses to overwrite "
                f"the table until you {ways_forward(r.dataset_id)}"
            )
    if lines:
        lines.insert(0, f"{writer} rolled back to pg for {len(rolled)} dataset(s):")
    return lines
