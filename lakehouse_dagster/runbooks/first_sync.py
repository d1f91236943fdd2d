"""After a write flip's gated set: the writer's first native sync, then the canary on it (runbook step 3).

Both the CLI (`lakehouse write-flags flip`) and the `write_flip` job call ``first_native_syncs``. Per
moved dataset: ``run_writer`` (sources/writers.py) takes the native path now that the flag says so,
then ``parity.first_native`` compares the new snapshot with what Postgres held, and the verdict is
recorded in lakehouse_read_parity. A MISMATCH, a failed sync, or a sync that did not go native stops
the step with the rollback command; on a MISMATCH auto-rollback (runbooks/auto_rollback.py) has already
set the writer back to pg for the dataset, and the step says so with the rollback report (the rows
written natively exist only in Iceberg). A dataset without a source is named and does not stop it: its
first native write, whoever makes it later (a source's sync, an ingest), is not compared here.

From before the write until the verdict is recorded (and a MISMATCH rolled back) the dataset's first native hold
is taken (core/guards.py): the reverse mirror waits on it, so it never copies the new snapshot into dataset_rows
while the canary still compares that snapshot with what Postgres held, nor leaves a rolled-back dataset's
Postgres holding the doubtful rows.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

import psycopg
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import LakehouseError
from lakehouse_dagster.core.guards import first_native_hold, guard_connection
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.flags.gates import NATIVE, Effect
from lakehouse_dagster.flags.registry import WRITE
from lakehouse_dagster.flags.resolver import FlagResolver
from lakehouse_dagster.lifecycle import store as lifecycle_store
from lakehouse_dagster.parity import canary
from lakehouse_dagster.runbooks import auto_rollback
from lakehouse_dagster.runbooks.auto_rollback import lines_of
from lakehouse_dagster.runbooks.first_native_canary import SOURCE, evaluate_first_native, rollback_command
from lakehouse_dagster.runbooks.rollback_report import rollback_lines, rolled_back
from lakehouse_dagster.sources import get_source
from lakehouse_dagster.sources.writers import IngestResult

log = logging.getLogger("lakehouse_dagster.runbooks")


@dataclasses.dataclass
class FirstSync:
    dataset_id: uuid.UUID
    verdict: str | None  # ok | MISMATCH | no-snapshot | error; None when no sync ran
    path: str | None  # what the sync took: native (expected) or pg
    rows: int | None
    snapshot_id: int | None
    detail: str
    problem: str | None = None  # why it stops the step (None: fine, or only skipped)
    auto_rollback: list[str] = dataclasses.field(default_factory=list)  # what auto-rollback did, for people
    rolled_back: bool = False  # the writer is back on pg for it (auto-rollback)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}


def first_native_syncs(
    conn: psycopg.Connection,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    writer: str,
    dataset_ids: list[uuid.UUID],
    *,
    run_id: str | None = None,
    logger=None,
) -> list[FirstSync]:
    lg = logger or log
    flags = FlagResolver(conn, ttl_seconds=0)  # the flip just happened: no cached resolution
    out = []
    for ds_id in dataset_ids:
        if get_source(conn, ds_id) is None:
            out.append(
                FirstSync(
                    ds_id,
                    None,
                    None,
                    None,
                    None,
                    "no source set: skipped; its first native write (a source's sync once one is set: "
                    f"lakehouse sources set --dataset {ds_id} ..., or an ingest) gets no first-native canary, "
                    "and the reverse mirror copies it to Postgres as it lands; to have it checked, set the "
                    "source before the flip",
                )
            )
            continue
        # the reverse mirror waits for the verdict: it would copy a doubtful snapshot into dataset_rows
        with guard_connection(dsn) as hold, first_native_hold(hold, ds_id):
            out.append(_first_sync(conn, dsn, catalog, settings, flags, writer, ds_id, run_id=run_id, logger=lg))
    return out


def _first_sync(conn, dsn, catalog, settings, flags, writer: str, ds_id: uuid.UUID, *, run_id, logger) -> FirstSync:
    """One dataset's first native sync, its canary and, on a MISMATCH, its auto-rollback."""
    from lakehouse_dagster.sources.writers import run_writer  # the source writers (ingest area)

    try:
        r = run_writer(dsn, catalog, settings, flags, ds_id, writer, run_id=run_id, logger=logger)
    except LakehouseError as exc:
        return FirstSync(ds_id, None, None, None, None, str(exc), problem=f"first native sync failed: {exc}")
    if r.path != "native":
        return FirstSync(
            ds_id,
            None,
            r.path,
            r.rows,
            r.snapshot_id,
            r.flag_reason,
            problem=f"the sync took the {r.path} path ({r.flag_reason}), not iceberg_native",
        )
    f = _canary_of(conn, dsn, catalog, settings, writer, ds_id, r, run_id)
    logger.info(f"first native sync {writer} ds={ds_id}: {r.rows} rows → snapshot {r.snapshot_id}; canary {f.verdict}")
    return f


