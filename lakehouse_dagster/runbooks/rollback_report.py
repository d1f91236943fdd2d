"""What a writer rollback (`write-flags set <writer> pg`, `clear`) leaves behind, per dataset it moves.

The effects are computed before the change (gates.effects: which datasets the change moves off
iceberg_native); the Iceberg-only counts after it, from the table metadata (iceberg_only.py). Which case applies
is said per dataset: reverse-synced up to the current snapshot (mirror/reverse.py: Postgres already holds every
row, no backfill), or the reverse was off or behind (then the backfill or a pg-path sync.full).

Just before the change, ``apply_reverse_first`` lets the reverse mirror apply what it has not yet (a native commit
of the last second, a stream that was down), so a rollback of a dataset with the reverse on is lossless however
recently it was written; only an apply that fails (or a native write landing between it and the flag change)
leaves the dataset behind, and the report says so.
"""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import NATIVE, Effect, effects
from lakehouse_dagster.flags.overrides import parse_scope
from lakehouse_dagster.flags.registry import WRITE, get_flag
from lakehouse_dagster.flags.reverse_setting import reverse_enabled
from lakehouse_dagster.lake.catalog import load_table_or_none, table_identifier
from lakehouse_dagster.mirror.native_run import IcebergOnly, iceberg_only, ways_forward
from lakehouse_dagster.mirror.reverse import ReversePosition, apply_reverse, position
from lakehouse_dagster.mirror.reverse_lag import reverse_lags
from lakehouse_dagster.parity.canary import MISMATCH, latest_verdicts


@dataclasses.dataclass(frozen=True)
class RolledBack:
    dataset_id: uuid.UUID
    name: str
    iceberg_only: IcebergOnly | None
    reverse: ReversePosition | None = None  # the reverse mirror's position (mirror/reverse.py)
    reverse_on: bool = True  # the dataset's reverse setting
    current_snapshot: int | None = None  # the table's, after the change

    @property
    def reverse_synced(self) -> bool:
        """Postgres holds the table's current snapshot through the reverse mirror: no backfill needed."""
        return (
            self.iceberg_only is None
            and self.reverse is not None
            and self.current_snapshot is not None
            and self.reverse.snapshot_id == self.current_snapshot
        )

    def reverse_case(self) -> str:
        if self.reverse_synced:
            return f"reverse-synced up to snapshot {self.current_snapshot}: no backfill needed"
        if not self.reverse_on:
            return "reverse was off: run lakehouse backfill"
        at = f"it holds snapshot {self.reverse.snapshot_id}" if self.reverse else "it never applied a snapshot"
        return f"reverse was behind ({at}): run lakehouse backfill"

    def as_dict(self) -> dict:
        return {
            "dataset_id": str(self.dataset_id),
            "name": self.name,
            "reverse_synced": self.reverse_synced,
            "reverse_case": self.reverse_case() if self.iceberg_only is not None or self.reverse_synced else None,
            "reverse_snapshot": self.reverse.snapshot_id if self.reverse else None,
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


def apply_reverse_first(
    dsn: str, catalog: Catalog, settings: Settings, moved: list[Effect], *, lock_timeout_s: float = 60
) -> dict[uuid.UUID, str]:
    """Before a writer rollback: apply what the reverse mirror has not yet for each dataset leaving iceberg_native
    whose reverse is on and behind (Postgres says which: one query). {dataset: why its apply failed}; those stay
    behind and their report says to backfill. A dataset whose newest verdict is a MISMATCH of its native writes (the
    first native sync's canary, not a reverse copy's) is left alone: what Iceberg holds is in doubt, so the rollback
    keeps Postgres as it is and the report names what only Iceberg holds."""
    if not moved:
        return {}
    with connect(dsn) as conn:
        lags, _off = reverse_lags(conn, {e.dataset_id for e in moved})
        verdicts = latest_verdicts(conn, list(lags))
    failed = {}
    for ds_id, lag in sorted(lags.items()):
        if lag.caught_up and lag.applied_snapshot is not None:
            continue
        v = verdicts.get(ds_id)
        if v is not None and v["verdict"] == MISMATCH and "reverse" not in (v["detail"] or {}):
            continue
        try:
            apply_reverse(dsn, catalog, settings, ds_id, lock_timeout_s=lock_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a rollback is the way out: a failed catch-up never blocks it
            what = " ".join(str(exc).split())[:300]
            failed[ds_id] = what if isinstance(exc, LakehouseError) else f"{type(exc).__name__}: {what}"
    return failed


def rolled_back(
    conn: psycopg.Connection, catalog: Catalog, settings: Settings, moved: list[Effect]
) -> list[RolledBack]:
    out = []
    for e in moved:
        table = load_table_or_none(catalog, table_identifier(settings, e.dataset_id))
        snap = table.current_snapshot() if table is not None else None
        out.append(
            RolledBack(
                e.dataset_id,
                e.name,
                iceberg_only(conn, catalog, settings, e.dataset_id, table=table),
                position(conn, e.dataset_id),
                reverse_enabled(conn, e.dataset_id).enabled,
                snap.snapshot_id if snap is not None else None,
            )
        )
    return out


def rollback_lines(writer: str, rolled: list[RolledBack]) -> list[str]:
    """One line per dataset moved back to pg: reverse-synced (nothing to do), or what only Iceberg holds, why
    (the reverse was off or behind) and the two ways forward."""
    lines = []
    for r in rolled:
        if r.reverse_synced:
            lines.append(
                f"  {r.name} ({r.dataset_id}): back on pg; {r.reverse_case()} — Postgres already holds every row "
                "of the table, the mirror may run at once"
            )
        elif r.iceberg_only is None:
            lines.append(f"  {r.name} ({r.dataset_id}): back on pg; Iceberg holds nothing Postgres lacks")
        else:
            lines.append(
                f"  {r.name} ({r.dataset_id}): {r.iceberg_only.describe()}; {r.reverse_case()}; the mirror refuses to overwrite "
                f"the table until you {ways_forward(r.dataset_id)}"
            )
    if lines:
        lines.insert(0, f"{writer} rolled back to pg for {len(rolled)} dataset(s):")
    return lines
