"""The conditions of a complete (the package docstring's list): every missing one named at once with what to do, and the
datasets a complete at a scope takes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import fetch_value
from lakehouse_dagster.core.errors import BadInput, FlipRefused
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.completed import (
    COMPLETE,
    with_status,
)
from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import DATASET, WORKSPACE, parse_scope, require_target
from lakehouse_dagster.flags.reader_datasets import on_postgres
from lakehouse_dagster.flags.registry import FLIPPABLE_WRITERS, PROVEN_READERS, WRITE
from lakehouse_dagster.flags.soak import audit_history, effective_since, until
from lakehouse_dagster.flags.soak_setting import current_soak
from lakehouse_dagster.flags.stored import resolve_for, stored_overrides
from lakehouse_dagster.mirror.reverse import reverse_states
from lakehouse_dagster.parity.canary import latest_verdicts
from lakehouse_dagster.parity.verdicts import latest_verdict_id
from lakehouse_dagster.tracking import undeclared
from lakehouse_dagster.tracking.datasets import get_dataset, lookup, pipeline_input_dataset_ids, scopes
from lakehouse_dagster.tracking.datasets.rows import TABLE as ROWS_TABLE

NATIVE = "iceberg_native"


PROVEN_NAMES = {r.name for r in PROVEN_READERS}


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the checks found for one dataset: ``missing`` empty means complete may start."""

    dataset_id: uuid.UUID
    name: str
    missing: tuple[str, ...]
    native_since: dt.datetime | None
    soak_seconds: int
    snapshot_id: int | None
    verdict_id: int | None = None

    def refusal(self, lifecycle: str | None = None) -> FlipRefused:
        """``lifecycle``: the dataset's state in words (flags.lifecycle_words), named in the first line."""
        state = f", {lifecycle}" if lifecycle else ""
        lines = [
            f"refused: complete of dataset {self.name} ({self.dataset_id}){state}: {len(self.missing)} "
            "condition(s) not met; nothing written:"
        ]
        lines += [f"  - {m}" for m in self.missing]
        return FlipRefused("\n".join(lines))


def check(
    conn: psycopg.Connection,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID,
    *,
    soak_seconds: int | None = None,
    now: dt.datetime | None = None,
) -> Checked:
    """Every condition of complete for one dataset, each missing one with what to do (nothing written).
    Long on purpose: the conditions in the order the docstring gives them, each beside its query."""
    ds = get_dataset(conn, dataset_id)
    ws_id = lookup.workspace_id_of(conn, dataset_id, "workspace")
    if ds.kind != "tabular":
        raise BadInput(f"dataset {dataset_id} is a {ds.kind} dataset; only tabular datasets are written to Iceberg")
    soak = current_soak(conn, settings).seconds if soak_seconds is None else soak_seconds
    now = now or fetch_value(conn.execute("select now()"), "the database clock")
    missing: list[str] = []

    # 1. native for at least the soak
    stored = stored_overrides(conn, WRITE, [w.name for w in FLIPPABLE_WRITERS])
    native = [w for w in FLIPPABLE_WRITERS if resolve_for(w, stored[w.name], dataset_id, ws_id) == NATIVE]
    since = None
    if not native:
        missing.append(
            "not written iceberg-native: no writer resolves to iceberg_native for it, so Postgres is still its "
            f"truth; flip its writers first (lakehouse write-flags flip <writer> --dataset {dataset_id}) and let "
            "them soak"
        )
    else:
        history = audit_history(conn, WRITE, [w.name for w in native])
        starts = [effective_since(history[w.name], w, dataset_id, ws_id, NATIVE) for w in native]
        known = [s for s in starts if s is not None]
        since = min(known) if known else None
        if since is None:
            missing.append(
                f"native by {', '.join(w.name for w in native)}, but no flag audit says since when (written outside "
                "the CLI?): set the writer again with lakehouse write-flags set <writer> iceberg_native "
                f"--dataset {dataset_id} to start its soak"
            )
        elif now < since + dt.timedelta(seconds=soak):
            missing.append(
                f"native since {since:%Y-%m-%d %H:%M:%S} UTC, under the soak of {soak} s: its soak "
                f"{until(since + dt.timedelta(seconds=soak), now)}; run complete again then"
            )

    # 2. reverse parity ok: the reverse on and caught up, the latest verdict at that snapshot agreeing
    state = reverse_states(conn, catalog, settings, [dataset_id])[0]
    snap = state.current_snapshot
    verdict_id = None
    if snap is None:
        missing.append(
            "it has no Iceberg snapshot: nothing would hold its rows once Postgres lets them go; sync it first "
            f"(lakehouse sync --dataset {dataset_id})"
        )
    elif native:
        if not state.enabled:
            missing.append(
                f"the reverse mirror is off for it ({state.source} setting), so Postgres may lack native rows: turn "
                f"it on (lakehouse reverse on --dataset {dataset_id}) and let it catch up"
            )
        elif not state.caught_up:
            at = state.position.snapshot_id if state.position else "none"
            missing.append(
                f"the reverse mirror is behind (its position is snapshot {at}, the table is at {snap}): apply what "
                f"is new (lakehouse reverse sync --dataset {dataset_id}), then run the canary"
            )
        else:
            verdict_id, why = _parity(conn, dataset_id, snap)
            if why:
                missing.append(why)

    # 3. no Postgres-locked consumer left
    if dataset_id in pipeline_input_dataset_ids(conn):
        missing.append(
            f"BLOCKED (pipeline input): a pipeline reads it from {ROWS_TABLE} (F3) and would read nothing once its "
            "rows are deleted; wait until the pipeline source reads Iceberg, or take it out of the pipeline"
        )
    locked = on_postgres(conn, {dataset_id: ws_id}).get(dataset_id)  # a compute reader flipped for it: not held
    if locked:
        names = ", ".join(d.describe() for d in locked)
        proven = [d.reader for d in locked if d.reader in PROVEN_NAMES]
        flip = (
            f"flip {', '.join(proven)} for it once its shadow reads prove it (lakehouse flags flip <reader> "
            f"--dataset {dataset_id}), or "
            if proven
            else ""
        )
        missing.append(
            f"read from {ROWS_TABLE} by {names}, locked to Postgres: it would read nothing once complete; {flip}"
            "remove the declaration (lakehouse pg-readers remove <reader> --dataset|--workspace <id>) only once "
            "it no longer reads this dataset"
        )
    # 4. no row holds a key the schema does not declare: Iceberg has no column for it and the export writes the
    # declared columns only, so complete would delete it for good (issue 42 item 5). One scan of the dataset's rows,
    # by the verb that is about to delete every one of them.
    extra = undeclared.find(conn, dataset_id, [c.name for c in ds.columns])
    if extra is not None:
        first = extra.keys[0][0] if extra.keys else "<key>"
        missing.append(
            f"{extra.rows} row(s) of {ROWS_TABLE} hold {extra.key_count} key(s) its schema does not declare: "
            f"{extra.names()}; Iceberg does not hold them and --export-to would not keep them, so complete would "
            "delete them for good: declare them in datasets.schema and bring their values into the table (roll "
            "the writers back to pg, let the mirror carry them, flip again), or remove them from the rows if they "
            f"are not wanted (update {ROWS_TABLE} set data = data - '{first}' where dataset_id = '{dataset_id}')"
        )
    return Checked(dataset_id, ds.name, tuple(missing), since, soak, snap, verdict_id)