def _canary_of(conn, dsn, catalog, settings, writer: str, ds_id: uuid.UUID, r, run_id) -> FirstSync:
    """A first native write's canary against what Postgres held, recorded; a MISMATCH rolls the writer back to pg
    (auto-rollback) and the rollback report says what only Iceberg holds now and the two ways forward."""
    v = evaluate_first_native(dsn, catalog, settings, ds_id, writer, snapshot_id=r.snapshot_id)
    auto_rollback.record_and_roll_back(conn, v, source=SOURCE, run_id=run_id, settings=settings)  # MISMATCH: to pg
    reason = str(v.detail.get("reason", ""))
    f = FirstSync(
        ds_id,
        v.verdict,
        r.path,
        r.rows,
        r.snapshot_id,
        reason,
        problem=None if v.verdict == canary.OK else f"canary {v.verdict}: {reason}",
    )
    f.auto_rollback = lines_of(v)
    f.rolled_back = bool((v.detail.get("auto_rollback") or {}).get("rolled_back"))
    if f.rolled_back:
        report = rolled_back(conn, catalog, settings, [Effect(ds_id, v.dataset, NATIVE, "pg")])
        f.auto_rollback += rollback_lines(writer, report)
    return f


def is_first_native_write(conn: psycopg.Connection, ds_id: uuid.UUID) -> bool:
    """The dataset became native from a mirrored state (its lifecycle history's last move into ``native`` came from
    ``mirrored`` or ``read-flipped``: Postgres was the truth of a copy the canary can compare with) and no native write
    has succeeded since: the next one is its first, whoever makes it. A dataset made native before it was ever
    mirrored has nothing to be compared with; one native before the lifecycle existed had its first write then."""
    return lifecycle_store.native_since_mirrored_without_native_write(conn, ds_id)


@dataclasses.dataclass
class CheckedWrite:
    """A source writer's run (``run_writer``'s IngestResult) and, when it was the dataset's first native write,
    its canary (FirstSync: verdict, auto-rollback lines)."""

    result: IngestResult
    first_native: FirstSync | None = None

    def lines(self) -> list[str]:
        f = self.first_native
        if f is None:
            return []
        head = f"first native write of {f.dataset_id}: canary {f.verdict} ({f.detail})"
        return [head, *f.auto_rollback]


def checked_write(
    conn: psycopg.Connection | None,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    flags: FlagResolver,
    dataset_id: uuid.UUID | str,
    writer: str,
    *,
    run_id: str | None = None,
    logger=None,
    **kw,
) -> CheckedWrite:
    """``run_writer``, with a dataset's FIRST native write checked wherever it is made (issue 42: a property of the
    write, not of `write-flags flip`): under the first-native hold (the reverse mirror waits for the verdict), the
    write, its canary against what Postgres held, and on a MISMATCH the auto-rollback of the writer. Every other
    write is ``run_writer`` alone. The CLI's ingest, the ingest job (and with it the source poller) and the service
    call this. ``conn`` None: a connection of its own on ``dsn`` (no statement timeout: the canary's comparison is
    long), opened only when the writer resolves native — a pg-path write needs none (issue 45: the service's)."""
    from lakehouse_dagster.sources.writers import run_writer  # the source writers (ingest area)

    lg = logger or log
    ds_id = parse_uuid(dataset_id, "dataset id")
    if flags.resolve(WRITE, writer, ds_id).mode != NATIVE:
        return CheckedWrite(run_writer(dsn, catalog, settings, flags, ds_id, writer, run_id=run_id, logger=lg, **kw))
    if conn is None:
        with connect(dsn) as own:
            return _checked_native(own, dsn, catalog, settings, flags, ds_id, writer, run_id, lg, kw)
    return _checked_native(conn, dsn, catalog, settings, flags, ds_id, writer, run_id, lg, kw)


def _checked_native(conn, dsn, catalog, settings, flags, ds_id, writer, run_id, lg, kw) -> CheckedWrite:
    """``checked_write`` of a writer that resolves native: the canary only where it is the first native write."""
    from lakehouse_dagster.sources.writers import run_writer  # the source writers (ingest area)

    if not is_first_native_write(conn, ds_id):
        return CheckedWrite(run_writer(dsn, catalog, settings, flags, ds_id, writer, run_id=run_id, logger=lg, **kw))
    with guard_connection(dsn) as hold, first_native_hold(hold, ds_id):
        if not is_first_native_write(conn, ds_id):  # another process made it while we waited for the hold
            return CheckedWrite(
                run_writer(dsn, catalog, settings, flags, ds_id, writer, run_id=run_id, logger=lg, **kw)
            )
        r = run_writer(dsn, catalog, settings, flags, ds_id, writer, run_id=run_id, logger=lg, **kw)
        if r.path != "native" or not r.new:
            return CheckedWrite(r)
        f = _canary_of(conn, dsn, catalog, settings, writer, ds_id, r, run_id)
        lg.info(f"first native write {writer} ds={ds_id}: {r.rows} rows → snapshot {r.snapshot_id}; canary {f.verdict}")
        return CheckedWrite(r, f)


def stop_message(writer: str, results: list[FirstSync]) -> str | None:
    """STOP with the rollback command per dataset that did not pass, or None when all passed."""
    bad = [r for r in results if r.problem]
    if not bad:
        return None
    lines = [f"STOP: {len(bad)} dataset(s) failed the first native sync of {writer}; roll back:"]
    for r in bad[:20]:
        lines.append(f"  {r.dataset_id}: {r.problem}")
        if r.rolled_back:
            lines += [f"    {line.strip()}" for line in r.auto_rollback]
        else:
            lines += [f"    {line}" for line in r.auto_rollback if "AUTO-ROLLBACK" in line]
            lines.append(f"    {rollback_command(writer, r.dataset_id)}")
    return "\n".join(lines)
