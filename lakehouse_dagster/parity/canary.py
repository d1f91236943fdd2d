"""The canary: per dataset, a pinned comparison of Postgres and Iceberg, and its verdict.

Verdicts (runbook Fase 1, step 2):
  ok           caught up (the snapshot covers the Postgres version read in the same pinned
               transaction), row counts and digests match (and, with smoke, the value multiset).
  lagging      the Iceberg snapshot is behind the current Postgres version: not yet caught up. Benign.
  no-snapshot  never synced: no table, or a table without a snapshot. The flip is inert.
  MISMATCH     caught up and disagrees → STOP. The differing row indexes (first 100) are in the detail.
  native       the snapshot was written iceberg-native: Postgres is not authoritative for it; the
               detail says whether the two still agree (useful right after the first native sync).
  error        the check could not see the data (a digest failed, a file is missing, the snapshot does
               not say which version it covers...). Never a pass.
Summary: the count per verdict, plus ``wedged`` — datasets whose latest sync has been non-succeeded
(running or failed) for longer than LAKEHOUSE_WEDGED_AFTER_SECONDS.

Pinning and ordering: the Iceberg snapshot is pinned FIRST, then the Postgres transaction starts. The
mirror only ever records a version it read from committed Postgres data, so a write landing at any
point makes the Postgres version newer than the snapshot's, which reads as ``lagging``: never a false
MISMATCH. Both digests, the localisation and the smoke rows then read exactly those two pins.

Digests (detail ``digest``): ``maintained`` compares the sums both sides keep up to date
(parity/maintained.py: per Iceberg data file, per Postgres dataset and segment) at the two pinned
versions, so an unchanged or appended dataset costs what changed; a maintained disagreement is only
reported once localisation has found the differing rows themselves (otherwise a sum was stale and the
full digest decides). ``full`` digests every row on both sides: when a side has no maintained sum
(``maintained_unavailable`` says why), on request (``full=True``, ``canary --full``) and every
FULL_EVERY-th scheduled run — the cross-check that also catches writes made with the triggers disabled,
and drops a maintained sum it finds stale (``maintained_stale``).

Exit codes: 0 no MISMATCH and no error; 1 a caught-up dataset mismatches (wins over errors);
5 an operational error in at least one dataset (verdict ``error``); 2 bad usage; 3 unknown dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import psycopg
from psycopg.types.json import Jsonb
from pyiceberg.catalog import Catalog

from lakehouse_dagster.core.db import connect
from lakehouse_dagster.core.errors import BadInput, NotFound
from lakehouse_dagster.core.ids import parse_uuid
from lakehouse_dagster.core.settings import Settings
from lakehouse_dagster.parity import maintained as maintained_digests
from lakehouse_dagster.parity import smoke as smoke_check
from lakehouse_dagster.parity.canary_compare import (
    _compare,
    _iceberg_is_the_truth,
)
from lakehouse_dagster.parity.canary_verdict import Hooks as Hooks  # re-exported: callers of canary.X
from lakehouse_dagster.parity.canary_verdict import Verdict as Verdict
from lakehouse_dagster.parity.canary_verdict import _one_line as _one_line
from lakehouse_dagster.parity.digest import (
    PinnedPostgres,
    idle_autocommit,
    pin_iceberg,
)
from lakehouse_dagster.parity.verdicts import (  # names canary.py uses; DEFAULT_LIMIT etc. re-exported below
    DEFAULT_LIMIT,
    ERROR,
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    LAGGING,
    MISMATCH,
    NATIVE,
    NO_SNAPSHOT,
    OK,
    VERDICTS,
    insert_verdict,
)
from lakehouse_dagster.parity.verdicts import FULL_EVERY as FULL_EVERY  # re-exported: callers of canary.X
from lakehouse_dagster.parity.verdicts import full_due as full_due
from lakehouse_dagster.parity.verdicts import latest_verdict_reasons as latest_verdict_reasons
from lakehouse_dagster.parity.verdicts import latest_verdicts as latest_verdicts
from lakehouse_dagster.parity.verdicts import wedged_syncs as wedged_syncs
from lakehouse_dagster.tracking import capture, sync_log
from lakehouse_dagster.tracking.datasets import fragments, lookup, parse_schema

# The canary's face: every name callers import from parity.canary, wherever it lives now.
__all__ = [
    "DEFAULT_LIMIT",
    "ERROR",
    "EXIT_ERROR",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "FULL_EVERY",
    "LAGGING",
    "MISMATCH",
    "NATIVE",
    "NO_SNAPSHOT",
    "OK",
    "VERDICTS",
    "CanaryReport",
    "Hooks",
    "Verdict",
    "_one_line",
    "evaluate",
    "exit_code_for",
    "full_due",
    "latest_verdict_reasons",
    "latest_verdicts",
    "record",
    "run_canary",
    "select_datasets",
    "wedged_syncs",
]

log = logging.getLogger("lakehouse_dagster.parity")


def _latest_sync(conn: psycopg.Connection, dataset_id: uuid.UUID) -> dict | None:
    row = sync_log.latest_sync_row(conn, dataset_id)
    if row is None:
        return None
    keys = ("sync_id", "status", "path", "snapshot_id", "source_version", "started_at", "finished_at", "error")
    return {k: (str(v) if isinstance(v, (uuid.UUID, dt.datetime)) else v) for k, v in zip(keys, row)}


def evaluate(
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    dataset_id: uuid.UUID | str,
    *,
    smoke: bool = False,
    smoke_max_rows: int = smoke_check.SMOKE_MAX_ROWS,
    localise: bool = True,
    hooks: Hooks | None = None,
    full: bool = False,
    pin=None,
    conn: psycopg.Connection | None = None,
) -> Verdict:
    """The verdict for one dataset (nothing recorded: see ``record``). ``full``: digest every row on
    both sides (the cross-check) instead of comparing the maintained sums (parity/maintained.py).
    ``pin``: the caller's Iceberg pin of the dataset, taken before this call (so still before the Postgres pin).
    ``conn``: the caller's idle autocommit connection (a batch's), used instead of opening two per dataset."""
    ds_id = parse_uuid(dataset_id, "dataset id")
    started = time.perf_counter()
    v = Verdict(ds_id, "", ERROR)
    try:
        _evaluate(dsn, catalog, settings, ds_id, v, smoke, smoke_max_rows, localise, hooks or Hooks(), full, pin, conn)
    except (NotFound, BadInput):
        raise
    except Exception as exc:  # the check could not see the data: say so, never pass
        v.verdict = ERROR
        v.detail["reason"] = _one_line(exc)
        log.warning("canary ds=%s: error: %s", ds_id, v.detail["reason"])
    _forget_stale(dsn, v)
    v.seconds = round(time.perf_counter() - started, 3)
    return v


def _prepare_maintained(dsn: str, pin, ds_id: uuid.UUID, v: Verdict, conn: psycopg.Connection | None = None) -> None:
    """Before the Postgres pin (these write): fold many delta rows, register and fill the Postgres side
    the first time, digest the snapshot's files that have none. A failure only means the full digest.
    ``conn``: the caller's connection (left open), else one of our own."""
    t = time.perf_counter()
    try:
        with contextlib.nullcontext(conn) if conn is not None else connect(dsn) as conn:
            row = lookup.kind_schema_version(conn, ds_id)
            if row is None or row[0] != "tabular":
                return
            if not pin.has_snapshot or pin.source_version is None or pin.source_version < row[2]:
                return  # lagging (or no snapshot): nothing to compare, nothing worth filling
            columns = parse_schema(row[1], f"dataset {ds_id}")
            # Capture mode after-commit: the sums include every write the consumer applied. Always, not only
            # when the dataset's applied_version lags: a write under the replica role is seen only by decoding.
            caught_up = capture.catch_up(conn)
            if caught_up.get("transactions"):
                v.detail["wal_consumer"] = caught_up
            maintained_digests.compact_pg(conn, ds_id)
            pg_outcome = maintained_digests.ensure_pg(conn, ds_id, columns)
            files = 0 if pin.has_deletes else maintained_digests.fill_file_digests(conn, pin, columns)
        v.detail["maintained_prepare"] = {
            "postgres": pg_outcome,
            "iceberg_files_digested": files,
            "seconds": round(time.perf_counter() - t, 3),
        }
    except Exception as exc:  # noqa: BLE001 - the full digest decides instead
        v.detail["maintained_prepare"] = {"error": _one_line(exc)}