def _parity(conn: psycopg.Connection, dataset_id: uuid.UUID, snapshot_id: int) -> tuple[int | None, str | None]:
    """(the verdict's id, why reverse parity is not ok or None): the newest recorded verdict must be at the table's
    current snapshot, say Postgres and Iceberg agree, and be taken at the dataset's Postgres version."""
    found = latest_verdicts(conn, [dataset_id]).get(dataset_id)
    run = f"run the canary (lakehouse canary --smoke --dataset {dataset_id}) until it says they agree"
    if found is None:
        return None, f"reverse parity unknown: no canary verdict is recorded; {run}"
    verdict_id = latest_verdict_id(conn, dataset_id)
    detail = found["detail"] or {}
    agrees = found["verdict"] == "ok" or (found["verdict"] == "native" and detail.get("agrees_with_postgres") is True)
    at = f"{found['checked_at']:%Y-%m-%d %H:%M:%S} UTC"
    if not agrees:
        return verdict_id, (
            f"reverse parity not ok: the latest canary verdict is {found['verdict']} ({at})"
            f"{'' if found['verdict'] != 'native' else ', Postgres differs from Iceberg'}; {run}"
        )
    if found["snapshot_id"] != snapshot_id:
        return verdict_id, (
            f"reverse parity not checked at the current snapshot: the latest verdict ({found['verdict']}, {at}) is "
            f"at snapshot {found['snapshot_id']}, the table is at {snapshot_id}; {run}"
        )
    version = lookup.rows_version(conn, dataset_id, "version")
    if found["pg_version"] is None or (version is not None and found["pg_version"] < version):
        return verdict_id, (
            f"Postgres was written since the canary checked it (version {found['pg_version']}, now {version}): "
            f"rows only Postgres holds would be lost; {run}"
        )
    return verdict_id, None


def scope_datasets(conn: psycopg.Connection, *, dataset=None, workspace=None) -> list[uuid.UUID]:
    """The datasets a complete at a scope takes: the one named, or the native tabular datasets of the workspace (or
    of every workspace) that are not complete yet."""
    scope = parse_scope(dataset, workspace)
    require_target(conn, scope)
    if scope.scope == DATASET:
        assert scope.scope_id is not None
        return [scope.scope_id]
    ids = scopes.tabular_ids(conn, scope.scope_id if scope.scope == WORKSPACE else None)
    done = with_status(conn, COMPLETE, ids)
    return sorted((native_dataset_ids(conn, ids) - done), key=str)
