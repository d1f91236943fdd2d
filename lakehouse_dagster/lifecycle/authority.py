"""Every write path asks the lifecycle who is authoritative before it writes: a write whose target store is not the
dataset's truth is refused with the reason, never half-done (issue 42: a pg writer beside a native one wrote rows
that the reverse mirror's next re-sync deleted — in neither store).

The check runs under the lifecycle lock taken shared (lifecycle/lock.py), in the write's own transaction (the pg
path: its rows commit with the check) or its own session (the native path: held until the commit has landed), so
no verb moves the dataset between the check and the write.
"""

from __future__ import annotations

import uuid

from lakehouse_dagster.lifecycle.errors import WriteRefused
from lakehouse_dagster.lifecycle.lock import write_hold, write_lock_statements
from lakehouse_dagster.lifecycle.states import COMPLETE, COMPLETING, ICEBERG, POSTGRES, RESTORING, Facts

__all__ = ["check_authority", "facts_of_row", "write_hold", "write_lock_statements"]


def facts_of_row(row) -> Facts | None:
    """The state read by ``write_lock_statements``' last statement (None: no row)."""
    return None if row is None else Facts(row[0], row[1], tuple(row[2] or ()))


def check_authority(facts: Facts | None, dataset_id: uuid.UUID, *, target: str, writer: str) -> None:
    """Raise WriteRefused unless ``target`` (postgres | iceberg) is the dataset's truth. ``facts`` None: the
    dataset has no recorded state (deleted meanwhile): the write's own checks say so."""
    if facts is None or facts.authority == target:
        return
    d = f"--dataset {dataset_id}"
    if target == POSTGRES:
        if facts.state in (COMPLETING, COMPLETE, RESTORING):
            raise WriteRefused(
                f"refused: {writer} would write dataset {dataset_id} into Postgres, but the dataset is "
                f"{facts.describe()}: its Postgres rows are retired and Iceberg is its only store; write it "
                f"iceberg-native (lakehouse write-flags set {writer} iceberg_native {d}); nothing was written"
            )
        natives = ", ".join(facts.native_writers) or "a writer"
        raise WriteRefused(
            f"refused: {writer} would write dataset {dataset_id} into Postgres, but the dataset is "
            f"{facts.describe()} ({natives} write{'s' if len(facts.native_writers) == 1 else ''} Iceberg, its truth): "
            f"rows written to dataset_rows now would be in neither store once the reverse mirror re-syncs it; flip "
            f"{writer} too (lakehouse write-flags set {writer} iceberg_native {d}) or roll {natives} back first "
            f"(lakehouse write-flags set <writer> pg {d}); nothing was written"
        )
    assert target == ICEBERG
    raise WriteRefused(
        f"refused: {writer} would write dataset {dataset_id} into Iceberg, but the dataset is {facts.describe()}: "
        "Postgres is its truth and the forward mirror would overwrite the table from it; the writer's flag changed "
        f"since it was read (the flag cache lags up to its TTL): run the write again; nothing was written"
    )