def _forget_stale(dsn: str, v: Verdict) -> None:
    """A full re-digest that found a maintained sum stale drops it: the next canary fills it again."""
    stale = v.detail.get("maintained_stale")
    if not isinstance(stale, list):
        return
    try:
        with connect(dsn) as conn:
            if "postgres" in stale:
                maintained_digests.forget_pg(conn, v.dataset_id)
            if "iceberg" in stale:
                maintained_digests.forget_file_digests(conn, v.dataset_id)
    except Exception as exc:  # noqa: BLE001
        log.warning("canary ds=%s: could not drop stale maintained digests: %s", v.dataset_id, _one_line(exc))


def _evaluate(
    dsn,
    catalog,
    settings,
    ds_id,
    v: Verdict,
    smoke,
    smoke_max_rows,
    localise,
    hooks: Hooks,
    full: bool = False,
    pin=None,
    conn=None,
) -> None:
    if conn is not None and not idle_autocommit(conn):
        conn = None  # not fit to lend (in a transaction, broken): our own connections, as without one
    pin = pin or pin_iceberg(catalog, settings, ds_id)  # FIRST: see the module docstring
    v.snapshot_id = pin.snapshot_id
    v.iceberg_version = pin.source_version
    if hooks.after_iceberg_pin:
        hooks.after_iceberg_pin()
    if not full:
        _prepare_maintained(dsn, pin, ds_id, v, conn)
    with PinnedPostgres(dsn, conn, dataset_id=ds_id) as pg:
        state = pg.state(ds_id)
        if state is None:
            raise NotFound(f"dataset {ds_id} does not exist (check the id with: lakehouse datasets)")
        if state.kind != "tabular":
            raise BadInput(
                f"dataset {ds_id} is a {state.kind} dataset (file-backed); the canary checks tabular datasets"
            )
        v.dataset = state.name
        v.pg_version = state.rows_version
        latest = _latest_sync(pg.conn, ds_id)
        if latest:
            v.detail["latest_sync"] = latest
        if not pin.exists or not pin.has_snapshot:
            v.verdict = NO_SNAPSHOT
            v.detail["reason"] = (
                f"no Iceberg table {'.'.join(pin.identifier)}"
                if not pin.exists
                else "the Iceberg table has no snapshot"
            ) + ("" if latest else "; never synced")
            return
        v.iceberg_count = pin.total_records
        native = _iceberg_is_the_truth(pg.conn, ds_id, pin)
        if not native:
            if pin.source_version is None:
                v.verdict = ERROR
                v.detail["reason"] = (
                    f"snapshot {pin.snapshot_id} does not say which Postgres version it covers "
                    "(no lakehouse.source-version in its summary or the table properties)"
                )
                return
            if pin.source_version < state.rows_version:
                v.verdict = LAGGING
                v.detail["reason"] = (
                    f"Iceberg covers Postgres version {pin.source_version}, Postgres is at {state.rows_version}"
                )
                return
            if pin.source_version > state.rows_version:
                v.verdict = ERROR
                v.detail["reason"] = (
                    f"snapshot {pin.snapshot_id} claims Postgres version {pin.source_version}, ahead of the "
                    f"current {state.rows_version} (restored database? re-run the canary)"
                )
                return
        v.detail["version_from"] = pin.version_from
        if pin.sync_id is None:
            v.detail["snapshot_not_from_a_sync"] = True
        _compare(pg, pin, state, v, native, smoke, smoke_max_rows, localise, full)


