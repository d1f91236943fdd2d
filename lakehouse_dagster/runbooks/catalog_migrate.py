"""`lakehouse catalog migrate --to rest|sql`: every dataset's table moved to the other catalog, data files untouched
(docs/catalog-cutover.md).

Per table, under the dataset's lock (G3: no sync or native write commits meanwhile; a table being written is skipped as
busy, not waited for long), lake/catalog_copy.py moves it (register or replay) or catches it up, then the move is
verified: the target serves the source's current snapshot, schema, properties and exactly its live data files, and
the canary, run on the target catalog, finds the table agreeing with Postgres (ok, or lagging / native as it would on
the source). A table that fails the verification after being created is dropped from the target again (never purged:
the files are the source's), so each table is moved whole or not at all. Run again, it resumes: moved tables are
"already", tables whose source went on are caught up, busy and failed ones are tried again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, LakehouseError, LockTimeout, first_line
from lakehouse_dagster.core.guards import dataset_lock
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.lake import catalog_copy
from lakehouse_dagster.lake.catalog import load_catalog, load_table_or_none, table_identifier
from lakehouse_dagster.lake.errors import CopyRefused
from lakehouse_dagster.parity import verdicts
from lakehouse_dagster.parity.canary import evaluate
from lakehouse_dagster.parity.digest import pin_iceberg
from lakehouse_dagster.tracking.datasets import scopes

log = logging.getLogger(__name__)

CATALOGS = ("rest", "sql")
# The canary verdicts a moved table may have: what it would have on the source catalog too.
ACCEPTED = (verdicts.OK, verdicts.LAGGING, verdicts.NATIVE, verdicts.NO_SNAPSHOT)


@dataclasses.dataclass
class Moved:
    dataset_id: uuid.UUID
    table: str
    outcome: str  # moved | caught-up | already | would-create | would-catch-up | busy | failed | no-table
    snapshots: int = 0  # snapshots added to the target
    files: int = 0  # live data files of the table (the same paths on both sides)
    verdict: str | None = None  # the canary's, on the target
    detail: str = ""

    def line(self) -> str:
        what = f"{self.outcome}: {self.table}"
        if self.snapshots:
            what += f", {self.snapshots} snapshot(s)"
        if self.files:
            what += f", {self.files} data file(s) untouched"
        if self.verdict:
            what += f", canary {self.verdict}"
        return what + (f" ({self.detail})" if self.detail else "")

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "dataset_id": str(self.dataset_id)}


def catalogs(settings: Settings, to: str, warehouse: str | None) -> tuple[Settings, Settings]:
    """(source, target) settings: the SQL catalog on the project's Postgres and the REST catalog of
    LAKEHOUSE_CATALOG_URI, whichever LAKEHOUSE_CATALOG_TYPE says today. ``warehouse``: the target's."""
    if to not in CATALOGS:
        raise BadInput(f"--to {to!r} is not a catalog type; use rest or sql")
    if not settings.catalog.uri:
        raise BadInput(
            "a catalog migration needs the REST catalog: set LAKEHOUSE_CATALOG_URI (and LAKEHOUSE_CATALOG_CREDENTIAL "
            "or LAKEHOUSE_CATALOG_TOKEN) to it, whichever catalog LAKEHOUSE_CATALOG_TYPE names today"
        )
    source = settings.replace(catalog={"type": "sql" if to == "rest" else "rest"})
    return source, settings.replace(catalog={"type": to, "warehouse": warehouse or settings.catalog.warehouse})


def migrate(
    dsn: str,
    settings: Settings,
    *,
    to: str,
    how: str = "register",
    dry_run: bool = False,
    warehouse: str | None = None,
    dataset_ids: Iterable[uuid.UUID] | None = None,
    lock_wait_s: float = 5.0,
    workers: int = 1,
) -> list[Moved]:
    """Move every dataset's table (or those of ``dataset_ids``); one Moved per dataset, in dataset id order.
    ``workers``: tables moved at once (threads; each table still under its own lock)."""
    if how not in catalog_copy.HOWS:
        raise BadInput(f"--how {how!r} is not one of {', '.join(catalog_copy.HOWS)}")
    if workers < 1:
        raise BadInput(f"--workers {workers} must be at least 1")
    source_settings, target_settings = catalogs(settings, to, warehouse)
    source = load_catalog(source_settings, dsn)
    target = load_catalog(target_settings, dsn)
    with connect(dsn) as conn:
        if dataset_ids is None:
            ids = scopes.all_ids(conn)
        else:
            ids = sorted(set(dataset_ids))
    # One session for the locks and one for the canaries per worker, for the whole run (a connection per table cost
    # more than the move itself).
    local = threading.local()
    opened: list[tuple] = []
    namespaces: set[str] = set()  # the target's, made sure of once per run

    def sessions() -> tuple:
        if not hasattr(local, "conns"):
            local.conns = (connect(dsn), connect(dsn))
            opened.append(local.conns)
        return local.conns

    def one(ds_id: uuid.UUID) -> Moved:
        ident = table_identifier(settings, ds_id)
        moved = Moved(ds_id, ".".join(ident), "no-table")
        try:
            if dry_run:
                src = load_table_or_none(source, ident)
                if src is None:
                    return moved
                step = catalog_copy.plan(src, load_table_or_none(target, ident))
                moved.outcome = {"create": "would-create", "catch-up": "would-catch-up"}.get(step.action, step.action)
                moved.snapshots, moved.detail = step.snapshots, step.reason
            else:
                _move(dsn, sessions(), source, target, target_settings, ident, moved, how, lock_wait_s, namespaces)
        except LakehouseError as exc:
            moved.outcome, moved.detail = "failed", first_line(exc)
        except Exception as exc:  # noqa: BLE001 - one table's failure is its line; the others still move
            moved.outcome, moved.detail = "failed", f"{type(exc).__name__}: {first_line(exc)}"
        log.info("catalog migrate --to %s: %s", to, moved.line())
        return moved

    try:
        if workers == 1:
            return [one(d) for d in ids]
        with ThreadPoolExecutor(workers, thread_name_prefix="catalog-migrate") as pool:
            return list(pool.map(one, ids))
    finally:
        for conns in opened:
            for c in conns:
                c.close()


def _move(
    dsn, conns, source, target, target_settings, ident, moved: Moved, how: str, lock_wait_s: float, namespaces
) -> None:
    lock_conn, canary_conn = conns
    try:
        with dataset_lock(lock_conn, moved.dataset_id, timeout_s=lock_wait_s):
            _copy_and_verify(dsn, canary_conn, source, target, target_settings, ident, moved, how, namespaces)
    except LockTimeout:
        moved.outcome, moved.detail = "busy", "a sync or native write holds its lock (G3); run the migration again"


def _copy_and_verify(
    dsn, canary_conn, source, target, target_settings, ident, moved: Moved, how: str, namespaces
) -> None:
    """Per table, each thing read once (the profile of docs/benchmarks.md "catalog migrate"): the source table is
    loaded once (under the lock: what is moved is what is verified), the moved table is the commit's answer (not
    loaded again), its one file plan is the canary's pin and the verification's target side."""
    started = time.perf_counter()
    src = load_table_or_none(source, ident)  # under the lock: what is moved is what is verified
    if src is None:
        return  # "no-table", as Moved starts
    step, src, dst, created = catalog_copy.copy_table(source, target, ident, how, source=src, namespaces=namespaces)
    pin = pin_iceberg(target, target_settings, moved.dataset_id, table=dst)
    problems, files = catalog_copy.verify(src, dst, set(pin.files))
    if not problems:
        moved.verdict = evaluate(dsn, target, target_settings, moved.dataset_id, conn=canary_conn, pin=pin).verdict
        if moved.verdict not in ACCEPTED:
            problems.append(f"the canary on the target says {moved.verdict}")
    moved.files = files
    if problems:
        undo = ""
        if created:
            target.drop_table(ident)  # never purge: the files are the source's
            undo = "; the target's table was dropped again"
        raise CopyRefused(f"the moved table differs: {'; '.join(problems)}{undo}")
    moved.outcome = {"create": "moved", "catch-up": "caught-up"}.get(step.action, step.action)
    moved.snapshots = step.snapshots if step.action != "already" else 0
    moved.detail = f"{time.perf_counter() - started:.2f}s"