def record(conn: psycopg.Connection, v: Verdict, *, source: str = "canary", run_id: str | None = None) -> int:
    """Write one verdict to lakehouse_read_parity; returns its id. Recording only: what a MISMATCH sets off
    (auto-rollback) is the caller's, through runbooks/auto_rollback.py (``record_and_roll_back``)."""
    detail = json.loads(json.dumps(v.detail, default=str))
    if v.wedged:
        detail["wedged"] = True
    parity_id = insert_verdict(
        conn,
        (
            v.dataset_id,
            v.verdict,
            source,
            v.pg_count,
            v.iceberg_count,
            v.pg_digest,
            v.iceberg_digest,
            v.snapshot_id,
            v.pg_version,
            v.iceberg_version,
            v.smoke,
            v.mismatched_row_indexes or None,
            v.seconds,
            run_id,
            Jsonb(detail),
        ),
    )
    return parity_id


def select_datasets(conn: psycopg.Connection, dataset_ids: Sequence[str] | None, limit: int) -> list[uuid.UUID]:
    """The given datasets (validated: each must exist and be tabular), or a random sample of up to
    ``limit`` synced tabular datasets (those with at least one succeeded sync)."""
    if dataset_ids:
        ids = list(dict.fromkeys(parse_uuid(d, "dataset id") for d in dataset_ids))
        rows: dict = lookup.kinds_of(conn, ids)
        for d in ids:
            if d not in rows:
                raise NotFound(f"dataset {d} does not exist (check the id with: lakehouse datasets)")
            if rows[d] != "tabular":
                raise BadInput(f"dataset {d} is a {rows[d]} dataset (file-backed); the canary checks tabular datasets")
        return ids
    if limit < 1:
        raise BadInput(f"--limit must be at least 1, got {limit}")
    synced = conn.execute(
        "select d.id "
        + fragments.FROM_DATASETS
        + """
            where d.kind = 'tabular'
              and exists (select 1 from lakehouse_latest_succeeded_sync(d.id))  -- tracking/sync_log.py
            order by random() limit %s""",
        (limit,),
    ).fetchall()
    return [r[0] for r in synced]


@dataclasses.dataclass
class CanaryReport:
    results: list[Verdict]
    wedged: list[dict]
    counts: dict[str, int]
    exit_code: int

    def summary_line(self) -> str:
        parts = [f"{k}={self.counts.get(k, 0)}" for k in VERDICTS]
        parts.append(f"wedged={len(self.wedged)}")
        return "summary: " + " ".join(parts)

    def as_dict(self) -> dict:
        return {
            "results": [r.as_dict() for r in self.results],
            "summary": {**{k: self.counts.get(k, 0) for k in VERDICTS}, "wedged": len(self.wedged)},
            "wedged": [
                {k: (str(x) if isinstance(x, (uuid.UUID, dt.datetime)) else x) for k, x in w.items()}
                for w in self.wedged
            ],
            "exit_code": self.exit_code,
        }


def exit_code_for(results: Sequence[Verdict]) -> int:
    if any(r.verdict == MISMATCH for r in results):
        return EXIT_MISMATCH
    if any(r.verdict == ERROR for r in results):
        return EXIT_ERROR
    return EXIT_OK


def run_canary(
    conn: psycopg.Connection,
    dsn: str,
    catalog: Catalog,
    settings: Settings,
    *,
    dataset_ids: Sequence[str] | None = None,
    limit: int = DEFAULT_LIMIT,
    smoke: bool = False,
    smoke_max_rows: int = smoke_check.SMOKE_MAX_ROWS,
    source: str = "canary",
    run_id: str | None = None,
    on_result: Callable[[Verdict], None] | None = None,
    full: bool = False,
    on_recorded: Callable[[Verdict, int], None] | None = None,
    evaluate_with: Callable[..., Verdict | None] | None = None,
) -> CanaryReport:
    """Evaluate, record every verdict in lakehouse_read_parity, and summarise (``conn``: autocommit).
    ``on_recorded(verdict, parity_id)`` runs right after each record, before the next dataset is compared:
    the caller's reaction to a verdict (runbooks/auto_rollback.py's ``run_canary_and_roll_back``).
    ``evaluate_with(dsn, catalog, settings, dataset_id, smoke=...)``: a comparison of the caller's for a dataset
    (the reverse mirror's parity both ways, runbooks/reverse_parity.py); None from it: this module's ``evaluate``."""
    ids = select_datasets(conn, dataset_ids, limit)
    wedged = wedged_syncs(conn, settings.mirror.wedged_after_seconds)
    wedged_ids = {w["dataset_id"] for w in wedged}
    results = []
    for ds_id in ids:
        v = evaluate_with(dsn, catalog, settings, ds_id, smoke=smoke) if evaluate_with else None
        if v is None:
            v = evaluate(dsn, catalog, settings, ds_id, smoke=smoke, smoke_max_rows=smoke_max_rows, full=full)
        v.wedged = ds_id in wedged_ids
        parity_id = record(conn, v, source=source, run_id=run_id)
        if on_recorded:
            on_recorded(v, parity_id)
        log.info("canary ds=%s verdict=%s %s", ds_id, v.verdict, v.detail.get("reason", ""))
        results.append(v)
        if on_result:
            on_result(v)
    counts = {k: sum(1 for r in results if r.verdict == k) for k in VERDICTS}
    return CanaryReport(results, wedged, counts, exit_code_for(results))
